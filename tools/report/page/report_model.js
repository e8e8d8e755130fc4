// tools/report/page/report_model.js: the report page's model (docs/report.md).
// Pure functions of the embedded data, no DOM: formatting (hex addresses,
// human-readable sizes and times) and buildModel, which rebuilds each block's
// lifetime from the trace's events (x = event index), adds the snapshot's
// segments, blocks, graph ranges and findings, and groups blocks into pools
// and segments (or address ranges, for a trace alone). report.js draws it.
'use strict';

const CapallocReport = (function () {
  // ---- formatting ------------------------------------------------------
  function addr(value) {
    if (typeof value === 'number') return value;
    if (typeof value !== 'string') return NaN;
    return parseInt(value, 16);
  }
  function hex(n) { return '0x' + Math.round(n).toString(16); }
  // A stream handle as the page names it. kNoStream (2^64 - 1, a number JSON
  // gives as 2^64): the segment of a destroyed stream no stream adopted yet.
  function streamName(s) {
    if (s === undefined) return '';
    if (s === 0) return 'default';
    if (s >= 18446744073709549568) return 'none (destroyed)';
    return hex(s);
  }
  function human(bytes) {
    if (bytes === undefined || bytes === null || isNaN(bytes)) return '?';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let v = bytes;
    let u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u += 1; }
    if (u === 0) return v + ' B';
    const text = v >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(1);
    return text + ' ' + units[u];
  }
  function duration(ns) {
    if (ns === undefined || ns === null) return '';
    if (ns < 1e3) return ns + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + ' µs';
    if (ns < 1e9) return (ns / 1e6).toFixed(2) + ' ms';
    return (ns / 1e9).toFixed(3) + ' s';
  }
  // ---- the model: pools, segments, blocks, captures, graphs, findings ----
  function poolKey(device, pool) { return (device || 0) + '/' + String(pool === undefined ? 0 : pool); }
  function lifetimeClass(b) {
    if (b.lifetime === 'persistent') return 'persistent';
    return b.poolIsGraph ? 'graph' : 'transient';
  }

  function buildModel(data) {
    const m = {
      pools: new Map(), blocks: [], captures: new Map(), graphs: [], findings: [],
      events: data.trace ? data.trace.events : [], undrawn: 0, otherEvents: 0,
    };
    const hasTrace = !!data.trace;
    m.hasTrace = hasTrace;
    // x is the event's index in the trace: its `x` member when the report
    // left blocks out (report_bound.hpp), else its place in the list.
    m.xmax = hasTrace ? Math.max(1, data.trace.xmax || m.events.length) : 1;
    m.eventCount = hasTrace ? (data.trace.xmax || m.events.length) : 0;
    m.omitted = hasTrace ? (data.trace.omitted || null) : null;
    m.eventAt = new Map();
    function pool(key, kind, label) {
      if (!m.pools.has(key)) {
        const [device, handle] = key.split('/');
        const graph = kind ? kind === 'graph' : handle !== '0';
        m.pools.set(key, {
          key: key, device: Number(device), handle: handle, graph: graph,
          label: label || (graph ? 'graph pool ' + handle : 'default pool'),
          segments: [], blocks: [],
        });
      }
      return m.pools.get(key);
    }
    const byId = new Map();
    const active = new Map(); // stream -> capture
    const traceFindings = [];
    m.events.forEach(function (e, i) {
      const x = e.x !== undefined ? e.x : i;
      m.eventAt.set(x, e);
      switch (e.op) {
        case 'alloc': {
          const a = addr(e.addr);
          if (isNaN(a)) { m.undrawn += 1; return; }
          const cap = active.get(e.stream);
          let key;
          if (e.pool !== undefined) key = poolKey(e.device, e.pool);
          else if (cap) key = poolKey(e.device, cap.pool !== undefined ? cap.pool : 'capture ' + cap.id);
          else key = poolKey(e.device, 0);
          const p = pool(key);
          const b = {
            id: e.id, sequence: e.id, addr: a, size: e.rounded || e.size, requested: e.size,
            tag: e.tag || '', lifetime: e.lifetime || 'transient', stream: e.stream,
            device: e.device || 0, pool: p, poolIsGraph: p.graph,
            capture: e.capture !== undefined ? e.capture : (cap ? cap.id : 0),
            start: x, end: null, t0: e.t, t1: null, line: e.line, state: 'allocated',
          };
          byId.set(e.id, b);
          m.blocks.push(b);
          p.blocks.push(b);
          break;
        }
        case 'free': {
          const b = byId.get(e.id);
          if (b && b.end === null) { b.end = x; b.t1 = e.t; b.state = 'freed'; }
          break;
        }
        case 'capture_begin': {
          const c = { id: e.capture, label: e.label || 'capture ' + e.capture, stream: e.stream,
            pool: e.pool, begin: x, end: null, replays: [], t: e.t };
          m.captures.set(e.capture, c);
          active.set(e.stream, c);
          break;
        }
        case 'capture_end': {
          const c = m.captures.get(e.capture);
          if (c) { c.end = x; active.delete(c.stream); }
          break;
        }
        case 'replay': {
          const c = m.captures.get(e.capture);
          if (c) c.replays.push({ x: x, refused: !!e.refused, t: e.t });
          break;
        }
        case 'graph_destroy': {
          const c = m.captures.get(e.capture);
          if (c) c.destroyed = x;
          break;
        }
        case 'finding':
          traceFindings.push({ x: x, e: e });
          break;
        default:
          m.otherEvents += 1;
      }
    });

    const snap = data.snapshot;
    if (snap) {
      (snap.devices || []).forEach(function (dev) {
        const device = dev.device || 0;
        (dev.pools || []).forEach(function (sp) {
          const p = pool(poolKey(device, sp.pool), sp.kind);
          (sp.segments || []).forEach(function (seg) {
            p.segments.push({ base: addr(seg.base), size: seg.size, stream: seg.stream, fromSnapshot: true,
              free: (seg.blocks || []).filter(function (b) { return b.state === 'free'; })
                .map(function (b) { return { addr: addr(b.ptr), size: b.size }; }) });
            (seg.blocks || []).forEach(function (sb) {
              if (sb.state === 'free') return;
              let b = byId.get(sb.sequence);
              if (b) {
                if (sb.state === 'pending_free') b.state = 'pending_free';
                b.pool = b.pool || p;
                return;
              }
              b = { id: sb.sequence, sequence: sb.sequence, addr: addr(sb.ptr), size: sb.size,
                requested: sb.requested, tag: sb.tag || '', lifetime: sb.lifetime || 'transient',
                stream: seg.stream, device: device, pool: p, poolIsGraph: p.graph, capture: sb.capture,
                start: 0, end: null, state: sb.state, fromSnapshot: true };
              byId.set(sb.sequence, b);
              m.blocks.push(b);
              p.blocks.push(b);
            });
          });
        });
        if (!dev.pools) {
          // An older snapshot (schema 3): live blocks only, no segments.
          (dev.live_blocks || []).forEach(function (lb) {
            if (byId.has(lb.sequence)) return;
            const p = pool(poolKey(device, lb.pool));
            const b = { id: lb.sequence, sequence: lb.sequence, addr: addr(lb.ptr), size: lb.size,
              requested: lb.requested, tag: lb.tag || '', lifetime: lb.lifetime, stream: lb.stream,
              device: device, pool: p, poolIsGraph: p.graph, capture: lb.capture, start: 0, end: null,
              state: 'allocated', fromSnapshot: true };
            byId.set(lb.sequence, b);
            m.blocks.push(b);
            p.blocks.push(b);
          });
        }
      });
      (snap.graphs || []).forEach(function (g) {
        m.graphs.push({ graph: g.graph, label: g.label, capture: g.capture, device: g.device || 0,
          pool: g.pool, precision: g.precision, order: g.order, writes: g.writes,
          ranges: (g.ranges || []).map(function (r) {
            return { begin: addr(r.begin), bytes: r.bytes, mode: r.mode, op: r.op, position: r.position,
              evidence: r.evidence, through: r.through, inferred: r.inferred_write };
          }), shown: true });
      });
    }
    // Pool labels from the captures that allocate into them.
    m.captures.forEach(function (c) {
      m.pools.forEach(function (p) {
        if (p.graph && String(c.pool) === p.handle) {
          p.captures = (p.captures || []).concat([c.label]);
        }
      });
    });

    // Findings: the snapshot's (complete: reuse chain, fix), else the trace's.
    const snapFindings = snap ? (snap.findings || []) : [];
    if (snapFindings.length > 0) {
      snapFindings.forEach(function (f) {
        const at = traceFindings.find(function (tf) {
          return addr(tf.e.addr) === addr(f.overlap.begin) && tf.e.graph === f.graph;
        });
        const c = m.captures.get(f.capture);
        m.findings.push({
          addr: addr(f.overlap.begin), end: addr(f.overlap.end), bytes: f.overlap.bytes,
          ranges: (f.overlap.ranges || []).map(function (r) { return { begin: addr(r.begin), bytes: r.bytes }; }),
          severity: f.severity, harm: f.harm, graph: f.graph, label: f.graph_label, capture: f.capture,
          victim: f.victim, writer: f.writer, chain: f.reuse_chain || [], fix: f.fix,
          reason: f.severity_reason, op: f.write_op, mode: f.write_mode, evidence: f.evidence,
          waived: f.waived, x: at ? at.x : (c && c.end !== null ? c.end : 0), device: 0,
        });
      });
    } else {
      traceFindings.forEach(function (tf) {
        const e = tf.e;
        const a = addr(e.addr);
        const known = function (seq) { return seq === undefined ? null : (byId.get(seq) || { sequence: seq }); };
        const victim = known(e.victim);
        const writer = known(e.writer);
        const c = e.capture !== undefined ? m.captures.get(e.capture) : null;
        m.findings.push({ addr: a, end: a + (e.size || 0), bytes: e.size, ranges: [{ begin: a, bytes: e.size }],
          severity: e.severity, harm: '', graph: e.graph, label: c ? c.label : 'graph ' + e.graph, capture: e.capture,
          victim: victim, writer: writer,
          chain: writer && victim ? [{ block: writer, live: writer.end === null }, { block: victim, live: victim.end === null }] : [],
          fix: e.message || '', reason: '', x: tf.x, device: e.device || 0 });
      });
    }
    // Graph labels from captures where the snapshot has none.
    m.graphs.forEach(function (g) {
      const c = m.captures.get(g.capture);
      g.cap = c || null;
    });

    // Segments: the snapshot's, and for blocks in none of them (released
    // segments, or a trace alone) address ranges rebuilt from the blocks.
    const MERGE_GAP = 2 * 1024 * 1024;
    m.pools.forEach(function (p) {
      p.segments.sort(function (a, b) { return a.base - b.base; });
      const outside = p.blocks.filter(function (b) {
        return !p.segments.some(function (s) { return b.addr >= s.base && b.addr + b.size <= s.base + s.size; });
      }).sort(function (a, b) { return a.addr - b.addr; });
      const rebuilt = [];
      outside.forEach(function (b) {
        const last = rebuilt[rebuilt.length - 1];
        if (last && b.addr <= last.base + last.size + MERGE_GAP) {
          last.size = Math.max(last.size, b.addr + b.size - last.base);
        } else {
          rebuilt.push({ base: b.addr, size: b.size, rebuilt: true, free: [] });
        }
      });
      p.segments = p.segments.concat(rebuilt).sort(function (a, b) { return a.base - b.base; });
      p.blocks.forEach(function (b) {
        b.segment = p.segments.find(function (s) { return b.addr >= s.base && b.addr < s.base + s.size; });
      });
    });
    m.blockBySeq = byId;
    return m;
  }


  return { addr: addr, hex: hex, streamName: streamName, human: human, duration: duration, lifetimeClass: lifetimeClass,
    buildModel: buildModel };
})();
