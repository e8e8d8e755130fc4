// oracle_property_test.cpp: the tracker's verdicts against what replay
// really does to memory, on random capture programs (issue 9's differential
// oracle, first part: one stream, declared evidence).
//
// A seeded generator makes programs: blocks allocated before the captures
// (eager), 1 to 3 captures (into one shared pool or private pools) of
// allocations, frees and kernels that write, read (into a sink block of
// their own) or update random ranges of random live blocks, then eager
// blocks freed and new ones allocated after the captures. For each graph the
// oracle fills every live block with values of its own, replays the graph on
// the host runtime, and compares memory with a de-aliased model run of the
// same nodes, in which every block, freed ones included, has memory of its
// own. Harm is measured by difference, not by expectation:
//   - a live block whose bytes differ after the replay was clobbered;
//   - a sink element that differs read wrong data; the live block that holds
//     the address it read is the victim (none: garbage, no victim).
// The verdict must agree: every harmed (graph, victim) has a finding naming
// them, a clobber's ranges cover every byte that differs, and every finding
// names harm the oracle saw (declared evidence: no false findings).
//
// CAPALLOC_ORACLE_PROGRAMS (default 10000) and CAPALLOC_ORACLE_SEED (default
// 1) set the run; a failure prints the seed and a shrunk program.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/status_macros.hpp"
#include "capalloc/capture.hpp"
#include "test_support.hpp"

using namespace capalloc;

namespace {

// --- Programs ------------------------------------------------------------------

enum class OpKind { kAlloc, kFree, kWrite, kRead, kUpdate };

struct Op {
  OpKind kind = OpKind::kWrite;
  int block = 0;           // program block id
  std::size_t lo = 0;      // float range [lo, hi) for kernels; floats for kAlloc in `hi`
  std::size_t hi = 0;
};

struct CaptureProgram {
  bool shared_pool = true;
  std::vector<Op> ops;
};

struct Program {
  std::vector<std::size_t> eager;      // floats of blocks 0..E-1, allocated first
  std::vector<CaptureProgram> captures;
  std::vector<int> free_after;         // eager block ids freed after the captures
  std::vector<std::size_t> alloc_after;  // floats of new eager blocks after them
};

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kAlloc: return "alloc";
    case OpKind::kFree: return "free";
    case OpKind::kWrite: return "write";
    case OpKind::kRead: return "read";
    case OpKind::kUpdate: return "update";
  }
  return "?";
}

std::string describe(const Program& p) {
  std::ostringstream out;
  for (std::size_t i = 0; i < p.eager.size(); ++i) out << "  B" << i << " = alloc(" << p.eager[i] << " floats)\n";
  for (std::size_t c = 0; c < p.captures.size(); ++c) {
    out << "  capture g" << c << (p.captures[c].shared_pool ? " (shared pool)" : " (private pool)") << ":\n";
    for (const Op& op : p.captures[c].ops) {
      out << "    " << op_name(op.kind) << " B" << op.block;
      if (op.kind == OpKind::kAlloc) out << " (" << op.hi << " floats)";
      if (op.kind != OpKind::kAlloc && op.kind != OpKind::kFree) out << " [" << op.lo << ", " << op.hi << ")";
      out << "\n";
    }
  }
  for (int b : p.free_after) out << "  free B" << b << "\n";
  for (std::size_t s : p.alloc_after) out << "  alloc(" << s << " floats)\n";
  return out.str();
}

// Few sizes, mostly small: freed memory is reused often, which is where
// aliasing happens.
constexpr std::size_t kSizes[] = {256, 256, 512, 2048};

