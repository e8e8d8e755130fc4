// tools/report/page/report_draw.js: the drawing. Every pool's address
// space over time as SVG (x: the trace's event index, or the one moment of a
// snapshot; y: the address within each segment): blocks, capture windows,
// replays, the ranges graphs access, findings and their reuse chains. It
// writes what it drew into DOM attributes (body[data-block-count]: the
// blocks in the time window shown; the findings' marks with data-addr) for
// tests/report_page_test.sh.
// Part of the capalloc report page's script (docs/report.md). The page's
// script is report_model.js, then report_view.js, report_draw.js and
// report_interact.js concatenated inside one function (tools/CMakeLists.txt
// wraps them), so these three share its constants, state and functions;
// each is one concern. Plain JavaScript, no library.

  // ---- drawing -----------------------------------------------------------
  function isWrite(r) { return r.mode === 'write' || r.mode === 'read_write' || r.mode === 'state' || r.inferred; }
  function plotWidth() { return Math.max(320, document.getElementById('pools').clientWidth - 22); }
  function xScale(width) {
    const span = Math.max(1e-9, view.x1 - view.x0);
    return function (x) { return LEFT + (x - view.x0) / span * (width - LEFT - RIGHT); };
  }
  function defs(root) {
    const d = svg('defs');
    [['hatch-write', 'var(--write)'], ['hatch-read', 'var(--read)'], ['hatch-touch', 'var(--touch)'], ['hatch-pending', '#777']].forEach(function (h) {
      const p = svg('pattern', { id: h[0], patternUnits: 'userSpaceOnUse', width: 6, height: 6, patternTransform: 'rotate(45)' });
      p.append(svg('rect', { width: 6, height: 6, fill: 'rgba(255,255,255,0.25)' }));
      p.append(svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, stroke: h[1], 'stroke-width': 2.2 }));
      d.append(p);
    });
    root.append(d);
  }
  // The hatch patterns, for the drawings and the legend: one hidden SVG
  // holds them, so that each id exists once in the page.
  (function () {
    const holder = svg('svg', { width: 0, height: 0, style: 'position:absolute' });
    defs(holder);
    document.body.append(holder);
  })();

  function tickStep(span, px) {
    const target = span / Math.max(1, px / 90);
    const pow = Math.pow(10, Math.floor(Math.log10(Math.max(target, 1))));
    for (const m of [1, 2, 5, 10]) if (pow * m >= target) return pow * m;
    return pow * 10;
  }

  let drawn = { blocks: 0, marks: [] };

  function drawPool(p, width) {
    const section = el('section', { class: 'pool', 'data-pool': p.key });
    const title = el('h3', {}, 'device ' + p.device + ' · ' + p.label);
    const reserved = p.segments.reduce(function (s, g) { return s + (g.rebuilt ? 0 : g.size); }, 0);
    const sub = [p.blocks.length + ' block' + (p.blocks.length === 1 ? '' : 's'),
      p.segments.length + (p.segments.some(function (s) { return s.rebuilt; }) ? ' address range' : ' segment') + (p.segments.length === 1 ? '' : 's')];
    if (reserved) sub.push(human(reserved) + ' reserved');
    if (p.captures) sub.push('captures: ' + p.captures.join(', '));
    title.append(el('span', { class: 'sub' }, sub.join(' · ')));
    section.append(title);

    const bandH = BASE_BAND * view.yZoom;
    const height = TOP + p.segments.length * (bandH + BAND_GAP) + 4;
    const root = svg('svg', { width: width, height: height, viewBox: '0 0 ' + width + ' ' + height });
    const X = xScale(width);
    const clip = svg('clipPath', { id: 'clip-' + p.key.replace(/[^a-z0-9]/gi, '_') });
    clip.append(svg('rect', { x: LEFT, y: 0, width: width - LEFT - RIGHT, height: height }));
    root.append(clip);
    const plot = svg('g', { 'clip-path': 'url(#' + clip.getAttribute('id') + ')' });

    // Time axis: event index (or the one moment of a snapshot).
    const axis = svg('g', { class: 'axis' });
    if (model.hasTrace) {
      const step = tickStep(view.x1 - view.x0, width - LEFT - RIGHT);
      for (let t = Math.ceil(view.x0 / step) * step; t <= view.x1; t += step) {
        axis.append(svg('line', { x1: X(t), y1: TOP - 4, x2: X(t), y2: height, class: 'grid' }));
        axis.append(svg('text', { x: X(t), y: 11, 'text-anchor': 'middle', class: 'muted' }, String(t)));
      }
      axis.append(svg('text', { x: 4, y: 11, class: 'muted' }, 'event →'));
    } else {
      axis.append(svg('text', { x: LEFT, y: 11, class: 'muted' }, 'snapshot: one moment'));
    }
    root.append(axis);

    // Capture windows and replays, across every band.
    const replays = [];
    model.captures.forEach(function (c) {
      const x0 = X(c.begin);
      const x1 = X(c.end === null ? model.xmax : c.end);
      plot.append(svg('rect', { x: x0, y: TOP - 2, width: Math.max(1, x1 - x0), height: height - TOP, class: 'capture-window' }));
      plot.append(svg('text', { x: x0 + 3, y: 25, class: 'muted' }, 'capture ' + c.label));
      c.replays.forEach(function (r) { replays.push({ x: r.x, refused: r.refused, label: c.label }); });
    });
    // Replay lines; a label only where it does not run into the one before.
    replays.sort(function (a, b) { return a.x - b.x; });
    let lastLabelEnd = -Infinity;
    replays.forEach(function (r) {
      const x = X(r.x);
      const line = svg('line', { x1: x, y1: TOP - 14, x2: x, y2: height, class: r.refused ? 'refused-line' : 'replay-line' });
      line.append(svg('title', {}, (r.refused ? 'replay refused: ' : 'replay: ') + r.label + ' (event ' + r.x + ')'));
      plot.append(line);
      const text = (r.refused ? '✕ ' : '▶ ') + r.label;
      if (x + 3 > lastLabelEnd + 6) {
        plot.append(svg('text', { x: x + 3, y: TOP - 6, class: r.refused ? 'finding-label' : 'muted' }, text));
        lastLabelEnd = x + 3 + text.length * 6.2;
      }
    });

    const usedLabelYs = [];
    p.segments.forEach(function (seg, i) {
      const y0 = TOP + i * (bandH + BAND_GAP);
      const Y = function (a) { return y0 + (a - seg.base) / seg.size * bandH; };
      root.append(svg('text', { x: 4, y: y0 + 12, class: 'mono' }, hex(seg.base)));
      root.append(svg('text', { x: 4, y: y0 + 26, class: 'muted' }, (seg.rebuilt ? 'range ' : 'segment ') + human(seg.size)));
      if (seg.stream !== undefined) root.append(svg('text', { x: 4, y: y0 + 40, class: 'muted' }, 'stream ' + streamName(seg.stream)));
      root.append(svg('text', { x: 4, y: y0 + bandH - 2, class: 'mono muted' }, hex(seg.base + seg.size)));
      plot.insertBefore(svg('rect', { x: LEFT, y: y0, width: width - LEFT - RIGHT, height: bandH, class: 'band' }), plot.firstChild);
      // Free space at the snapshot's moment (dashed).
      if (!model.hasTrace) {
        seg.free.forEach(function (f) {
          plot.append(svg('rect', { x: X(0), y: Y(f.addr), width: X(model.xmax) - X(0), height: Math.max(1, f.size / seg.size * bandH), class: 'free-block' }));
        });
      }
      // Blocks.
      p.blocks.forEach(function (b) {
        if (b.segment !== seg) return;
        // Outside the zoomed time window: not drawn (large traces stay quick).
        if (b.start > view.x1 || (b.end !== null && b.end < view.x0)) return;
        const x0 = X(b.start);
        const x1 = X(b.end === null ? model.xmax : b.end);
        const cls = lifetimeClass(b);
        const fill = b.state === 'pending_free' ? 'url(#hatch-pending)'
          : 'var(--' + cls + (b.end !== null ? '-freed' : '') + ')';
        const r = svg('rect', {
          x: x0, y: Y(b.addr), width: Math.max(1.5, x1 - x0), height: Math.max(1.5, b.size / seg.size * bandH),
          fill: fill, class: 'block ' + cls + (b.end !== null ? ' freed' : ''),
          'data-seq': String(b.sequence), 'data-addr': hex(b.addr), 'data-size': String(b.size), 'data-tag': b.tag,
        });
        r.addEventListener('mousemove', function (ev) { showBlock(ev, b); r.classList.add('hover'); });
        r.addEventListener('mouseleave', function () { hideTip(); r.classList.remove('hover'); });
        b.rect = r;
        plot.append(r);
        drawn.blocks += 1;
        const h = b.size / seg.size * bandH;
        const w = x1 - x0;
        if (b.tag && h >= 12 && w >= 30) {
          const label = svg('text', { x: Math.max(x0, LEFT) + 4, y: Y(b.addr) + Math.min(h / 2 + 4, 14), class: 'block-label', fill: '#fff', 'pointer-events': 'none' }, b.tag + (w > 110 ? ' · ' + human(b.size) : ''));
          label.style.fill = '#fff';
          plot.append(label);
        }
      });
      // The ranges each graph accesses on replay: hatched from its capture's
      // end (the graph exists from then on), a solid tick at each replay.
      model.graphs.forEach(function (g) {
        if (!g.shown || g.device !== p.device) return;
        const from = g.cap && g.cap.end !== null ? g.cap.end : 0;
        const until = g.cap && g.cap.destroyed !== undefined ? g.cap.destroyed : model.xmax;
        // Reads first, writes over them: a write is what can clobber.
        const ordered = g.ranges.filter(function (r) { return !isWrite(r); })
          .concat(g.ranges.filter(isWrite));
        ordered.forEach(function (rg) {
          if (rg.begin < seg.base || rg.begin >= seg.base + seg.size) return;
          const kind = isWrite(rg) ? 'write' : (rg.mode === 'read' ? 'read' : 'touch');
          const y = Y(rg.begin);
          const h = Math.max(2, rg.bytes / seg.size * bandH);
          const over = svg('rect', { x: X(from), y: y, width: Math.max(1, X(until) - X(from)), height: h,
            fill: 'url(#hatch-' + kind + ')', stroke: 'var(--' + kind + ')', class: 'range', 'fill-opacity': 0.8,
            'data-graph': String(g.graph), 'data-addr': hex(rg.begin) });
          over.addEventListener('mousemove', function (ev) { showRange(ev, g, rg); });
          over.addEventListener('mouseleave', hideTip);
          plot.append(over);
          (g.cap ? g.cap.replays : []).forEach(function (rp) {
            plot.append(svg('rect', { x: X(rp.x) - 2, y: y, width: 4, height: h, fill: 'var(--' + kind + ')', class: 'range-tick', 'pointer-events': 'none' }));
          });
        });
      });
      // Findings: the harmed bytes outlined from when the finding was made,
      // a mark at the address on the left edge.
      model.findings.forEach(function (f, i) {
        if (f.addr < seg.base || f.addr >= seg.base + seg.size) return;
        if (f.device !== p.device) return;
        const ranges = f.ranges.length ? f.ranges : [{ begin: f.addr, bytes: f.bytes }];
        ranges.forEach(function (rg) {
          const box = svg('rect', { x: X(f.x), y: Y(rg.begin), width: Math.max(2, X(model.xmax) - X(f.x)),
            height: Math.max(3, rg.bytes / seg.size * bandH), class: 'finding-box', 'data-finding': String(i + 1),
            'pointer-events': 'none' });
          plot.append(box);
        });
        const y = Y(f.addr);
        // Findings at one address (one victim, several graphs) stack their
        // labels downwards instead of printing over each other.
        let labelY = y;
        while (usedLabelYs.some(function (u) { return Math.abs(u - labelY) < 13; })) labelY += 13;
        usedLabelYs.push(labelY);
        const mark = svg('path', { d: 'M' + (LEFT - 2) + ' ' + y + ' l-11 -7 v14 z', class: 'finding-mark',
          'data-addr': hex(f.addr), 'data-finding': String(i + 1) });
        mark.addEventListener('mousemove', function (ev) { showFinding(ev, f, i); });
        mark.addEventListener('mouseleave', hideTip);
        mark.addEventListener('click', function () { focusFinding(i); });
        root.append(mark);
        const short = { hazard: 'hazard', possible: 'possible', cross_graph_output: 'cross-graph' };
        root.append(svg('text', { x: LEFT - 16, y: labelY + 4, 'text-anchor': 'end', class: 'finding-label' }, '#' + (i + 1) + ' ' + (short[f.severity] || f.severity)));
        drawn.marks.push({ finding: i, pool: p.key });
        // The sentence inside the plot, right-aligned where it would run off.
        const words = '#' + (i + 1) + ' ' + (f.label || 'graph ' + f.graph) + ' ' +
          (f.harm === 'stale_read' ? 'reads stale data into' : 'clobbers') + ' ' + blockName(f.victim) + ' at ' + hex(f.addr);
        const textWidth = words.length * 6.4;
        const fitsFrom = Math.max(X(f.x), LEFT) + 6;
        const right = width - RIGHT - 6;
        const labelAttrs = fitsFrom + textWidth <= right
          ? { x: fitsFrom, 'text-anchor': 'start' } : { x: right, 'text-anchor': 'end' };
        labelAttrs.y = y - 5 > y0 + 10 ? labelY - 5 : labelY + 14;
        labelAttrs.class = 'finding-label';
        const halo = svg('text', Object.assign({}, labelAttrs, { class: 'finding-label halo' }), words);
        plot.append(halo);
        plot.append(svg('text', labelAttrs, words));
      });
    });
    root.append(plot);
    // Finding chains: outline the blocks of each reuse chain.
    model.findings.forEach(function (f) {
      f.chain.forEach(function (link) {
        const b = model.blockBySeq.get(link.block.sequence);
        if (b && b.rect) b.rect.classList.add('chain');
      });
      const v = f.victim && model.blockBySeq.get(f.victim.sequence);
      if (v && v.rect) v.rect.classList.add('victim');
    });
    attachZoom(root, width);
    section.append(root);
    return section;
  }

  function drawAll() {
    const box = document.getElementById('pools');
    box.textContent = '';
    drawn = { blocks: 0, marks: [] };
    model.blocks.forEach(function (b) { b.rect = null; });
    const width = plotWidth();
    if (poolOrder.length === 0) box.append(el('p', { class: 'empty' }, 'No block to draw.'));
    poolOrder.forEach(function (p) { box.append(drawPool(p, width)); });
    document.body.setAttribute('data-block-count', String(drawn.blocks));
    document.body.setAttribute('data-finding-count', String(model.findings.length));
    document.body.setAttribute('data-finding-marks', String(drawn.marks.length));
    document.body.setAttribute('data-pool-count', String(poolOrder.length));
  }

