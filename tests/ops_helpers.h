/* Helpers shared by the per-op tests (test_ops_*.c): host-side dtype conversion, tensor
 * construction and read-back, error expectations. Each test file is its own program.
 * The suites are device-parametrized: every input is made on `dev` (GRAFT_TEST_DEVICE, see
 * check_test_device; ops_device_init sets it at the start of main), every result read must be
 * on that device, and the expected values are always computed here on the host. */
#ifndef GRAFT_OPS_HELPERS_H
#define GRAFT_OPS_HELPERS_H
#include "graft.h"
#include "check.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define U __attribute__((unused))


U static const graft_dtype ALL_DT[8] = {GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16,
                                      GRAFT_I32, GRAFT_I64, GRAFT_U8,  GRAFT_BOOL};
U static const graft_dtype FLOAT_DT[4] = {GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16};
U static const graft_dtype INT_DT[3] = {GRAFT_I32, GRAFT_I64, GRAFT_U8};
U static const graft_dtype NUM_DT[7] = {GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16,
                                      GRAFT_I32, GRAFT_I64, GRAFT_U8};

U static int is_flt(graft_dtype dt) {
  return dt == GRAFT_F32 || dt == GRAFT_F64 || dt == GRAFT_F16 || dt == GRAFT_BF16;
}