Program generate(std::mt19937_64& rng) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  Program p;
  const int eager = 1 + static_cast<int>(pick(3));
  for (int i = 0; i < eager; ++i) p.eager.push_back(kSizes[pick(4)]);
  std::map<int, std::size_t> live;  // block -> floats
  for (int i = 0; i < eager; ++i) live[i] = p.eager[static_cast<std::size_t>(i)];
  int next = eager;
  const int captures = 1 + static_cast<int>(pick(3));
  for (int c = 0; c < captures; ++c) {
    CaptureProgram cp;
    cp.shared_pool = pick(4) != 0;
    std::vector<int> born;
    int recent = -1;  // the block allocated last: used more often
    const int ops = 2 + static_cast<int>(pick(14));
    for (int k = 0; k < ops; ++k) {
      const std::size_t roll = pick(10);
      if (roll < 3 || live.empty()) {
        const std::size_t floats = kSizes[pick(4)];
        cp.ops.push_back({OpKind::kAlloc, next, 0, floats});
        live[next] = floats;
        recent = next;
        born.push_back(next++);
      } else if (roll < 5 && !born.empty()) {
        const std::size_t i = pick(born.size());
        cp.ops.push_back({OpKind::kFree, born[i], 0, 0});
        live.erase(born[i]);
        born.erase(born.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        auto it = live.begin();
        if (recent >= 0 && live.contains(recent) && pick(2) == 0) {
          it = live.find(recent);
        } else {
          std::advance(it, static_cast<std::ptrdiff_t>(pick(live.size())));
        }
        const std::size_t floats = it->second;
        std::size_t lo = pick(floats), hi = pick(floats + 1);
        if (lo > hi) std::swap(lo, hi);
        if (hi == lo) ++hi;  // lo < floats: a range of one float at least
        const OpKind kind = roll < 7 ? OpKind::kWrite : roll < 9 ? OpKind::kRead : OpKind::kUpdate;
        cp.ops.push_back({kind, it->first, lo, hi});
      }
    }
    p.captures.push_back(std::move(cp));
  }
  for (int i = 0; i < eager; ++i) {
    if (pick(2) == 0) p.free_after.push_back(i);
  }
  const int fresh = static_cast<int>(pick(3));
  for (int i = 0; i < fresh; ++i) p.alloc_after.push_back(kSizes[pick(4)]);
  return p;
}

// --- Running a program ---------------------------------------------------------

float fill_value(int block, std::size_t i) {  // exact in float, never a code
  return static_cast<float>(1000000 + block * 4096 + static_cast<int>(i % 4096));
}
float own_value(int block, std::size_t i) {  // a freed block's own memory in the model
  return -static_cast<float>(5000000 + block * 4096 + static_cast<int>(i % 4096));
}
float code(int node, std::size_t i) {
  return -static_cast<float>(1 + node * 4096 + static_cast<int>(i % 4096));
}

// One kernel node of a graph, resolved: the model replays these.
struct Node {
  OpKind kind;
  int block;
  std::size_t lo, hi;
  int sink_block;           // kRead: where it copies to
  std::size_t sink_offset;  // in floats
  int id;                   // its code
};

struct Run {
  std::shared_ptr<DeviceRuntime> rt;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<CaptureTracker> tracker;
  StreamHandle side = kDefaultStream;
  std::map<int, float*> ptr;           // every block ever allocated
  std::map<int, std::size_t> floats;   // its size
  std::set<int> live;
  std::vector<GraphHandle> graphs;
  std::vector<std::vector<Node>> nodes;  // per graph
};

KernelLaunch kernel_for(const Node& n, Run& r) {
  float* b = r.ptr.at(n.block);
  KernelLaunch k;
  k.name = op_name(n.kind);
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
  return k;
}

