// tests/oracle/replay_check.cpp: see replay_check.hpp.
#include "oracle/replay_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "common/status_macros.hpp"
#include "capalloc/capture.hpp"
#include "replay_orders.hpp"

namespace capalloc::oracle {

void OracleStats::add(const OracleStats& o) {
  graphs += o.graphs;
  replays += o.replays;
  harmed += o.harmed;
  findings += o.findings;
  unseen_harm += o.unseen_harm;
  for (const auto& [k, v] : o.unconfirmed) unconfirmed[k] += v;
  for (const auto& [k, v] : o.by_evidence) by_evidence[k] += v;
  for (const auto& [k, v] : o.by_severity) by_severity[k] += v;
}

std::string OracleStats::severities() const {
  std::string out;
  for (const auto& [k, v] : by_severity) {
    out += (out.empty() ? "" : ", ") + k + " " + std::to_string(v);
  }
  return out.empty() ? "none" : out;
}

namespace {

float fill_value(int block, std::size_t i) {  // exact in float, never a code
  return static_cast<float>(1000000 + block * 4096 + static_cast<int>(i % 4096));
}
float own_value(int block, std::size_t i) {  // a freed block's own memory in the model
  return -static_cast<float>(5000000 + block * 4096 + static_cast<int>(i % 4096));
}
float code(int node, std::size_t i) {
  return -static_cast<float>(1 + node * 4096 + static_cast<int>(i % 4096));
}
// A memset's byte: its floats (tiny positive non-integers) equal no fill,
// own value or code.
int memset_byte(int node) { return 1 + node % 63; }

// One node of a graph, resolved: the model replays these.
struct Node {
  OpKind kind;
  int block;
  std::size_t lo, hi;
  int sink_block;           // kRead, kUpdate, kCopy: where it copies what it read
  std::size_t sink_offset;  // in floats
  int id;                   // its code
};

struct Graph {
  GraphHandle handle = 0;
  CaptureId capture = 0;
  Route route = Route::kTracker;
  std::vector<Node> nodes;  // by position
  int allocations = 0;      // made during the capture
  PoolHandle own_pool = kDefaultPool;  // native route: a private pool, held while the graph lives
};

struct Run {
  std::shared_ptr<testing::ReplayOrder> order = std::make_shared<testing::ReplayOrder>();
  std::shared_ptr<DeviceRuntime> rt;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<CaptureTracker> tracker;
  std::vector<StreamHandle> streams;   // streams[0] begins every capture
  std::map<int, float*> ptr;           // every block ever allocated
  std::map<int, std::size_t> floats;   // its size
  std::set<int> live;
  std::vector<Graph> graphs;
};

// The kernel's parameter buffer as CUDA would hold it: the block pointer
// (into the range it uses), the sink pointer, and the range as two 8-byte
// integers, by value.
std::vector<std::byte> params_of(const void* at, const void* sink, std::size_t lo, std::size_t hi) {
  const std::uint64_t words[] = {reinterpret_cast<std::uint64_t>(at),
                                 reinterpret_cast<std::uint64_t>(sink), lo, hi};
  std::vector<std::byte> out(sizeof(words));
  std::memcpy(out.data(), words, sizeof(words));
  return out;
}

// A kernel for node `n`: declaring its accesses (the tracker route), or, on
// the native route, with only its parameter buffer to show what it uses, as
// a PyTorch kernel is seen.
KernelLaunch kernel_for(const Node& n, Run& r, Route route) {
  float* b = r.ptr.at(n.block);
  KernelLaunch k;
  k.name = op_name(n.kind);
  const float* tap = n.kind == OpKind::kWrite ? nullptr : r.ptr.at(n.sink_block) + n.sink_offset;
  k.params = params_of(b + n.lo, tap, n.lo, n.hi);
  const MemorySpan span{b + n.lo, (n.hi - n.lo) * sizeof(float)};
  const std::size_t lo = n.lo, hi = n.hi;
  const int id = n.id;
  if (n.kind == OpKind::kWrite) {
    k.writes = {span};
    k.host_body = [b, lo, hi, id] {
      for (std::size_t i = lo; i < hi; ++i) b[i] = code(id, i);
    };
  } else if (n.kind == OpKind::kUpdate) {
    // Also taps what it read into its sink, so that the oracle sees the data
    // an update computes from, not only what it leaves.
    float* sink = r.ptr.at(n.sink_block) + n.sink_offset;
    k.updates = {span};
    k.writes = {{sink, (hi - lo) * sizeof(float)}};
    k.host_body = [b, sink, lo, hi, id] {
      for (std::size_t i = lo; i < hi; ++i) {
        sink[i - lo] = b[i];
        b[i] = b[i] * 0.5f + code(id, i);
      }
    };
  } else {
    float* sink = r.ptr.at(n.sink_block) + n.sink_offset;
    k.reads = {span};
    k.writes = {{sink, (hi - lo) * sizeof(float)}};
    k.host_body = [b, sink, lo, hi] {
      for (std::size_t i = lo; i < hi; ++i) sink[i - lo] = b[i];
    };
  }
  if (route == Route::kNative) {
    k.reads.clear();
    k.writes.clear();
    k.updates.clear();
  }
  return k;
}

absl::Status allocate(Run& r, int id, std::size_t n, StreamHandle s) {
  CAPALLOC_ASSIGN_OR_RETURN(void* q, r.alloc->allocate(n * sizeof(float), 0, s));
  r.ptr[id] = static_cast<float*>(q);
  r.floats[id] = n;
  r.live.insert(id);
  return absl::OkStatus();
}

absl::Status join(Run& r, StreamHandle from, StreamHandle to) {
  CAPALLOC_ASSIGN_OR_RETURN(EventHandle e, r.rt->create_event(0));
  CAPALLOC_RETURN_IF_ERROR(r.rt->record_event(e, from));
  CAPALLOC_RETURN_IF_ERROR(r.rt->stream_wait_event(to, e));
  return r.rt->destroy_event(e);
}

// Issues one capture's ops; `sink` receives what its reads read.
absl::Status issue(const CaptureProgram& c, int sink, int& node_id, Run& r, Graph& g) {
  std::set<int> joined{0};
  std::size_t sink_at = 0;
  for (const Op& op : c.ops) {
    // Ops on streams not in the capture, or on blocks not live (a shrunk
    // program), are skipped.
    if (!joined.contains(op.stream) || op.stream >= c.streams) continue;
    const StreamHandle s = r.streams[static_cast<std::size_t>(op.stream)];
    if (op.kind == OpKind::kJoin) {
      if (op.to >= c.streams || op.to == op.stream) continue;
      CAPALLOC_RETURN_IF_ERROR(join(r, s, r.streams[static_cast<std::size_t>(op.to)]));
      joined.insert(op.to);
      continue;
    }
    if (op.kind == OpKind::kAlloc) {
      if (!r.ptr.contains(op.block)) {
        CAPALLOC_RETURN_IF_ERROR(allocate(r, op.block, op.hi, s));
        ++g.allocations;
      }
      continue;
    }
    if (!r.live.contains(op.block)) continue;
    if (op.kind == OpKind::kFree) {
      CAPALLOC_RETURN_IF_ERROR(r.alloc->deallocate(r.ptr[op.block]));
      r.live.erase(op.block);
      continue;
    }
    if (op.hi > r.floats[op.block] || op.lo >= op.hi) continue;
    Node n{op.kind, op.block, op.lo, op.hi, sink, sink_at, node_id++};
    if (reads_into_sink(op.kind)) sink_at += op.hi - op.lo;
    if (op.kind == OpKind::kMemset) {
      CAPALLOC_RETURN_IF_ERROR(r.rt->memset_async(r.ptr[op.block] + op.lo, memset_byte(n.id),
                                                  (op.hi - op.lo) * sizeof(float), s));
    } else if (op.kind == OpKind::kCopy) {
      CAPALLOC_RETURN_IF_ERROR(r.rt->memcpy_async(r.ptr.at(sink) + n.sink_offset,
                                                  r.ptr[op.block] + op.lo,
                                                  (op.hi - op.lo) * sizeof(float), s));
    } else {
      CAPALLOC_RETURN_IF_ERROR(r.rt->launch_kernel(s, kernel_for(n, r, c.route)));
    }
    g.nodes.push_back(n);
  }
  for (int m : joined) {
    if (m != 0) CAPALLOC_RETURN_IF_ERROR(join(r, r.streams[static_cast<std::size_t>(m)], r.streams[0]));
  }
  return absl::OkStatus();
}

absl::Status build(const Program& p, Run& r) {
  CAPALLOC_ASSIGN_OR_RETURN(r.rt, make_host_runtime(testing::ordered_host_options(r.order)));
  CAPALLOC_ASSIGN_OR_RETURN(r.alloc, Allocator::create(r.rt));
  CAPALLOC_ASSIGN_OR_RETURN(r.tracker, CaptureTracker::create(*r.alloc));
  for (int i = 0; i < 4; ++i) {
    CAPALLOC_ASSIGN_OR_RETURN(StreamHandle s, r.rt->create_stream(0));
    r.streams.push_back(s);
  }
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle shared, r.alloc->create_graph_pool(0));
  int next = 0;
  for (std::size_t n : p.eager) CAPALLOC_RETURN_IF_ERROR(allocate(r, next++, n, kDefaultStream));
  int max_id = next;
  for (const CaptureProgram& c : p.captures) {
    for (const Op& op : c.ops) max_id = std::max(max_id, op.block + 1);
  }
  int node_id = 1;
  for (std::size_t ci = 0; ci < p.captures.size(); ++ci) {
    const CaptureProgram& c = p.captures[ci];
    std::size_t sink_floats = 1;
    for (const Op& op : c.ops) {
      if (reads_into_sink(op.kind)) sink_floats += op.hi - op.lo;
    }
    const int sink = max_id + 1000 + static_cast<int>(ci);
    CAPALLOC_RETURN_IF_ERROR(allocate(r, sink, sink_floats, kDefaultStream));
    const PoolHandle pool = c.shared_pool ? shared : kDefaultPool;
    Graph g;
    g.route = c.route;
    if (c.route == Route::kTracker) {
      CAPALLOC_ASSIGN_OR_RETURN(g.capture, r.tracker->begin_capture(
                                               0, r.streams[0],
                                               {.pool = pool, .label = "g" + std::to_string(ci)}));
    } else {
      // As PyTorch does: a native capture, its allocations routed to a pool
      // (shared, or one of its own), and the route ended right after the
      // capture: the capture-end hook.
      CAPALLOC_ASSIGN_OR_RETURN(g.capture, r.rt->begin_capture(r.streams[0], CaptureMode::kGlobal));
      PoolHandle route_pool = shared;
      if (!c.shared_pool) {
        CAPALLOC_ASSIGN_OR_RETURN(route_pool, r.alloc->create_graph_pool(0));
        g.own_pool = route_pool;
      }
      CAPALLOC_RETURN_IF_ERROR(r.alloc->begin_allocate_to_pool(0, g.capture, route_pool));
    }
    const absl::Status inside = issue(c, sink, node_id, r, g);
    if (c.route == Route::kTracker) {
      auto done = r.tracker->end_capture(r.streams[0]);
      CAPALLOC_RETURN_IF_ERROR(inside);
      if (!done.ok()) return done.status();
      g.handle = done->graph;
    } else {
      auto done = r.rt->end_capture(r.streams[0]);
      CAPALLOC_RETURN_IF_ERROR(r.alloc->end_allocate_to_pool(g.capture));
      CAPALLOC_RETURN_IF_ERROR(inside);
      if (!done.ok()) return done.status();
      g.handle = *done;
    }
    r.graphs.push_back(std::move(g));
  }
  for (int b : p.free_after) {
    if (r.live.contains(b)) {
      CAPALLOC_RETURN_IF_ERROR(r.alloc->deallocate(r.ptr[b]));
      r.live.erase(b);
    }
  }
  int fresh = max_id + 2000;
  for (std::size_t n : p.alloc_after) {
    CAPALLOC_RETURN_IF_ERROR(allocate(r, fresh++, n, kDefaultStream));
  }
  return absl::OkStatus();
}

// What the oracle saw for one graph over every order tried: per live block,
// the floats that differ after some replay, and the live blocks whose data a
// read saw instead of its own.
struct Harm {
  std::map<int, std::set<std::size_t>> changed;
  std::set<int> read_from;
};

// Fills every live block with its values (block `varied`, if any, with other
// values of its own), replays the graph in the order set in r.order, and
// returns every live block's memory; `start` gets the fills.
absl::StatusOr<std::map<int, std::vector<float>>> replay_real(
    Run& r, const Graph& g, int varied, std::map<int, std::vector<float>>* start) {
  // Every copy is queued on the stream, so the host buffers they read and
  // write (`fills`, `real`) must outlive the stream's work: this function
  // drains the stream before it returns, on errors too.
  std::map<int, std::vector<float>> fills;
  std::map<int, std::vector<float>> real;
  const absl::Status queued = [&]() -> absl::Status {
    for (int b : r.live) {
      std::vector<float>& v = fills[b];
      v.resize(r.floats[b]);
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = b == varied ? 2.0f * fill_value(b, i) : fill_value(b, i);  // exact, and different
      }
      CAPALLOC_RETURN_IF_ERROR(
          r.rt->memcpy_async(r.ptr[b], v.data(), v.size() * sizeof(float), kDefaultStream));
    }
    CAPALLOC_RETURN_IF_ERROR(r.rt->launch_graph(g.handle, kDefaultStream));
    for (int b : r.live) {
      std::vector<float>& v = real[b];
      v.resize(r.floats[b]);
      CAPALLOC_RETURN_IF_ERROR(
          r.rt->memcpy_async(v.data(), r.ptr[b], v.size() * sizeof(float), kDefaultStream));
    }
    return absl::OkStatus();
  }();
  const absl::Status drained = r.rt->synchronize_stream(kDefaultStream);
  CAPALLOC_RETURN_IF_ERROR(queued);
  CAPALLOC_RETURN_IF_ERROR(drained);
  if (start != nullptr) *start = std::move(fills);
  return real;
}

