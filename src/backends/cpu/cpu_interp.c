/* The first tier: a new graph runs at once, one instruction at a time, while it waits to be
 * compiled. Contractions, convolutions, pooling, gather and scatter_add take the host kernels
 * (BLAS, im2col): a CNN step ran 107 ms on the reference kernels alone. Float elementwise ops
 * and the copying movement ops (broadcast, transpose, slice) take typed loops here: the same
 * math as the reference kernels (float math in double, rounded once), so the same results,
 * without a dtype dispatch per element. Everything else runs on the reference kernels. */
#include "cpu_internal.h"
#include "opmath.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

static bool interp_supports(const exec_instr *ins) {
  return ins->op == IR_DATA || ref_kernels[ins->op] != NULL;
}

static void *interp_compile(const exec_program *p) { return (void *)p; } /* nothing to build */

/* ---- float elementwise (f32 and f64; operands share the output's shape) ----
 * The loops are generated from ops.def's math lines (M1 / M2), the same lines the reference
 * kernels are generated from: equal results by construction. */
#define UNARY_LOOP(T, EXPR)                                                                      \
  do {                                                                                           \
    const T *x = in[0].data;                                                                     \
    T *y = out;                                                                                  \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                        \
      double v = x[i];                                                                           \
      y[i] = (T)(EXPR);                                                                          \
    }                                                                                            \
  } while (0)

static int interp_unary(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  bool f32 = ins->dtype == GRAFT_F32;
  switch (ins->op) {
#define M1(e, expr) case IR_##e: if (f32) UNARY_LOOP(float, expr); else UNARY_LOOP(double, expr); break;
#include "ops.def"
  default: return -1;
  }
  return 0;
}

#define BINARY_LOOP(T, EXPR)                                                                     \
  do {                                                                                           \
    const T *x = in[0].data, *z = in[1].data;                                                    \
    T *y = out;                                                                                  \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                        \
      double a = x[i], b = z[i];                                                                 \
      y[i] = (T)(EXPR);                                                                          \
    }                                                                                            \
  } while (0)

static int interp_binary(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  bool f32 = ins->dtype == GRAFT_F32;
  switch (ins->op) {
#define M2(e, expr) case IR_##e: if (f32) BINARY_LOOP(float, expr); else BINARY_LOOP(double, expr); break;
#include "ops.def"
  default: return -1;
  }
  return 0;
}

/* A typed loop where the table declares one (OPS_INTERP_LOOP) and ops.def has the math. */
static bool interp_loop_ok(ir_op op, int math) {
  return ir_ops[op].interp == OPS_INTERP_LOOP && ir_op_math[op] == math;
}

/* NaN: every comparison false except ne */
#define COMPARE_LOOP(T, EXPR)                                                                    \
  do {                                                                                           \
    const T *x = in[0].data, *z = in[1].data;                                                    \
    uint8_t *y = out;                                                                            \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                        \
      T a = x[i], b = z[i];                                                                      \
      y[i] = (EXPR);                                                                             \
    }                                                                                            \
  } while (0)

#define COMPARE_OPS(T)                                                                           \
  do {                                                                                           \
    switch (ins->op) {                                                                           \
    case IR_EQ: COMPARE_LOOP(T, a == b); break;                                                  \
    case IR_NE: COMPARE_LOOP(T, !(a == b)); break;                                               \
    case IR_LT: COMPARE_LOOP(T, a < b); break;                                                   \
    case IR_LE: COMPARE_LOOP(T, a <= b); break;                                                  \
    case IR_GT: COMPARE_LOOP(T, a > b); break;                                                   \
    default: COMPARE_LOOP(T, a >= b); break;                                                     \
    }                                                                                            \
  } while (0)

static int interp_compare(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  if (in[0].dtype == GRAFT_F32) COMPARE_OPS(float);
  else COMPARE_OPS(double);
  return 0;
}

