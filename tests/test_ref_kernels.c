/* Reference kernel tests: every op called directly through ref_kernels[] on small hand-checked
 * cases, plus dtype conversions. Standalone (no framework):
 *   gcc -std=c11 -Wall -Wextra -Werror -g -fsanitize=address,undefined -fno-sanitize-recover=all \
 *       -Iinclude -Isrc/core tests/test_ref_kernels.c src/backends/ref/ *.c src/core/dtype.c -lm \
 *       [-DREF_TEST_STANDALONE | src/core/error.c]
 */
#include "../src/backends/ref/ref.h"
#include "../src/backends/ref/ref_rng.h"
#include "dtype.h"
#include "error.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- error state: a stand-in for src/core/error.c when built alone ---- */
#ifdef REF_TEST_STANDALONE
static graft_status t_status;
static char t_msg[512];
void *err_set(graft_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_msg, sizeof t_msg, fmt, ap);
  va_end(ap);
  t_status = st;
  return NULL;
}
int err_pending(void) { return t_status != GRAFT_OK; }
static graft_status last_status(void) { return t_status; }
static const char *last_msg(void) { return t_msg; }
static void clear_err(void) { t_status = GRAFT_OK; t_msg[0] = 0; }
#else
static graft_status last_status(void) { return graft_last_status(); }
static const char *last_msg(void) { return graft_last_error(); }
static void clear_err(void) { graft_clear_error(); }
#endif

/* ---- tiny check framework ---- */
static int n_pass, n_fail;
#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (cond) n_pass++;                                                                     \
    else {                                                                                  \
      n_fail++;                                                                             \
      printf("%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                       \
    }                                                                                       \
  } while (0)

static const char *op_names[IR_OP_COUNT] = {
#define X(e, name, ...) [IR_##e] = name,
#include "ops.def"
};

static const graft_dtype FLOATS[] = {GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16};
static const graft_dtype INTS[] = {GRAFT_I32, GRAFT_I64, GRAFT_U8};
static const graft_dtype NUMS[] = {GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16,
                                   GRAFT_I32, GRAFT_I64, GRAFT_U8};

static size_t esize(graft_dtype dt) {
  return dt == GRAFT_F64 || dt == GRAFT_I64 ? 8 : dt == GRAFT_F32 || dt == GRAFT_I32 ? 4
       : dt == GRAFT_F16 || dt == GRAFT_BF16 ? 2 : 1;
}

static int64_t numel_of(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

/* An instruction for op with output dtype/shape; attrs zeroed. */
static exec_instr mk(ir_op op, graft_dtype dt, int nd, const int64_t *shape, int nin) {
  exec_instr ins;
  memset(&ins, 0, sizeof ins);
  ins.op = op;
  ins.dtype = dt;
  ins.ndim = nd;
  for (int d = 0; d < nd; d++) ins.shape[d] = shape[d];
  ins.numel = numel_of(nd, shape);
  ins.nin = nin;
  ins.last_use = -1;
  return ins;
}

static ref_arg arg(const void *data, graft_dtype dt, int nd, const int64_t *shape) {
  ref_arg a = {.data = data, .dtype = dt, .ndim = nd, .shape = shape, .numel = numel_of(nd, shape)};
  return a;
}

/* A buffer of n elements of dt holding vals (through dtype_store). Freed by the caller. */
static void *buf_d(graft_dtype dt, const double *vals, int64_t n) {
  void *p = calloc((size_t)(n ? n : 1), esize(dt));
  for (int64_t i = 0; i < n; i++) dtype_store(p, dt, i, vals[i]);
  return p;
}
static void *buf_i(graft_dtype dt, const int64_t *vals, int64_t n) {
  void *p = calloc((size_t)(n ? n : 1), esize(dt));
  for (int64_t i = 0; i < n; i++) dtype_store_i(p, dt, i, vals[i]);
  return p;
}
/* Output buffer filled with garbage, since kernels get memory that is NOT zeroed. */
static void *buf_out(graft_dtype dt, int64_t n) {
  void *p = malloc((size_t)(n ? n : 1) * esize(dt));
  memset(p, 0xA5, (size_t)(n ? n : 1) * esize(dt));
  return p;
}

static int run(const exec_instr *ins, const ref_arg *in, void *out) {
  return ref_kernels[ins->op](ins, in, out);
}

static const char *dname(graft_dtype dt) {
  static const char *n[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"};
  return dtype_valid(dt) ? n[dt] : "?";
}

/* Relative tolerance one rounding of dt needs (0 for exact integer dtypes). */
static double tol_of(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F64: return 1e-12;
  case GRAFT_F32: return 1e-6;
  case GRAFT_F16: return 1e-3;
  case GRAFT_BF16: return 8e-3;
  default: return 0;
  }
}

/* True when out (dtype dt) equals want[0..n) within dt's tolerance (NaN matches NaN). */
static bool eq_d(const void *out, graft_dtype dt, const double *want, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double g = dtype_load(out, dt, i), w = want[i];
    bool ok = isnan(w) ? isnan(g) : isinf(w) ? g == w : fabs(g - w) <= tol_of(dt) * fmax(1, fabs(w));
    if (!ok) {
      printf("  [%lld] got %.17g want %.17g (%s)\n", (long long)i, g, w, dname(dt));
      return false;
    }
  }
  return true;
}

/* True when out (integer dtype dt) equals want[0..n) exactly. */
static bool eq_i(const void *out, graft_dtype dt, const int64_t *want, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    int64_t g = dtype_load_i(out, dt, i);
    if (g != want[i]) {
      printf("  [%lld] got %lld want %lld (%s)\n", (long long)i, (long long)g,
             (long long)want[i], dname(dt));
      return false;
    }
  }
  return true;
}

static float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ======================================================================================= */

static void test_table(void) {
  for (int op = 0; op < IR_OP_COUNT; op++) {
    if (op == IR_DATA) {
      CHECK(ref_kernels[op] == NULL);
      continue;
    }
    if (!ref_kernels[op]) printf("  no ref kernel for %s\n", op_names[op]);
    CHECK(ref_kernels[op] != NULL);
  }
}

static void test_f16(void) {
  CHECK(dtype_f32_to_f16(1.0f) == 0x3c00);
  CHECK(dtype_f32_to_f16(-2.0f) == 0xc000);
  CHECK(dtype_f32_to_f16(0.0f) == 0x0000);
  CHECK(dtype_f32_to_f16(-0.0f) == 0x8000);
  CHECK(dtype_f32_to_f16(65504.0f) == 0x7bff);   /* max half */
  CHECK(dtype_f32_to_f16(65519.0f) == 0x7bff);   /* below the half-way point */
  CHECK(dtype_f32_to_f16(65520.0f) == 0x7c00);   /* tie rounds to even = inf */
  CHECK(dtype_f32_to_f16(1e10f) == 0x7c00);
  CHECK(dtype_f32_to_f16(INFINITY) == 0x7c00);
  CHECK(dtype_f32_to_f16(-INFINITY) == 0xfc00);
  uint16_t hn = dtype_f32_to_f16(NAN);
  CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
  CHECK(isnan(dtype_f16_to_f32(0x7e00)));
  CHECK(isinf(dtype_f16_to_f32(0x7c00)) && dtype_f16_to_f32(0xfc00) < 0);
  /* ties to even on normals: 1 + 2^-11 is half-way between 1 (even) and 1 + 2^-10 */
  CHECK(dtype_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(dtype_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* between 0x3c01 (odd), 0x3c02 */
  CHECK(dtype_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01); /* just above the tie */
  /* subnormals: 2^-24 is the smallest */
  CHECK(dtype_f32_to_f16(0x1p-24f) == 0x0001);
  CHECK(dtype_f32_to_f16(0x1p-25f) == 0x0000);          /* tie with 0 -> even 0 */
  CHECK(dtype_f32_to_f16(0x1.8p-25f) == 0x0001);        /* above the tie */
  CHECK(dtype_f32_to_f16(3 * 0x1p-25f) == 0x0002);      /* 1.5 ulp: tie -> even 2 */
  CHECK(dtype_f32_to_f16(5 * 0x1p-25f) == 0x0002);      /* 2.5 ulp: tie -> even 2 */
  CHECK(dtype_f32_to_f16(-0x1p-24f) == 0x8001);
  CHECK(dtype_f32_to_f16(0x1p-14f) == 0x0400);          /* smallest normal */
  CHECK(dtype_f32_to_f16(0x1p-14f - 0x1p-26f) == 0x0400); /* rounds up into the normals */
  CHECK(dtype_f32_to_f16(0x1p-30f) == 0x0000);
  CHECK(dtype_f32_to_f16(0x1p-140f) == 0x0000);         /* float subnormal */
  CHECK(dtype_f16_to_f32(0x0001) == 0x1p-24f);
  CHECK(dtype_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  CHECK(dtype_f16_to_f32(0x3555) == 0x1.554p-2f);
  /* every half round-trips through float */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = dtype_f16_to_f32((uint16_t)h);
    uint16_t back = dtype_f32_to_f16(f);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) bad += !isnan(f) || (back & 0x7fff) <= 0x7c00;
    else bad += back != h;
  }
  CHECK(bad == 0);
}

static void test_bf16(void) {
  CHECK(dtype_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(dtype_f32_to_bf16(-1.0f) == 0xbf80);
  CHECK(dtype_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);     /* tie -> even */
  CHECK(dtype_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82); /* tie -> even (up) */
  CHECK(dtype_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  CHECK(dtype_f32_to_bf16(INFINITY) == 0x7f80);
  CHECK(dtype_f32_to_bf16(-INFINITY) == 0xff80);
  CHECK(dtype_f32_to_bf16(bits_to_f32(0x7f7fffff)) == 0x7f80); /* FLT_MAX rounds to inf */
  uint16_t bn = dtype_f32_to_bf16(bits_to_f32(0x7f800001)); /* signalling NaN, low payload */
  CHECK((bn & 0x7f80) == 0x7f80 && (bn & 0x7f) != 0);
  CHECK(isnan(dtype_bf16_to_f32(0x7fc0)));
  CHECK(dtype_f32_to_bf16(0x1p-130f) == 0x0008);            /* subnormal, exact */
  CHECK(dtype_bf16_to_f32(0x0001) == 0x1p-133f);
  CHECK(f32_to_bits(dtype_bf16_to_f32(0x8000)) == 0x80000000u);
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = dtype_bf16_to_f32((uint16_t)h);
    uint16_t back = dtype_f32_to_bf16(f);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) bad += !isnan(f) || (back & 0x7fff) <= 0x7f80;
    else bad += back != h;
  }
  CHECK(bad == 0);
}

static void test_load_store(void) {
  int32_t i32[4];
  dtype_store(i32, GRAFT_I32, 0, 2.9);
  dtype_store(i32, GRAFT_I32, 1, -2.9);
  dtype_store(i32, GRAFT_I32, 2, NAN);
  dtype_store(i32, GRAFT_I32, 3, 1e20);
  CHECK(i32[0] == 2 && i32[1] == -2 && i32[2] == 0 && i32[3] == INT32_MAX);
  int64_t i64[3];
  dtype_store(i64, GRAFT_I64, 0, -1e30);
  dtype_store(i64, GRAFT_I64, 1, INFINITY);
  dtype_store(i64, GRAFT_I64, 2, -7.5);
  CHECK(i64[0] == INT64_MIN && i64[1] == INT64_MAX && i64[2] == -7);
  uint8_t u8[4];
  dtype_store(u8, GRAFT_U8, 0, 300.0); /* wraps mod 256 */
  dtype_store(u8, GRAFT_U8, 1, -1.0);
  dtype_store_i(u8, GRAFT_U8, 2, 257);
  dtype_store(u8, GRAFT_U8, 3, 255.9);
  CHECK(u8[0] == 44 && u8[1] == 255 && u8[2] == 1 && u8[3] == 255);
  uint8_t b[4];
  dtype_store(b, GRAFT_BOOL, 0, 0.0);
  dtype_store(b, GRAFT_BOOL, 1, -0.0);
  dtype_store(b, GRAFT_BOOL, 2, NAN);
  dtype_store_i(b, GRAFT_BOOL, 3, -5);
  CHECK(b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 1);
  int64_t big = ((int64_t)1 << 62) + 1; /* not representable in double */
  dtype_store_i(i64, GRAFT_I64, 0, big);
  CHECK(dtype_load_i(i64, GRAFT_I64, 0) == big);
  uint16_t h[2];
  dtype_store(h, GRAFT_F16, 0, 0.1);
  dtype_store(h, GRAFT_BF16, 1, 3.0);
  CHECK(h[0] == 0x2e66 && h[1] == 0x4040);
  CHECK(dtype_load(h, GRAFT_BF16, 1) == 3.0);
  float f = -2.75f;
  CHECK(dtype_load_i(&f, GRAFT_F32, 0) == -2);
}

/* ---- elementwise ---- */

/* Runs a unary op on n values of dt, checks against want. */
static bool unary_d(ir_op op, graft_dtype dt, const double *x, const double *want, int64_t n) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(op, dt, 1, shape, 1);
  void *a = buf_d(dt, x, n), *o = buf_out(dt, n);
  ref_arg in[1] = {arg(a, dt, 1, shape)};
  bool ok = run(&ins, in, o) == 0 && eq_d(o, dt, want, n);
  if (!ok) printf("  unary %s on %s\n", op_names[op], dname(dt));
  free(a);
  free(o);
  return ok;
}

static bool unary_i(ir_op op, graft_dtype dt, const int64_t *x, const int64_t *want, int64_t n) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(op, dt, 1, shape, 1);
  void *a = buf_i(dt, x, n), *o = buf_out(dt, n);
  ref_arg in[1] = {arg(a, dt, 1, shape)};
  bool ok = run(&ins, in, o) == 0 && eq_i(o, dt, want, n);
  if (!ok) printf("  unary %s on %s\n", op_names[op], dname(dt));
  free(a);
  free(o);
  return ok;
}

