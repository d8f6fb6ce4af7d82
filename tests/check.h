/* A tiny test harness: TEST(name) functions registered by hand in main via RUN(name).
 * Prints "N passed, M failed" as its last line; exits non-zero on any failure. */
#ifndef GRAFT_CHECK_H
#define GRAFT_CHECK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#define RUN(name)                                                                           \
  do {                                                                                      \
    check_failed_in_test = 0;                                                               \
    name();                                                                                 \
    if (check_failed_in_test) {                                                             \
      check_failed++;                                                                       \
      fprintf(stderr, "FAIL %s\n", #name);                                                  \
    } else {                                                                                \
      check_passed++;                                                                       \
    }                                                                                       \
  } while (0)
/* The device the device-parametrized tests (test_composite, test_grad) make their inputs on:
 * GRAFT_TEST_DEVICE=n runs them on cpu:n (the Makefile runs them on cpu:0 and cpu:1). */
static inline int check_test_device(void) {
  const char *e = getenv("GRAFT_TEST_DEVICE");
  return e && *e ? atoi(e) : 0;
}

#define CHECK_DONE()                                                                        \
  (printf("%d passed, %d failed\n", check_passed, check_failed), check_failed ? 1 : 0)
#endif