#define SELECT_LOOP(T)                                                                           \
  do {                                                                                           \
    const uint8_t *c = in[0].data;                                                               \
    const T *a = in[1].data, *b = in[2].data;                                                    \
    T *y = out;                                                                                  \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = c[i] ? a[i] : b[i];               \
  } while (0)

static int interp_select(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  if (ins->dtype == GRAFT_F32) SELECT_LOOP(float);
  else SELECT_LOOP(double);
  return 0;
}

/* ---- bool logic (and, or, xor, not: masks such as hardtanh's gradient) and float fills ---- */
static int interp_logical(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  const uint8_t *x = in[0].data, *z = ins->nin > 1 ? in[1].data : NULL;
  uint8_t *y = out;
  switch (ins->op) {
  case IR_AND: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = (x[i] != 0) & (z[i] != 0); break;
  case IR_OR: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = (x[i] != 0) | (z[i] != 0); break;
  case IR_XOR: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = (x[i] != 0) ^ (z[i] != 0); break;
  case IR_NOT: _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = x[i] == 0; break;
  default: return -1;
  }
  return 0;
}

static bool interp_logical_ok(const exec_instr *ins, const ref_arg *in) {
  if (ins->dtype != GRAFT_BOOL || ir_ops[ins->op].dtypes != IR_D_INTBOOL ||
      ir_ops[ins->op].interp != OPS_INTERP_LOOP)
    return false;
  for (int k = 0; k < ins->nin; k++)
    if (in[k].dtype != GRAFT_BOOL) return false;
  return true;
}

/* n elements of value as dt stores it (dtype_store's rounding, as the reference kernels). */
static void interp_fill(void *out, graft_dtype dt, int64_t n, double value) {
  size_t es = graft_dtype_size(dt);
  unsigned char v[16];
  dtype_store(v, dt, 0, value);
  if (es == 4) {
    uint32_t f, *y = out;
    memcpy(&f, v, 4);
    for (int64_t i = 0; i < n; i++) y[i] = f;
  } else if (es == 8) {
    uint64_t f, *y = out;
    memcpy(&f, v, 8);
    for (int64_t i = 0; i < n; i++) y[i] = f;
  } else {
    for (int64_t i = 0; i < n; i++) memcpy((char *)out + (size_t)i * es, v, es);
  }
}

static int interp_constant(const exec_instr *ins, const ref_arg *in, void *out) {
  (void)in;
  interp_fill(out, ins->dtype, ins->numel, ins->attr.f);
  return 0;
}

/* ---- copying movement: dst[dbase + sum c[d] * dst[d]] = src[sbase + sum c[d] * sst[d]] over
 * a shape, any dtype (broadcast, transpose, slice: dst is the output, row-major; pad: the
 * operand is copied into the filled output at strides). The dims are coalesced first (those
 * of size 1 dropped, neighbours that step through both sides as one dim merged), so a
 * per-channel broadcast [1,C,1,1] -> [N,C,H,W] copies rows of H*W equal values, not rows of
 * W, and a scalar broadcast is one fill. */
typedef struct {
  int nd;
  int64_t shape[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS];
  size_t es;
  const void *src;
  int64_t sbase, dbase;
  void *out;
} interp_copy;

static void interp_coalesce(interp_copy *g, int nd, const int64_t *shape, const int64_t *sst,
                            const int64_t *dst) {
  g->nd = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    int k = g->nd - 1;
    if (k >= 0 && g->sst[k] == sst[d] * shape[d] && g->dst[k] == dst[d] * shape[d]) {
      g->shape[k] *= shape[d]; /* dim k steps like d, shape[d] times on */
      g->sst[k] = sst[d];
      g->dst[k] = dst[d];
      continue;
    }
    g->shape[g->nd] = shape[d];
    g->sst[g->nd] = sst[d];
    g->dst[g->nd++] = dst[d];
  }
  if (g->nd == 0) { /* one element */
    g->shape[0] = 1;
    g->sst[0] = g->dst[0] = 0;
    g->nd = 1;
  }
}

