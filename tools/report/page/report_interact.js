// tools/report/page/report_interact.js: zoom, pan and hover details, and
// the start of the page (what runs once the script is loaded).
// Part of the capalloc report page's script (docs/report.md). The page's
// script is report_model.js, then report_view.js, report_draw.js and
// report_interact.js concatenated inside one function (tools/CMakeLists.txt
// wraps them), so these three share its constants, state and functions;
// each is one concern. Plain JavaScript, no library.

  // ---- zoom and pan ------------------------------------------------------
  function zoomX(factor, around) {
    const span = view.x1 - view.x0;
    const c = around === undefined ? view.x0 + span / 2 : around;
    const next = Math.min(model.xmax, Math.max(model.xmax / 5000, span * factor));
    view.x0 = c - (c - view.x0) * next / span;
    view.x1 = view.x0 + next;
    clampX();
    drawAll();
  }
  function clampX() {
    const span = view.x1 - view.x0;
    if (view.x0 < 0) { view.x0 = 0; view.x1 = span; }
    if (view.x1 > model.xmax) { view.x1 = model.xmax; view.x0 = Math.max(0, model.xmax - span); }
  }
  function zoomY(factor) { view.yZoom = Math.min(40, Math.max(0.3, view.yZoom * factor)); drawAll(); }
  function reset() { view.x0 = 0; view.x1 = model.xmax; view.yZoom = 1; drawAll(); }
  // Dragging pans time. The drag lives on the window, as every redraw
  // replaces the SVG the drag began on.
  let drag = null;
  function attachZoom(root, width) {
    const toX = function (px) { return view.x0 + (px - LEFT) / (width - LEFT - RIGHT) * (view.x1 - view.x0); };
    root.addEventListener('wheel', function (ev) {
      ev.preventDefault();
      const factor = ev.deltaY > 0 ? 1.25 : 0.8;
      if (ev.shiftKey) zoomY(1 / factor);
      else zoomX(factor, toX(ev.offsetX));
    }, { passive: false });
    root.addEventListener('mousedown', function (ev) {
      drag = { px: ev.clientX, x0: view.x0, x1: view.x1, width: width };
      document.body.classList.add('dragging');
    });
    root.addEventListener('dblclick', reset);
  }
  window.addEventListener('mouseup', function () { drag = null; document.body.classList.remove('dragging'); });
  window.addEventListener('mousemove', function (ev) {
    if (!drag || Math.abs(ev.clientX - drag.px) <= 2) return;
    const dx = (ev.clientX - drag.px) / (drag.width - LEFT - RIGHT) * (drag.x1 - drag.x0);
    view.x0 = drag.x0 - dx;
    view.x1 = drag.x1 - dx;
    clampX();
    drawAll();
  });
  document.getElementById('zoom-in').addEventListener('click', function () { zoomX(0.5); });
  document.getElementById('zoom-out').addEventListener('click', function () { zoomX(2); });
  document.getElementById('taller').addEventListener('click', function () { zoomY(1.5); });
  document.getElementById('shorter').addEventListener('click', function () { zoomY(1 / 1.5); });
  document.getElementById('zoom-reset').addEventListener('click', reset);
  window.addEventListener('resize', function () { drawAll(); });

  // ---- hover details -------------------------------------------------------
  const tip = document.getElementById('tooltip');
  function showTip(ev, title, rows) {
    tip.textContent = '';
    tip.append(el('div', { class: 'tt-title' }, title));
    rows.forEach(function (r) {
      if (r[1] === undefined || r[1] === null || r[1] === '') return;
      const row = el('div', { class: 'tt-row' });
      row.append(el('span', {}, r[0]));
      row.append(el('span', { class: r[2] || '' }, String(r[1])));
      tip.append(row);
    });
    tip.hidden = false;
    const w = tip.offsetWidth;
    const h = tip.offsetHeight;
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - w - 8) + 'px';
    tip.style.top = Math.min(ev.clientY + 14, window.innerHeight - h - 8) + 'px';
  }
  function hideTip() { tip.hidden = true; }
  function when(x, t) {
    if (!model.hasTrace) return 'before the snapshot';
    const e = model.eventAt.get(x);
    return 'event ' + x + (t !== undefined && t !== null ? ' (' + duration(t) + ')' : '') + (e && e.line ? ', line ' + e.line : '');
  }
  function showBlock(ev, b) {
    const cap = b.capture ? model.captures.get(b.capture) : null;
    showTip(ev, blockName(b), [
      ['address', hex(b.addr) + ' – ' + hex(b.addr + b.size), 'tt-addr'],
      ['size', human(b.size) + (b.requested && b.requested !== b.size ? ' (' + human(b.requested) + ' requested)' : '')],
      ['lifetime', b.lifetime + (b.poolIsGraph ? ', in a graph pool' : '')],
      ['state', b.state === 'freed' ? 'freed' : b.state.replace('_', ' ')],
      ['stream', streamName(b.stream)],
      ['capture', b.capture ? (cap ? cap.label + ' (capture ' + b.capture + ')' : 'capture ' + b.capture) : 'none'],
      ['allocated', b.fromSnapshot && !model.hasTrace ? 'before the snapshot' : when(b.start, b.t0)],
      ['freed', b.end === null ? (b.state === 'pending_free' ? 'pending' : 'still live') : when(b.end, b.t1)],
    ]);
  }
  function showRange(ev, g, r) {
    showTip(ev, (g.label || 'graph ' + g.graph) + ': ' + (isWrite(r) ? 'writes' : (r.mode === 'read' ? 'reads' : 'touches')), [
      ['range', hex(r.begin) + ' – ' + hex(r.begin + r.bytes), 'tt-addr'],
      ['bytes', human(r.bytes)],
      ['node', r.op + ' at capture position ' + r.position],
      ['mode', r.mode + (r.inferred ? ' (taken as a whole write)' : '')],
      ['evidence', r.evidence],
      ['through', r.through ? blockName(model.blockBySeq.get(r.through) || { sequence: r.through }) : 'memory no block held'],
    ]);
  }
  function showFinding(ev, f, i) {
    showTip(ev, 'finding #' + (i + 1) + ': ' + f.severity, [
      ['graph', f.label],
      ['harm', f.harm],
      ['bytes', hex(f.addr) + ' – ' + hex(f.end) + ' (' + human(f.bytes) + ')', 'tt-addr'],
      ['victim', blockName(f.victim)],
      ['writer', blockName(f.writer)],
      ['why', f.reason],
      ['fix', f.fix],
    ]);
  }
  function highlightFinding(i, on) {
    const f = model.findings[i];
    f.chain.forEach(function (link) {
      const b = model.blockBySeq.get(link.block.sequence);
      if (b && b.rect) b.rect.classList.toggle('chain-hover', on);
    });
    const v = f.victim && model.blockBySeq.get(f.victim.sequence);
    if (v && v.rect) v.rect.classList.toggle('chain-hover', on);
  }
  function focusFinding(i) {
    const mark = document.querySelector('.finding-mark[data-finding="' + (i + 1) + '"]');
    if (mark) mark.closest('section').scrollIntoView({ behavior: 'smooth', block: 'center' });
    highlightFinding(i, true);
    setTimeout(function () { highlightFinding(i, false); }, 1500);
  }

  summary();
  legend();
  drawAll();
  findingsTable();
  graphsTable();
  audit();
  leftOut();
  document.body.setAttribute('data-ready', 'yes');