static void test_unary(void) {
  const double x[4] = {0.5, -1.25, 2.0, 0.0};
  for (int k = 0; k < 4; k++) {
    graft_dtype dt = FLOATS[k];
    CHECK(unary_d(IR_NEG, dt, x, (double[]){-0.5, 1.25, -2.0, 0.0}, 4));
    CHECK(unary_d(IR_ABS, dt, x, (double[]){0.5, 1.25, 2.0, 0.0}, 4));
    CHECK(unary_d(IR_EXP, dt, x, (double[]){exp(0.5), exp(-1.25), exp(2.0), 1.0}, 4));
    CHECK(unary_d(IR_LOG, dt, (double[]){1.0, 2.0, 0.0, -1.0},
                  (double[]){0.0, log(2.0), -INFINITY, NAN}, 4));
    CHECK(unary_d(IR_SQRT, dt, (double[]){4.0, 2.0, 0.0, 0.25}, (double[]){2.0, sqrt(2.0), 0.0, 0.5}, 4));
    CHECK(unary_d(IR_RSQRT, dt, (double[]){4.0, 0.25}, (double[]){0.5, 2.0}, 2));
    CHECK(unary_d(IR_TANH, dt, x, (double[]){tanh(0.5), tanh(-1.25), tanh(2.0), 0.0}, 4));
    CHECK(unary_d(IR_ERF, dt, x, (double[]){erf(0.5), erf(-1.25), erf(2.0), 0.0}, 4));
    CHECK(unary_d(IR_SIGMOID, dt, (double[]){0.0, 2.0, -1000.0, 1000.0},
                  (double[]){0.5, 1.0 / (1.0 + exp(-2.0)), 0.0, 1.0}, 4));
    CHECK(unary_d(IR_SIN, dt, x, (double[]){sin(0.5), sin(-1.25), sin(2.0), 0.0}, 4));
    CHECK(unary_d(IR_COS, dt, x, (double[]){cos(0.5), cos(-1.25), cos(2.0), 1.0}, 4));
    CHECK(unary_d(IR_FLOOR, dt, x, (double[]){0.0, -2.0, 2.0, 0.0}, 4));
    CHECK(unary_d(IR_CEIL, dt, x, (double[]){1.0, -1.0, 2.0, 0.0}, 4));
    CHECK(unary_d(IR_ROUND, dt, (double[]){0.5, 1.5, 2.5, -0.5, -1.5, 2.75},
                  (double[]){0.0, 2.0, 2.0, -0.0, -2.0, 3.0}, 6)); /* half to even */
    CHECK(unary_d(IR_SIGN, dt, (double[]){3.5, -0.25, 0.0, NAN}, (double[]){1, -1, 0, NAN}, 4));
    CHECK(unary_d(IR_RECIPROCAL, dt, (double[]){2.0, -0.5, 0.0}, (double[]){0.5, -2.0, INFINITY}, 3));
    CHECK(unary_d(IR_LOG1P, dt, x, (double[]){log1p(0.5), log1p(-1.25), log1p(2.0), 0.0}, 4));
    CHECK(unary_d(IR_EXPM1, dt, x, (double[]){expm1(0.5), expm1(-1.25), expm1(2.0), 0.0}, 4));
  }
  /* sigmoid at the extremes stays finite and exact in f64 */
  CHECK(unary_d(IR_SIGMOID, GRAFT_F64, (double[]){-800.0, 800.0, -30.0},
                (double[]){0.0, 1.0, exp(-30.0) / (1 + exp(-30.0))}, 3));
  /* rounding once from double: exp(1) in f16 is the nearest half to e (0x4170) */
  {
    int64_t s[1] = {1};
    exec_instr ins = mk(IR_EXP, GRAFT_F16, 1, s, 1);
    uint16_t one = 0x3c00, o = 0;
    ref_arg in[1] = {arg(&one, GRAFT_F16, 1, s)};
    CHECK(run(&ins, in, &o) == 0 && o == 0x4170);
  }
  /* integers: neg wraps, abs, sign, not */
  CHECK(unary_i(IR_NEG, GRAFT_I64, (int64_t[]){5, -3, INT64_MIN}, (int64_t[]){-5, 3, INT64_MIN}, 3));
  CHECK(unary_i(IR_NEG, GRAFT_I32, (int64_t[]){7, INT32_MIN}, (int64_t[]){-7, INT32_MIN}, 2));
  CHECK(unary_i(IR_NEG, GRAFT_U8, (int64_t[]){5, 0, 255}, (int64_t[]){251, 0, 1}, 3));
  CHECK(unary_i(IR_ABS, GRAFT_I32, (int64_t[]){-4, 4, INT32_MIN}, (int64_t[]){4, 4, INT32_MIN}, 3));
  CHECK(unary_i(IR_ABS, GRAFT_I64, (int64_t[]){-9, INT64_MIN}, (int64_t[]){9, INT64_MIN}, 2));
  CHECK(unary_i(IR_ABS, GRAFT_U8, (int64_t[]){200, 0}, (int64_t[]){200, 0}, 2));
  CHECK(unary_i(IR_SIGN, GRAFT_I32, (int64_t[]){-7, 0, 9}, (int64_t[]){-1, 0, 1}, 3));
  CHECK(unary_i(IR_SIGN, GRAFT_I64, (int64_t[]){INT64_MIN, 0, INT64_MAX}, (int64_t[]){-1, 0, 1}, 3));
  CHECK(unary_i(IR_SIGN, GRAFT_U8, (int64_t[]){0, 200}, (int64_t[]){0, 1}, 2));
  CHECK(unary_i(IR_NOT, GRAFT_BOOL, (int64_t[]){0, 1}, (int64_t[]){1, 0}, 2));
  CHECK(unary_i(IR_NOT, GRAFT_I32, (int64_t[]){0, 5, -1}, (int64_t[]){-1, -6, 0}, 3));
  CHECK(unary_i(IR_NOT, GRAFT_I64, (int64_t[]){0, INT64_MAX}, (int64_t[]){-1, INT64_MIN}, 2));
  CHECK(unary_i(IR_NOT, GRAFT_U8, (int64_t[]){0, 5, 255}, (int64_t[]){255, 250, 0}, 3));
}