/* One row: inner elements from stride is (0: a fill) to stride os. */
static void interp_copy_row(char *o, int64_t os, const char *s, int64_t is, int64_t inner,
                            size_t es) {
  if (is == 1 && os == 1) {
    memcpy(o, s, (size_t)inner * es);
  } else if (es == 4) {
    const uint32_t *sp = (const uint32_t *)(const void *)s;
    uint32_t *op = (uint32_t *)(void *)o;
    if (is == 0 && os == 1) {
      uint32_t v = sp[0];
      for (int64_t k = 0; k < inner; k++) op[k] = v;
    } else if (os == 1) {
      for (int64_t k = 0; k < inner; k++) op[k] = sp[k * is];
    } else {
      for (int64_t k = 0; k < inner; k++) op[k * os] = sp[k * is];
    }
  } else {
    for (int64_t k = 0; k < inner; k++)
      memcpy(o + (size_t)(k * os) * es, s + (size_t)(k * is) * es, es);
  }
}

/* Rows [lo, hi) of the shape (a row: the innermost coalesced dim). */
static void interp_copy_rows(void **S, int64_t lo, int64_t hi) {
  const interp_copy *g = S[0];
  size_t es = g->es;
  int nd = g->nd;
  int64_t c[GRAFT_MAX_DIMS] = {0}, inner = g->shape[nd - 1], so = g->sbase, doff = g->dbase;
  for (int64_t d = nd - 2, r = lo; d >= 0; d--) { /* row lo's coordinates */
    c[d] = r % g->shape[d];
    r /= g->shape[d];
    so += c[d] * g->sst[d];
    doff += c[d] * g->dst[d];
  }
  char *o = g->out;
  const char *s = g->src;
  for (int64_t r = lo; r < hi; r++) {
    interp_copy_row(o + (size_t)doff * es, g->dst[nd - 1], s + (size_t)so * es, g->sst[nd - 1],
                    inner, es);
    for (int d = nd - 2; d >= 0; d--) { /* odometer over the outer dims */
      so += g->sst[d];
      doff += g->dst[d];
      if (++c[d] < g->shape[d]) break;
      so -= g->sst[d] * g->shape[d];
      doff -= g->dst[d] * g->shape[d];
      c[d] = 0;
    }
  }
}

/* Big first-tier loops run on the pool (a new graph's steps run here until its code lands:
 * mobilenet_v2's first steps spent a quarter of their time in these copies and loops). */
enum { INTERP_PAR_MIN = 32768 };

static void interp_copy_strided(int nd, const int64_t *shape, graft_dtype dt, const void *src,
                                int64_t sbase, const int64_t *sst, void *out, int64_t dbase,
                                const int64_t *dst) {
  int64_t numel = 1;
  for (int d = 0; d < nd; d++) numel *= shape[d];
  if (numel == 0) return;
  interp_copy g = {.es = graft_dtype_size(dt), .src = src, .sbase = sbase, .out = out, .dbase = dbase};
  interp_coalesce(&g, nd, shape, sst, dst);
  if (g.nd == 1 && g.shape[0] >= INTERP_PAR_MIN) /* one long row: rows of it for the pool */
    for (int64_t parts = 64; parts >= 2; parts /= 2)
      if (g.shape[0] % parts == 0) {
        g.shape[1] = g.shape[0] / parts, g.sst[1] = g.sst[0], g.dst[1] = g.dst[0];
        g.shape[0] = parts, g.sst[0] *= g.shape[1], g.dst[0] *= g.shape[1];
        g.nd = 2;
        break;
      }
  void *S[1] = {&g};
  int64_t rows = numel / g.shape[g.nd - 1];
  if (numel >= INTERP_PAR_MIN && rows >= 2) cpu_parallel_run(interp_copy_rows, S, rows);
  else interp_copy_rows(S, 0, rows);
}

