/* Primitive op tests, elementwise part: unary, binary, compare, where, convert, scalar ops and
 * creation (full, iota, scalar, rand), every accepted dtype, plus dtype rejections. Public API
 * only; expectations are computed in plain C here, never by graft. */
#include "graft.h"
#include "check.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "ops_helpers.h"

/* ================= unary ================= */

static double r_neg(double x) { return -x; }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_sign(double x) { return x > 0 ? 1 : x < 0 ? -1 : x; }
static double r_recip(double x) { return 1 / x; }
static double r_round(double x) { /* half to even, by hand */
  double f = floor(x), d = x - f;
  if (d > 0.5 || (d == 0.5 && fmod(f, 2) != 0)) f += 1;
  return f;
}

typedef graft_tensor *(*unary_fn)(graft_tensor *);
static const struct {
  const char *name;
  unary_fn fn;
  double (*ref)(double);
} FLOAT_UNARY[] = {
    {"neg", graft_neg, r_neg},         {"abs", graft_abs, fabs},
    {"exp", graft_exp, exp},           {"log", graft_log, log},
    {"sqrt", graft_sqrt, sqrt},        {"rsqrt", graft_rsqrt, r_rsqrt},
    {"tanh", graft_tanh, tanh},        {"erf", graft_erf, erf},
    {"sigmoid", graft_sigmoid, r_sigmoid}, {"sin", graft_sin, sin},
    {"cos", graft_cos, cos},           {"floor", graft_floor, floor},
    {"ceil", graft_ceil, ceil},        {"round", graft_round, r_round},
    {"sign", graft_sign, r_sign},      {"reciprocal", graft_reciprocal, r_recip},
    {"log1p", graft_log1p, log1p},     {"expm1", graft_expm1, expm1},
    {"tan", graft_tan, tan},           {"sinh", graft_sinh, sinh},
    {"cosh", graft_cosh, cosh},        {"asinh", graft_asinh, asinh},
    {"exp2", graft_exp2, exp2},        {"erfc", graft_erfc, erfc},
    {"trunc", graft_trunc, trunc},
};
#define NFU (int)(sizeof FLOAT_UNARY / sizeof FLOAT_UNARY[0])