/* convert from (dt_in, values) to dt_out; checks doubles (or ints when want_i). */
static bool convert_case(graft_dtype from, const void *src, graft_dtype to, const double *want_d,
                         const int64_t *want_i, int64_t n) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(IR_CONVERT, to, 1, shape, 1);
  void *o = buf_out(to, n);
  ref_arg in[1] = {arg(src, from, 1, shape)};
  bool ok = run(&ins, in, o) == 0 && (want_i ? eq_i(o, to, want_i, n) : eq_d(o, to, want_d, n));
  if (!ok) printf("  convert %s -> %s\n", dname(from), dname(to));
  free(o);
  return ok;
}

static void test_convert(void) {
  float f[5] = {2.7f, -2.7f, NAN, 1e20f, -1e20f};
  CHECK(convert_case(GRAFT_F32, f, GRAFT_I32, NULL, (int64_t[]){2, -2, 0, INT32_MAX, INT32_MIN}, 5));
  CHECK(convert_case(GRAFT_F32, f, GRAFT_I64, NULL, (int64_t[]){2, -2, 0, INT64_MAX, INT64_MIN}, 3));
  CHECK(convert_case(GRAFT_F32, f, GRAFT_BOOL, NULL, (int64_t[]){1, 1, 1, 1, 1}, 5));
  double z[3] = {0.0, -0.0, 0.5};
  CHECK(convert_case(GRAFT_F64, z, GRAFT_BOOL, NULL, (int64_t[]){0, 0, 1}, 3));
  int64_t big[4] = {((int64_t)1 << 32) + 5, -1, ((int64_t)1 << 62) + 1, 300};
  CHECK(convert_case(GRAFT_I64, big, GRAFT_I32, NULL, (int64_t[]){5, -1, 1, 300}, 4));
  CHECK(convert_case(GRAFT_I64, big, GRAFT_U8, NULL, (int64_t[]){5, 255, 1, 44}, 4));
  CHECK(convert_case(GRAFT_I64, big, GRAFT_I64, NULL, big, 4)); /* exact, no double */
  int32_t i32[3] = {-3, 1000, 0};
  CHECK(convert_case(GRAFT_I32, i32, GRAFT_I64, NULL, (int64_t[]){-3, 1000, 0}, 3));
  CHECK(convert_case(GRAFT_I32, i32, GRAFT_F16, (double[]){-3, 1000, 0}, NULL, 3));
  CHECK(convert_case(GRAFT_I32, i32, GRAFT_BOOL, NULL, (int64_t[]){1, 1, 0}, 3));
  uint8_t bools[2] = {1, 0};
  CHECK(convert_case(GRAFT_BOOL, bools, GRAFT_F32, (double[]){1, 0}, NULL, 2));
  CHECK(convert_case(GRAFT_BOOL, bools, GRAFT_I64, NULL, (int64_t[]){1, 0}, 2));
  uint16_t bf[2] = {0x4040, 0xc0a0}; /* 3.0, -5.0 */
  CHECK(convert_case(GRAFT_BF16, bf, GRAFT_F16, (double[]){3.0, -5.0}, NULL, 2));
  CHECK(convert_case(GRAFT_BF16, bf, GRAFT_U8, NULL, (int64_t[]){3, 251}, 2));
  double d[2] = {1.0 + 0x1p-30, 70000.0};
  CHECK(convert_case(GRAFT_F64, d, GRAFT_F32, (double[]){1.0, 70000.0}, NULL, 2));
  CHECK(convert_case(GRAFT_F64, d, GRAFT_F16, (double[]){1.0, INFINITY}, NULL, 2));
}

static bool binary_d(ir_op op, graft_dtype dt, const double *x, const double *y,
                     const double *want, int64_t n) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(op, dt, 1, shape, 2);
  void *a = buf_d(dt, x, n), *b = buf_d(dt, y, n), *o = buf_out(dt, n);
  ref_arg in[2] = {arg(a, dt, 1, shape), arg(b, dt, 1, shape)};
  bool ok = run(&ins, in, o) == 0 && eq_d(o, dt, want, n);
  if (!ok) printf("  binary %s on %s\n", op_names[op], dname(dt));
  free(a);
  free(b);
  free(o);
  return ok;
}

static bool binary_i(ir_op op, graft_dtype dt, const int64_t *x, const int64_t *y,
                     const int64_t *want, int64_t n) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(op, dt, 1, shape, 2);
  void *a = buf_i(dt, x, n), *b = buf_i(dt, y, n), *o = buf_out(dt, n);
  ref_arg in[2] = {arg(a, dt, 1, shape), arg(b, dt, 1, shape)};
  bool ok = run(&ins, in, o) == 0 && eq_i(o, dt, want, n);
  if (!ok) printf("  binary %s on %s\n", op_names[op], dname(dt));
  free(a);
  free(b);
  free(o);
  return ok;
}

static void test_binary(void) {
  const double x[3] = {6, 7, 1}, y[3] = {3, 2, 4};
  for (int k = 0; k < 7; k++) { /* small exact values work on every numeric dtype */
    graft_dtype dt = NUMS[k];
    CHECK(binary_d(IR_ADD, dt, x, y, (double[]){9, 9, 5}, 3));
    CHECK(binary_d(IR_SUB, dt, x, (double[]){3, 2, 1}, (double[]){3, 5, 0}, 3));
    CHECK(binary_d(IR_MUL, dt, x, y, (double[]){18, 14, 4}, 3));
    CHECK(binary_d(IR_MAX, dt, x, y, (double[]){6, 7, 4}, 3));
    CHECK(binary_d(IR_MIN, dt, x, y, (double[]){3, 2, 1}, 3));
    CHECK(binary_d(IR_REM, dt, x, y, (double[]){0, 1, 1}, 3));
    CHECK(binary_d(IR_DIV, dt, x, (double[]){3, 2, 4},
                   dtype_is_float(dt) ? (double[]){2, 3.5, 0.25} : (double[]){2, 3, 0}, 3));
  }
  for (int k = 0; k < 4; k++) {
    graft_dtype dt = FLOATS[k];
    CHECK(binary_d(IR_POW, dt, (double[]){2, 9, -2, 0}, (double[]){10, 0.5, 3, 0},
                   (double[]){1024, 3, -8, 1}, 4));
    CHECK(binary_d(IR_MAX, dt, (double[]){NAN, 1, 2}, (double[]){1, NAN, -1}, (double[]){NAN, NAN, 2}, 3));
    CHECK(binary_d(IR_MIN, dt, (double[]){NAN, 1, 2}, (double[]){1, NAN, -1}, (double[]){NAN, NAN, -1}, 3));
    CHECK(binary_d(IR_REM, dt, (double[]){-7, 7, 5.5}, (double[]){3, -3, 2}, (double[]){-1, 1, 1.5}, 3));
    CHECK(binary_d(IR_DIV, dt, (double[]){1, -1, 0}, (double[]){0, 0, 0}, (double[]){INFINITY, -INFINITY, NAN}, 3));
  }
  /* f32 rounds once: 0.1 + 0.2 computed in double then rounded to float */
  CHECK(binary_d(IR_ADD, GRAFT_F32, (double[]){0.1}, (double[]){0.2}, (double[]){(float)((double)0.1f + (double)0.2f)}, 1));
  /* integer wraparound */
  CHECK(binary_i(IR_ADD, GRAFT_I32, (int64_t[]){INT32_MAX, INT32_MIN}, (int64_t[]){1, -1},
                 (int64_t[]){INT32_MIN, INT32_MAX}, 2));
  CHECK(binary_i(IR_ADD, GRAFT_I64, (int64_t[]){INT64_MAX}, (int64_t[]){1}, (int64_t[]){INT64_MIN}, 1));
  CHECK(binary_i(IR_ADD, GRAFT_U8, (int64_t[]){200, 255}, (int64_t[]){100, 1}, (int64_t[]){44, 0}, 2));
  CHECK(binary_i(IR_SUB, GRAFT_U8, (int64_t[]){5}, (int64_t[]){10}, (int64_t[]){251}, 1));
  CHECK(binary_i(IR_SUB, GRAFT_I64, (int64_t[]){INT64_MIN}, (int64_t[]){1}, (int64_t[]){INT64_MAX}, 1));
  CHECK(binary_i(IR_MUL, GRAFT_I64, (int64_t[]){INT64_MAX, (int64_t)1 << 62}, (int64_t[]){2, 4},
                 (int64_t[]){-2, 0}, 2));
  CHECK(binary_i(IR_MUL, GRAFT_I32, (int64_t[]){65536}, (int64_t[]){65536}, (int64_t[]){0}, 1));
  CHECK(binary_i(IR_MUL, GRAFT_U8, (int64_t[]){16}, (int64_t[]){17}, (int64_t[]){16}, 1));
  /* exact i64 (no double): 2^62+1 + 2 */
  CHECK(binary_i(IR_ADD, GRAFT_I64, (int64_t[]){((int64_t)1 << 62) + 1}, (int64_t[]){2},
                 (int64_t[]){((int64_t)1 << 62) + 3}, 1));
  /* division / remainder: truncation, sign of dividend, by zero = 0, MIN / -1 wraps */
  for (int k = 0; k < 2; k++) {
    graft_dtype dt = INTS[k];
    int64_t mn = k == 0 ? INT32_MIN : INT64_MIN;
    CHECK(binary_i(IR_DIV, dt, (int64_t[]){-7, 7, 5, mn, 9}, (int64_t[]){2, -2, 0, -1, 3},
                   (int64_t[]){-3, -3, 0, mn, 3}, 5));
    CHECK(binary_i(IR_REM, dt, (int64_t[]){-7, 7, 5, mn, 9}, (int64_t[]){3, -3, 0, -1, 4},
                   (int64_t[]){-1, 1, 0, 0, 1}, 5));
    CHECK(binary_i(IR_MAX, dt, (int64_t[]){-7, mn}, (int64_t[]){-8, 0}, (int64_t[]){-7, 0}, 2));
  }
  CHECK(binary_i(IR_DIV, GRAFT_U8, (int64_t[]){200, 9}, (int64_t[]){0, 2}, (int64_t[]){0, 4}, 2));
  CHECK(binary_i(IR_REM, GRAFT_U8, (int64_t[]){200, 9}, (int64_t[]){0, 2}, (int64_t[]){0, 1}, 2));
  /* logical on bool, bitwise on ints */
  const int64_t p[4] = {0, 0, 1, 1}, q[4] = {0, 1, 0, 1};
  CHECK(binary_i(IR_AND, GRAFT_BOOL, p, q, (int64_t[]){0, 0, 0, 1}, 4));
  CHECK(binary_i(IR_OR, GRAFT_BOOL, p, q, (int64_t[]){0, 1, 1, 1}, 4));
  CHECK(binary_i(IR_XOR, GRAFT_BOOL, p, q, (int64_t[]){0, 1, 1, 0}, 4));
  for (int k = 0; k < 3; k++) {
    graft_dtype dt = INTS[k];
    CHECK(binary_i(IR_AND, dt, (int64_t[]){12, 255}, (int64_t[]){10, 15}, (int64_t[]){8, 15}, 2));
    CHECK(binary_i(IR_OR, dt, (int64_t[]){12, 240}, (int64_t[]){10, 15}, (int64_t[]){14, 255}, 2));
    CHECK(binary_i(IR_XOR, dt, (int64_t[]){12, 255}, (int64_t[]){10, 15}, (int64_t[]){6, 240}, 2));
  }
  CHECK(binary_i(IR_AND, GRAFT_I64, (int64_t[]){-1}, (int64_t[]){INT64_MIN}, (int64_t[]){INT64_MIN}, 1));
}

