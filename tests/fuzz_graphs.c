/* Differential fuzzer: `fuzz_graphs [count] [first_seed] [--train]` builds count random graphs
 * (the generators of test_cpu_backend.c) and compares the compiled CPU backend against the
 * reference backend on each. --train: training-shaped graphs (a small CNN's forward, backward
 * and optimizer update), each trained three steps through the public API with donated inputs
 * and a warm buffer pool, every step compared. Prints the failing seeds and a summary; exits
 * non-zero on any mismatch. FUZZ_VERBOSE=1: each graph's description (--train) and the
 * generated source of a failing one. */
#define CPU_FUZZ_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "test_cpu_backend.c"
#include <time.h>

int main(int argc, char **argv) {
  int train = 0, pos = 0;
  long count = 1000;
  unsigned long long first = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--train")) train = 1;
    else if (pos++ == 0) count = atol(argv[i]);
    else first = strtoull(argv[i], NULL, 10);
  }
  int verbose = getenv("FUZZ_VERBOSE") ? 2 : 1;
  setup_cache_root();
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long failed = 0;
  for (long i = 0; i < count; i++) {
    unsigned long long seed = first + (unsigned long long)i;
    failed += (train ? train_one(seed, verbose) : fuzz_one(seed, verbose)) != 0;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("fuzz%s: %ld graphs%s, %ld mismatching, %.1f s (compiles %llu, disk hits %llu)", train ? " --train" : "",
         count, train ? " x 3 steps" : "", failed, s, (unsigned long long)cpu_stats.compiles,
         (unsigned long long)cpu_stats.disk_hits);
  if (train) {
    graft_metrics gm;
    graft_metrics_get(&gm);
    printf(", native compiles %.1f s, donated buffers %llu, largest error %.3g (seed %llu)",
           gm.native_compile_ms / 1e3, (unsigned long long)gm.donated_buffers, tr_maxerr,
           (unsigned long long)tr_maxerr_seed);
  }
  printf("\n");
  capture_free(&cap);
  if (train) graft_shutdown();
  cpu_pool_shutdown();
  cleanup_cache_root();
  return failed != 0;
}