absl::Status build(const Program& p, Run& r) {
  r.rt = capalloc::testing::host_runtime();
  CAPALLOC_ASSIGN_OR_RETURN(r.alloc, Allocator::create(r.rt));
  CAPALLOC_ASSIGN_OR_RETURN(r.tracker, CaptureTracker::create(*r.alloc));
  CAPALLOC_ASSIGN_OR_RETURN(r.side, r.rt->create_stream(0));
  CAPALLOC_ASSIGN_OR_RETURN(PoolHandle shared, r.alloc->create_graph_pool(0));
  auto allocate = [&](int id, std::size_t n, StreamHandle s) -> absl::Status {
    CAPALLOC_ASSIGN_OR_RETURN(void* q, r.alloc->allocate(n * sizeof(float), 0, s));
    r.ptr[id] = static_cast<float*>(q);
    r.floats[id] = n;
    r.live.insert(id);
    return absl::OkStatus();
  };
  int next = 0;
  for (std::size_t n : p.eager) CAPALLOC_RETURN_IF_ERROR(allocate(next++, n, kDefaultStream));
  int max_id = next;
  for (const CaptureProgram& c : p.captures) {
    for (const Op& op : c.ops) max_id = std::max(max_id, op.block + 1);
  }
  int node_id = 1;
  for (std::size_t ci = 0; ci < p.captures.size(); ++ci) {
    const CaptureProgram& c = p.captures[ci];
    std::size_t sink_floats = 1;
    for (const Op& op : c.ops) {
      if (op.kind == OpKind::kRead || op.kind == OpKind::kUpdate) sink_floats += op.hi - op.lo;
    }
    const int sink = max_id + 1000 + static_cast<int>(ci);
    CAPALLOC_RETURN_IF_ERROR(allocate(sink, sink_floats, kDefaultStream));
    CAPALLOC_RETURN_IF_ERROR(
        r.tracker->begin_capture(0, r.side, {.pool = c.shared_pool ? shared : kDefaultPool,
                                             .label = "g" + std::to_string(ci)})
            .status());
    std::vector<Node> nodes;
    std::size_t sink_at = 0;
    absl::Status inside;
    for (const Op& op : c.ops) {
      if (!inside.ok()) break;
      if (op.kind == OpKind::kAlloc) {
        if (!r.ptr.contains(op.block)) inside = allocate(op.block, op.hi, r.side);
        continue;
      }
      // Ops on blocks that are not live (a shrunk program) are skipped.
      if (!r.live.contains(op.block)) continue;
      if (op.kind == OpKind::kFree) {
        inside = r.alloc->deallocate(r.ptr[op.block]);
        r.live.erase(op.block);
        continue;
      }
      if (op.hi > r.floats[op.block] || op.lo >= op.hi) continue;
      Node n{op.kind, op.block, op.lo, op.hi, sink, sink_at, node_id++};
      if (op.kind == OpKind::kRead || op.kind == OpKind::kUpdate) sink_at += op.hi - op.lo;
      inside = r.rt->launch_kernel(r.side, kernel_for(n, r));
      nodes.push_back(n);
    }
    auto done = r.tracker->end_capture(r.side);
    CAPALLOC_RETURN_IF_ERROR(inside);
    if (!done.ok()) return done.status();
    r.graphs.push_back(done->graph);
    r.nodes.push_back(std::move(nodes));
  }
  for (int b : p.free_after) {
    if (r.live.contains(b)) {
      CAPALLOC_RETURN_IF_ERROR(r.alloc->deallocate(r.ptr[b]));
      r.live.erase(b);
    }
  }
  int fresh = max_id + 2000;
  for (std::size_t n : p.alloc_after) CAPALLOC_RETURN_IF_ERROR(allocate(fresh++, n, kDefaultStream));
  return absl::OkStatus();
}

// What the oracle saw for one graph: per live block, the bytes (as float
// indices) that differ after the replay, and the live blocks whose data a
// read saw instead of its own.
struct Harm {
  std::map<int, std::set<std::size_t>> changed;
  std::set<int> read_from;
};

absl::StatusOr<Harm> observe(Run& r, std::size_t g) {
  // Fills, real replay.
  std::map<int, std::vector<float>> start;
  for (int b : r.live) {
    std::vector<float> v(r.floats[b]);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = fill_value(b, i);
    CAPALLOC_RETURN_IF_ERROR(r.rt->memcpy_async(r.ptr[b], v.data(), v.size() * sizeof(float), kDefaultStream));
    start[b] = std::move(v);
  }
  CAPALLOC_RETURN_IF_ERROR(r.rt->launch_graph(r.graphs[g], kDefaultStream));
  std::map<int, std::vector<float>> real;
  for (int b : r.live) {
    std::vector<float> v(r.floats[b]);
    CAPALLOC_RETURN_IF_ERROR(r.rt->memcpy_async(v.data(), r.ptr[b], v.size() * sizeof(float), kDefaultStream));
    real[b] = std::move(v);
  }
  CAPALLOC_RETURN_IF_ERROR(r.rt->synchronize_stream(kDefaultStream));

  // The de-aliased model: every block its own memory; blocks not live start
  // with values of their own too.
  std::map<int, std::vector<float>> model = start;
  auto mem = [&](int b) -> std::vector<float>& {
    auto [it, fresh] = model.try_emplace(b);
    if (fresh) {
      it->second.resize(r.floats[b]);
      for (std::size_t i = 0; i < it->second.size(); ++i) it->second[i] = own_value(b, i);
    }
    return it->second;
  };
  for (const Node& n : r.nodes[g]) {
    std::vector<float>& b = mem(n.block);
    for (std::size_t i = n.lo; i < n.hi; ++i) {
      if (n.kind != OpKind::kWrite) mem(n.sink_block)[n.sink_offset + i - n.lo] = b[i];
      if (n.kind == OpKind::kWrite) b[i] = code(n.id, i);
      if (n.kind == OpKind::kUpdate) b[i] = b[i] * 0.5f + code(n.id, i);
    }
  }

  Harm h;
  auto holder = [&](std::uintptr_t addr) -> int {
    for (int b : r.live) {
      const auto base = reinterpret_cast<std::uintptr_t>(r.ptr[b]);
      if (addr >= base && addr < base + r.floats[b] * sizeof(float)) return b;
    }
    return -1;
  };
  for (int b : r.live) {
    for (std::size_t i = 0; i < r.floats[b]; ++i) {
      if (real[b][i] != model[b][i]) h.changed[b].insert(i);
    }
  }
  // Sink differences: which live block held the address the read read.
  for (const Node& n : r.nodes[g]) {
    if (n.kind == OpKind::kWrite) continue;
    for (std::size_t i = n.lo; i < n.hi; ++i) {
      const std::size_t s = n.sink_offset + i - n.lo;
      if (real[n.sink_block][s] == model[n.sink_block][s]) continue;
      const int v = holder(reinterpret_cast<std::uintptr_t>(r.ptr[n.block] + i));
      if (v >= 0) h.read_from.insert(v);
    }
  }
  // A sink is the graph's own output: its differences were attributed.
  for (const Node& n : r.nodes[g]) {
    if (n.kind != OpKind::kWrite) h.changed.erase(n.sink_block);
  }
  return h;
}