/* Compares x and y of dt under all six ops; want packs eq ne lt le gt ge per element. */
static bool compare_case(graft_dtype dt, const void *x, const void *y, const int (*want)[6], int n) {
  static const ir_op ops[6] = {IR_EQ, IR_NE, IR_LT, IR_LE, IR_GT, IR_GE};
  int64_t shape[1] = {n};
  bool ok = true;
  for (int k = 0; k < 6; k++) {
    exec_instr ins = mk(ops[k], GRAFT_BOOL, 1, shape, 2);
    uint8_t *o = buf_out(GRAFT_BOOL, n);
    ref_arg in[2] = {arg(x, dt, 1, shape), arg(y, dt, 1, shape)};
    ok = ok && run(&ins, in, o) == 0;
    for (int i = 0; i < n; i++)
      if (o[i] != want[i][k]) {
        printf("  compare %s on %s [%d]: got %d\n", op_names[ops[k]], dname(dt), i, o[i]);
        ok = false;
      }
    free(o);
  }
  return ok;
}

static void test_compare(void) {
  /*                       eq ne lt le gt ge */
  static const int LT[6] = {0, 1, 1, 1, 0, 0};
  static const int EQ[6] = {1, 0, 0, 1, 0, 1};
  static const int GT[6] = {0, 1, 0, 0, 1, 1};
  static const int UN[6] = {0, 1, 0, 0, 0, 0}; /* unordered (NaN) */
  for (int k = 0; k < 4; k++) {
    graft_dtype dt = FLOATS[k];
    void *x = buf_d(dt, (double[]){1, 2, 3, NAN, 1}, 5), *y = buf_d(dt, (double[]){2, 2, -3, 0, NAN}, 5);
    int want[5][6];
    memcpy(want[0], LT, sizeof LT);
    memcpy(want[1], EQ, sizeof EQ);
    memcpy(want[2], GT, sizeof GT);
    memcpy(want[3], UN, sizeof UN);
    memcpy(want[4], UN, sizeof UN);
    CHECK(compare_case(dt, x, y, (const int (*)[6])want, 5));
    free(x);
    free(y);
  }
  for (int k = 0; k < 3; k++) {
    graft_dtype dt = INTS[k];
    void *x = buf_i(dt, (int64_t[]){1, 2, 200}, 3), *y = buf_i(dt, (int64_t[]){2, 2, 100}, 3);
    int want[3][6];
    memcpy(want[0], LT, sizeof LT);
    memcpy(want[1], EQ, sizeof EQ);
    memcpy(want[2], GT, sizeof GT);
    CHECK(compare_case(dt, x, y, (const int (*)[6])want, 3));
    free(x);
    free(y);
  }
  /* i64 past 2^53: equal as doubles, different as integers */
  int64_t bx[2] = {((int64_t)1 << 53) + 1, INT64_MIN}, by[2] = {(int64_t)1 << 53, INT64_MIN + 1};
  int w64[2][6];
  memcpy(w64[0], GT, sizeof GT);
  memcpy(w64[1], LT, sizeof LT);
  CHECK(compare_case(GRAFT_I64, bx, by, (const int (*)[6])w64, 2));
  uint8_t bbx[2] = {0, 1}, bby[2] = {1, 1};
  int wb[2][6];
  memcpy(wb[0], LT, sizeof LT);
  memcpy(wb[1], EQ, sizeof EQ);
  CHECK(compare_case(GRAFT_BOOL, bbx, bby, (const int (*)[6])wb, 2));
}

static void test_select_constant_iota(void) {
  int64_t shape[1] = {4};
  uint8_t pred[4] = {1, 0, 0, 1};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    void *a = buf_d(dt, (double[]){1, 2, 3, 4}, 4), *b = buf_d(dt, (double[]){10, 20, 30, 40}, 4);
    void *o = buf_out(dt, 4);
    exec_instr ins = mk(IR_SELECT, dt, 1, shape, 3);
    ref_arg in[3] = {arg(pred, GRAFT_BOOL, 1, shape), arg(a, dt, 1, shape), arg(b, dt, 1, shape)};
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){1, 20, 30, 4}, 4));
    free(a);
    free(b);
    free(o);
  }
  { /* select on bool and on i64 values beyond double precision */
    uint8_t a[4] = {1, 1, 0, 0}, b[4] = {0, 0, 1, 1}, o[4];
    exec_instr ins = mk(IR_SELECT, GRAFT_BOOL, 1, shape, 3);
    ref_arg in[3] = {arg(pred, GRAFT_BOOL, 1, shape), arg(a, GRAFT_BOOL, 1, shape),
                     arg(b, GRAFT_BOOL, 1, shape)};
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 0 && o[2] == 1 && o[3] == 0);
    int64_t big = INT64_MAX - 1, ia[4] = {big, 0, 0, 0}, ib[4] = {0, 0, 0, 0}, io[4];
    ins = mk(IR_SELECT, GRAFT_I64, 1, shape, 3);
    in[1] = arg(ia, GRAFT_I64, 1, shape);
    in[2] = arg(ib, GRAFT_I64, 1, shape);
    CHECK(run(&ins, in, io) == 0 && io[0] == big);
  }
  /* constant on every dtype class */
  int64_t cs[2] = {2, 3};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    exec_instr ins = mk(IR_CONSTANT, dt, 2, cs, 0);
    ins.attr.f = dtype_is_float(dt) ? -2.5 : 7.0;
    void *o = buf_out(dt, 6);
    double v = ins.attr.f;
    CHECK(run(&ins, NULL, o) == 0 && eq_d(o, dt, (double[]){v, v, v, v, v, v}, 6));
    free(o);
  }
  {
    exec_instr ins = mk(IR_CONSTANT, GRAFT_BOOL, 2, cs, 0);
    ins.attr.f = 0.5;
    uint8_t o[6];
    CHECK(run(&ins, NULL, o) == 0 && o[0] == 1 && o[5] == 1);
    ins.attr.f = 0;
    CHECK(run(&ins, NULL, o) == 0 && o[0] == 0 && o[5] == 0);
    ins = mk(IR_CONSTANT, GRAFT_U8, 2, cs, 0);
    ins.attr.f = -1; /* wraps like a C conversion of the integer */
    CHECK(run(&ins, NULL, o) == 0 && o[0] == 255);
    ins = mk(IR_CONSTANT, GRAFT_F16, 0, cs, 0); /* 0-d: one element */
    ins.attr.f = 65504;
    uint16_t h = 0;
    CHECK(run(&ins, NULL, &h) == 0 && h == 0x7bff);
  }
  /* iota along axis 1 and axis 0 of [2,3] */
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    exec_instr ins = mk(IR_IOTA, dt, 2, cs, 0);
    ins.attr.a[0] = 1;
    void *o = buf_out(dt, 6);
    CHECK(run(&ins, NULL, o) == 0 && eq_d(o, dt, (double[]){0, 1, 2, 0, 1, 2}, 6));
    ins.attr.a[0] = 0;
    CHECK(run(&ins, NULL, o) == 0 && eq_d(o, dt, (double[]){0, 0, 0, 1, 1, 1}, 6));
    free(o);
  }
}

