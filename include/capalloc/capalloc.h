/* capalloc/capalloc.h: the C ABI of capalloc.
 *
 * Every call works on one process-wide allocator, created on first use over
 * the runtime named by CAPALLOC_RUNTIME (auto|host|cuda|hip; default auto).
 * Calls return a capalloc_status; on failure the calling thread's last error
 * message (capalloc_last_error) says what went wrong, and no state changed.
 * No C++ exception crosses this boundary. All calls are thread-safe.
 *
 * Streams are passed as `void*`: a cudaStream_t / hipStream_t on the GPU
 * runtimes, a handle from capalloc_stream_create on the host runtime, NULL for
 * the default stream.
 *
 * Example:
 *
 *   void* p = NULL;
 *   if (capalloc_malloc(&p, 1 << 20, 0, NULL) != CAPALLOC_OK)
 *     fprintf(stderr, "%s\n", capalloc_last_error());
 *   capalloc_free(p);
 */
#ifndef CAPALLOC_CAPALLOC_H_
#define CAPALLOC_CAPALLOC_H_

#include <stddef.h>
#include <stdint.h>

#include "capalloc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum capalloc_status {
  CAPALLOC_OK = 0,
  CAPALLOC_ERROR_INVALID_ARGUMENT = 1,
  CAPALLOC_ERROR_OUT_OF_MEMORY = 2,
  CAPALLOC_ERROR_NOT_FOUND = 3,
  CAPALLOC_ERROR_FAILED_PRECONDITION = 4,
  CAPALLOC_ERROR_UNAVAILABLE = 5,
  CAPALLOC_ERROR_INTERNAL = 6
} capalloc_status;

typedef struct capalloc_stats {
  int64_t allocated_bytes;
  int64_t allocated_bytes_peak;
  int64_t requested_bytes;
  int64_t requested_bytes_peak;
  int64_t reserved_bytes;
  int64_t reserved_bytes_peak;
  int64_t segments;
  int64_t allocated_blocks;
  int64_t free_blocks;
  int64_t pending_free_blocks;
  uint64_t allocations;
  uint64_t frees;
  uint64_t retries;
  uint64_t ooms;
} capalloc_stats;

/* The calling thread's message for its last failed call ("" if none). The
 * pointer stays valid until the thread's next capalloc call. */
CAPALLOC_API const char* capalloc_last_error(void);

/* The runtime the process-wide allocator uses ("host", "cuda", "hip"); NULL
 * and a last error if it could not be created. */
CAPALLOC_API const char* capalloc_runtime_name(void);

/* Allocates `size` bytes (> 0) on `device` for use on `stream`. */
CAPALLOC_API capalloc_status capalloc_malloc(void** out, size_t size, int device, void* stream);

/* Frees a block from capalloc_malloc. NULL is an error (not a no-op): a C
 * caller passing NULL has lost a pointer. */
CAPALLOC_API capalloc_status capalloc_free(void* ptr);

/* The block is used on `stream` as well; see Allocator::record_stream. */
CAPALLOC_API capalloc_status capalloc_record_stream(void* ptr, void* stream);

/* Returns cached free segments of `device` (-1: all devices). */
CAPALLOC_API capalloc_status capalloc_empty_cache(int device);

CAPALLOC_API capalloc_status capalloc_get_stats(int device, capalloc_stats* out);

/* Verifies the allocator's invariants (see Allocator::CheckInvariants). */
CAPALLOC_API capalloc_status capalloc_check_invariants(void);

/* Streams of the process-wide runtime, for hosts without a native stream
 * API (the host runtime). capalloc_stream_synchronize refuses a capturing
 * stream (CAPALLOC_ERROR_FAILED_PRECONDITION) rather than invalidate its capture.
 * Every call that takes a stream refuses one the runtime does not know
 * (never created or destroyed): the host runtime knows each of its streams;
 * on CUDA and HIP a stream is checked the first time capalloc sees it and
 * remembered until it is destroyed through capalloc, so a handle destroyed
 * natively behind capalloc's back is not noticed. */
CAPALLOC_API capalloc_status capalloc_stream_create(int device, void** out);
CAPALLOC_API capalloc_status capalloc_stream_destroy(void* stream);
CAPALLOC_API capalloc_status capalloc_stream_synchronize(void* stream);

/* Like capalloc_malloc, with a tag (NULL: none) shown in findings, and
 * persistent != 0 for a block that must outlive every graph replay: refused
 * while a capture is active (the error names the fix: capalloc_preallocate). */
CAPALLOC_API capalloc_status capalloc_malloc_tagged(void** out, size_t size, int device,
                                                    void* stream, const char* tag,
                                                    int persistent);

