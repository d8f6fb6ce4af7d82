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
#define X(e, name, arity, kind, dts) [IR_##e] = name,
#include "ops.def"
#undef X
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
  ref_arg a = {data, dt, nd, shape, numel_of(nd, shape)};
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

/* True when out (dtype dt) equals want[0..n) within tol (NaN matches NaN). */
static bool eq_d(const void *out, graft_dtype dt, const double *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++) {
    double g = dtype_load(out, dt, i);
    if (isnan(want[i]) ? !isnan(g) : !(fabs(g - want[i]) <= tol)) {
      printf("  [%lld] got %.17g want %.17g (%s)\n", (long long)i, g, want[i],
             graft_dtype_name_local(dt));
      return false;
    }
  }
  return true;
}
