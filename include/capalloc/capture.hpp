// capalloc/capture.hpp: graph capture through capalloc, the write record of
// each graph, and the alias check that runs before any replay.
//
// A CaptureTracker wraps an Allocator. Captures begun through it allocate
// into a graph pool (a private one, or a shared pool handle as vLLM uses one
// across batch sizes). At the end of each capture the tracker builds the
// graph's write record (which address ranges its replays write, through which
// block) and evaluates the alias rule against every live block: a graph
// *clobbers* a live block when it writes the block's range through another
// block's identity and, with declared writes, does not itself write the block
// afterwards. Findings are reported then, before any replay, again by the
// replay guard before each replay launched through the tracker, and on demand.
//
// Example (seed 003, arm A):
//
//   auto tracker = capalloc::CaptureTracker::create(*allocator).value();
//   tracker->begin_capture(0, stream).value();
//   ... allocate T, launch kernels writing T, free T, allocate WS ...
//   auto done = tracker->end_capture(stream).value();
//   for (const auto& f : done.new_findings) std::puts(f.summary().c_str());
//   tracker->replay(done.graph, stream);  // warns, or refuses in strict mode
//
// Thread safety: all methods may be called concurrently. The tracker must be
// destroyed before its allocator.
#ifndef CAPALLOC_CAPTURE_HPP_
#define CAPALLOC_CAPTURE_HPP_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capalloc/allocator.hpp"
#include "capalloc/export.h"
#include "capalloc/runtime.hpp"

namespace capalloc {

// How bad a finding is. A clobber is a hazard when the victim is persistent,
// was allocated outside any capture, is written by no graph, is used by the
// clobbering graph itself, or is read by some graph before that graph writes
// it (modes kRead, kReadWrite, kState). When every graph that uses the
// clobbered bytes writes them whole first (an output of another graph, or
// scratch), it is kCrossGraphOutput: vLLM's normal pattern, reported lower
// and replayed in strict mode. kPossible: the harm depends on what the
// evidence does not say (a footprint record: capalloc saw only malloc and
// free, not what the graph writes); strict mode refuses it only when asked
// (CAPALLOC_STRICT=possible, set_strict_possible). Values run from most to
// least severe.
enum class Severity { kHazard, kPossible, kCrossGraphOutput };

// What a graph's replay does to the victim.
enum class Harm {
  kClobber,    // writes the victim's bytes through another block
  kStaleRead,  // reads, through a block freed since the capture (or through no
               // block), bytes the victim now holds: each replay computes from
               // the victim's data instead of its own input
};

// A block as records and findings name it: its identity is `sequence`.
struct CAPALLOC_API BlockRef {
  std::uint64_t sequence = 0;  // 0: no block (memory not allocated at the time)
  std::string_view tag;        // valid for the life of the process (see BlockInfo::tag)
  const void* ptr = nullptr;
  std::size_t size = 0;
  Lifetime lifetime = Lifetime::kTransient;
  PoolHandle pool = kDefaultPool;
  CaptureId capture = 0;  // allocated during this capture (0: outside any)
  std::size_t capture_position = 0;