/* --- Graph capture through capalloc ----------------------------------------
 * Graph pools hold the blocks of captures; several captures may share one. A
 * capture allocates into `pool` (0: a private pool). At its end the graph's
 * write record is checked against every live block; findings come back as a
 * JSON array (schema: docs/findings.md) in a thread-local string valid until
 * the thread's next call that returns one. */
CAPALLOC_API capalloc_status capalloc_pool_create(int device, uint64_t* out);
/* Gives up one handle from capalloc_pool_create. Captures and graphs hold
 * their own references, so the pool lives on while they use it. A release
 * beyond the handles capalloc_pool_create gave (or of a pool PyTorch's hooks
 * made: capalloc_torch_release_pool) is CAPALLOC_ERROR_FAILED_PRECONDITION
 * and changes nothing. */
CAPALLOC_API capalloc_status capalloc_pool_release(uint64_t pool);
CAPALLOC_API capalloc_status capalloc_capture_begin(int device, void* stream, uint64_t pool,
                                                    const char* label);
/* `findings_json` may be NULL. */
CAPALLOC_API capalloc_status capalloc_capture_end(void* stream, uint64_t* graph,
                                                  const char** findings_json);
/* The replay guard: checks, then launches. In strict mode a graph with a
 * hazard finding is refused (CAPALLOC_ERROR_FAILED_PRECONDITION). */
CAPALLOC_API capalloc_status capalloc_graph_replay(uint64_t graph, void* stream);
CAPALLOC_API capalloc_status capalloc_graph_destroy(uint64_t graph);
/* Every graph against the live blocks now. */
CAPALLOC_API capalloc_status capalloc_check(const char** findings_json);
/* Marks the findings of `graph` on a victim as judged benign, with `reason`
 * (required): strict mode then replays the graph despite them, and the
 * findings' JSON carries "waived": {"reason": ...}. The victim is `victim`
 * (a pointer into a live block) or, with victim NULL, every block tagged
 * `tag`. Errors change nothing: NOT_FOUND (unknown graph, pointer into no
 * live block), INVALID_ARGUMENT (no reason, neither victim nor tag). */
CAPALLOC_API capalloc_status capalloc_waive(uint64_t graph, const void* victim, const char* tag,
                                            const char* reason);
/* Strict mode: 0 off (findings are logged), 1 replays through capalloc of
 * graphs with hazards are refused, 2 also those with `possible` findings.
 * Other values: INVALID_ARGUMENT. */
CAPALLOC_API capalloc_status capalloc_set_strict(int strict);
/* The allocator's and the tracker's state as JSON (docs/snapshot.md), in the
 * same thread-local string as findings. */
CAPALLOC_API capalloc_status capalloc_snapshot(const char** json);

/* --- Retention audit and event trace (c_api/c_api_audit.cpp) -----------------
 * capalloc_checkpoint stores the allocation order now in *out (and remembers
 * it as the latest checkpoint, which the snapshot's audit section uses);
 * capalloc_live_since answers the blocks allocated after `checkpoint` and
 * still live, grouped by tag and allocation site, as JSON (schema
 * capalloc.live_since/1, docs/snapshot.md) in the same thread-local string as
 * findings. capalloc_set_record_stacks(1) records each allocation's call
 * stack from now on (CAPALLOC_STACKS=1: from the start), (0) stops; any
 * other value is INVALID_ARGUMENT and changes nothing.
 *
 * capalloc_push_tag opens a tag scope on the calling thread: allocations
 * this thread makes without a tag of their own (capalloc_malloc,
 * capalloc_torch_malloc) get `tag` and `site` (a call site such as
 * "model.py:12 in forward"; NULL or "" for none) until the matching
 * capalloc_pop_tag. Scopes nest (at most 64); the innermost applies. Errors:
 * INVALID_ARGUMENT for a NULL tag, OUT_OF_MEMORY past 64 scopes,
 * FAILED_PRECONDITION for a pop with none open. capalloc_set_tag replaces
 * the calling thread's scopes with one (`tag`, `site`), or closes them all
 * when `tag` is NULL: for a caller that keeps its own scope stack and tells
 * the thread which scope is current (the Python package, whose scopes
 * follow asyncio tasks and contexts: it calls this on entering and leaving
 * a scope and before the allocations it makes itself).
 *
 * capalloc_trace_start writes the event trace (docs/trace.md) to `path`
 * (FAILED_PRECONDITION when one runs; INVALID_ARGUMENT when the file cannot
 * be created); capalloc_trace_stop writes what is buffered and closes it
 * (FAILED_PRECONDITION when none runs). A trace still running at exit is
 * written out then. */