TEST(test_unary_float) {
  BEGIN();
  const double x[10] = {-2.5, -1, -0.5, 0, 0.5, 1, 1.5, 2.5, 3, -0.3};
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    graft_tensor *t = mk1(dt, 10, x);
    for (int k = 0; k < NFU; k++) {
      double want[10];
      for (int i = 0; i < 10; i++) want[i] = FLOAT_UNARY[k].ref(q(dt, x[i]));
      int ok = expect1_d(FLOAT_UNARY[k].fn(t), dt, 10, want, tol_of(dt));
      if (!ok) fprintf(stderr, "  op %s dtype %s\n", FLOAT_UNARY[k].name, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  /* hand-checked: round half to even, floor/ceil of negatives, sign of 0 */
  const double r[6] = {0.5, 1.5, 2.5, -0.5, -1.5, -2.5};
  const double rw[6] = {0, 2, 2, -0, -2, -2}, fw[6] = {0, 1, 2, -1, -2, -3}, cw[6] = {1, 2, 3, -0., -1, -2};
  CHECK(expect1_d(graft_round(mk1(GRAFT_F32, 6, r)), GRAFT_F32, 6, rw, 0));
  CHECK(expect1_d(graft_floor(mk1(GRAFT_F64, 6, r)), GRAFT_F64, 6, fw, 0));
  CHECK(expect1_d(graft_ceil(mk1(GRAFT_F16, 6, r)), GRAFT_F16, 6, cw, 0));
  END();
}

/* Ops defined on part of the line, each on inputs inside its domain (test_unary_float's inputs
 * would make NaN of most of them). */
static const struct {
  const char *name;
  unary_fn fn;
  double (*ref)(double);
  double x[6];
} DOMAIN_UNARY[] = {
    {"asin", graft_asin, asin, {-0.9, -0.5, -0.25, 0, 0.3, 0.75}},
    {"acos", graft_acos, acos, {-0.9, -0.5, -0.25, 0, 0.3, 0.75}},
    {"atanh", graft_atanh, atanh, {-0.9, -0.5, -0.25, 0, 0.3, 0.75}},
    {"acosh", graft_acosh, acosh, {1, 1.25, 1.5, 2, 3, 10}},
    {"log2", graft_log2, log2, {0.125, 0.5, 1, 2, 3.5, 10}},
    {"log10", graft_log10, log10, {0.125, 0.5, 1, 2, 3.5, 10}},
};
#define NDU (int)(sizeof DOMAIN_UNARY / sizeof DOMAIN_UNARY[0])

TEST(test_unary_float_domains) {
  BEGIN();
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    for (int k = 0; k < NDU; k++) {
      double want[6];
      for (int i = 0; i < 6; i++) want[i] = DOMAIN_UNARY[k].ref(q(dt, DOMAIN_UNARY[k].x[i]));
      int ok = expect1_d(DOMAIN_UNARY[k].fn(mk1(dt, 6, DOMAIN_UNARY[k].x)), dt, 6, want, tol_of(dt));
      if (!ok) fprintf(stderr, "  op %s dtype %s\n", DOMAIN_UNARY[k].name, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  END();
}

TEST(test_unary_float_properties) {
  BEGIN();
  const double x[6] = {0.125, 0.5, 1, 2, 3.5, 10};
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    double qx[6];
    for (int i = 0; i < 6; i++) qx[i] = q(dt, x[i]);
    graft_tensor *t = mk1(dt, 6, x);
    /* exp(log(x)) ~ x, sqrt(x)^2 ~ x, rsqrt(x)*sqrt(x) ~ 1, sin^2+cos^2 ~ 1, tanh odd */
    double tol = 4 * tol_of(dt), one[6] = {1, 1, 1, 1, 1, 1}, zero[6] = {0};
    CHECK(expect1_d(graft_exp(graft_log(t)), dt, 6, qx, tol));
    graft_tensor *s = graft_sqrt(t);
    CHECK(expect1_d(graft_mul(s, s), dt, 6, qx, tol));
    CHECK(expect1_d(graft_mul(graft_rsqrt(t), s), dt, 6, one, tol));
    graft_tensor *sn = graft_sin(t), *cs = graft_cos(t);
    CHECK(expect1_d(graft_add(graft_mul(sn, sn), graft_mul(cs, cs)), dt, 6, one, tol));
    CHECK(expect1_d(graft_add(graft_tanh(t), graft_tanh(graft_neg(t))), dt, 6, zero, tol));
    CHECK(expect1_d(graft_log1p(graft_expm1(t)), dt, 6, qx, tol));
  }
  END();
}

TEST(test_unary_int) {
  BEGIN();
  const int64_t x32[5] = {5, -3, 0, INT32_MIN, INT32_MAX};
  const int64_t neg32[5] = {-5, 3, 0, INT32_MIN, -INT32_MAX}, abs32[5] = {5, 3, 0, INT32_MIN, INT32_MAX};
  const int64_t sgn[5] = {1, -1, 0, -1, 1}, not32[5] = {-6, 2, -1, INT32_MAX, INT32_MIN};
  graft_tensor *a = mk1_i(GRAFT_I32, 5, x32);
  CHECK(expect1_i(graft_neg(a), GRAFT_I32, 5, neg32));
  CHECK(expect1_i(graft_abs(a), GRAFT_I32, 5, abs32));
  CHECK(expect1_i(graft_sign(a), GRAFT_I32, 5, sgn));
  CHECK(expect1_i(graft_logical_not(a), GRAFT_I32, 5, not32));

  const int64_t x64[5] = {5, -3, 0, INT64_MIN, INT64_MAX};
  const int64_t neg64[5] = {-5, 3, 0, INT64_MIN, -INT64_MAX}, abs64[5] = {5, 3, 0, INT64_MIN, INT64_MAX};
  const int64_t not64[5] = {-6, 2, -1, INT64_MAX, INT64_MIN};
  graft_tensor *b = mk1_i(GRAFT_I64, 5, x64);
  CHECK(expect1_i(graft_neg(b), GRAFT_I64, 5, neg64));
  CHECK(expect1_i(graft_abs(b), GRAFT_I64, 5, abs64));
  CHECK(expect1_i(graft_sign(b), GRAFT_I64, 5, sgn));
  CHECK(expect1_i(graft_logical_not(b), GRAFT_I64, 5, not64));

  const int64_t xu[5] = {5, 200, 0, 255, 1};
  const int64_t negu[5] = {251, 56, 0, 1, 255}, sgnu[5] = {1, 1, 0, 1, 1}, notu[5] = {250, 55, 255, 0, 254};
  graft_tensor *c = mk1_i(GRAFT_U8, 5, xu);
  CHECK(expect1_i(graft_neg(c), GRAFT_U8, 5, negu));
  CHECK(expect1_i(graft_abs(c), GRAFT_U8, 5, xu));
  CHECK(expect1_i(graft_sign(c), GRAFT_U8, 5, sgnu));
  CHECK(expect1_i(graft_logical_not(c), GRAFT_U8, 5, notu));

  const int64_t xb[2] = {0, 1}, nb[2] = {1, 0};
  CHECK(expect1_i(graft_logical_not(mk1_i(GRAFT_BOOL, 2, xb)), GRAFT_BOOL, 2, nb));
  END();
}

/* An op refusing a dtype: GRAFT_ERR_DTYPE and a message naming the dtype. */
static int rejects1(unary_fn fn, graft_dtype dt, const char *opname) {
  graft_scope_begin();
  const double v[2] = {1, 0};
  graft_tensor *t = mk1(dt, 2, v);
  graft_tensor *r = fn(t);
  int ok = r == NULL && expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(dt), NULL);
  if (!ok) fprintf(stderr, "  %s on %s was not rejected\n", opname, graft_dtype_name(dt));
  graft_scope_end();
  return ok;
}

TEST(test_unary_dtype_rejects) {
  const graft_dtype nonfloat[4] = {GRAFT_I32, GRAFT_I64, GRAFT_U8, GRAFT_BOOL};
  for (int k = 0; k < NFU; k++) {
    int num = FLOAT_UNARY[k].fn == graft_neg || FLOAT_UNARY[k].fn == graft_abs ||
              FLOAT_UNARY[k].fn == graft_sign;
    for (int d = num ? 3 : 0; d < 4; d++) CHECK(rejects1(FLOAT_UNARY[k].fn, nonfloat[d], FLOAT_UNARY[k].name));
  }
  for (int k = 0; k < NDU; k++)
    for (int d = 0; d < 4; d++) CHECK(rejects1(DOMAIN_UNARY[k].fn, nonfloat[d], DOMAIN_UNARY[k].name));
  for (int d = 0; d < 4; d++) CHECK(rejects1(graft_logical_not, FLOAT_DT[d], "logical_not"));
  CHECK(sane());
}

/* ================= binary ================= */

typedef graft_tensor *(*binary_fn)(graft_tensor *, graft_tensor *);

static double r_max(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }
static double r_min(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }

TEST(test_binary_float) {
  BEGIN();
  const double a[9] = {1.5, -2, 3, 0.25, -0.5, 4, 7, -7, 0};
  const double b[9] = {2, 0.5, -3, 4, -0.25, 0, 2, 2.5, 0};
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    graft_tensor *x = mk1(dt, 9, a), *y = mk1(dt, 9, b);
    double w[8][9];
    for (int i = 0; i < 9; i++) {
      double p = q(dt, a[i]), r = q(dt, b[i]);
      w[0][i] = p + r, w[1][i] = p - r, w[2][i] = p * r, w[3][i] = p / r;
      w[4][i] = pow(p, r), w[5][i] = r_max(p, r), w[6][i] = r_min(p, r), w[7][i] = fmod(p, r);
    }
    const binary_fn fns[8] = {graft_add, graft_sub, graft_mul, graft_div,
                              graft_pow, graft_maximum, graft_minimum, graft_rem};
    for (int k = 0; k < 8; k++) {
      int ok = expect1_d(fns[k](x, y), dt, 9, w[k], tol_of(dt));
      if (!ok) fprintf(stderr, "  binary op #%d dtype %s\n", k, graft_dtype_name(dt));
      CHECK(ok);
    }
    /* NaN propagates through maximum/minimum from either side */
    const double na[3] = {NAN, 1, NAN}, nb[3] = {1, NAN, NAN}, nn[3] = {NAN, NAN, NAN};
    graft_tensor *p = mk1(dt, 3, na), *r = mk1(dt, 3, nb);
    CHECK(expect1_d(graft_maximum(p, r), dt, 3, nn, 0));
    CHECK(expect1_d(graft_minimum(p, r), dt, 3, nn, 0));
  }
  /* hand-checked: 1/0 = inf, 0/0 = NaN, fmod keeps the sign of a */
  const double hx[4] = {1, -1, 0, -7}, hy[4] = {0, 0, 0, 2.5}, hd[4] = {INFINITY, -INFINITY, NAN, -2.8};
  const double hr[4] = {NAN, NAN, NAN, -2};
  CHECK(expect1_d(graft_div(mk1(GRAFT_F64, 4, hx), mk1(GRAFT_F64, 4, hy)), GRAFT_F64, 4, hd, 1e-12));
  CHECK(expect1_d(graft_rem(mk1(GRAFT_F64, 4, hx), mk1(GRAFT_F64, 4, hy)), GRAFT_F64, 4, hr, 1e-12));
  END();
}

/* Hand-checked integer tables: wraparound, truncation toward zero, /0 and %0 give 0. */
TEST(test_binary_int_hand) {
  BEGIN();
  const binary_fn fns[7] = {graft_add, graft_sub, graft_mul, graft_div, graft_rem, graft_maximum, graft_minimum};
  const char *names[7] = {"add", "sub", "mul", "div", "rem", "maximum", "minimum"};
  {
    const int64_t a[8] = {INT32_MAX, -7, 7, 7, INT32_MIN, 65536, -3, 100};
    const int64_t b[8] = {1, 2, -2, 0, -1, 65536, 7, 3};
    const int64_t w[7][8] = {
        {INT32_MIN, -5, 5, 7, INT32_MAX, 131072, 4, 103},
        {INT32_MAX - 1, -9, 9, 7, INT32_MIN + 1, 0, -10, 97},
        {INT32_MAX, -14, -14, 0, INT32_MIN, 0, -21, 300},
        {INT32_MAX, -3, -3, 0, INT32_MIN, 1, 0, 33},
        {0, -1, 1, 0, 0, 0, -3, 1},
        {INT32_MAX, 2, 7, 7, -1, 65536, 7, 100},
        {1, -7, -2, 0, INT32_MIN, 65536, -3, 3}};
    graft_tensor *x = mk1_i(GRAFT_I32, 8, a), *y = mk1_i(GRAFT_I32, 8, b);
    for (int k = 0; k < 7; k++) {
      int ok = expect1_i(fns[k](x, y), GRAFT_I32, 8, w[k]);
      if (!ok) fprintf(stderr, "  i32 %s\n", names[k]);
      CHECK(ok);
    }
  }
  {
    const int64_t P = INT64_C(1) << 32;
    const int64_t a[8] = {INT64_MAX, -7, 7, 7, INT64_MIN, P, -3, 100};
    const int64_t b[8] = {1, 2, -2, 0, -1, P, 7, 3};
    const int64_t w[7][8] = {
        {INT64_MIN, -5, 5, 7, INT64_MAX, 2 * P, 4, 103},
        {INT64_MAX - 1, -9, 9, 7, INT64_MIN + 1, 0, -10, 97},
        {INT64_MAX, -14, -14, 0, INT64_MIN, 0, -21, 300},
        {INT64_MAX, -3, -3, 0, INT64_MIN, 1, 0, 33},
        {0, -1, 1, 0, 0, 0, -3, 1},
        {INT64_MAX, 2, 7, 7, -1, P, 7, 100},
        {1, -7, -2, 0, INT64_MIN, P, -3, 3}};
    graft_tensor *x = mk1_i(GRAFT_I64, 8, a), *y = mk1_i(GRAFT_I64, 8, b);
    for (int k = 0; k < 7; k++) {
      int ok = expect1_i(fns[k](x, y), GRAFT_I64, 8, w[k]);
      if (!ok) fprintf(stderr, "  i64 %s\n", names[k]);
      CHECK(ok);
    }
  }
  {
    const int64_t a[8] = {250, 3, 16, 7, 200, 255, 0, 100};
    const int64_t b[8] = {10, 5, 20, 0, 7, 255, 9, 3};
    const int64_t w[7][8] = {
        {4, 8, 36, 7, 207, 254, 9, 103},
        {240, 254, 252, 7, 193, 0, 247, 97},
        {196, 15, 64, 0, 120, 1, 0, 44},
        {25, 0, 0, 0, 28, 1, 0, 33},
        {0, 3, 16, 0, 4, 0, 0, 1},
        {250, 5, 20, 7, 200, 255, 9, 100},
        {10, 3, 16, 0, 7, 255, 0, 3}};
    graft_tensor *x = mk1_i(GRAFT_U8, 8, a), *y = mk1_i(GRAFT_U8, 8, b);
    for (int k = 0; k < 7; k++) {
      int ok = expect1_i(fns[k](x, y), GRAFT_U8, 8, w[k]);
      if (!ok) fprintf(stderr, "  u8 %s\n", names[k]);
      CHECK(ok);
    }
  }
  END();
}

/* Integer binary ops over a grid of operands against a reference in exact int64 + wrap. */
static int64_t int_ref(int k, graft_dtype dt, int64_t a, int64_t b) {
  uint64_t ua = (uint64_t)a, ub = (uint64_t)b;
  int64_t r;
  switch (k) {
  case 0: r = (int64_t)(ua + ub); break;
  case 1: r = (int64_t)(ua - ub); break;
  case 2: r = (int64_t)(ua * ub); break;
  case 3: r = b == 0 ? 0 : a / b; break; /* C division truncates toward zero */
  case 4: r = b == 0 ? 0 : a % b; break;
  case 5: r = a > b ? a : b; break;
  default: r = a < b ? a : b; break;
  }
  return wrap_to(dt, r);
}

TEST(test_binary_int_grid) {
  BEGIN();
  const binary_fn fns[7] = {graft_add, graft_sub, graft_mul, graft_div, graft_rem, graft_maximum, graft_minimum};
  const int64_t sv[7] = {-100, -7, -1, 0, 3, 9, 120}, uv[7] = {0, 1, 3, 7, 50, 128, 255};
  for (int d = 0; d < 3; d++) {
    graft_dtype dt = INT_DT[d];
    const int64_t *v = dt == GRAFT_U8 ? uv : sv;
    int64_t a[49], b[49], w[49];
    for (int i = 0; i < 49; i++) a[i] = v[i / 7], b[i] = v[i % 7];
    graft_tensor *x = mk1_i(dt, 49, a), *y = mk1_i(dt, 49, b);
    for (int k = 0; k < 7; k++) {
      for (int i = 0; i < 49; i++) w[i] = int_ref(k, dt, a[i], b[i]);
      int ok = expect1_i(fns[k](x, y), dt, 49, w);
      if (!ok) fprintf(stderr, "  op #%d dtype %s\n", k, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  END();
}

TEST(test_logical) {
  BEGIN();
  const int64_t ba[4] = {0, 0, 1, 1}, bb[4] = {0, 1, 0, 1};
  const int64_t band[4] = {0, 0, 0, 1}, bor[4] = {0, 1, 1, 1}, bxor[4] = {0, 1, 1, 0};
  graft_tensor *p = mk1_i(GRAFT_BOOL, 4, ba), *r = mk1_i(GRAFT_BOOL, 4, bb);
  CHECK(expect1_i(graft_logical_and(p, r), GRAFT_BOOL, 4, band));
  CHECK(expect1_i(graft_logical_or(p, r), GRAFT_BOOL, 4, bor));
  CHECK(expect1_i(graft_logical_xor(p, r), GRAFT_BOOL, 4, bxor));

  const int64_t ia[4] = {12, -1, 0, 0x0F}, ib[4] = {10, 5, 7, 0xF0};
  const int64_t iand[4] = {8, 5, 0, 0}, ior[4] = {14, -1, 7, 0xFF}, ixor[4] = {6, -6, 7, 0xFF};
  for (int d = 0; d < 2; d++) {
    graft_dtype dt = INT_DT[d];
    graft_tensor *x = mk1_i(dt, 4, ia), *y = mk1_i(dt, 4, ib);
    CHECK(expect1_i(graft_logical_and(x, y), dt, 4, iand));
    CHECK(expect1_i(graft_logical_or(x, y), dt, 4, ior));
    CHECK(expect1_i(graft_logical_xor(x, y), dt, 4, ixor));
  }
  const int64_t ua[4] = {12, 255, 0, 0x0F};
  const int64_t uand[4] = {8, 5, 0, 0}, uor[4] = {14, 255, 7, 255}, uxor[4] = {6, 250, 7, 255};
  graft_tensor *x = mk1_i(GRAFT_U8, 4, ua), *y = mk1_i(GRAFT_U8, 4, ib);
  CHECK(expect1_i(graft_logical_and(x, y), GRAFT_U8, 4, uand));
  CHECK(expect1_i(graft_logical_or(x, y), GRAFT_U8, 4, uor));
  CHECK(expect1_i(graft_logical_xor(x, y), GRAFT_U8, 4, uxor));
  END();
}

static int rejects2(binary_fn fn, graft_dtype dt, const char *opname) {
  graft_scope_begin();
  const double v[2] = {1, 0};
  graft_tensor *r = fn(mk1(dt, 2, v), mk1(dt, 2, v));
  int ok = r == NULL && expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(dt), NULL);
  if (!ok) fprintf(stderr, "  %s on %s was not rejected\n", opname, graft_dtype_name(dt));
  graft_scope_end();
  return ok;
}

TEST(test_binary_dtype_rejects) {
  const binary_fn num[7] = {graft_add, graft_sub, graft_mul, graft_div, graft_maximum, graft_minimum, graft_rem};
  for (int k = 0; k < 7; k++) CHECK(rejects2(num[k], GRAFT_BOOL, "numeric binary op"));
  const graft_dtype nonfloat[4] = {GRAFT_I32, GRAFT_I64, GRAFT_U8, GRAFT_BOOL};
  for (int d = 0; d < 4; d++) CHECK(rejects2(graft_pow, nonfloat[d], "pow"));
  const binary_fn lg[3] = {graft_logical_and, graft_logical_or, graft_logical_xor};
  for (int k = 0; k < 3; k++)
    for (int d = 0; d < 4; d++) CHECK(rejects2(lg[k], FLOAT_DT[d], "logical op"));
  /* scalar forms follow their op's dtype rules */
  BEGIN();
  const double v[2] = {1, 2};
  CHECK(graft_pow_scalar(mk1(GRAFT_I32, 2, v), 2) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "i32", NULL));
  CHECK(graft_add_scalar(mk1(GRAFT_BOOL, 2, v), 1) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  END();
  CHECK(sane());
}

TEST(test_compare) {
  BEGIN();
  const double a[4] = {1, 2, 3, 0}, b[4] = {2, 2, 1, 0};
  const double ba[4] = {0, 1, 1, 0}, bb[4] = {1, 1, 0, 0};
  const int64_t w[6][4] = {{0, 1, 0, 1}, {1, 0, 1, 0}, {1, 0, 0, 0},
                           {1, 1, 0, 1}, {0, 0, 1, 0}, {0, 1, 1, 1}};
  const binary_fn fns[6] = {graft_eq, graft_ne, graft_lt, graft_le, graft_gt, graft_ge};
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    int isb = dt == GRAFT_BOOL;
    graft_tensor *x = mk1(dt, 4, isb ? ba : a), *y = mk1(dt, 4, isb ? bb : b);
    for (int k = 0; k < 6; k++) {
      int ok = expect1_i(fns[k](x, y), GRAFT_BOOL, 4, w[k]);
      if (!ok) fprintf(stderr, "  compare #%d dtype %s\n", k, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  /* NaN: every comparison false except ne */
  for (int d = 0; d < 4; d++) {
    const double na[3] = {NAN, 1, NAN}, nb[3] = {1, NAN, NAN};
    graft_tensor *x = mk1(FLOAT_DT[d], 3, na), *y = mk1(FLOAT_DT[d], 3, nb);
    const int64_t f[3] = {0, 0, 0}, t[3] = {1, 1, 1};
    for (int k = 0; k < 6; k++) CHECK(expect1_i(fns[k](x, y), GRAFT_BOOL, 3, k == 1 ? t : f));
  }
  /* i64 beyond 2^53 compares exactly; u8 compares unsigned */
  const int64_t la[2] = {(INT64_C(1) << 53), INT64_MAX}, lb[2] = {(INT64_C(1) << 53) + 1, INT64_MAX - 1};
  const int64_t lt[2] = {1, 0}, eq[2] = {0, 0};
  graft_tensor *x = mk1_i(GRAFT_I64, 2, la), *y = mk1_i(GRAFT_I64, 2, lb);
  CHECK(expect1_i(graft_lt(x, y), GRAFT_BOOL, 2, lt));
  CHECK(expect1_i(graft_eq(x, y), GRAFT_BOOL, 2, eq));
  const int64_t ua[2] = {200, 1}, ub[2] = {100, 255}, gt[2] = {1, 0};
  CHECK(expect1_i(graft_gt(mk1_i(GRAFT_U8, 2, ua), mk1_i(GRAFT_U8, 2, ub)), GRAFT_BOOL, 2, gt));
  END();
}

TEST(test_binary_broadcast) {
  BEGIN();
  const double a[6] = {1, 2, 3, 4, 5, 6}, r3[3] = {10, 20, 30}, c2[2] = {1, 2};
  const int64_t s23[2] = {2, 3}, s3[1] = {3}, s21[2] = {2, 1}, s13[2] = {1, 3};
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    double tol = tol_of(dt);
    graft_tensor *x = mk(dt, 2, s23, a);
    const double w1[6] = {11, 22, 33, 14, 25, 36};
    CHECK(expect_d(graft_add(x, mk(dt, 1, s3, r3)), dt, 2, s23, w1, tol));
    CHECK(expect_d(graft_add(mk(dt, 1, s3, r3), x), dt, 2, s23, w1, tol));
    const double w2[6] = {10, 20, 30, 20, 40, 60};
    CHECK(expect_d(graft_mul(mk(dt, 2, s21, c2), mk(dt, 2, s13, r3)), dt, 2, s23, w2, tol));
    const double w3[6] = {3, 4, 5, 6, 7, 8};
    CHECK(expect_d(graft_add(x, graft_scalar_on(2, dt, dev)), dt, 2, s23, w3, tol));
  }
  END();
}

TEST(test_scalar_ops) {
  BEGIN();
  const double a[4] = {1, 2, 4, 9};
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    double tol = tol_of(dt);
    graft_tensor *x = mk1(dt, 4, a);
    const double wa[4] = {1.5, 2.5, 4.5, 9.5}, wm[4] = {-3, -6, -12, -27}, wd[4] = {0.25, 0.5, 1, 2.25};
    const double wp[4] = {1, 1.4142135623730951, 2, 3};
    CHECK(expect1_d(graft_add_scalar(x, 0.5), dt, 4, wa, tol));
    CHECK(expect1_d(graft_mul_scalar(x, -3), dt, 4, wm, tol));
    CHECK(expect1_d(graft_div_scalar(x, 4), dt, 4, wd, tol));
    CHECK(expect1_d(graft_pow_scalar(x, 0.5), dt, 4, wp, tol));
  }
  const int64_t ia[4] = {7, -7, 100, 0};
  const int64_t wa[4] = {9, -5, 102, 2}, wd[4] = {3, -3, 50, 0}, wm[4] = {21, -21, 300, 0};
  graft_tensor *x = mk1_i(GRAFT_I32, 4, ia);
  CHECK(expect1_i(graft_add_scalar(x, 2), GRAFT_I32, 4, wa));
  CHECK(expect1_i(graft_div_scalar(x, 2), GRAFT_I32, 4, wd));
  CHECK(expect1_i(graft_mul_scalar(x, 3), GRAFT_I32, 4, wm));
  const int64_t ua[2] = {250, 3}, uw[2] = {4, 13};
  CHECK(expect1_i(graft_add_scalar(mk1_i(GRAFT_U8, 2, ua), 10), GRAFT_U8, 2, uw));
  END();
}

TEST(test_where) {
  BEGIN();
  const int64_t s21[2] = {2, 1}, s23[2] = {2, 3};
  const double c[2] = {1, 0}, a[6] = {1, 2, 3, 4, 5, 6}, b6[6] = {0, 1, 0, 1, 1, 0};
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    int isb = dt == GRAFT_BOOL;
    graft_tensor *cond = mk(GRAFT_BOOL, 2, s21, c);
    graft_tensor *x = mk(dt, 2, s23, isb ? b6 : a);
    graft_tensor *y = graft_full_on(isb ? 1 : 9, dt, 0, NULL, dev);
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = i < 3 ? (isb ? b6[i] : a[i]) : (isb ? 1 : 9);
    int ok = expect_d(graft_where(cond, x, y), dt, 2, s23, w, tol_of(dt));
    if (!ok) fprintf(stderr, "  where dtype %s\n", graft_dtype_name(dt));
    CHECK(ok);
  }
  /* elementwise condition from a comparison */
  graft_tensor *x = mk(GRAFT_F32, 2, s23, a);
  const double w2[6] = {0, 0, 0, 4, 5, 6};
  graft_tensor *zero = graft_zeros_on(GRAFT_F32, 0, NULL, dev);
  CHECK(expect_d(graft_where(graft_gt(x, graft_scalar_on(3, GRAFT_F32, dev)), x, zero), GRAFT_F32,
                 2, s23, w2, 0));
  /* non-bool condition, mismatched branches */
  CHECK(graft_where(mk(GRAFT_I32, 2, s21, c), x, x) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "i32", NULL));
  CHECK(graft_where(mk(GRAFT_BOOL, 2, s21, c), x, mk(GRAFT_F64, 2, s23, a)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f64", "f32"));
  END();
}

TEST(test_convert) {
  BEGIN();
  /* every pair of dtypes on small values */
  const double v[4] = {0, 1, 2, 3}, vb[4] = {0, 1, 1, 0};
  for (int s = 0; s < 8; s++)
    for (int d = 0; d < 8; d++) {
      graft_dtype from = ALL_DT[s], to = ALL_DT[d];
      const double *src = from == GRAFT_BOOL ? vb : v;
      double w[4];
      for (int i = 0; i < 4; i++) w[i] = to == GRAFT_BOOL ? src[i] != 0 : src[i];
      int ok = expect1_d(graft_convert(mk1(from, 4, src), to), to, 4, w, 0);
      if (!ok) fprintf(stderr, "  convert %s -> %s\n", graft_dtype_name(from), graft_dtype_name(to));
      CHECK(ok);
    }
  /* float -> int truncates toward zero; -> bool is != 0 */
  const double f[5] = {-2.7, 2.7, -0.5, 3.99, 255.5};
  const int64_t ti[5] = {-2, 2, 0, 3, 255};
  for (int s = 0; s < 4; s++) {
    graft_tensor *x = mk1(FLOAT_DT[s], 5, f);
    int64_t tw[5];
    for (int i = 0; i < 5; i++) tw[i] = (int64_t)trunc(q(FLOAT_DT[s], f[i])); /* bf16: 255.5 -> 256 */
    CHECK(tw[0] == ti[0] && tw[1] == ti[1] && tw[3] == ti[3]);
    CHECK(expect1_i(graft_convert(x, GRAFT_I32), GRAFT_I32, 5, tw));
    CHECK(expect1_i(graft_convert(x, GRAFT_I64), GRAFT_I64, 5, tw));
  }
  const double fu[4] = {2.7, 0.5, 3.99, 255.5};
  const int64_t tu[4] = {2, 0, 3, 255};
  CHECK(expect1_i(graft_convert(mk1(GRAFT_F32, 4, fu), GRAFT_U8), GRAFT_U8, 4, tu));
  const double fb[5] = {0, -0.5, 2, -0.0, 1e-30};
  const int64_t tb[5] = {0, 1, 1, 0, 1};
  CHECK(expect1_i(graft_convert(mk1(GRAFT_F64, 5, fb), GRAFT_BOOL), GRAFT_BOOL, 5, tb));
  /* int -> int wraps */
  const int64_t i32[4] = {300, -1, 256, 7}, u8w[4] = {44, 255, 0, 7};
  CHECK(expect1_i(graft_convert(mk1_i(GRAFT_I32, 4, i32), GRAFT_U8), GRAFT_U8, 4, u8w));
  const int64_t i64[3] = {(INT64_C(1) << 32) + 5, -1, (INT64_C(1) << 31)};
  const int64_t i32w[3] = {5, -1, INT32_MIN};
  CHECK(expect1_i(graft_convert(mk1_i(GRAFT_I64, 3, i64), GRAFT_I32), GRAFT_I32, 3, i32w));
  const int64_t big[1] = {(INT64_C(1) << 53) + 1};
  CHECK(expect1_i(graft_convert(mk1_i(GRAFT_I64, 1, big), GRAFT_I64), GRAFT_I64, 1, big));
  /* f64 -> f16 / bf16 round to nearest even (bits against the test's own converters) */
  const double h[7] = {1.0 / 3, 0.1, 65504, 70000, 1e-6, -2.5, 1 + 0x1p-11};
  graft_tensor *x = mk1(GRAFT_F64, 7, h);
  uint16_t got[7];
  CHECK(graft_to_host(graft_convert(x, GRAFT_F16), got, sizeof got) == GRAFT_OK);
  for (int i = 0; i < 7; i++) {
    if (got[i] != to_f16(h[i])) fprintf(stderr, "  f16 of %g: got %04x want %04x\n", h[i], got[i], to_f16(h[i]));
    CHECK(got[i] == to_f16(h[i]));
  }
  CHECK(graft_to_host(graft_convert(x, GRAFT_BF16), got, sizeof got) == GRAFT_OK);
  for (int i = 0; i < 7; i++) {
    if (got[i] != to_bf16(h[i])) fprintf(stderr, "  bf16 of %g: got %04x want %04x\n", h[i], got[i], to_bf16(h[i]));
    CHECK(got[i] == to_bf16(h[i]));
  }
  /* float -> integer -> float gives +0 for (-1, 0), not trunc()'s -0 (compiled code once
   * folded the round trip): 1 / that is +inf */
  const double fr[4] = {-0.5, 0.5, -0.0, -1.5}, inv[4] = {INFINITY, INFINITY, INFINITY, -1};
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < 2; k++) {
      graft_dtype ft = s ? GRAFT_F64 : GRAFT_F32, it = k ? GRAFT_I64 : GRAFT_I32;
      graft_tensor *y = graft_convert(graft_convert(mk1(ft, 4, fr), it), ft);
      CHECK(expect1_d(graft_div(graft_ones_on(ft, 1, (int64_t[]){4}, graft_device(y)), y), ft, 4, inv, 0));
    }
  /* half -> f32 is exact, and a round trip through f32 keeps the bits */
  CHECK(to_f16(1.0) == 0x3c00 && to_bf16(1.0) == 0x3f80 && from_f16(0x7bff) == 65504);
  graft_tensor *hx = mk1(GRAFT_F16, 7, h);
  CHECK(graft_to_host(graft_convert(graft_convert(hx, GRAFT_F32), GRAFT_F16), got, sizeof got) == GRAFT_OK);
  for (int i = 0; i < 7; i++) CHECK(got[i] == to_f16(h[i]));
  END();
}

/* ================= creation ================= */

TEST(test_full_zeros_ones) {
  BEGIN();
  const int64_t s[2] = {2, 3};
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = q(dt, 2.5);
    CHECK(expect_d(graft_full_on(2.5, dt, 2, s, dev), dt, 2, s, w, 0));
    for (int i = 0; i < 6; i++) w[i] = 0;
    CHECK(expect_d(graft_zeros_on(dt, 2, s, dev), dt, 2, s, w, 0));
    for (int i = 0; i < 6; i++) w[i] = 1;
    CHECK(expect_d(graft_ones_on(dt, 2, s, dev), dt, 2, s, w, 0));
    double one = -1;
    CHECK(graft_item(graft_full_on(dt == GRAFT_BOOL ? 1 : 7, dt, 0, NULL, dev), &one) == GRAFT_OK);
    CHECK(one == (dt == GRAFT_BOOL ? 1 : 7));
  }
  END();
}

TEST(test_iota) {
  BEGIN();
  const int64_t s[2] = {3, 4};
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    double w0[12], w1[12];
    for (int i = 0; i < 12; i++) w0[i] = i / 4, w1[i] = i % 4;
    CHECK(expect_d(graft_iota_on(dt, 2, s, 0, dev), dt, 2, s, w0, 0));
    CHECK(expect_d(graft_iota_on(dt, 2, s, 1, dev), dt, 2, s, w1, 0));
    CHECK(expect_d(graft_iota_on(dt, 2, s, -1, dev), dt, 2, s, w1, 0));
    /* sum of iota(n) = n(n-1)/2 (u8 wraps mod 256) */
    int64_t n = 100;
    double want = dt == GRAFT_U8 ? (4950 % 256) : 4950;
    double got = -1;
    graft_tensor *s = graft_sum(graft_iota_on(dt, 1, &n, 0, dev), NULL, 0, false);
    CHECK(graft_item(s, &got) == GRAFT_OK);
    CHECK_NEAR(got, want, tol_of(dt));
  }
  const int64_t n300 = 300;
  double last = -1;
  const int64_t st[1] = {299}, li[1] = {300};
  graft_tensor *u = graft_iota_on(GRAFT_U8, 1, &n300, 0, dev);
  CHECK(graft_item(graft_slice(u, st, li, NULL), &last) == GRAFT_OK);
  CHECK(last == 299 % 256);
  CHECK(graft_iota_on(GRAFT_BOOL, 2, s, 0, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  CHECK(graft_iota_on(GRAFT_F32, 2, s, 2, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  END();
}

TEST(test_scalar_and_item) {
  BEGIN();
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *t = graft_scalar_on(3.5, dt, dev);
    CHECK(t && graft_ndim(t) == 0 && graft_numel(t) == 1 && graft_get_dtype(t) == dt);
    double v = -1;
    CHECK(graft_item(t, &v) == GRAFT_OK);
    CHECK(v == q(dt, 3.5));
    CHECK(graft_device(t) == dev);
  }
  /* item of a [1,1] tensor and of an op result */
  const int64_t s11[2] = {1, 1};
  const double x[1] = {-4.25};
  double v = 0;
  CHECK(graft_item(mk(GRAFT_F64, 2, s11, x), &v) == GRAFT_OK && v == -4.25);
  CHECK(graft_item(graft_abs(mk(GRAFT_F32, 2, s11, x)), &v) == GRAFT_OK && v == 4.25);
  END();
}

static double mean_of(const double *v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s / n;
}
static double var_of(const double *v, int n) {
  double m = mean_of(v, n), s = 0;
  for (int i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
  return s / n;
}

/* Fetches n values of t, which must be on the test device, as doubles (0 on failure). */
static int fetch(graft_tensor *t, double *out, int64_t n) {
  if (!t || graft_device(t) != dev) return 0;
  graft_dtype dt = graft_get_dtype(t);
  void *buf = calloc((size_t)n + 1, 8);
  int ok = graft_numel(t) == n && graft_to_host(t, buf, (size_t)n * graft_dtype_size(dt)) == GRAFT_OK;
  for (int64_t i = 0; ok && i < n; i++) out[i] = load_d(buf, dt, i);
  free(buf);
  return ok;
}

TEST(test_rand) {
  BEGIN();
  enum { N = 20000 };
  double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  int64_t n = N;
  /* The seed is an i64 parameter operand: the op's dtype rule applies to the output. */
  for (int d = 0; d < 4; d++) {
    graft_dtype dt = FLOAT_DT[d];
    graft_manual_seed(1234);
    CHECK(fetch(graft_rand_uniform_on(dt, 1, &n, dev), a, N));
    int in_range = 1;
    for (int i = 0; i < N; i++) in_range &= a[i] >= 0 && a[i] < 1;
    CHECK(in_range);
    CHECK(fabs(mean_of(a, N) - 0.5) < 0.02);
    CHECK(fabs(var_of(a, N) - 1.0 / 12) < 0.01);
    /* same seed, same stream; the next draw differs */
    graft_manual_seed(1234);
    CHECK(fetch(graft_rand_uniform_on(dt, 1, &n, dev), b, N));
    CHECK(!memcmp(a, b, N * sizeof *a));
    CHECK(fetch(graft_rand_uniform_on(dt, 1, &n, dev), b, N));
    int differ = 0;
    for (int i = 0; i < N; i++) differ += a[i] != b[i];
    CHECK(differ > N / 2);

    graft_manual_seed(99);
    CHECK(fetch(graft_rand_normal_on(dt, 1, &n, dev), a, N));
    double m = mean_of(a, N), var = var_of(a, N), m4 = 0;
    for (int i = 0; i < N; i++) m4 += pow(a[i] - m, 4) / N;
    CHECK(fabs(m) < 0.05);
    CHECK(fabs(var - 1) < 0.05);
    CHECK(fabs(m4 / (var * var) - 3) < 0.3); /* kurtosis of a normal */
    graft_manual_seed(99);
    CHECK(fetch(graft_rand_normal_on(dt, 1, &n, dev), b, N));
    CHECK(!memcmp(a, b, N * sizeof *a));
  }
  /* A non-float dtype is rejected with its own name in the message. */
  for (int d = 0; d < 4; d++) {
    graft_dtype bad = d < 3 ? INT_DT[d] : GRAFT_BOOL;
    CHECK(graft_rand_uniform_on(bad, 1, &n, dev) == NULL);
    CHECK(expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(bad), NULL));
    CHECK(graft_rand_normal_on(bad, 1, &n, dev) == NULL);
    CHECK(expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(bad), NULL));
  }
  free(a);
  free(b);
  END();
}

int main(void) {
  if (ops_device_init("test_ops_elementwise")) return 2;
  RUN(test_unary_float);
  RUN(test_unary_float_domains);
  RUN(test_unary_float_properties);
  RUN(test_unary_int);
  RUN(test_unary_dtype_rejects);
  RUN(test_binary_float);
  RUN(test_binary_int_hand);
  RUN(test_binary_int_grid);
  RUN(test_logical);
  RUN(test_binary_dtype_rejects);
  RUN(test_compare);
  RUN(test_binary_broadcast);
  RUN(test_scalar_ops);
  RUN(test_where);
  RUN(test_convert);
  RUN(test_full_zeros_ones);
  RUN(test_iota);
  RUN(test_scalar_and_item);
  RUN(test_rand);
  RUN(test_no_live_tensors);
  graft_shutdown();
  return CHECK_DONE();
}