// Checks the verdict of every graph against the oracle; returns what
// disagrees (empty: all agree).
struct OracleStats {
  std::uint64_t graphs = 0, harmed = 0, findings = 0;
};

absl::StatusOr<std::string> check_program(const Program& p, OracleStats* stats = nullptr) {
  Run r;
  CAPALLOC_RETURN_IF_ERROR(build(p, r));
  const std::vector<Finding> findings = r.tracker->check();
  if (stats != nullptr) stats->findings += findings.size();
  std::map<const void*, int> block_at;
  for (int b : r.live) block_at[r.ptr[b]] = b;
  std::ostringstream bad;
  for (std::size_t g = 0; g < r.graphs.size(); ++g) {
    CAPALLOC_ASSIGN_OR_RETURN(Harm h, observe(r, g));
    if (stats != nullptr) {
      ++stats->graphs;
      std::set<int> victims(h.read_from);
      for (const auto& [v, bytes] : h.changed) victims.insert(v);
      stats->harmed += victims.size();
    }
    std::map<int, const Finding*> clobber, stale;
    for (const Finding& f : findings) {
      if (f.graph != r.graphs[g] || !block_at.contains(f.victim.ptr)) continue;
      (f.harm == capalloc::Harm::kClobber ? clobber : stale)[block_at[f.victim.ptr]] = &f;
    }
    for (const auto& [v, bytes] : h.changed) {
      if (!clobber.contains(v)) {
        bad << "g" << g << " changes " << bytes.size() << " float(s) of B" << v << " with no clobber finding\n";
        continue;
      }
      const Finding& f = *clobber[v];
      for (std::size_t i : bytes) {
        const auto addr = reinterpret_cast<std::uintptr_t>(r.ptr[v] + i);
        bool covered = false;
        for (const MemorySpan& s : f.ranges) covered = covered || (addr >= s.begin() && addr < s.end());
        if (!covered) {
          bad << "g" << g << " changes B" << v << "[" << i << "] outside the finding's ranges\n";
          break;
        }
      }
    }
    for (int v : h.read_from) {
      if (!clobber.contains(v) && !stale.contains(v)) {
        bad << "g" << g << " reads B" << v << "'s data instead of its own with no finding\n";
      }
    }
    for (const auto& [v, f] : clobber) {
      if (!h.changed.contains(v) && !h.read_from.contains(v)) {
        bad << "g" << g << " has a clobber finding on B" << v << " the replay does not bear out\n";
      }
    }
    for (const auto& [v, f] : stale) {
      if (!h.read_from.contains(v)) {
        bad << "g" << g << " has a stale-read finding on B" << v << " the replay does not bear out\n";
      }
    }
  }
  for (GraphHandle gh : r.graphs) r.tracker->destroy_graph(gh).IgnoreError();
  for (int b : r.live) r.alloc->deallocate(r.ptr[b]).IgnoreError();
  r.tracker.reset();
  r.rt->destroy_stream(r.side).IgnoreError();
  return bad.str();
}