static void interp_row_major(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

/* The instruction's output, row-major, from src at strides sst. */
static void interp_gather_strided(const exec_instr *ins, const void *src, int64_t base,
                                  const int64_t *sst, void *out) {
  int64_t ost[GRAFT_MAX_DIMS];
  interp_row_major(ins->ndim, ins->shape, ost);
  interp_copy_strided(ins->ndim, ins->shape, ins->dtype, src, base, sst, out, 0, ost);
}

static void interp_src_strides(const ref_arg *x, int64_t *st) { interp_row_major(x->ndim, x->shape, st); }

static int interp_broadcast(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t st[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS] = {0};
  int off = ins->ndim - in[0].ndim; /* operand dims are right-aligned */
  interp_src_strides(&in[0], st);
  for (int d = 0; d < in[0].ndim; d++) sst[d + off] = in[0].shape[d] == 1 ? 0 : st[d];
  interp_gather_strided(ins, in[0].data, 0, sst, out);
  return 0;
}

static int interp_transpose(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t st[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS];
  interp_src_strides(&in[0], st);
  for (int d = 0; d < ins->ndim; d++) sst[d] = st[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)];
  interp_gather_strided(ins, in[0].data, 0, sst, out);
  return 0;
}

static int interp_slice(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t st[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], base = 0;
  interp_src_strides(&in[0], st);
  for (int d = 0; d < ins->ndim; d++) {
    sst[d] = st[d] * IR_ATTR_AT(ins->attr, SLICE, stride, d);
    base += IR_ATTR_AT(ins->attr, SLICE, start, d) * st[d];
  }
  interp_gather_strided(ins, in[0].data, base, sst, out);
  return 0;
}

/* The fill everywhere, then the operand at strides (1 + interior) from lo (pads are >= 0:
 * the API's checks). */
static int interp_pad(const exec_instr *ins, const ref_arg *in, void *out) {
  interp_fill(out, ins->dtype, ins->numel, ins->attr.f);
  int64_t ost[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS], dbase = 0;
  interp_row_major(ins->ndim, ins->shape, ost);
  interp_src_strides(&in[0], sst);
  for (int d = 0; d < ins->ndim; d++) {
    dst[d] = ost[d] * (1 + IR_ATTR_AT(ins->attr, PAD, interior, d));
    dbase += IR_ATTR_AT(ins->attr, PAD, lo, d) * ost[d];
  }
  interp_copy_strided(in[0].ndim, in[0].shape, ins->dtype, in[0].data, 0, sst, out, dbase, dst);
  return 0;
}

/* An elementwise loop whose operands share the output's shape, over element ranges on the
 * pool: each chunk runs the loop on its range (a copy of the instruction with that numel, the
 * operands and output offset to it). */
typedef struct {
  ref_fn fn;
  const exec_instr *ins;
  const ref_arg *in;
  void *out;
  int rc;
} interp_split;

static void interp_split_range(void **S, int64_t lo, int64_t hi) {
  interp_split *sp = S[0];
  exec_instr part = *sp->ins;
  ref_arg a[3];
  part.numel = hi - lo;
  for (int k = 0; k < part.nin && k < 3; k++) {
    a[k] = sp->in[k];
    a[k].data = (char *)a[k].data + (size_t)lo * graft_dtype_size(a[k].dtype);
    a[k].numel = hi - lo;
  }
  char *o = (char *)sp->out + (size_t)lo * graft_dtype_size(part.dtype);
  if (sp->fn(&part, a, o)) __atomic_store_n(&sp->rc, -1, __ATOMIC_RELAXED);
}

#define INTERP_PARALLEL(name)                                                                    \
  static int name##_par(const exec_instr *ins, const ref_arg *in, void *out) {                   \
    if (ins->numel < INTERP_PAR_MIN || ins->nin > 3) return name(ins, in, out);                 \
    interp_split sp = {name, ins, in, out, 0};                                                   \
    void *S[1] = {&sp};                                                                          \
    cpu_parallel_run(interp_split_range, S, ins->numel);                                         \
    return sp.rc;                                                                                \
  }
