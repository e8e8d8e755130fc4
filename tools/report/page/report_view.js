// tools/report/page/report_view.js: the page's data and view state (the
// embedded JSON, the model report_model.js builds from it, the time window
// shown) and everything drawn once as HTML: the summary and notes, the
// legend, the findings, graphs and audit tables, and what a large trace left
// out of the drawing.
// Part of the capalloc report page's script (docs/report.md). The page's
// script is report_model.js, then report_view.js, report_draw.js and
// report_interact.js concatenated inside one function (tools/CMakeLists.txt
// wraps them), so these three share its constants, state and functions;
// each is one concern. Plain JavaScript, no library.

  const DATA = JSON.parse(document.getElementById('capalloc-data').textContent);
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const LEFT = 178;      // px for the address labels
  const RIGHT = 16;
  const TOP = 44;        // px for the time axis, capture and replay labels
  const BAND_GAP = 10;
  const BASE_BAND = 150; // px per segment at vertical zoom 1

  const { hex, streamName, human, duration, lifetimeClass, buildModel } = CapallocReport;

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
    if (model.hasTrace) items.push(['events', String(model.eventCount)]);
    if (model.omitted) items.push(['left out', model.omitted.blocks + ' of ' + model.omitted.total + ' blocks']);
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

  // What a large trace left out of the drawing (report_bound.hpp): per time
  // bucket, the blocks allocated and the most of them live at once, as bars
  // on the drawing's time axis, with the figures on hover.
  function leftOut() {
    const o = model.omitted;
    if (!o) return;
    const section = document.getElementById('left-out-section');
    section.hidden = false;
    section.setAttribute('data-left-out', String(o.blocks));
    document.getElementById('left-out-text').textContent = o.blocks + ' of the trace\'s ' + o.total +
      ' blocks (' + human(o.bytes) + ' allocated in all) are not drawn: at most ' + o.max_blocks +
      ' are (capalloc report --max-blocks). Drawn: the blocks of every finding, those live at the end ' +
      'and those the snapshot holds, then the largest and the longest-lived. Below, per stretch of the ' +
      'trace, how many of the others were live at most (bar) and allocated.';
    const width = Math.max(320, document.getElementById('pools').clientWidth - 22);
    const height = 90;
    const root = svg('svg', { width: width, height: height, viewBox: '0 0 ' + width + ' ' + height, id: 'left-out-bars' });
    const peak = Math.max(1, ...o.buckets.map(function (b) { return b.peak_live_bytes; }));
    const X = function (x) { return LEFT + x / model.xmax * (width - LEFT - RIGHT); };
    root.append(svg('text', { x: 4, y: 14, class: 'muted' }, 'live, not drawn'));
    root.append(svg('text', { x: 4, y: 28, class: 'mono muted' }, 'peak ' + human(peak)));
    o.buckets.forEach(function (b) {
      const h = b.peak_live_bytes / peak * (height - 20);
      const bar = svg('rect', { x: X(b.x0), y: height - 14 - h, width: Math.max(1, X(b.x1) - X(b.x0) - 1), height: Math.max(h, 0.5),
        class: 'left-out-bar' });
      bar.append(svg('title', {}, 'events ' + b.x0 + '–' + b.x1 + (b.t0 !== undefined ? ' (' + duration(b.t0) + ' – ' + duration(b.t1) + ')' : '') +
        ': ' + b.blocks + ' block(s) allocated (' + human(b.bytes) + '), at most ' + b.peak_live_blocks +
        ' live at once (' + human(b.peak_live_bytes) + ')'));
      root.append(bar);
    });
    root.append(svg('text', { x: LEFT, y: height - 2, class: 'muted' }, 'event 0'));
    root.append(svg('text', { x: width - RIGHT, y: height - 2, 'text-anchor': 'end', class: 'muted' }, 'event ' + model.xmax));
    document.getElementById('left-out').append(root);
  }