/* ---- movement ---- */

static void test_movement(void) {
  { /* broadcast [3] -> [2,3] and [2,1] -> [2,3], [] -> [2,3] */
    int64_t os[2] = {2, 3}, s3[1] = {3}, s21[2] = {2, 1};
    int64_t x3[3] = {INT64_MAX, 2, 3}, x21[2] = {7, 8}, o[6];
    exec_instr ins = mk(IR_BROADCAST, GRAFT_I64, 2, os, 1);
    ref_arg in[1] = {arg(x3, GRAFT_I64, 1, s3)};
    CHECK(run(&ins, in, o) == 0 && eq_i(o, GRAFT_I64, (int64_t[]){INT64_MAX, 2, 3, INT64_MAX, 2, 3}, 6));
    in[0] = arg(x21, GRAFT_I64, 2, s21);
    CHECK(run(&ins, in, o) == 0 && eq_i(o, GRAFT_I64, (int64_t[]){7, 7, 7, 8, 8, 8}, 6));
    in[0] = arg(x21, GRAFT_I64, 0, s21);
    CHECK(run(&ins, in, o) == 0 && eq_i(o, GRAFT_I64, (int64_t[]){7, 7, 7, 7, 7, 7}, 6));
    uint16_t h[1] = {0x3c00}, ho[6]; /* f16 [1,1] -> [2,3] */
    int64_t s11[2] = {1, 1};
    ins = mk(IR_BROADCAST, GRAFT_F16, 2, os, 1);
    in[0] = arg(h, GRAFT_F16, 2, s11);
    CHECK(run(&ins, in, ho) == 0 && ho[0] == 0x3c00 && ho[5] == 0x3c00);
  }
  { /* reshape [2,3] -> [3,2] */
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    float x[6] = {1, 2, 3, 4, 5, 6}, o[6];
    exec_instr ins = mk(IR_RESHAPE, GRAFT_F32, 2, s32, 1);
    ref_arg in[1] = {arg(x, GRAFT_F32, 2, s23)};
    CHECK(run(&ins, in, o) == 0 && memcmp(x, o, sizeof x) == 0);
  }
  { /* transpose [2,3,4] with perm (2,0,1): out [4,2,3], out[k][i][j] = x[i][j][k] */
    int64_t xs[3] = {2, 3, 4}, os[3] = {4, 2, 3};
    int32_t x[24], o[24];
    for (int i = 0; i < 24; i++) x[i] = i;
    exec_instr ins = mk(IR_TRANSPOSE, GRAFT_I32, 3, os, 1);
    ins.attr.a[0] = 2;
    ins.attr.a[1] = 0;
    ins.attr.a[2] = 1;
    ref_arg in[1] = {arg(x, GRAFT_I32, 3, xs)};
    CHECK(run(&ins, in, o) == 0);
    bool ok = true;
    for (int k = 0; k < 4; k++)
      for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) ok = ok && o[(k * 2 + i) * 3 + j] == x[(i * 3 + j) * 4 + k];
    CHECK(ok);
    CHECK(o[0] == 0 && o[1] == 4 && o[3] == 12 && o[6] == 1); /* spot values by hand */
  }
  { /* slice [4,5] rows 1..4 stride 2, cols 0..5 stride 3 -> [2,2] */
    int64_t xs[2] = {4, 5}, os[2] = {2, 2};
    double x[20], o[4];
    for (int i = 0; i < 20; i++) x[i] = i;
    exec_instr ins = mk(IR_SLICE, GRAFT_F64, 2, os, 1);
    ins.attr.a[0] = 1; ins.attr.a[1] = 0;   /* start */
    ins.attr.a[8] = 4; ins.attr.a[9] = 5;   /* limit */
    ins.attr.a[16] = 2; ins.attr.a[17] = 3; /* stride */
    ref_arg in[1] = {arg(x, GRAFT_F64, 2, xs)};
    CHECK(run(&ins, in, o) == 0 && eq_d(o, GRAFT_F64, (double[]){5, 8, 15, 18}, 4));
  }
  { /* concat 3 inputs along axis 1: [2,1] + [2,2] + [2,3] -> [2,6] */
    int64_t s1[2] = {2, 1}, s2[2] = {2, 2}, s3[2] = {2, 3}, os[2] = {2, 6};
    uint8_t a[2] = {1, 2}, b[4] = {3, 4, 5, 6}, c[6] = {7, 8, 9, 10, 11, 12}, o[12];
    exec_instr ins = mk(IR_CONCAT, GRAFT_U8, 2, os, 3);
    ins.attr.a[0] = 1;
    ref_arg in[3] = {arg(a, GRAFT_U8, 2, s1), arg(b, GRAFT_U8, 2, s2), arg(c, GRAFT_U8, 2, s3)};
    CHECK(run(&ins, in, o) == 0 &&
          eq_i(o, GRAFT_U8, (int64_t[]){1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12}, 12));
    /* along axis 0: [1,2] + [2,2] + [0,2] -> [3,2] */
    int64_t r1[2] = {1, 2}, r2[2] = {2, 2}, r0[2] = {0, 2}, os0[2] = {3, 2};
    ins = mk(IR_CONCAT, GRAFT_U8, 2, os0, 3);
    ins.attr.a[0] = 0;
    in[0] = arg(a, GRAFT_U8, 2, r1);
    in[1] = arg(b, GRAFT_U8, 2, r2);
    in[2] = arg(c, GRAFT_U8, 2, r0);
    CHECK(run(&ins, in, o) == 0 && eq_i(o, GRAFT_U8, (int64_t[]){1, 2, 3, 4, 5, 6}, 6));
  }
  { /* pad [2,2] with lo (1,0), hi (0,2), fill -1 -> [3,4] */
    int64_t xs[2] = {2, 2}, os[2] = {3, 4};
    for (int k = 0; k < 7; k++) {
      graft_dtype dt = NUMS[k];
      void *x = buf_d(dt, (double[]){1, 2, 3, 4}, 4), *o = buf_out(dt, 12);
      exec_instr ins = mk(IR_PAD, dt, 2, os, 1);
      ins.attr.a[0] = 1; ins.attr.a[1] = 0;
      ins.attr.a[8] = 0; ins.attr.a[9] = 2;
      ins.attr.f = dt == GRAFT_U8 ? 9 : -1;
      double f = ins.attr.f;
      ref_arg in[1] = {arg(x, dt, 2, xs)};
      CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){f, f, f, f, 1, 2, f, f, 3, 4, f, f}, 12));
      free(x);
      free(o);
    }
  }
}

/* ---- reductions ---- */

static bool reduce_case(ir_op op, graft_dtype dt, int nd, const int64_t *xs, const double *x,
                        int64_t mask, int keep, int ond, const int64_t *os, const double *want) {
  exec_instr ins = mk(op, dt, ond, os, 1);
  ins.attr.a[0] = mask;
  ins.attr.a[1] = keep;
  int64_t n = numel_of(nd, xs);
  void *xb = buf_d(dt, x, n), *o = buf_out(dt, ins.numel);
  ref_arg in[1] = {arg(xb, dt, nd, xs)};
  bool ok = run(&ins, in, o) == 0 && eq_d(o, dt, want, ins.numel);
  if (!ok) printf("  %s on %s\n", op_names[op], dname(dt));
  free(xb);
  free(o);
  return ok;
}