absl::Status observe_order(Run& r, const Graph& g, const std::vector<std::size_t>& order,
                           Harm& h) {
  std::map<int, std::vector<float>> start;
  CAPALLOC_ASSIGN_OR_RETURN(auto real, replay_real(r, g, -1, &start));

  // The de-aliased model, in the same order: every block its own memory;
  // blocks not live start with values of their own too.
  std::map<int, std::vector<float>> model = start;
  auto mem = [&](int b) -> std::vector<float>& {
    auto [it, fresh] = model.try_emplace(b);
    if (fresh) {
      it->second.resize(r.floats[b]);
      for (std::size_t i = 0; i < it->second.size(); ++i) it->second[i] = own_value(b, i);
    }
    return it->second;
  };
  for (std::size_t position : order) {
    const Node& n = g.nodes[position];
    std::vector<float>& b = mem(n.block);
    if (n.kind == OpKind::kMemset) {
      std::memset(b.data() + n.lo, memset_byte(n.id), (n.hi - n.lo) * sizeof(float));
      continue;
    }
    for (std::size_t i = n.lo; i < n.hi; ++i) {
      if (reads_into_sink(n.kind)) mem(n.sink_block)[n.sink_offset + i - n.lo] = b[i];
      if (n.kind == OpKind::kWrite) b[i] = code(n.id, i);
      if (n.kind == OpKind::kUpdate) b[i] = b[i] * 0.5f + code(n.id, i);
    }
  }

  auto holder = [&](std::uintptr_t addr) -> int {
    for (int b : r.live) {
      const auto base = reinterpret_cast<std::uintptr_t>(r.ptr[b]);
      if (addr >= base && addr < base + r.floats[b] * sizeof(float)) return b;
    }
    return -1;
  };
  std::set<int> sinks;
  for (const Node& n : g.nodes) {
    if (reads_into_sink(n.kind)) sinks.insert(n.sink_block);
  }
  for (int b : r.live) {
    if (sinks.contains(b)) continue;  // the graph's own output: attributed below
    for (std::size_t i = 0; i < r.floats[b]; ++i) {
      if (std::memcmp(&real[b][i], &model[b][i], sizeof(float)) != 0) h.changed[b].insert(i);
    }
  }
  // Reads that differ from the model read the wrong data. Whose? Only the
  // live block holding the address can be the victim. A read through that
  // block itself saw it clobbered. A read through another (freed) block
  // harms it if varying its fill alone changes what was read (its data from
  // before the replay), or if the value read is one a node of this replay
  // wrote through it (the values encode their node and offset); otherwise
  // the read took data the replay wrote there through a third block: no
  // live block's.
  auto written_through = [&](int v, const float* addr, float value) {
    const float* base = r.ptr[v];
    for (const Node& m : g.nodes) {
      if (m.block != v || addr < base + m.lo || addr >= base + m.hi) continue;
      const std::size_t j = static_cast<std::size_t>(addr - base);
      if (m.kind == OpKind::kUpdate) return true;  // computed from what it read: any value
      float expected = code(m.id, j);
      if (m.kind == OpKind::kMemset) std::memset(&expected, memset_byte(m.id), sizeof(float));
      if (m.kind == OpKind::kWrite || m.kind == OpKind::kMemset) {
        if (std::memcmp(&expected, &value, sizeof(float)) == 0) return true;
      }
    }
    return false;
  };
  std::map<int, std::vector<std::pair<int, std::size_t>>> suspects;  // holder -> sink elements
  for (const Node& n : g.nodes) {
    if (!reads_into_sink(n.kind)) continue;
    for (std::size_t i = n.lo; i < n.hi; ++i) {
      const std::size_t s = n.sink_offset + i - n.lo;
      if (std::memcmp(&real[n.sink_block][s], &model[n.sink_block][s], sizeof(float)) == 0) {
        continue;
      }
      const float* addr = r.ptr[n.block] + i;
      const int v = holder(reinterpret_cast<std::uintptr_t>(addr));
      if (v < 0) continue;
      if (v == n.block || written_through(v, addr, real[n.sink_block][s])) {
        h.read_from.insert(v);
      } else {
        suspects[v].emplace_back(n.sink_block, s);
      }
    }
  }
  for (const auto& [v, elements] : suspects) {
    if (h.read_from.contains(v)) continue;
    CAPALLOC_ASSIGN_OR_RETURN(auto varied, replay_real(r, g, v, nullptr));
    for (const auto& [sink, s] : elements) {
      if (std::memcmp(&varied[sink][s], &real[sink][s], sizeof(float)) != 0) {
        h.read_from.insert(v);
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Harm> observe(Run& r, const Graph& g, OracleStats& stats) {
  CAPALLOC_ASSIGN_OR_RETURN(GraphDependencies deps, r.rt->graph_dependencies(g.handle));
  if (deps.size() != g.nodes.size()) {
    return absl::InternalError("oracle: the graph's node count is not the program's");
  }
  // Capture order; every node as late as its edges allow (each possible
  // last writer; each read after every write it need not precede); every
  // reading node as early as they allow (each read before every write it
  // need not follow); and, where the graph has unordered nodes, two seeded
  // random orders (pairs of swaps the others miss).
  Harm h;
  std::vector<testing::ReplayOrder> orders{testing::ReplayOrder{}};
  bool forked = false;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    orders.push_back({.late = i});
    if (reads_into_sink(g.nodes[i].kind)) orders.push_back({.early = i});
    forked = forked || (i > 0 && !(deps.of(i).size() == 1 && deps.of(i)[0] == i - 1));
  }
  if (forked) {
    for (std::uint64_t k = 0; k < 2; ++k) {
      orders.push_back({.random = g.capture * 1000003 + g.nodes.size() * 31 + k});
    }
  }
  const std::vector<std::vector<std::size_t>> lists = deps.lists();
  for (const testing::ReplayOrder& o : orders) {
    *r.order = o;
    CAPALLOC_RETURN_IF_ERROR(observe_order(r, g, o.order(lists), h));
    ++stats.replays;
  }
  *r.order = testing::ReplayOrder{};
  return h;
}

}  // namespace

absl::StatusOr<std::string> check_program(const Program& p, OracleStats* stats_out) {
  OracleStats stats;
  Run r;
  CAPALLOC_RETURN_IF_ERROR(build(p, r));
  const std::vector<Finding> findings = r.tracker->check();
  stats.findings += findings.size();
  std::map<const void*, int> block_at;
  for (int b : r.live) block_at[r.ptr[b]] = b;
  std::ostringstream bad;
  for (std::size_t gi = 0; gi < r.graphs.size(); ++gi) {
    const Graph& g = r.graphs[gi];
    CAPALLOC_ASSIGN_OR_RETURN(Harm h, observe(r, g, stats));
    ++stats.graphs;
    std::set<int> victims(h.read_from);
    for (const auto& [v, bytes] : h.changed) victims.insert(v);
    stats.harmed += victims.size();
    // A native capture that allocates nothing never shows itself to the
    // allocator, so capalloc has no record of it (docs/design.md, the
    // PyTorch route): its harm is counted, not checked.
    if (g.route == Route::kNative && g.allocations == 0) {
      stats.unseen_harm += victims.size();
      continue;
    }
    std::map<int, const Finding*> clobber, stale;
    for (const Finding& f : findings) {
      if (f.capture != g.capture || !block_at.contains(f.victim.ptr)) continue;
      (f.harm == capalloc::Harm::kClobber ? clobber : stale)[block_at[f.victim.ptr]] = &f;
    }
    for (const auto& [v, bytes] : h.changed) {
      if (!clobber.contains(v)) {
        bad << "g" << gi << " changes " << bytes.size() << " float(s) of B" << v
            << " with no clobber finding\n";
        continue;
      }
      const Finding& f = *clobber[v];
      for (std::size_t i : bytes) {
        const auto addr = reinterpret_cast<std::uintptr_t>(r.ptr[v] + i);
        bool covered = false;
        for (const MemorySpan& s : f.ranges) covered = covered || (addr >= s.begin() && addr < s.end());
        if (!covered) {
          bad << "g" << gi << " changes B" << v << "[" << i << "] outside the finding's ranges\n";
          break;
        }
      }
    }
    for (int v : h.read_from) {
      if (!clobber.contains(v) && !stale.contains(v)) {
        bad << "g" << gi << " reads B" << v << "'s data instead of its own with no finding\n";
      }
    }
    // Declared evidence: every finding is borne out. Otherwise a finding the
    // replays do not bear out must be `possible`; those are counted.
    auto unconfirmed = [&](const Finding& f, int v, const char* what) {
      const std::string evidence = evidence_name(f.evidence);
      if (g.route == Route::kNative) {
        ++stats.unconfirmed[evidence];
        if (f.severity != Severity::kPossible) {
          bad << "g" << gi << " has a " << evidence << " " << what << " finding on B" << v
              << " at " << severity_name(f.severity) << " that the replays do not bear out\n";
        }
        return;
      }
      bad << "g" << gi << " has a " << what << " finding on B" << v
          << " the replays do not bear out\n";
    };
    for (const auto& [v, f] : clobber) {
      ++stats.by_evidence[evidence_name(f->evidence)];
      ++stats.by_severity[severity_name(f->severity)];
      if (!h.changed.contains(v) && !h.read_from.contains(v)) unconfirmed(*f, v, "clobber");
    }
    for (const auto& [v, f] : stale) {
      ++stats.by_evidence[evidence_name(f->evidence)];
      ++stats.by_severity[severity_name(f->severity)];
      if (!h.read_from.contains(v)) unconfirmed(*f, v, "stale-read");
    }
  }
  for (const Graph& g : r.graphs) {
    if (g.route == Route::kTracker) {
      r.tracker->destroy_graph(g.handle).IgnoreError();
    } else {
      r.rt->destroy_graph(g.handle).IgnoreError();
      if (g.own_pool != kDefaultPool) r.alloc->release_graph_pool(g.own_pool).IgnoreError();
    }
  }
  for (int b : r.live) r.alloc->deallocate(r.ptr[b]).IgnoreError();
  r.tracker.reset();
  for (StreamHandle s : r.streams) r.rt->destroy_stream(s).IgnoreError();
  if (stats_out != nullptr) stats_out->add(stats);
  return bad.str();
}

}  // namespace capalloc::oracle
