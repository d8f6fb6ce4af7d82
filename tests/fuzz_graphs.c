/* Differential fuzzer: `fuzz_graphs [count] [first_seed]` builds count random graphs (the
 * generator of test_cpu_backend.c) and compares the compiled CPU backend against the reference
 * backend on each. Prints the failing seeds and a summary; exits non-zero on any mismatch. */
#define CPU_FUZZ_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "test_cpu_backend.c"
#include <time.h>

int main(int argc, char **argv) {
  long count = argc > 1 ? atol(argv[1]) : 1000;
  unsigned long long first = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
  setup_cache_root();
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long failed = 0;
  for (long i = 0; i < count; i++) failed += fuzz_one(first + (unsigned long long)i, getenv("FUZZ_VERBOSE") ? 2 : 1) != 0;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("fuzz: %ld graphs, %ld mismatching, %.1f s (compiles %llu, disk hits %llu)\n", count,
         failed, s, (unsigned long long)cpu_stats.compiles, (unsigned long long)cpu_stats.disk_hits);
  capture_free(&cap);
  cpu_pool_shutdown();
  cleanup_cache_root();
  return failed != 0;
}