static void test_reduce(void) {
  /* x [2,3,2] = 0..11; reduce axes {0,2} keepdim -> [1,3,1]:
   * j=0: 0+1+6+7 = 14, j=1: 2+3+8+9 = 22, j=2: 4+5+10+11 = 30 */
  int64_t xs[3] = {2, 3, 2}, keep[3] = {1, 3, 1}, nokeep[1] = {3};
  double x[12];
  for (int i = 0; i < 12; i++) x[i] = i;
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    CHECK(reduce_case(IR_REDUCE_SUM, dt, 3, xs, x, 5, 1, 3, keep, (double[]){14, 22, 30}));
    CHECK(reduce_case(IR_REDUCE_SUM, dt, 3, xs, x, 5, 0, 1, nokeep, (double[]){14, 22, 30}));
    CHECK(reduce_case(IR_REDUCE_MAX, dt, 3, xs, x, 5, 1, 3, keep, (double[]){7, 9, 11}));
    CHECK(reduce_case(IR_REDUCE_MIN, dt, 3, xs, x, 5, 0, 1, nokeep, (double[]){0, 2, 4}));
    /* prod over axis 1 -> [2,2]: (0*2*4, 1*3*5, 6*8*10, 7*9*11) */
    int64_t ps[2] = {2, 2};
    CHECK(reduce_case(IR_REDUCE_PROD, dt, 3, xs, x, 2, 0, 2, ps,
                      dt == GRAFT_U8 ? (double[]){0, 15, 480 % 256, 693 % 256}
                                     : (double[]){0, 15, 480, 693}));
    /* all axes -> 0-d */
    CHECK(reduce_case(IR_REDUCE_SUM, dt, 3, xs, x, 7, 0, 0, NULL, (double[]){66}));
  }
  /* NaN propagates through max/min; f64 */
  int64_t s4[1] = {4};
  CHECK(reduce_case(IR_REDUCE_MAX, GRAFT_F64, 1, s4, (double[]){1, NAN, 3, 2}, 1, 0, 0, NULL, (double[]){NAN}));
  CHECK(reduce_case(IR_REDUCE_MIN, GRAFT_F32, 1, s4, (double[]){1, 2, 3, NAN}, 1, 0, 0, NULL, (double[]){NAN}));
  CHECK(reduce_case(IR_REDUCE_MAX, GRAFT_F16, 1, s4, (double[]){-1, -5, -3, -2}, 1, 0, 0, NULL, (double[]){-1}));
  /* empty reduction [2,0] over axis 1 */
  int64_t es[2] = {2, 0}, eo[1] = {2};
  CHECK(reduce_case(IR_REDUCE_SUM, GRAFT_F32, 2, es, NULL, 2, 0, 1, eo, (double[]){0, 0}));
  CHECK(reduce_case(IR_REDUCE_PROD, GRAFT_I32, 2, es, NULL, 2, 0, 1, eo, (double[]){1, 1}));
  CHECK(reduce_case(IR_REDUCE_MAX, GRAFT_F64, 2, es, NULL, 2, 0, 1, eo, (double[]){-INFINITY, -INFINITY}));
  CHECK(reduce_case(IR_REDUCE_MIN, GRAFT_BF16, 2, es, NULL, 2, 0, 1, eo, (double[]){INFINITY, INFINITY}));
  CHECK(reduce_case(IR_REDUCE_MAX, GRAFT_I32, 2, es, NULL, 2, 0, 1, eo, (double[]){INT32_MIN, INT32_MIN}));
  CHECK(reduce_case(IR_REDUCE_MIN, GRAFT_U8, 2, es, NULL, 2, 0, 1, eo, (double[]){255, 255}));
  {
    int64_t o[2];
    exec_instr ins = mk(IR_REDUCE_MAX, GRAFT_I64, 1, eo, 1);
    ins.attr.a[0] = 2;
    int64_t dummy = 0;
    ref_arg in[1] = {arg(&dummy, GRAFT_I64, 2, es)};
    CHECK(run(&ins, in, o) == 0 && o[0] == INT64_MIN && o[1] == INT64_MIN);
    ins.op = IR_REDUCE_MIN;
    CHECK(run(&ins, in, o) == 0 && o[0] == INT64_MAX);
  }
  /* integer sums wrap */
  int64_t s3[1] = {3};
  CHECK(reduce_case(IR_REDUCE_SUM, GRAFT_U8, 1, s3, (double[]){200, 100, 1}, 1, 0, 0, NULL, (double[]){45}));
  {
    int64_t v[2] = {INT64_MAX, 2}, o = 0, s2[1] = {2};
    exec_instr ins = mk(IR_REDUCE_SUM, GRAFT_I64, 0, NULL, 1);
    ins.attr.a[0] = 1;
    ref_arg in[1] = {arg(v, GRAFT_I64, 1, s2)};
    CHECK(run(&ins, in, &o) == 0 && o == INT64_MIN + 1);
  }
  /* f16 sum accumulates in double: 2048 + 1 + 1 (each +1 alone would round away in f16) */
  CHECK(reduce_case(IR_REDUCE_SUM, GRAFT_F16, 1, s3, (double[]){2048, 1, 1}, 1, 0, 0, NULL, (double[]){2050}));
  /* bool max = any, min = all */
  {
    uint8_t b[4] = {0, 1, 1, 1}, o[2];
    int64_t bs[2] = {2, 2}, os[1] = {2};
    exec_instr ins = mk(IR_REDUCE_MAX, GRAFT_BOOL, 1, os, 1);
    ins.attr.a[0] = 2;
    ref_arg in[1] = {arg(b, GRAFT_BOOL, 2, bs)};
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 1);
    ins.op = IR_REDUCE_MIN;
    CHECK(run(&ins, in, o) == 0 && o[0] == 0 && o[1] == 1);
  }
}

static void test_argmax(void) {
  /* x [2,4]; axis 1 -> [2], first maximum wins */
  int64_t xs[2] = {2, 4}, os[1] = {2};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    void *x = buf_d(dt, (double[]){1, 5, 5, 2, 9, 0, 9, 9}, 8);
    int64_t o[2] = {-1, -1};
    exec_instr ins = mk(IR_ARGMAX, GRAFT_I64, 1, os, 1);
    ins.attr.a[0] = 1;
    ref_arg in[1] = {arg(x, dt, 2, xs)};
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 0);
    /* axis 0 keepdim -> [1,4]: columns (1,9) (5,0) (5,9) (2,9) */
    int64_t o4[4], os4[2] = {1, 4};
    ins = mk(IR_ARGMAX, GRAFT_I64, 2, os4, 1);
    ins.attr.a[0] = 0;
    ins.attr.a[1] = 1;
    CHECK(run(&ins, in, o4) == 0 && eq_i(o4, GRAFT_I64, (int64_t[]){1, 0, 1, 1}, 4));
    free(x);
  }
  /* NaN counts as the maximum, the first NaN wins */
  double x[8] = {1, NAN, 7, NAN, -INFINITY, -INFINITY, 3, 3};
  int64_t o[2];
  exec_instr ins = mk(IR_ARGMAX, GRAFT_I64, 1, os, 1);
  ins.attr.a[0] = 1;
  ref_arg in[1] = {arg(x, GRAFT_F64, 2, xs)};
  CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 2);
  /* i64 beyond double precision */
  int64_t big[2] = {((int64_t)1 << 60) + 1, ((int64_t)1 << 60) + 2}, s2[1] = {2}, r = -1;
  ins = mk(IR_ARGMAX, GRAFT_I64, 0, NULL, 1);
  in[0] = arg(big, GRAFT_I64, 1, s2);
  CHECK(run(&ins, in, &r) == 0 && r == 1);
}

/* ---- contraction ---- */

static void test_dot(void) {
  /* [2,2,3] x [2,3,2]: batch 0 = [[1,2,3],[4,5,6]] x [[1,0],[0,1],[1,1]] = [[4,5],[10,11]];
   * batch 1 = [[1,1,1],[0,2,0]] x [[2,3],[4,5],[6,7]] = [[12,15],[8,10]] */
  int64_t as[3] = {2, 2, 3}, bs[3] = {2, 3, 2}, os[3] = {2, 2, 2};
  const double a[12] = {1, 2, 3, 4, 5, 6, 1, 1, 1, 0, 2, 0};
  const double b[12] = {1, 0, 0, 1, 1, 1, 2, 3, 4, 5, 6, 7};
  const double want[8] = {4, 5, 10, 11, 12, 15, 8, 10};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    void *ab = buf_d(dt, a, 12), *bb = buf_d(dt, b, 12), *o = buf_out(dt, 8);
    exec_instr ins = mk(IR_DOT, dt, 3, os, 2);
    ref_arg in[2] = {arg(ab, dt, 3, as), arg(bb, dt, 3, bs)};
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, want, 8));
    free(ab);
    free(bb);
    free(o);
  }
  { /* 2-D f32 [1,2]x[2,1] with K accumulating in double; i64 wraps; K = 0 gives zeros */
    int64_t a2[2] = {1, 2}, b2[2] = {2, 1}, o2[2] = {1, 1};
    int64_t ia[2] = {INT64_MAX, 1}, ib[2] = {2, 2}, io = 0;
    exec_instr ins = mk(IR_DOT, GRAFT_I64, 2, o2, 2);
    ref_arg in[2] = {arg(ia, GRAFT_I64, 2, a2), arg(ib, GRAFT_I64, 2, b2)};
    CHECK(run(&ins, in, &io) == 0 && io == 0); /* 2*MAX + 2 wraps to 0 */
    float fa[2] = {1e8f, 1.0f}, fb[2] = {1.0f, 1.0f}, fo = 0;
    ins = mk(IR_DOT, GRAFT_F32, 2, o2, 2);
    in[0] = arg(fa, GRAFT_F32, 2, a2);
    in[1] = arg(fb, GRAFT_F32, 2, b2);
    CHECK(run(&ins, in, &fo) == 0 && fo == (float)(1e8 + 1.0));
    int64_t z0[2] = {2, 0}, z1[2] = {0, 2}, zo[2] = {2, 2};
    double zout[4];
    ins = mk(IR_DOT, GRAFT_F64, 2, zo, 2);
    in[0] = arg(fa, GRAFT_F64, 2, z0);
    in[1] = arg(fb, GRAFT_F64, 2, z1);
    CHECK(run(&ins, in, zout) == 0 && eq_d(zout, GRAFT_F64, (double[]){0, 0, 0, 0}, 4));
  }
}

/* conv2d of x [xs] and w [ws] into output shape os with attrs; compares against want. */
static bool conv_case(graft_dtype dt, const int64_t *xs, const double *x, const int64_t *ws,
                      const double *w, const int64_t *os, const int64_t *attr, const double *want) {
  exec_instr ins = mk(IR_CONV2D, dt, 4, os, 2);
  for (int i = 0; i < 11; i++) ins.attr.a[i] = attr[i];
  void *xb = buf_d(dt, x, numel_of(4, xs)), *wb = buf_d(dt, w, numel_of(4, ws));
  void *o = buf_out(dt, ins.numel);
  ref_arg in[2] = {arg(xb, dt, 4, xs), arg(wb, dt, 4, ws)};
  bool ok = run(&ins, in, o) == 0 && eq_d(o, dt, want, ins.numel);
  if (!ok) printf("  conv2d on %s\n", dname(dt));
  free(xb);
  free(wb);
  free(o);
  return ok;
}