CAPALLOC_API capalloc_status capalloc_checkpoint(uint64_t* out);
CAPALLOC_API capalloc_status capalloc_live_since(uint64_t checkpoint, const char** json);
CAPALLOC_API capalloc_status capalloc_set_record_stacks(int record);
CAPALLOC_API capalloc_status capalloc_push_tag(const char* tag, const char* site);
CAPALLOC_API capalloc_status capalloc_pop_tag(void);
CAPALLOC_API capalloc_status capalloc_set_tag(const char* tag, const char* site);
CAPALLOC_API capalloc_status capalloc_trace_start(const char* path);
CAPALLOC_API capalloc_status capalloc_trace_stop(void);

/* --- Persistent buffers by (device, key) -------------------------------------
 * capalloc_preallocate creates (or returns) the buffer during warmup; it is
 * refused during a capture. capalloc_get never allocates. `out` of
 * capalloc_preallocate may be NULL. */
CAPALLOC_API capalloc_status capalloc_preallocate(int device, const char* key, size_t bytes,
                                                  void** out);
CAPALLOC_API capalloc_status capalloc_get(int device, const char* key, void** out);
/* Frees the buffer (device, key); the caller guarantees that no graph using
 * it replays again. The only way to free one: capalloc_free of a persistent
 * buffer is refused (CAPALLOC_ERROR_FAILED_PRECONDITION, naming this call).
 * CAPALLOC_ERROR_NOT_FOUND for a key that holds no buffer. */
CAPALLOC_API capalloc_status capalloc_release_persistent(int device, const char* key);

/* PyTorch's CUDAPluggableAllocator entry points, with exactly its C++
 * signatures. capalloc_torch_malloc returns NULL for size 0 (PyTorch's
 * convention for empty tensors) and on failure, logging the error;
 * capalloc_torch_free ignores NULL. */
CAPALLOC_API void* capalloc_torch_malloc(size_t size, int device, void* stream);
CAPALLOC_API void capalloc_torch_free(void* ptr, size_t size, int device, void* stream);

/* --- PyTorch's graph pools (CUDAPluggableAllocator's hooks) -----------------
 * What PyTorch's beginAllocateToPool, endAllocateToPool and releasePool
 * reach through the C++ shim (python/capalloc/_torch_shim.cpp). PyTorch names
 * a pool by a pair of integers (MempoolId_t: `pool_a`, `pool_b`; never both
 * 0) per device; capalloc keeps one graph pool for each, so that graphs
 * captured with torch.cuda.graph(pool=...) share it. Errors change nothing.
 *
 * A filter says whether a stream's allocations belong to the capture that
 * began: nonzero yes. PyTorch begins before the capture exists, so the
 * filter is asked at the first allocation through capalloc_torch_malloc on
 * a capturing stream of `device`; the capture it accepts then allocates
 * into the pool. NULL: every capture on the device. The filter runs outside
 * the allocator's lock but under the lock of these pool functions, which is
 * what keeps `filter` and `context` in use no longer than until the
 * matching capalloc_torch_end_allocate_to_pool returns: it may allocate
 * and free through capalloc_torch_malloc/free on a stream that is not
 * capturing, but must not call the functions below (they would wait for
 * that lock). */
typedef int (*capalloc_stream_filter)(void* context, void* stream);

/* beginAllocateToPool: the pool gets a use (it is created on first use).
 * INVALID_ARGUMENT: pool (0, 0) or an unknown device. */
CAPALLOC_API capalloc_status capalloc_torch_begin_allocate_to_pool(int device, uint64_t pool_a,
                                                                   uint64_t pool_b,
                                                                   capalloc_stream_filter filter,
                                                                   void* context);
/* endAllocateToPool, after the capture has ended and before PyTorch
 * instantiates and destroys its graph: the oldest begin of the pool ends;
 * the capture it routed is inspected (its graph's kernels, memsets, memcpys
 * and edges) and checked against every live block now. Its findings (and
 * those of other graphs on the blocks it left live) come back as JSON in
 * `findings_json` (may be NULL; "[]" for a capture that allocated nothing,
 * which capalloc never saw), which is set exactly when the end happened. In
 * strict mode (capalloc_set_strict) a finding strict mode refuses makes the
 * call return FAILED_PRECONDITION with the finding in the message; the end
 * has happened all the same, and the JSON is set. Errors that change nothing
 * (and leave `*findings_json` as it was): NOT_FOUND (a pool never begun, or
 * released), FAILED_PRECONDITION (no begin of the pool left to end, or the
 * capture is still active). */