/* IEEE half <-> double, written here independently of graft (round to nearest even). */
U static uint16_t to_f16(double x) {
  uint16_t sign = signbit(x) ? 0x8000u : 0;
  if (isnan(x)) return 0x7e00u;
  x = fabs(x);
  if (x >= 65520.0) return (uint16_t)(sign | 0x7c00u);
  if (x < 0x1p-14) return (uint16_t)(sign | (uint16_t)nearbyint(x * 0x1p24));
  int e;
  double m = frexp(x, &e); /* x = m * 2^e, m in [0.5, 1) */
  double q = nearbyint(m * 2048.0);
  int E = e - 1 + 15;
  if (q == 2048.0) q = 1024.0, E++;
  if (E >= 31) return (uint16_t)(sign | 0x7c00u);
  return (uint16_t)(sign | (unsigned)E << 10 | ((unsigned)q - 1024u));
}
U static double from_f16(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return (h & 0x8000u) ? -v : v;
}
/* bfloat16 <-> double (the upper 16 bits of a float, round to nearest even). */
U static uint16_t to_bf16(double x) {
  float f = (float)x;
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7fc0u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
U static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Narrows an exact integer to dt, wrapping (two's complement) like a C cast through unsigned. */
U static int64_t wrap_to(graft_dtype dt, int64_t v) {
  switch (dt) {
  case GRAFT_I32: return (int32_t)(uint32_t)(uint64_t)v;
  case GRAFT_U8: return (uint8_t)(uint64_t)v;
  case GRAFT_BOOL: return v != 0;
  default: return v;
  }
}

/* The value dt stores for x (floats round; integers truncate toward zero). */
U static double q(graft_dtype dt, double x) {
  switch (dt) {
  case GRAFT_F32: return (float)x;
  case GRAFT_F64: return x;
  case GRAFT_F16: return from_f16(to_f16(x));
  case GRAFT_BF16: return from_bf16(to_bf16(x));
  case GRAFT_BOOL: return x != 0;
  default: return (double)wrap_to(dt, (int64_t)x);
  }
}

U static double tol_of(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F32: return 1e-5;
  case GRAFT_F64: return 1e-12;
  case GRAFT_F16: return 2e-3;
  case GRAFT_BF16: return 8e-3;
  default: return 0;
  }
}

U static void store_d(void *p, graft_dtype dt, int64_t i, double v) {
  switch (dt) {
  case GRAFT_F32: ((float *)p)[i] = (float)v; break;
  case GRAFT_F64: ((double *)p)[i] = v; break;
  case GRAFT_F16: ((uint16_t *)p)[i] = to_f16(v); break;
  case GRAFT_BF16: ((uint16_t *)p)[i] = to_bf16(v); break;
  case GRAFT_I32: ((int32_t *)p)[i] = (int32_t)wrap_to(dt, (int64_t)v); break;
  case GRAFT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
  case GRAFT_U8: ((uint8_t *)p)[i] = (uint8_t)wrap_to(dt, (int64_t)v); break;
  default: ((uint8_t *)p)[i] = v != 0; break;
  }
}
U static void store_i(void *p, graft_dtype dt, int64_t i, int64_t v) {
  switch (dt) {
  case GRAFT_I32: ((int32_t *)p)[i] = (int32_t)wrap_to(dt, v); break;
  case GRAFT_I64: ((int64_t *)p)[i] = v; break;
  case GRAFT_U8: ((uint8_t *)p)[i] = (uint8_t)wrap_to(dt, v); break;
  case GRAFT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  default: store_d(p, dt, i, (double)v); break;
  }
}
U static double load_d(const void *p, graft_dtype dt, int64_t i) {
  switch (dt) {
  case GRAFT_F32: return ((const float *)p)[i];
  case GRAFT_F64: return ((const double *)p)[i];
  case GRAFT_F16: return from_f16(((const uint16_t *)p)[i]);
  case GRAFT_BF16: return from_bf16(((const uint16_t *)p)[i]);
  case GRAFT_I32: return ((const int32_t *)p)[i];
  case GRAFT_I64: return (double)((const int64_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}
U static int64_t load_i(const void *p, graft_dtype dt, int64_t i) {
  switch (dt) {
  case GRAFT_I32: return ((const int32_t *)p)[i];
  case GRAFT_I64: return ((const int64_t *)p)[i];
  case GRAFT_U8: case GRAFT_BOOL: return ((const uint8_t *)p)[i];
  default: return (int64_t)load_d(p, dt, i);
  }
}

U static int64_t numel_of(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  return n;
}

/* The device every input is made on (GRAFT_TEST_DEVICE; cpu:0 by default). */
U static int dev;

/* Sets dev from GRAFT_TEST_DEVICE (check_test_device_for); -1 when there is no such device. */
U static int ops_device_init(const char *suite) {
  dev = check_test_device_for(suite);
  return dev < 0 ? -1 : 0;
}

/* A tensor of dt holding v (converted by the test's own converters) on device d. */
U static graft_tensor *mk_dev(graft_dtype dt, int nd, const int64_t *shape, const double *v, int d) {
  int64_t n = numel_of(nd, shape);
  void *buf = calloc((size_t)n + 1, 8);
  for (int64_t i = 0; i < n; i++) store_d(buf, dt, i, v[i]);
  graft_tensor *t = graft_from_host(buf, dt, nd, shape, d);
  free(buf);
  return t;
}
/* The same on the test device. */
U static graft_tensor *mk(graft_dtype dt, int nd, const int64_t *shape, const double *v) {
  return mk_dev(dt, nd, shape, v, dev);
}
U static graft_tensor *mk_i(graft_dtype dt, int nd, const int64_t *shape, const int64_t *v) {
  int64_t n = numel_of(nd, shape);
  void *buf = calloc((size_t)n + 1, 8);
  for (int64_t i = 0; i < n; i++) store_i(buf, dt, i, v[i]);
  graft_tensor *t = graft_from_host(buf, dt, nd, shape, dev);
  free(buf);
  return t;
}
/* 1-D helpers. */
U static graft_tensor *mk1(graft_dtype dt, int64_t n, const double *v) { return mk(dt, 1, &n, v); }
U static graft_tensor *mk1_i(graft_dtype dt, int64_t n, const int64_t *v) {
  return mk_i(dt, 1, &n, v);
}

/* Checks t's dtype and shape, and that t is on the inputs' device; prints what differs. */
U static int expect_meta(graft_tensor *t, graft_dtype dt, int nd, const int64_t *shape) {
  if (!t) {
    fprintf(stderr, "  tensor is NULL: %s\n", graft_last_error());
    return 0;
  }
  if (graft_device(t) != dev) {
    char a[32], b[32];
    fprintf(stderr, "  result on %s, inputs on %s\n", check_device_str(graft_device(t), a, sizeof a),
            check_device_str(dev, b, sizeof b));
    return 0;
  }
  int64_t s[GRAFT_MAX_DIMS];
  int tnd = graft_shape(t, s);
  int ok = graft_get_dtype(t) == dt && tnd == nd;
  for (int i = 0; ok && i < nd; i++) ok = s[i] == shape[i];
  if (!ok) {
    fprintf(stderr, "  meta: got %s ndim %d [", graft_dtype_name(graft_get_dtype(t)), tnd);
    for (int i = 0; i < tnd; i++) fprintf(stderr, "%s%lld", i ? "," : "", (long long)s[i]);
    fprintf(stderr, "], want %s ndim %d\n", graft_dtype_name(dt), nd);
  }
  return ok;
}

/* Syncs t and returns a fresh host copy of its n elements of dt (free it), or NULL after
 * printing why. */
U static void *fetch_host(graft_tensor *t, graft_dtype dt, int64_t n) {
  void *buf = calloc((size_t)n + 1, 8);
  graft_status st = graft_to_host(t, buf, (size_t)n * graft_dtype_size(dt));
  if (st == GRAFT_OK) return buf;
  fprintf(stderr, "  to_host failed (%d): %s\n", (int)st, graft_last_error());
  free(buf);
  return NULL;
}

/* Syncs t, checks dtype/shape, and compares every element with want (|a-b| <= tol*(1+|b|),
 * NaN matches NaN, inf matches the same inf). */
U static int expect_d(graft_tensor *t, graft_dtype dt, int nd, const int64_t *shape,
                    const double *want, double tol) {
  if (!expect_meta(t, dt, nd, shape)) return 0;
  int64_t n = numel_of(nd, shape);
  void *buf = fetch_host(t, dt, n);
  int ok = buf != NULL, shown = 0;
  for (int64_t i = 0; ok && i < n; i++) {
    double a = load_d(buf, dt, i), b = want[i];
    int good = (isnan(a) && isnan(b)) || a == b || fabs(a - b) <= tol * (1 + fabs(b));
    if (!good) {
      if (shown++ < 6)
        fprintf(stderr, "  [%s] element %lld: got %.9g, want %.9g\n", graft_dtype_name(dt),
                (long long)i, a, b);
    }
  }
  free(buf);
  return ok && !shown;
}
/* Exact integer comparison (also fine for i64 beyond 2^53). */
U static int expect_i(graft_tensor *t, graft_dtype dt, int nd, const int64_t *shape,
                    const int64_t *want) {
  if (!expect_meta(t, dt, nd, shape)) return 0;
  int64_t n = numel_of(nd, shape);
  void *buf = fetch_host(t, dt, n);
  int ok = buf != NULL, shown = 0;
  for (int64_t i = 0; ok && i < n; i++) {
    int64_t a = load_i(buf, dt, i);
    if (a != want[i] && shown++ < 6)
      fprintf(stderr, "  [%s] element %lld: got %lld, want %lld\n", graft_dtype_name(dt),
              (long long)i, (long long)a, (long long)want[i]);
  }
  free(buf);
  return ok && !shown;
}
U static int expect1_d(graft_tensor *t, graft_dtype dt, int64_t n, const double *want, double tol) {
  return expect_d(t, dt, 1, &n, want, tol);
}
U static int expect1_i(graft_tensor *t, graft_dtype dt, int64_t n, const int64_t *want) {
  return expect_i(t, dt, 1, &n, want);
}

/* Checks the thread's error is st and its message contains s1 (and s2 if not NULL), then clears
 * it. */
U static int expect_err(graft_status st, const char *s1, const char *s2) {
  graft_status got = graft_last_status();
  const char *msg = graft_last_error();
  int ok = got == st && (!s1 || strstr(msg, s1)) && (!s2 || strstr(msg, s2));
  if (!ok)
    fprintf(stderr, "  error: got status %d \"%s\", want status %d containing \"%s\" \"%s\"\n",
            (int)got, msg, (int)st, s1 ? s1 : "", s2 ? s2 : "");
  graft_clear_error();
  return ok;
}

/* A valid op still works (no corrupted state after an error). */
U static int sane(void) {
  graft_scope_begin();
  const double a[3] = {1, 2, 3}, b[3] = {10, 20, 30}, want[3] = {11, 22, 33};
  graft_tensor *s = graft_add(mk1(GRAFT_F32, 3, a), mk1(GRAFT_F32, 3, b));
  int ok = expect1_d(s, GRAFT_F32, 3, want, 0) && graft_last_status() == GRAFT_OK;
  graft_scope_end();
  if (!ok) fprintf(stderr, "  sanity op failed after an error\n");
  return ok;
}

/* Every test runs inside a scope and must leave no error behind. */
#define BEGIN() graft_scope_begin()
#define END()                                                                               \
  do {                                                                                      \
    if (graft_last_status() != GRAFT_OK) {                                                  \
      fprintf(stderr, "%s:%d: unexpected error left: %s\n", __FILE__, __LINE__,             \
              graft_last_error());                                                          \
      check_failed_in_test = 1;                                                             \
      graft_clear_error();                                                                  \
    }                                                                                       \
    graft_scope_end();                                                                      \
  } while (0)

/* Last test of every file: nothing leaked out of the scopes. */
TEST(test_no_live_tensors) {
  graft_metrics m;
  graft_metrics_get(&m);
  CHECK(m.live_tensors == 0);
  if (m.live_tensors) fprintf(stderr, "  %llu live tensors\n", (unsigned long long)m.live_tensors);
}

#endif
