/* Uses the installed C ABI (capalloc/capalloc.h) from plain C: allocate,
 * write, free, and the error path (capalloc_last_error). Also calls the
 * PyTorch plug-in entry points, so their exported names are checked.
 * Run with CAPALLOC_RUNTIME=host. Exits 0 only if all of it behaves. */
#include <stdio.h>
#include <string.h>

#include "capalloc/capalloc.h"

static int fail(const char* what) {
  fprintf(stderr, "consumer_c: %s: %s\n", what, capalloc_last_error());
  return 1;
}

int main(void) {
  const char* name = capalloc_runtime_name();
  if (name == NULL) return fail("capalloc_runtime_name");
  char runtime[32];
  snprintf(runtime, sizeof runtime, "%s", name);

  void* p = NULL;
  if (capalloc_malloc(&p, (size_t)1 << 20, 0, NULL) != CAPALLOC_OK) return fail("capalloc_malloc");
  if (p == NULL) return fail("capalloc_malloc returned NULL");
  if (strcmp(runtime, "host") == 0) memset(p, 0x5a, (size_t)1 << 20);

  capalloc_stats stats;
  memset(&stats, 0, sizeof stats);
  if (capalloc_get_stats(0, &stats) != CAPALLOC_OK) return fail("capalloc_get_stats");
  if (stats.allocated_bytes < ((int64_t)1 << 20)) {
    fprintf(stderr, "consumer_c: allocated_bytes %lld < 1 MiB\n", (long long)stats.allocated_bytes);
    return 1;
  }

  if (capalloc_free(p) != CAPALLOC_OK) return fail("capalloc_free");

  /* Errors come back as codes with a message; no state changes. */
  if (capalloc_free(NULL) == CAPALLOC_OK) {
    fprintf(stderr, "consumer_c: capalloc_free(NULL) was accepted\n");
    return 1;
  }
  if (capalloc_last_error()[0] == '\0') {
    fprintf(stderr, "consumer_c: no last error after a failed call\n");
    return 1;
  }

  void* t = capalloc_torch_malloc(4096, 0, NULL);
  if (t == NULL) return fail("capalloc_torch_malloc");
  capalloc_torch_free(t, 4096, 0, NULL);

  if (capalloc_check_invariants() != CAPALLOC_OK) return fail("capalloc_check_invariants");
  printf("consumer_c: ok (%s runtime)\n", runtime);
  return 0;
}