INTERP_PARALLEL(interp_unary)
INTERP_PARALLEL(interp_binary)
INTERP_PARALLEL(interp_compare)
INTERP_PARALLEL(interp_select)
INTERP_PARALLEL(interp_logical)
INTERP_PARALLEL(interp_constant)

static ref_fn interp_pick(const exec_instr *ins, const ref_arg *in) {
  cpu_host_fn host = cpu_host_kernel(ins, in);
  if (host || (host = cpu_reduce_kernel(ins, in))) return host;
  bool fl = ins->dtype == GRAFT_F32 || ins->dtype == GRAFT_F64;
  if (interp_logical_ok(ins, in)) return interp_logical_par;
  if (ins->op == IR_CONSTANT && fl && ir_ops[IR_CONSTANT].interp == OPS_INTERP_LOOP)
    return interp_constant_par;
  switch (ir_ops[ins->op].kind) {
  case IR_K_UNARY:
    return fl && in[0].dtype == ins->dtype && interp_loop_ok(ins->op, OPS_MATH_UNARY)
               ? interp_unary_par : NULL;
  case IR_K_BINARY:
    return fl && in[0].dtype == ins->dtype && in[1].dtype == ins->dtype &&
                   interp_loop_ok(ins->op, OPS_MATH_BINARY) ? interp_binary_par : NULL;
  case IR_K_COMPARE:
    return (in[0].dtype == GRAFT_F32 || in[0].dtype == GRAFT_F64) && in[1].dtype == in[0].dtype
               ? interp_compare_par : NULL;
  case IR_K_SELECT:
    return fl && in[0].dtype == GRAFT_BOOL && in[1].dtype == ins->dtype && in[2].dtype == ins->dtype
               ? interp_select_par : NULL;
  default: break;
  }
  switch (ins->op) {
  case IR_BROADCAST: return interp_broadcast;
  case IR_TRANSPOSE: return interp_transpose;
  case IR_SLICE: return interp_slice;
  case IR_PAD: return interp_pad;
  default: return NULL;
  }
}

ops_interp_path cpu_interp_route(const exec_instr *ins, const ref_arg *in) {
  if (cpu_host_kernel(ins, in)) return OPS_INTERP_HOST;
  ref_fn f = interp_pick(ins, in);
  if (!f) return OPS_INTERP_REF;
  return f == interp_broadcast || f == interp_transpose || f == interp_slice || f == interp_pad
             ? OPS_INTERP_COPY
                                                                            : OPS_INTERP_LOOP; /* cpu_interp.c, or cpu_reduce.c for reductions */
}

static int interp_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                          exec_buffer **outs) {
  (void)exe;
  return ref_run(p, params, outs, interp_pick);
}

/* GRAFT_CHECK: the kernel that computed slot (one instruction at a time here). */
static void interp_explain(void *exe, const exec_program *p, int slot, char *buf, size_t n,
                           char **source) {
  (void)exe;
  const exec_instr *ins = &p->instr[slot];
  ref_arg a[16];
  for (int k = 0; k < ins->nin && k < 16; k++) {
    const exec_instr *x = &p->instr[ins->in[k]];
    a[k] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel}; /* the picks read no data */
  }
  ops_interp_path r = ins->nin <= 16 ? cpu_interp_route(ins, a) : OPS_INTERP_REF;
  const char *what = r == OPS_INTERP_HOST ? "the host kernel (cpu_kernels.c)"
                   : r == OPS_INTERP_REF ? "the reference kernel" : "a typed loop of cpu_interp.c";
  snprintf(buf, n, "%s for %s %%%d, on the first tier (one instruction at a time; an operand "
           "that is not an output may already have differed)", what, ir_ops[ins->op].name, slot);
  if (source) *source = NULL;
}

const backend cpu_interp_backend = {
    .name = "interp",
    .supports = interp_supports,
    .compile = interp_compile,
    .execute = interp_execute,
    .free_exe = NULL,
    .explain = interp_explain,
};