  MemorySpan span() const { return {ptr, size}; }
  static BlockRef from(const BlockInfo& info);
};

// One access a graph's replays make: a write, or (mode kRead) a read. Only
// writes clobber; reads and the order of accesses decide a finding's severity.
struct RecordedWrite {
  MemorySpan span;
  BlockRef writer;            // the block the access went through
  std::size_t position = 0;   // capture position of the node
  std::string_view op;        // kernel name, "memset", "memcpy" or "footprint" (interned:
                              // valid for the life of the process)
  WriteEvidence evidence = WriteEvidence::kDeclared;
  AccessMode mode = AccessMode::kWrite;  // footprint records count as kWrite
  // A touch (mode kTouch) taken to write the block whole: the first use, in
  // the graph's order, of a block allocated during this capture (its contents
  // are undefined until then). Inference may lower a finding's severity to
  // `possible`; it never removes bytes from one.
  bool inferred_write = false;
};

struct WriteRecord {
  GraphHandle graph = 0;
  std::string label;
  CaptureId capture = 0;
  int device = 0;
  PoolHandle pool = kDefaultPool;
  WriteEvidence precision = WriteEvidence::kFootprint;  // the weakest evidence in it
  // Whether the order of `writes` comes from the graph's edges
  // (DeviceRuntime::graph_dependencies), or, where the runtime gave none,
  // from capture order taken as the only order.
  bool order_from_edges = false;
  std::vector<RecordedWrite> writes;
};

// One occupant of an address range, in allocation order.
struct ChainLink {
  BlockRef block;
  bool live = false;
  CaptureId freed_in_capture = 0;  // when freed during a capture
  std::size_t freed_at = 0;        // ... at this capture position
};

struct CAPALLOC_API Finding {
  GraphHandle graph = 0;
  std::string graph_label;
  CaptureId capture = 0;
  Harm harm = Harm::kClobber;
  Severity severity = Severity::kHazard;
  WriteEvidence evidence = WriteEvidence::kDeclared;
  // For a clobber, the last write (in capture order) that lands on the
  // victim through another block: the data a replay leaves there;
  // `clobbering_writes` counts all such writes of the graph and `overlap`
  // bounds them. For a stale read, the first read of the victim's bytes
  // through the freed block (`writer`), and `clobbering_writes` counts the
  // stale reads.
  BlockRef writer;
  std::size_t write_position = 0;
  std::string write_op;
  AccessMode write_mode = AccessMode::kWrite;
  std::size_t clobbering_writes = 0;
  BlockRef victim;
  // The harmed bytes: `ranges`, sorted and disjoint, exactly (declared
  // accesses, memset and memcpy nodes) or as block-granular upper bounds
  // (`ranges_exact` false: footprint evidence, or an inspected touch, which
  // names a block, not bytes); `overlap` bounds them.
  std::vector<MemorySpan> ranges;
  bool ranges_exact = true;
  MemorySpan overlap;
  std::vector<ChainLink> reuse_chain;
  // The order evidence: how the harmful access relates to the accesses that
  // could have undone it, in one sentence (a path of edges such as "node 2
  // -> node 5", or "unordered": no path of edges between them, so some
  // replay runs them the other way), and that path's node positions.
  // `order_from_edges` false: the runtime gave no edges and capture order
  // stood in for them.
  bool order_from_edges = false;
  std::string order;
  std::vector<std::size_t> order_path;
  // Whether the harm rests on an access whose mode the evidence does not give
  // (an inspected touch): it may happen, and the finding is `possible`.
  bool mode_unknown = false;
  // Why this severity: which graph reads the victim before writing it, or
  // that every graph using it writes it first (an output or scratch).
  std::string severity_reason;
  // Set when the user judged this finding benign (CaptureTracker::waive):
  // still reported, listed apart, and never a reason for strict mode to
  // refuse a replay.
  bool waived = false;
  std::string waiver_reason;
  std::string fix;

