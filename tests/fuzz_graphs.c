/* Differential fuzzer: `fuzz_graphs [count] [first_seed] [--train]` builds count random graphs
 * (the generators of test_cpu_backend.c) and compares the compiled CPU backend against the
 * reference backend on each. --train: training-shaped graphs (a small CNN's forward, backward
 * and optimizer update), each trained three steps through the public API with donated inputs
 * and a warm buffer pool, every step compared. --test-seeds: exactly the seeds make test runs
 * in test_cpu_backend (random graphs 1..300 and 1150, training seeds 11, 19, 54, 124).
 * GRAFT_TEST_DEVICE=n (or =opencl, see tests/check.h): the data lives on that device and its
 * registered compiler is compared with its registered reference (make check-opencl). Prints
 * the failing seeds and a summary; exits non-zero on any mismatch. FUZZ_VERBOSE=1: each
 * graph's description (--train) and the generated source of a failing one. */
#define CPU_FUZZ_MAIN
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "test_cpu_backend.c"
#include <time.h>

/* Makes the fuzzers build their data on device d and compare there the compiler and the
 * reference registered for d's kind (the backends a sync on d would use). -1 with a message
 * when d is no device or its kind has no such backends. */
static int fuzz_set_device(int d) {
  if (d < 0 || !graft_device_kind(d)) {
    fprintf(stderr, "fuzz: no device %d: %s\n", d, graft_last_error());
    return -1;
  }
  const backend *ref = graph_backend(d, BACKEND_REFERENCE), *cc = graph_backend(d, BACKEND_COMPILER);
  if (!ref || !cc) {
    fprintf(stderr, "fuzz: no reference or compiler backend for %s devices\n", graft_device_kind(d));
    return -1;
  }
  fuzz_dev = d;
  cmp_ref = ref;
  cmp_cc = cc;
  return 0;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* The training seeds' counters: compile time, donation, the largest error seen. */
static void print_train_summary(void) {
  graft_metrics gm;
  graft_metrics_get(&gm);
  printf(", native compiles %.1f s, donated buffers %llu, largest error %.3g (seed %llu)",
         gm.native_compile_ms / 1e3, (unsigned long long)gm.donated_buffers, tr_maxerr,
         (unsigned long long)tr_maxerr_seed);
}

int main(int argc, char **argv) {
  int train = 0, test_seeds = 0, pos = 0;
  long count = 1000;
  unsigned long long first = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--train")) train = 1;
    else if (!strcmp(argv[i], "--test-seeds")) test_seeds = 1;
    else if (pos++ == 0) count = atol(argv[i]);
    else first = strtoull(argv[i], NULL, 10);
  }
  int verbose = getenv("FUZZ_VERBOSE") ? 2 : 1;
  const char *td = getenv("GRAFT_TEST_DEVICE");
  if (td && *td && fuzz_set_device(check_test_device())) return 2;
  char dname[32];
  printf("fuzz on %s: %s against %s\n", check_device_str(fuzz_dev, dname, sizeof dname),
         cmp_cc->name, cmp_ref->name);
  setup_cache_root();
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long failed = 0;
  if (test_seeds) {
    failed = fuzz_test_seeds() + train_test_seeds();
    printf("fuzz --test-seeds: 301 graphs and %d trained x 3 steps, %ld mismatching, %.1f s",
           TRAIN_TEST_SEEDS, failed, seconds_since(&t0));
  } else {
    for (long i = 0; i < count; i++) {
      unsigned long long seed = first + (unsigned long long)i;
      failed += (train ? train_one(seed, verbose) : fuzz_one(seed, verbose)) != 0;
    }
    printf("fuzz%s: %ld graphs%s, %ld mismatching, %.1f s", train ? " --train" : "", count,
           train ? " x 3 steps" : "", failed, seconds_since(&t0));
  }
  graft_metrics gm;
  graft_metrics_get(&gm);
  printf(" (compiles %llu, disk hits %llu, declined by the compiler %d, device uploads %llu, "
         "downloads %llu)", (unsigned long long)cpu_stats.compiles,
         (unsigned long long)cpu_stats.disk_hits, fuzz_declined,
         (unsigned long long)gm.device_uploads, (unsigned long long)gm.device_downloads);
  if (train || test_seeds) print_train_summary();
  printf("\n");
  nvrtc_summary();
  capture_free(&cap);
  if (train || test_seeds) graft_shutdown();
  cpu_pool_shutdown();
  cleanup_cache_root();
  return failed != 0;
}