// Removes ops, captures and after-steps one at a time while the program
// still fails.
Program shrink(Program p) {
  auto fails = [](const Program& q) {
    auto r = check_program(q);
    return r.ok() && !r->empty();
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (std::size_t c = 0; c < p.captures.size() && !progress; ++c) {
      for (std::size_t i = 0; i < p.captures[c].ops.size(); ++i) {
        Program q = p;
        q.captures[c].ops.erase(q.captures[c].ops.begin() + static_cast<std::ptrdiff_t>(i));
        if (fails(q)) {
          p = std::move(q);
          progress = true;
          break;
        }
      }
    }
    for (std::size_t i = 0; i < p.free_after.size() && !progress; ++i) {
      Program q = p;
      q.free_after.erase(q.free_after.begin() + static_cast<std::ptrdiff_t>(i));
      if (fails(q)) p = std::move(q), progress = true;
    }
    for (std::size_t i = 0; i < p.alloc_after.size() && !progress; ++i) {
      Program q = p;
      q.alloc_after.erase(q.alloc_after.begin() + static_cast<std::ptrdiff_t>(i));
      if (fails(q)) p = std::move(q), progress = true;
    }
  }
  return p;
}

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

}  // namespace

TEST_CASE("random capture programs: every verdict agrees with the replay", "[oracle]") {
  capalloc::set_log_level("off").IgnoreError();
  const std::uint64_t programs = env_or("CAPALLOC_ORACLE_PROGRAMS", 10000);
  const std::uint64_t seed = env_or("CAPALLOC_ORACLE_SEED", 1);
  std::uint64_t graphs = 0, harmed = 0, findings = 0;
  for (std::uint64_t k = 0; k < programs; ++k) {
    std::mt19937_64 rng(seed * 1000003 + k);
    const Program p = generate(rng);
    OracleStats stats;
    auto verdict = check_program(p, &stats);
    REQUIRE_OK(verdict.status());
    if (!verdict->empty()) {
      const Program small = shrink(p);
      FAIL("program " << k << " (CAPALLOC_ORACLE_SEED=" << seed << "): the verdict disagrees "
           "with the replay:\n" << *verdict << "shrunk program:\n" << describe(small)
           << "its disagreement:\n" << *check_program(small));
    }
    graphs += stats.graphs;
    harmed += stats.harmed;
    findings += stats.findings;
  }
  // The programs must exercise harm, or agreement proves nothing.
  std::printf("oracle: %llu programs (seed %llu), %llu graphs, %llu harmed (graph, block) pairs, "
              "%llu findings, all agreeing with their replays\n",
              static_cast<unsigned long long>(programs), static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(graphs), static_cast<unsigned long long>(harmed),
              static_cast<unsigned long long>(findings));
  CHECK(harmed * 10 >= programs);
}

// Named programs through the same oracle: each must show harm, and the
// verdict must agree with it.
TEST_CASE("the oracle sees the harm of named programs and agrees with their verdicts",
          "[oracle]") {
  capalloc::set_log_level("off").IgnoreError();
  struct Named {
    const char* name;
    Program program;
  };
  const std::vector<Named> named = {
      {"a victim read between a clobber and its own rewrite",
       {{}, {{false, {{OpKind::kAlloc, 0, 0, 256}, {OpKind::kWrite, 0, 0, 256}, {OpKind::kFree, 0, 0, 0},
                      {OpKind::kAlloc, 1, 0, 256}, {OpKind::kRead, 1, 0, 256}, {OpKind::kWrite, 1, 0, 256}}}},
        {}, {}}},
      {"an eager input freed after the capture and reused (stale read)",
       {{256}, {{false, {{OpKind::kRead, 0, 0, 256}}}}, {0}, {256}}},
      {"seed 003 arm A: a transient's write over a block left live",
       {{}, {{true, {{OpKind::kAlloc, 0, 0, 256}, {OpKind::kWrite, 0, 0, 256}, {OpKind::kFree, 0, 0, 0},
                     {OpKind::kAlloc, 1, 0, 256}}}},
        {}, {}}},
      {"an update of a block another graph clobbers",
       {{}, {{true, {{OpKind::kAlloc, 0, 0, 256}, {OpKind::kWrite, 0, 0, 256}, {OpKind::kFree, 0, 0, 0}}},
             {true, {{OpKind::kAlloc, 1, 0, 256}, {OpKind::kUpdate, 1, 0, 256}}}},
        {}, {}}},
  };
  for (const Named& n : named) {
    INFO(n.name << "\n" << describe(n.program));
    OracleStats stats;
    auto verdict = check_program(n.program, &stats);
    REQUIRE_OK(verdict.status());
    CHECK(*verdict == "");
    CHECK(stats.harmed > 0);
    CHECK(stats.findings > 0);
  }
}
