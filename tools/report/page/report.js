// The capalloc report page's script (docs/report.md). Plain JavaScript, no
// library: it reads the data embedded in #capalloc-data (a snapshot, an event
// trace, or both), takes the model report_model.js builds from it (each
// block's lifetime, pools, segments, graphs, findings), and draws every
// pool's address space over time as SVG, with zoom, pan and hover details: x is the trace's event index (a snapshot
// alone is one moment), y the address within each segment. It then writes
// what it drew into DOM attributes (body[data-block-count]: the blocks in
// the time window shown, all of them until one zooms; the findings' rows and
// marks with data-addr) for tests/report_page_test.sh.
'use strict';

(function () {
  const DATA = JSON.parse(document.getElementById('capalloc-data').textContent);
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const LEFT = 178;      // px for the address labels
  const RIGHT = 16;
  const TOP = 44;        // px for the time axis, capture and replay labels
  const BAND_GAP = 10;
  const BASE_BAND = 150; // px per segment at vertical zoom 1

  const { hex, human, duration, lifetimeClass, buildModel } = CapallocReport;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    return node;
  }


  const model = buildModel(DATA);
  const view = { x0: 0, x1: model.xmax, yZoom: 1 };
  const poolOrder = Array.from(model.pools.values()).sort(function (a, b) {
    return a.device - b.device || (a.graph - b.graph) || String(a.handle).localeCompare(String(b.handle), 'en', { numeric: true });
  });

  // ---- header, legend, tables --------------------------------------------
  function summary() {
    const box = document.getElementById('summary');
    const snap = DATA.snapshot;
    const items = [];
    if (snap) {
      items.push(['runtime', snap.runtime]);
      (snap.devices || []).forEach(function (d) {
        const s = d.stats || {};
        if (s.allocated_bytes) items.push(['device ' + d.device + ' allocated', human(s.allocated_bytes.current) + ' (peak ' + human(s.allocated_bytes.peak) + ')']);
        if (s.reserved_bytes) items.push(['reserved', human(s.reserved_bytes.current)]);
      });
    }
    items.push(['blocks', String(model.blocks.length)]);
    if (model.hasTrace) items.push(['events', String(model.events.length)]);
    items.push(['captures', String(model.captures.size || model.graphs.length)]);
    const hazards = model.findings.filter(function (f) { return f.severity === 'hazard'; }).length;
    items.push(['findings', model.findings.length + (hazards ? ' (' + hazards + ' hazard' + (hazards > 1 ? 's' : '') + ')' : '')]);
    items.forEach(function (it) {
      const span = el('span');
      span.append(it[0] + ': ');
      span.append(el('b', {}, it[1]));
      box.append(span);
    });
    const notes = document.getElementById('notes');
    (DATA.notes || []).forEach(function (n) { notes.append(el('li', {}, n)); });
    if (!model.hasTrace) notes.append(el('li', {}, 'A snapshot alone is one moment: blocks span the whole width. Give an event trace too to see lifetimes over time.'));
    if (model.undrawn) notes.append(el('li', {}, model.undrawn + ' allocation(s) in the trace carry no address and are not drawn.'));
    const sources = document.getElementById('sources');
    sources.textContent = 'Drawn by capalloc report from ' + (DATA.sources || []).join(' and ') +
      (model.hasTrace && DATA.trace.header.source ? ' (trace source: ' + DATA.trace.header.source + ')' : '') + '.';
  }

  function swatch(kind) {
    const s = svg('svg', { width: 26, height: 14 });
    const fills = { transient: 'var(--transient)', persistent: 'var(--persistent)', graph: 'var(--graph)' };
    if (fills[kind]) s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, fill: fills[kind], class: 'block' }));
    else if (kind === 'freed') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, fill: 'var(--transient-freed)', class: 'block freed' }));
    else if (kind === 'pending') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, fill: 'url(#hatch-pending)', class: 'block' }));
    else if (kind === 'free') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, class: 'band' }));
    else if (kind === 'write') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, fill: 'url(#hatch-write)', stroke: 'var(--write)' }));
    else if (kind === 'read') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, fill: 'url(#hatch-read)', stroke: 'var(--read)' }));
    else if (kind === 'capture') s.append(svg('rect', { x: 1, y: 1, width: 24, height: 12, class: 'capture-window' }));
    else if (kind === 'replay') s.append(svg('line', { x1: 13, y1: 0, x2: 13, y2: 14, class: 'replay-line' }));
    else if (kind === 'finding') s.append(svg('rect', { x: 2, y: 2, width: 22, height: 10, class: 'finding-box' }));
    else if (kind === 'chain') s.append(svg('rect', { x: 2, y: 2, width: 22, height: 10, fill: 'var(--graph)', class: 'block chain' }));
    return s;
  }
  function legend() {
    const box = document.getElementById('legend');
    [['transient', 'transient block'], ['persistent', 'persistent block'], ['graph', 'graph-pool block (allocated in a capture)'],
      ['freed', 'freed (lighter: its lifetime ended)'], ['pending', 'pending free (waits on other streams)'],
      ['free', 'segment (free space)'], ['capture', 'capture in progress'], ['replay', 'replay'],
      ['write', 'range a graph writes on replay'], ['read', 'range a graph reads (or touches)'],
      ['finding', 'finding: bytes a replay harms'], ['chain', 'reuse chain of a finding']].forEach(function (it) {
      const item = el('span', { class: 'item' });
      item.append(swatch(it[0]));
      item.append(it[1]);
      box.append(item);
    });
  }

  function blockName(b) {
    if (!b) return '?';
    if (!b.sequence) return 'no block';
    return (b.tag ? "'" + b.tag + "'" : 'untagged') + ' #' + b.sequence;
  }

  function findingsTable() {
    const table = document.getElementById('findings');
    if (model.findings.length === 0) {
      document.getElementById('no-findings').hidden = false;
      table.hidden = true;
      return;
    }
    const head = el('tr');
    ['#', 'severity', 'graph', 'harm', 'address', 'bytes', 'victim', 'written through', 'reuse chain', 'fix'].forEach(function (h) { head.append(el('th', {}, h)); });
    table.append(head);
    model.findings.forEach(function (f, i) {
      const tr = el('tr', { class: 'finding', 'data-addr': hex(f.addr), 'data-index': String(i + 1),
        'data-victim': f.victim ? String(f.victim.sequence) : '', 'data-severity': f.severity });
      tr.append(el('td', { class: 'num' }, String(i + 1)));
      const sev = el('td');
      sev.append(el('span', { class: 'sev ' + f.severity }, f.severity + (f.waived ? ' (waived)' : '')));
      tr.append(sev);
      tr.append(el('td', {}, f.label || ('graph ' + f.graph)));
      tr.append(el('td', {}, (f.harm || '').replace('_', ' ')));
      tr.append(el('td', { class: 'addr' }, hex(f.addr) + ' – ' + hex(f.end)));
      tr.append(el('td', { class: 'num' }, human(f.bytes)));
      tr.append(el('td', {}, blockName(f.victim)));
      tr.append(el('td', {}, blockName(f.writer) + (f.op ? ' (' + f.op + ', ' + f.mode + ')' : '')));
      const chain = el('td');
      const list = el('div', { class: 'chain-list' });
      f.chain.forEach(function (link, k) {
        if (k > 0) list.append('→');
        list.append(el('span', { class: 'link' + (link.live ? ' live' : '') }, blockName(link.block) + (link.live ? ' (live)' : ' (freed)')));
      });
      chain.append(list);
      tr.append(chain);
      tr.append(el('td', { class: 'fix' }, f.fix || ''));
      tr.addEventListener('mouseenter', function () { highlightFinding(i, true); });
      tr.addEventListener('mouseleave', function () { highlightFinding(i, false); });
      tr.addEventListener('click', function () { focusFinding(i); });
      table.append(tr);
    });
  }

  function graphsTable() {
    const table = document.getElementById('graphs');
    if (model.graphs.length === 0) {
      const section = document.getElementById('graphs-section');
      section.append(el('p', { class: 'empty' }, model.hasTrace && model.captures.size
        ? 'The trace names the captures; the ranges their graphs access come with a snapshot.'
        : 'No graph.'));
      table.hidden = true;
      return;
    }
    const head = el('tr');
    ['show', 'graph', 'capture', 'pool', 'evidence', 'order', 'ranges', 'bytes written', 'bytes read', 'replays'].forEach(function (h) { head.append(el('th', {}, h)); });
    table.append(head);
    model.graphs.forEach(function (g) {
      const tr = el('tr', { 'data-graph': String(g.graph) });
      const box = el('input', { type: 'checkbox' });
      box.checked = g.shown;
      box.addEventListener('change', function () { g.shown = box.checked; drawAll(); });
      const td = el('td');
      td.append(box);
      tr.append(td);
      let wrote = 0;
      let read = 0;
      g.ranges.forEach(function (r) { if (isWrite(r)) wrote += r.bytes; else read += r.bytes; });
      tr.append(el('td', {}, g.label || ('graph ' + g.graph)));
      tr.append(el('td', { class: 'num' }, String(g.capture)));
      tr.append(el('td', {}, g.pool ? 'graph pool ' + g.pool : 'default'));
      tr.append(el('td', {}, g.precision || ''));
      tr.append(el('td', {}, g.order || ''));
      tr.append(el('td', { class: 'num' }, String(g.ranges.length)));
      tr.append(el('td', { class: 'num' }, human(wrote)));
      tr.append(el('td', { class: 'num' }, human(read)));
      tr.append(el('td', { class: 'num' }, g.cap ? String(g.cap.replays.length) : ''));
      table.append(tr);
    });
  }

  // The audit section (docs/snapshot.md, `audit`): drawn as a table of its
  // groups, whatever their exact members, bytes made readable.
  function audit() {
    const a = DATA.snapshot && DATA.snapshot.audit;
    if (!a) return;
    const section = document.getElementById('audit-section');
    section.hidden = false;
    const box = document.getElementById('audit');
    let rows = Array.isArray(a) ? a : null;
    if (!rows) {
      const scalars = [];
      for (const k in a) {
        if (Array.isArray(a[k]) && !rows) rows = a[k];
        else if (a[k] === null || typeof a[k] !== 'object') scalars.push(k + ': ' + a[k]);
      }
      if (scalars.length) box.append(el('p', { class: 'empty' }, scalars.join(' · ')));
    }
    if (!rows || rows.length === 0) { box.append(el('p', { class: 'empty' }, 'Nothing allocated since the checkpoint is still live.')); return; }
    const keys = [];
    rows.forEach(function (r) { for (const k in r) if (keys.indexOf(k) < 0) keys.push(k); });
    const table = el('table', { id: 'audit-table', 'data-rows': String(rows.length) });
    const head = el('tr');
    keys.forEach(function (k) { head.append(el('th', {}, k.replace(/_/g, ' '))); });
    table.append(head);
    rows.forEach(function (r) {
      const tr = el('tr', { class: 'audit-row' });
      keys.forEach(function (k) {
        const v = r[k];
        let text;
        if (v === undefined || v === null) text = '';
        else if (typeof v === 'number' && /bytes/.test(k)) text = human(v);
        else if (k === 'tag' && v === '') text = '(untagged)';
        else if (Array.isArray(v)) text = v.map(function (x) { return typeof x === 'object' ? JSON.stringify(x) : String(x); }).join('\n');
        else if (typeof v === 'object') text = JSON.stringify(v);
        else text = String(v);
        const td = el('td', { class: typeof v === 'number' ? 'num' : (/site|stack|ptr|addr/.test(k) ? 'addr' : '') }, text);
        if (Array.isArray(v)) td.style.whiteSpace = 'pre-wrap';
        tr.append(td);
      });
      table.append(tr);
    });
    box.append(table);
  }

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
      if (seg.stream !== undefined) root.append(svg('text', { x: 4, y: y0 + 40, class: 'muted' }, 'stream ' + (seg.stream === 0 ? 'default' : hex(seg.stream))));
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
    const e = model.events[x];
    return 'event ' + x + (t !== undefined && t !== null ? ' (' + duration(t) + ')' : '') + (e && e.line ? ', line ' + e.line : '');
  }
  function showBlock(ev, b) {
    const cap = b.capture ? model.captures.get(b.capture) : null;
    showTip(ev, blockName(b), [
      ['address', hex(b.addr) + ' – ' + hex(b.addr + b.size), 'tt-addr'],
      ['size', human(b.size) + (b.requested && b.requested !== b.size ? ' (' + human(b.requested) + ' requested)' : '')],
      ['lifetime', b.lifetime + (b.poolIsGraph ? ', in a graph pool' : '')],
      ['state', b.state === 'freed' ? 'freed' : b.state.replace('_', ' ')],
      ['stream', b.stream === 0 ? 'default' : (b.stream !== undefined ? hex(b.stream) : '')],
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
  document.body.setAttribute('data-ready', 'yes');
})();