CAPALLOC_API capalloc_status capalloc_torch_end_allocate_to_pool(int device, uint64_t pool_a,
                                                                 uint64_t pool_b,
                                                                 const char** findings_json);
/* releasePool: the pool loses a use; with none left, capalloc's graph pool
 * is released (its memory goes back once its graphs' blocks are freed).
 * NOT_FOUND for a pool never begun or already released. */
CAPALLOC_API capalloc_status capalloc_torch_release_pool(int device, uint64_t pool_a,
                                                         uint64_t pool_b);
/* The capalloc graph pool (as capalloc_pool_create returns) that stands for
 * PyTorch's pool, and its uses. NOT_FOUND when it has none. */
CAPALLOC_API capalloc_status capalloc_torch_pool(int device, uint64_t pool_a, uint64_t pool_b,
                                                 uint64_t* pool, int* uses);
/* The strict mode capalloc_set_strict set (or CAPALLOC_STRICT): 0, 1 or 2. */
CAPALLOC_API capalloc_status capalloc_get_strict(int* out);

/* --- Stream-ordered release (capalloc/release.hpp) ---------------------------
 * capalloc_release_on_stream runs fn(context) once the work enqueued on
 * `stream` (of `device`) up to the call has completed, on a thread capalloc
 * owns; it never waits. `ptr`/`bytes` name the memory fn gives back (both,
 * or NULL and 0): while a live graph's record reads or writes it, the
 * release waits until that graph is destroyed. A release on a capturing
 * stream waits until the capture's graph is gone. At process exit (or
 * capalloc_release_drain) every pending release runs after its stream's
 * work, held or not; a release requested later runs before the call
 * returns. fn must not call capalloc_release_drain. Errors change nothing
 * (fn is not called): INVALID_ARGUMENT (fn NULL, ptr without bytes or the
 * reverse, an unknown device, ptr + bytes past the end of the address
 * space), NOT_FOUND (a stream the runtime does not
 * know), FAILED_PRECONDITION (the stream's capture was invalidated),
 * UNAVAILABLE (a capturing stream on a runtime that cannot tell when a
 * graph is gone: HIP 5.2). */
typedef void (*capalloc_release_fn)(void* context);
CAPALLOC_API capalloc_status capalloc_release_on_stream(void* stream, int device,
                                                        capalloc_release_fn fn, void* context,
                                                        const void* ptr, size_t bytes);
/* Releases requested and not yet run. */
CAPALLOC_API capalloc_status capalloc_release_pending(uint64_t* out);
/* Teardown now: runs every pending release (after its stream's work; those
 * held by a live graph too). FAILED_PRECONDITION from inside a release fn. */
CAPALLOC_API capalloc_status capalloc_release_drain(void);

/* --- DLPack import (capalloc/dlpack.hpp; <dlpack/dlpack.h>) -------------------
 * capalloc_dlpack_import takes ownership of `tensor` for use on `stream`;
 * `data` and `bytes` (each may be NULL) receive its first element and the
 * bytes it addresses. Device types: kDLCUDA (cuda runtime), kDLROCM (hip),
 * kDLCPU (host). capalloc_dlpack_release gives it back: its deleter runs
 * once the work enqueued on the import's stream up to the release has
 * completed (capalloc_release_on_stream's rules). Errors change nothing
 * (the caller keeps the tensor): INVALID_ARGUMENT (NULL, a device type or
 * id the runtime cannot serve, a malformed shape), FAILED_PRECONDITION (the
 * tensor is already imported), NOT_FOUND (release of a tensor not imported,
 * or released already). */
struct DLManagedTensor;
CAPALLOC_API capalloc_status capalloc_dlpack_import(struct DLManagedTensor* tensor, void* stream,
                                                    void** data, size_t* bytes);
CAPALLOC_API capalloc_status capalloc_dlpack_release(struct DLManagedTensor* tensor);
/* As capalloc_dlpack_import, also giving the import's token (never 0, never
 * reused); capalloc_dlpack_release_token releases that import only
 * (token 0: whichever), and is NOT_FOUND when the address is now another
 * import: a producer that reuses its DLManagedTensor once the deleter has
 * run cannot have its newer import released through a stale handle. A
 * tensor whose import stream was destroyed since is released too (its work
 * has run). */
CAPALLOC_API capalloc_status capalloc_dlpack_import_token(struct DLManagedTensor* tensor,
                                                          void* stream, void** data,
                                                          size_t* bytes, uint64_t* token);
CAPALLOC_API capalloc_status capalloc_dlpack_release_token(struct DLManagedTensor* tensor,
                                                           uint64_t token);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAPALLOC_CAPALLOC_H_ */