static void test_conv2d(void) {
  const double x9[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}; /* [1,1,3,3] */
  int64_t xs[4] = {1, 1, 3, 3}, ws[4] = {1, 1, 2, 2}, o22[4] = {1, 1, 2, 2};
  /*                      stride  plo   phi   dil   ldil  groups */
  const int64_t plain[11] = {1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  for (int k = 0; k < 4; k++) /* w = [[1,0],[0,1]]: x[i][j] + x[i+1][j+1] */
    CHECK(conv_case(FLOATS[k], xs, x9, ws, (double[]){1, 0, 0, 1}, o22, plain,
                    (double[]){6, 8, 12, 14}));
  /* stride 2, pad 1 on all sides, w all ones: OH = (3+2-2)/2+1 = 2; windows cover
   * {1}, {2,3}, {4,7}, {5,6,8,9} */
  const int64_t s2p1[11] = {2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  CHECK(conv_case(GRAFT_F32, xs, x9, ws, (double[]){1, 1, 1, 1}, o22, s2p1, (double[]){1, 5, 11, 28}));
  /* asymmetric padding: lo 1, hi 0 gives the same windows: (3+1-2)/2+1 = 2 */
  const int64_t s2lo1[11] = {2, 2, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  CHECK(conv_case(GRAFT_F64, xs, x9, ws, (double[]){1, 1, 1, 1}, o22, s2lo1, (double[]){1, 5, 11, 28}));
  /* pad lo 0, hi 1 with stride 2: windows at rows/cols {0,1},{2,pad}: {1,2,4,5}, {3,6}, {7,8}, {9} */
  const int64_t s2hi1[11] = {2, 2, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  CHECK(conv_case(GRAFT_F64, xs, x9, ws, (double[]){1, 1, 1, 1}, o22, s2hi1, (double[]){12, 9, 15, 9}));
  /* dilation 2: taps (0,0) (0,2) (2,0) (2,2) -> 1*1 + 2*3 + 3*7 + 4*9 = 64 */
  const int64_t dil2[11] = {1, 1, 0, 0, 0, 0, 2, 2, 1, 1, 1};
  int64_t o11[4] = {1, 1, 1, 1};
  CHECK(conv_case(GRAFT_F32, xs, x9, ws, (double[]){1, 2, 3, 4}, o11, dil2, (double[]){64}));
  /* dilation 2 on rows only: OH = 1, OW = 2; taps rows {0, 2}, cols {c, c+1}:
   * out[0][c] = w00*x[0][c] + w01*x[0][c+1] + w10*x[2][c] + w11*x[2][c+1] */
  const int64_t dilh[11] = {1, 1, 0, 0, 0, 0, 2, 1, 1, 1, 1};
  int64_t o12[4] = {1, 1, 1, 2};
  CHECK(conv_case(GRAFT_F32, xs, x9, ws, (double[]){1, 2, 3, 4}, o12, dilh,
                  (double[]){1 + 4 + 21 + 32, 2 + 6 + 24 + 36}));
  /* lhs dilation 2: x [[1,2],[3,4]] dilates to [[1,0,2],[0,0,0],[3,0,4]]; each 2x2 window
   * meets exactly one input: w00*1, w01*2, w10*3, w11*4 */
  const int64_t ldil2[11] = {1, 1, 0, 0, 0, 0, 1, 1, 2, 2, 1};
  int64_t x2s[4] = {1, 1, 2, 2};
  CHECK(conv_case(GRAFT_F32, x2s, (double[]){1, 2, 3, 4}, ws, (double[]){1, 2, 3, 4}, o22, ldil2,
                  (double[]){1, 4, 9, 16}));
  /* lhs dilation 2 with padding 1 (transposed-conv style), 1x1 kernel: output is the padded
   * dilated input [5,5]: zeros except (1,1)=1 (1,3)=2 (3,1)=3 (3,3)=4 */
  const int64_t ldilp[11] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 1};
  int64_t w1s[4] = {1, 1, 1, 1}, o55[4] = {1, 1, 5, 5};
  double want55[25] = {0};
  want55[6] = 1; want55[8] = 2; want55[16] = 3; want55[18] = 4;
  CHECK(conv_case(GRAFT_BF16, x2s, (double[]){1, 2, 3, 4}, w1s, (double[]){1}, o55, ldilp, want55));
  /* groups 2 with 2 output channels per group, 1x1 kernel: x [1,2,1,2] ch0 = (1,2),
   * ch1 = (5,6); w [4,1,1,1] = 1,2,3,4 -> out ch0 = ch0, ch1 = 2 ch0, ch2 = 3 ch1, ch3 = 4 ch1 */
  const int64_t g2[11] = {1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 2};
  int64_t gxs[4] = {1, 2, 1, 2}, gws[4] = {4, 1, 1, 1}, gos[4] = {1, 4, 1, 2};
  CHECK(conv_case(GRAFT_F32, gxs, (double[]){1, 2, 5, 6}, gws, (double[]){1, 2, 3, 4}, gos, g2,
                  (double[]){1, 2, 2, 4, 15, 18, 20, 24}));
  /* groups 2 with 2 input channels per group: x [1,4,1,1] = 1,2,3,4; w [2,2,1,1] =
   * [[1,10],[100,1000]] -> out0 = 1*1 + 10*2 = 21, out1 = 100*3 + 1000*4 = 4300 */
  int64_t hxs[4] = {1, 4, 1, 1}, hws[4] = {2, 2, 1, 1}, hos[4] = {1, 2, 1, 1};
  CHECK(conv_case(GRAFT_F64, hxs, (double[]){1, 2, 3, 4}, hws, (double[]){1, 10, 100, 1000}, hos,
                  g2, (double[]){21, 4300}));
  /* batch 2, 2 input channels, 2 outputs, 2x2 kernel on 2x2 input (one output pixel):
   * out[n][o] = sum over c,kh,kw x[n][c] . w[o][c] */
  int64_t bxs[4] = {2, 2, 2, 2}, bws[4] = {2, 2, 2, 2}, bos[4] = {2, 2, 1, 1};
  double bx[16], bw[16], bwant[4];
  for (int i = 0; i < 16; i++) { bx[i] = i + 1; bw[i] = (i % 3) - 1; }
  for (int n = 0; n < 2; n++)
    for (int o = 0; o < 2; o++) {
      double s = 0;
      for (int j = 0; j < 8; j++) s += bx[n * 8 + j] * bw[o * 8 + j];
      bwant[n * 2 + o] = s;
    }
  CHECK(conv_case(GRAFT_F32, bxs, bx, bws, bw, bos, plain, bwant));
  CHECK(bwant[0] == -1 + 0 + 3 + -4 + 0 + 6 + -7 + 0); /* the expected values, by hand */
}

/* ---- indexing ---- */

static void test_gather_scatter(void) {
  int64_t xs[2] = {2, 3}, is[2] = {2, 2};
  const double x[6] = {1, 2, 3, 4, 5, 6};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    graft_dtype it = k % 2 ? GRAFT_I32 : GRAFT_I64;
    void *xb = buf_d(dt, x, 6), *ib = buf_i(it, (int64_t[]){2, 0, 1, 1}, 4), *o = buf_out(dt, 4);
    exec_instr ins = mk(IR_GATHER, dt, 2, is, 2);
    ins.attr.a[0] = 1;
    ref_arg in[2] = {arg(xb, dt, 2, xs), arg(ib, it, 2, is)};
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){3, 1, 5, 5}, 4));
    /* axis 0 with index [1,3] = (1,0,1) -> (4,2,6) */
    int64_t i13[2] = {1, 3};
    void *ib0 = buf_i(it, (int64_t[]){1, 0, 1}, 3);
    ins = mk(IR_GATHER, dt, 2, i13, 2);
    ins.attr.a[0] = 0;
    in[1] = arg(ib0, it, 2, i13);
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){4, 2, 6}, 3));
    free(xb);
    free(ib);
    free(ib0);
    free(o);
  }
  { /* gather on bool; out-of-range index is an error */
    uint8_t b[6] = {0, 1, 0, 1, 1, 0}, o[4];
    int32_t idx[4] = {1, 0, 3, 0};
    exec_instr ins = mk(IR_GATHER, GRAFT_BOOL, 2, is, 2);
    ins.attr.a[0] = 1;
    ref_arg in[2] = {arg(b, GRAFT_BOOL, 2, xs), arg(idx, GRAFT_I32, 2, is)};
    clear_err();
    CHECK(run(&ins, in, o) == -1);
    CHECK(last_status() == GRAFT_ERR_ARG);
    CHECK(strcmp(last_msg(), "gather: index 3 out of range [0, 3) on axis 1") == 0);
    idx[2] = -1;
    clear_err();
    CHECK(run(&ins, in, o) == -1 && strstr(last_msg(), "index -1") != NULL);
    idx[2] = 2;
    clear_err();
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 0 && o[2] == 0 && o[3] == 1);
  }
  /* scatter_add: x [2,3] = base, axis 1, index [[0,0],[2,1]], src [[1,2],[3,4]]:
   * row 0 gets 1+2 at col 0; row 1 gets 3 at col 2 and 4 at col 1 */
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    graft_dtype it = k % 2 ? GRAFT_I64 : GRAFT_I32;
    void *xb = buf_d(dt, (double[]){10, 20, 30, 40, 50, 60}, 6);
    void *ib = buf_i(it, (int64_t[]){0, 0, 2, 1}, 4), *sb = buf_d(dt, (double[]){1, 2, 3, 4}, 4);
    void *o = buf_out(dt, 6);
    exec_instr ins = mk(IR_SCATTER_ADD, dt, 2, xs, 3);
    ins.attr.a[0] = 1;
    ref_arg in[3] = {arg(xb, dt, 2, xs), arg(ib, it, 2, is), arg(sb, dt, 2, is)};
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){13, 20, 30, 40, 54, 63}, 6));
    /* axis 0, index [1,3] = (1,1,0), src (1,2,3) */
    int64_t i13[2] = {1, 3};
    void *ib0 = buf_i(it, (int64_t[]){1, 1, 0}, 3), *sb0 = buf_d(dt, (double[]){1, 2, 3}, 3);
    ins.attr.a[0] = 0;
    in[1] = arg(ib0, it, 2, i13);
    in[2] = arg(sb0, dt, 2, i13);
    CHECK(run(&ins, in, o) == 0 && eq_d(o, dt, (double[]){10, 20, 33, 41, 52, 60}, 6));
    /* out of range */
    dtype_store_i(ib0, it, 1, 2);
    clear_err();
    CHECK(run(&ins, in, o) == -1 && last_status() == GRAFT_ERR_ARG);
    CHECK(strcmp(last_msg(), "scatter_add: index 2 out of range [0, 2) on axis 0") == 0);
    free(xb);
    free(ib);
    free(sb);
    free(ib0);
    free(sb0);
    free(o);
  }
  { /* f16 scatter_add accumulates in double: 2048 + 1 + 1 -> 2050 (not 2048) */
    int64_t s1[1] = {1}, s2[1] = {2};
    uint16_t xh = dtype_f32_to_f16(2048), src[2] = {0x3c00, 0x3c00}, o = 0;
    int64_t idx[2] = {0, 0};
    exec_instr ins = mk(IR_SCATTER_ADD, GRAFT_F16, 1, s1, 3);
    ref_arg in[3] = {arg(&xh, GRAFT_F16, 1, s1), arg(idx, GRAFT_I64, 1, s2), arg(src, GRAFT_F16, 1, s2)};
    CHECK(run(&ins, in, &o) == 0 && dtype_f16_to_f32(o) == 2050.0f);
  }
}