  // The number of harmed bytes (the sum of `ranges`).
  std::size_t harmed_bytes() const;
  // One paragraph for logs and the CLI.
  std::string summary() const;
};

// Findings as a JSON array (schema in docs/findings.md).
CAPALLOC_API std::string findings_to_json(const std::vector<Finding>& findings);
CAPALLOC_API const char* severity_name(Severity severity);
CAPALLOC_API const char* evidence_name(WriteEvidence evidence);
CAPALLOC_API const char* access_mode_name(AccessMode mode);
CAPALLOC_API const char* harm_name(Harm harm);

// What the alias check has done so far: counts, not times, so that tests can
// pin how the work grows (with the blocks and nodes a capture involves, not
// with the captures before it).
struct TrackerWork {
  std::uint64_t records = 0;            // write records built
  std::uint64_t victims = 0;            // (record, live block) pairs the rule evaluated
  std::uint64_t accesses = 0;           // recorded accesses those evaluations examined,
                                        // and write-index entries scanned to find them
  std::uint64_t nodes = 0;              // graph nodes: listed writes and ordered nodes
  std::uint64_t blocks = 0;             // blocks: events noted, history entries scanned,
                                        // live blocks looked up, occupants re-indexed
  std::uint64_t findings = 0;           // findings the rule built or weighed for reporting
};

struct CAPALLOC_API TrackerOptions {
  // Refuse replays of graphs with hazard findings (kFailedPrecondition)
  // instead of logging a warning.
  bool strict = false;
  // With strict, also refuse replays of graphs with `possible` findings.
  bool strict_possible = false;
  // Reads CAPALLOC_STRICT: 0 (off, the default when unset or empty), 1
  // (refuse hazards) or possible (refuse hazards and possible findings); any
  // other value is kInvalidArgument naming the variable, the value and the
  // accepted ones.
  static absl::StatusOr<TrackerOptions> from_env();
};

struct CaptureOptions {
  // Shared graph pool to allocate into; kDefaultPool: a private pool.
  PoolHandle pool = kDefaultPool;
  CaptureMode mode = CaptureMode::kGlobal;
  std::string label;  // names the graph in findings; default "graph <handle>"
};

struct CaptureResult {
  GraphHandle graph = 0;
  std::vector<Finding> new_findings;  // found at capture end, before any replay
};

class CAPALLOC_API CaptureTracker {
 public:
  static absl::StatusOr<std::unique_ptr<CaptureTracker>> create(Allocator& allocator,
                                                                TrackerOptions options = {});
  ~CaptureTracker();
  CaptureTracker(const CaptureTracker&) = delete;
  CaptureTracker& operator=(const CaptureTracker&) = delete;

  // Begins a capture on `stream` (of `device`). Errors: the runtime's (stream
  // already capturing, default stream), kNotFound for an unknown pool.
  absl::StatusOr<CaptureId> begin_capture(int device, StreamHandle stream,
                                          CaptureOptions options = {});
  // Ends the capture begun on `stream`, builds the graph's write record and
  // runs the alias check. If the runtime refuses (invalidated or unjoined
  // capture), returns its error; the allocator stays consistent, blocks
  // allocated in the capture stay live and accounted in the graph pool.
  absl::StatusOr<CaptureResult> end_capture(StreamHandle stream);

  // The replay guard: checks the graph against the live blocks, then launches
  // it. Hazards are logged (default) or refuse the replay (strict mode).
  absl::Status replay(GraphHandle graph, StreamHandle stream);
  absl::Status destroy_graph(GraphHandle graph);

  // Marks the findings of `graph` on a victim as judged benign, with the
  // reason: strict mode then replays the graph despite them, and they are
  // listed apart (Finding::waived). The victim is named by a pointer into a
  // live block (the waiver holds for that block) or, with `victim` null, by
  // `tag` (every block with that tag, now and later). Errors, changing
  // nothing: kNotFound for a graph this tracker does not hold or a pointer
  // into no live block; kInvalidArgument for an empty reason, or neither a
  // pointer nor a tag. A waiver goes with its graph (destroy_graph).
  absl::Status waive(GraphHandle graph, const void* victim, std::string_view tag,
                     std::string_view reason);

  // Findings of one graph, or of every graph, against the live blocks now.
  absl::StatusOr<std::vector<Finding>> check_graph(GraphHandle graph);
  std::vector<Finding> check();

  absl::StatusOr<WriteRecord> write_record(GraphHandle graph) const;
  // The allocator's and the tracker's state as JSON (docs/snapshot.md):
  // per device stats and live blocks, the graphs, captures in progress and
  // the current findings.
  std::string snapshot_json();
  // Every block known to have occupied part of `span`, in allocation order.
  std::vector<ChainLink> reuse_chain(int device, MemorySpan span);

  Allocator& allocator() const;
  // The alias check's work since the tracker was created.
  TrackerWork work() const;
  bool strict() const;
  void set_strict(bool strict);
  // Whether strict mode also refuses `possible` findings.
  bool strict_possible() const;
  void set_strict_possible(bool strict_possible);

 private:
  struct Impl;
  explicit CaptureTracker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace capalloc

#endif  // CAPALLOC_CAPTURE_HPP_
