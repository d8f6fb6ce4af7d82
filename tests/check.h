/* A tiny test harness: TEST(name) functions registered by hand in main via RUN(name).
 * Prints "N passed, M failed" as its last line; exits non-zero on any failure. */
#ifndef GRAFT_CHECK_H
#define GRAFT_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "graft.h"

static int check_failed_in_test;
static int check_passed, check_failed;

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);             \
      check_failed_in_test = 1;                                                             \
    }                                                                                       \
  } while (0)

/* |a-b| <= atol + rtol*|b|, NaN equal to NaN. */
#define CHECK_NEAR(a, b, tol)                                                               \
  do {                                                                                      \
    double ca_ = (a), cb_ = (b);                                                            \
    if (!((isnan(ca_) && isnan(cb_)) || fabs(ca_ - cb_) <= (tol) * (1 + fabs(cb_)))) {      \
      fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s = %.9g, %s = %.9g\n", __FILE__,        \
              __LINE__, #a, ca_, #b, cb_);                                                  \
      check_failed_in_test = 1;                                                             \
    }                                                                                       \
  } while (0)

#define TEST(name) static void name(void)
/* GRAFT_TEST_ONLY=name runs that test alone (while working on it; make test runs all). */
#define RUN(name)                                                                           \
  do {                                                                                      \
    const char *only_ = getenv("GRAFT_TEST_ONLY");                                          \
    if (only_ && *only_ && strcmp(only_, #name)) break;                                     \
    check_failed_in_test = 0;                                                               \
    name();                                                                                 \
    if (check_failed_in_test) {                                                             \
      check_failed++;                                                                       \
      fprintf(stderr, "FAIL %s\n", #name);                                                  \
    } else {                                                                                \
      check_passed++;                                                                       \
    }                                                                                       \
  } while (0)
/* The device the device-parametrized tests (test_ops_*, test_composite, test_grad, and
 * fuzz_graphs) make their inputs on: GRAFT_TEST_DEVICE=n runs them on device n, =opencl (=cuda,
 * =cuda:1) on that kind's first (that) device (the Makefile runs them on cpu:0, test_composite
 * and test_grad on cpu:1 too, all of them on opencl:0 in make check-opencl, where graft finds
 * one; scripts/gpu-check.sh on cuda). */
static inline int check_test_device(void) {
  const char *e = getenv("GRAFT_TEST_DEVICE");
  if (!e || !*e) return 0;
  if (*e >= '0' && *e <= '9') return atoi(e);
  char kind[16];
  const char *colon = strchr(e, ':');
  size_t n = colon ? (size_t)(colon - e) : strlen(e);
  snprintf(kind, sizeof kind, "%.*s", (int)(n < sizeof kind ? n : sizeof kind - 1), e);
  return graft_device_find(kind, colon ? atoi(colon + 1) : 0); /* -1: the suite says why */
}

/* How graft's errors name device id: "cpu:1", "opencl:0". */
static inline const char *check_device_str(int id, char *buf, size_t n) {
  const char *kind = graft_device_kind(id);
  int ordinal = 0;
  for (int i = 0; kind && i < id; i++) ordinal += !strcmp(graft_device_kind(i), kind);
  snprintf(buf, n, "%s:%d", kind ? kind : "?", ordinal);
  return buf;
}

/* check_test_device for suite, named on stdout; or -1 after saying why there is no such device
 * (a suite asked for a device graft does not have fails rather than running elsewhere). */
static inline int check_test_device_for(const char *suite) {
  int d = check_test_device();
  char s[32];
  if (d >= 0 && graft_device_kind(d)) {
    printf("%s on %s (%s)\n", suite, check_device_str(d, s, sizeof s), graft_device_name(d));
    return d;
  }
  bool found_none = graft_last_status() != GRAFT_OK; /* =opencl: graft_device_find said why */
  if (!found_none) snprintf(s, sizeof s, "ids are 0..%d", graft_device_count() - 1);
  fprintf(stderr, "%s: GRAFT_TEST_DEVICE=%s: no such device (%s)\n", suite,
          getenv("GRAFT_TEST_DEVICE"), found_none ? graft_last_error() : s);
  return -1;
}

/* The compiled pass (make check-compiled runs the suites with GRAFT_COMPILE=sync) must run
 * compiled code: a graph the compiler failed on would silently run on the first tier and pass.
 * So when the program started with GRAFT_COMPILE=sync, CHECK_DONE fails the run if graft's
 * metrics count any compile failure (native_compile_failures). Graphs the compiler declines
 * through its supports() are declared fallbacks, not failures. A test that breaks the compiler
 * on purpose through the tier must account for it (graft_metrics_reset() afterwards). */
static int check_started_sync;
__attribute__((constructor)) static void check_record_compile_mode(void) {
  const char *m = getenv("GRAFT_COMPILE");
  check_started_sync = m && !strcmp(m, "sync");
}

static inline void check_compile_failures(void) {
  if (!check_started_sync) return;
  graft_metrics m;
  graft_metrics_get(&m);
  if (m.native_compile_failures) {
    fprintf(stderr, "FAIL compiled pass: GRAFT_COMPILE=sync but %llu graph%s did not compile and "
            "ran on the first tier instead (native_compile_failures; graft's warning above names "
            "the compiler's error)\n", (unsigned long long)m.native_compile_failures,
            m.native_compile_failures > 1 ? "s" : "");
    check_failed++;
  }
}

/* The metrics now (tests compare counters before and after). */
static inline graft_metrics M(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  return m;
}

/* n floats of a deterministic pattern in [-scale, scale] (malloc'ed; the caller frees). */
static inline float *ramp(int64_t n, float scale) {
  float *v = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = scale * (float)((i * 37) % 101 - 50) / 50.0f;
  return v;
}

#define CHECK_DONE()                                                                        \
  (check_compile_failures(), printf("%d passed, %d failed\n", check_passed, check_failed),  \
   check_failed ? 1 : 0)
#endif