/* ---- reduce_window ---- */

static void test_reduce_window(void) {
  /* x [1,1,3,3], window 2x2 stride 2 pad 1 on every side -> [1,1,2,2] */
  int64_t xs[4] = {1, 1, 3, 3}, os[4] = {1, 1, 2, 2};
  for (int k = 0; k < 7; k++) {
    graft_dtype dt = NUMS[k];
    bool neg = dtype_is_float(dt) || dt != GRAFT_U8;
    double x[9];
    for (int i = 0; i < 9; i++) x[i] = neg ? -(i + 1) : i + 1;
    exec_instr ins = mk(IR_REDUCE_WINDOW, dt, 4, os, 1);
    for (int d = 0; d < 4; d++) {
      ins.attr.a[8 + d] = d < 2 ? 1 : 2;
      ins.attr.a[16 + d] = d < 2 ? 1 : 2;
      ins.attr.a[24 + d] = d < 2 ? 0 : 1;
      ins.attr.a[32 + d] = d < 2 ? 0 : 1;
    }
    void *xb = buf_d(dt, x, 9), *o = buf_out(dt, 4);
    ref_arg in[1] = {arg(xb, dt, 4, xs)};
    /* windows: {1}, {2,3}, {4,7}, {5,6,8,9}; with negated values padding (0) must not win */
    ins.attr.a[0] = 0;
    CHECK(run(&ins, in, o) == 0 &&
          eq_d(o, dt, neg ? (double[]){-1, -2, -4, -5} : (double[]){1, 3, 7, 9}, 4));
    ins.attr.a[0] = 1;
    CHECK(run(&ins, in, o) == 0 &&
          eq_d(o, dt, neg ? (double[]){-1, -5, -11, -28} : (double[]){1, 5, 11, 28}, 4));
    free(xb);
    free(o);
  }
  { /* 1-D i32 sum, window 3 stride 1, pad lo 2 hi 0: out = (4+2-3)/1+1 = 4 */
    int64_t s4[1] = {4}, o4s[1] = {4};
    int32_t x[4] = {1, 2, 3, 4}, o[4];
    exec_instr ins = mk(IR_REDUCE_WINDOW, GRAFT_I32, 1, o4s, 1);
    ins.attr.a[0] = 1;
    ins.attr.a[8] = 3;
    ins.attr.a[16] = 1;
    ins.attr.a[24] = 2;
    ref_arg in[1] = {arg(x, GRAFT_I32, 1, s4)};
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 3 && o[2] == 6 && o[3] == 9);
    ins.attr.a[0] = 0; /* max with NaN-free ints */
    CHECK(run(&ins, in, o) == 0 && o[0] == 1 && o[1] == 2 && o[2] == 3 && o[3] == 4);
  }
  { /* NaN propagates through window max */
    int64_t s3[1] = {3}, os1[1] = {2};
    double x[3] = {1, NAN, 2}, o[2];
    exec_instr ins = mk(IR_REDUCE_WINDOW, GRAFT_F64, 1, os1, 1);
    ins.attr.a[8] = 2;
    ins.attr.a[16] = 1;
    ref_arg in[1] = {arg(x, GRAFT_F64, 1, s3)};
    CHECK(run(&ins, in, o) == 0 && isnan(o[0]) && isnan(o[1]));
  }
}

/* ---- rng ---- */

/* The spec of the generator written out independently of ref_rng.h. */
static uint64_t spec_bits(uint64_t seed, uint64_t ctr) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + ctr * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int rng_run(graft_dtype dt, int dist, int64_t seed, int64_t n, void *o) {
  int64_t shape[1] = {n};
  exec_instr ins = mk(IR_RNG, dt, 1, shape, 1);
  ins.attr.a[0] = dist;
  ref_arg in[1] = {arg(&seed, GRAFT_I64, 0, NULL)};
  return run(&ins, in, o);
}

static void test_rng(void) {
  enum { N = 100000 };
  CHECK(ref_rng_bits(0, 0) == spec_bits(0, 0));
  CHECK(ref_rng_bits(12345, 678) == spec_bits(12345, 678));
  CHECK(ref_rng_bits(~0ull, ~0ull) == spec_bits(~0ull, ~0ull));
  double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
  CHECK(rng_run(GRAFT_F64, 0, 42, N, a) == 0 && rng_run(GRAFT_F64, 0, 42, N, b) == 0);
  CHECK(memcmp(a, b, N * sizeof *a) == 0); /* same seed, same values */
  CHECK(a[7] == (double)(spec_bits(42, 7) >> 11) * 0x1.0p-53);
  double sum = 0, lo = 1, hi = 0;
  for (int i = 0; i < N; i++) {
    sum += a[i];
    lo = fmin(lo, a[i]);
    hi = fmax(hi, a[i]);
  }
  CHECK(lo >= 0 && hi < 1);
  CHECK(fabs(sum / N - 0.5) < 0.01);
  CHECK(rng_run(GRAFT_F64, 0, 43, N, b) == 0);
  int same = 0;
  for (int i = 0; i < N; i++) same += a[i] == b[i];
  CHECK(same < 10); /* a different seed gives a different stream */
  /* normal: mean ~0, variance ~1 */
  CHECK(rng_run(GRAFT_F64, 1, 7, N, a) == 0);
  double m = 0, v = 0;
  for (int i = 0; i < N; i++) m += a[i];
  m /= N;
  for (int i = 0; i < N; i++) v += (a[i] - m) * (a[i] - m);
  v /= N;
  CHECK(fabs(m) < 0.02 && fabs(v - 1) < 0.02);
  {
    double u1 = (double)((spec_bits(7, 10) >> 11) + 1) * 0x1.0p-53;
    double u2 = (double)(spec_bits(7, 11) >> 11) * 0x1.0p-53;
    CHECK(a[5] == sqrt(-2 * log(u1)) * cos(6.283185307179586476925 * u2));
  }
  /* narrow dtypes: uniform stays below 1 and matches the f64 stream rounded */
  float *f = malloc(N * sizeof *f);
  uint16_t *h = malloc(N * sizeof *h), *bh = malloc(N * sizeof *bh);
  CHECK(rng_run(GRAFT_F32, 0, 42, N, f) == 0 && rng_run(GRAFT_F16, 0, 42, N, h) == 0 &&
        rng_run(GRAFT_BF16, 0, 42, N, bh) == 0 && rng_run(GRAFT_F64, 0, 42, N, a) == 0);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    double hv = dtype_f16_to_f32(h[i]), bv = dtype_bf16_to_f32(bh[i]);
    bad += !(f[i] >= 0 && f[i] < 1 && hv >= 0 && hv < 1 && bv >= 0 && bv < 1);
    bad += fabs(f[i] - a[i]) > 1e-7 || fabs(hv - a[i]) > 1e-3 || fabs(bv - a[i]) > 4e-3;
  }
  CHECK(bad == 0);
  CHECK(rng_run(GRAFT_BF16, 1, 7, N, bh) == 0);
  m = 0;
  for (int i = 0; i < N; i++) m += dtype_bf16_to_f32(bh[i]);
  CHECK(fabs(m / N) < 0.02);
  { /* a value that rounds to 1.0 in f16/bf16 is stored as the largest value below 1 */
    uint64_t seed = 0;
    int64_t idx = -1;
    for (int64_t i = 0; i < N && idx < 0; i++) /* find an element with u >= 1 - 2^-12 */
      if ((double)(spec_bits(seed, (uint64_t)i) >> 11) * 0x1.0p-53 >= 1 - 0x1p-12) idx = i;
    CHECK(idx >= 0);
    if (idx >= 0) {
      CHECK(rng_run(GRAFT_F16, 0, 0, idx + 1, h) == 0 && h[idx] == 0x3bff);
      CHECK(rng_run(GRAFT_BF16, 0, 0, idx + 1, bh) == 0 && bh[idx] == 0x3f7f);
    }
  }
  free(a);
  free(b);
  free(f);
  free(h);
  free(bh);
}

int main(void) {
  test_table();
  test_f16();
  test_bf16();
  test_load_store();
  test_unary();
  test_convert();
  test_binary();
  test_compare();
  test_select_constant_iota();
  test_movement();
  test_reduce();
  test_argmax();
  test_dot();
  test_conv2d();
  test_gather_scatter();
  test_reduce_window();
  test_rng();
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail > 0;
}
