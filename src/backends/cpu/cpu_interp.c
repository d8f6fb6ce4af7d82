/* The first tier: a new graph runs at once, one instruction at a time, while it waits to be
 * compiled. Contractions, convolutions, pooling, gather and scatter_add take the host kernels
 * (BLAS, im2col): a CNN step ran 107 ms on the reference kernels alone. Float elementwise ops
 * and the copying movement ops (broadcast, transpose, slice) take typed loops here: the same
 * math as the reference kernels (float math in double, rounded once), so the same results,
 * without a dtype dispatch per element. Everything else runs on the reference kernels. */
#include "cpu_internal.h"
#include "opmath.h"
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static bool interp_supports(const exec_instr *ins) {
  return ins->op == IR_DATA || ref_kernels[ins->op] != NULL;
}


/* ---- float elementwise (f32 and f64; operands share the output's shape) ----
 * The loops are generated from ops.def's math lines (M1 / M2), the same lines the reference
 * kernels are generated from: equal results by construction. */
/* The loops are built for AVX-512, AVX2 and the baseline (CPU_ISAS): baseline x86-64 did 2
 * doubles an instruction, and these loops are the first tier's elementwise time (float math
 * in double). */

#define UNARY_LOOP(T, EXPR)                                                                      \
  do {                                                                                           \
    const T *x = in[0].data;                                                                     \
    T *y = out;                                                                                  \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                        \
      double v = x[i];                                                                           \
      y[i] = (T)(EXPR);                                                                          \
    }                                                                                            \
  } while (0)

CPU_ISAS static int interp_unary(const exec_instr *ins, const ref_arg *in, void *out) {
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

/* f32 +, -, *, / in float: the same result as in double rounded once (double's 53 bits are
 * more than 2 x 24 + 2, so the double rounding is exact), in half the conversions: these loops
 * were the first tier's biggest elementwise cost (resnet18's fused groups). */
#define FLOAT_LOOP(OP)                                                                           \
  do {                                                                                           \
    const float *x = in[0].data, *z = in[1].data;                                                \
    float *y = out;                                                                              \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = x[i] OP z[i];                     \
  } while (0)

CPU_ISAS static int interp_binary(const exec_instr *ins, const ref_arg *in, void *out) {
  int64_t n = ins->numel;
  bool f32 = ins->dtype == GRAFT_F32;
  if (f32) {
    switch (ins->op) {
    case IR_ADD: FLOAT_LOOP(+); return 0;
    case IR_SUB: FLOAT_LOOP(-); return 0;
    case IR_MUL: FLOAT_LOOP(*); return 0;
    case IR_DIV: FLOAT_LOOP(/); return 0;
    default: break;
    }
  }
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

CPU_ISAS static int interp_compare(const exec_instr *ins, const ref_arg *in, void *out) {
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

CPU_ISAS static int interp_select(const exec_instr *ins, const ref_arg *in, void *out) {
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

/* A broadcast, transpose or slice: its output, row-major, read from its operand at the strides
 * of the view it is (cpu_views.c). */
static int interp_move(const exec_instr *ins, const ref_arg *in, void *out) {
  ref_view v;
  int64_t ost[GRAFT_MAX_DIMS];
  cpu_view_of(ins, in[0].ndim, in[0].shape, &v);
  cpu_row_major(ins->ndim, ins->shape, ost);
  cpu_copy_strided(ins->ndim, ins->shape, ins->dtype, in[0].data, v.offset, v.strides, out, 0, ost);
  return 0;
}

/* The fill everywhere, then the operand at strides (1 + interior) from lo (pads are >= 0:
 * the API's checks). */
static int interp_pad(const exec_instr *ins, const ref_arg *in, void *out) {
  interp_fill(out, ins->dtype, ins->numel, ins->attr.f);
  int64_t ost[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS], dbase = 0;
  cpu_row_major(ins->ndim, ins->shape, ost);
  for (int d = 0; d < ins->ndim; d++) {
    dst[d] = ost[d] * (1 + IR_ATTR_AT(ins->attr, PAD, interior, d));
    dbase += IR_ATTR_AT(ins->attr, PAD, lo, d) * ost[d];
  }
  if (in[0].view) /* a view walked as its own shape (interp_takes_view) */
    memcpy(sst, in[0].view->strides, sizeof(int64_t) * (size_t)in[0].ndim);
  else
    cpu_row_major(in[0].ndim, in[0].shape, sst);
  cpu_copy_strided(in[0].ndim, in[0].shape, ins->dtype, in[0].data, 0, sst, out, dbase, dst);
  return 0;
}

/* Operand x's destination strides in a concatenation's output (row-major strides ost), over
 * the dims x is walked by: its own, or its view's walk (false where the walk cannot say them). */
static bool interp_concat_dst(const ref_arg *x, const int64_t *ost, int64_t *dst) {
  if (x->view && x->view->pad) return false;
  if (!x->view || cpu_view_plain(x->view, x->ndim, x->shape)) {
    memcpy(dst, ost, sizeof(int64_t) * (size_t)x->ndim);
    return true;
  }
  return cpu_view_reshape(x->ndim, x->shape, ost, x->view->ndim, x->view->shape, dst);
}

/* Each operand's block along the axis, copied at its strides (a view's too: a convolution's
 * taps, slices of its padded input, are read in place). */
static int interp_concat(const exec_instr *ins, const ref_arg *in, void *out) {
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  int64_t ost[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS], at = 0;
  cpu_row_major(ins->ndim, ins->shape, ost);
  for (int k = 0; k < ins->nin; k++) {
    const ref_arg *x = &in[k];
    if (!interp_concat_dst(x, ost, dst))
      return err_set(GRAFT_ERR_INTERNAL, "concat: an operand view it cannot place"), -1;
    if (x->view) {
      cpu_copy_strided(x->view->ndim, x->view->shape, ins->dtype, x->data, 0, x->view->strides, out,
                       at * ost[axis], dst);
    } else {
      cpu_row_major(x->ndim, x->shape, sst);
      cpu_copy_strided(x->ndim, x->shape, ins->dtype, x->data, 0, sst, out, at * ost[axis], dst);
    }
    at += x->shape[axis];
  }
  return 0;
}

/* An elementwise loop whose operands share the output's shape, over element ranges on the
 * pool: each chunk runs the loop on its range (a copy of the instruction with that numel, the
 * operands and output offset to it). A loop reading a view never runs here: the plan makes it
 * a fused group's root (cpu_groups.c), whose runner gathers the view a chunk at a time. */
enum { INTERP_MAX_IN = 3 };

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
  ref_arg a[INTERP_MAX_IN];
  part.numel = hi - lo;
  for (int k = 0; k < part.nin; k++) {
    a[k] = sp->in[k];
    a[k].data = (char *)a[k].data + (size_t)lo * graft_dtype_size(a[k].dtype);
    a[k].numel = hi - lo;
  }
  char *o = (char *)sp->out + (size_t)lo * graft_dtype_size(part.dtype);
  if (sp->fn(&part, a, o)) __atomic_store_n(&sp->rc, -1, __ATOMIC_RELAXED);
}

#define INTERP_PARALLEL(name)                                                                    \
  static int name##_par(const exec_instr *ins, const ref_arg *in, void *out) {                   \
    if (ins->numel < CPU_COPY_PAR_MIN || ins->nin > INTERP_MAX_IN) return name(ins, in, out);    \
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
  case IR_BROADCAST: case IR_TRANSPOSE: case IR_SLICE: return interp_move;
  case IR_PAD: return interp_pad;
  case IR_CONCAT: return interp_concat;
  default: return NULL;
  }
}

/* The typed loop that computes instruction i (not split for the pool), or NULL. */
static ref_fn interp_loop_of(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  ref_arg a[INTERP_MAX_IN] = {{0}};
  if (ins->nin > INTERP_MAX_IN) return NULL;
  for (int q = 0; q < ins->nin; q++) { /* the picks read no data */
    const exec_instr *x = &p->instr[ins->in[q]];
    a[q] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, NULL};
  }
  ref_fn f = interp_pick(ins, a);
  return f == interp_unary_par ? interp_unary : f == interp_binary_par ? interp_binary
       : f == interp_compare_par ? interp_compare : f == interp_select_par ? interp_select : NULL;
}

/* The loops that gather a view operand a chunk at a time, BLAS, and the concatenation. */
static bool interp_takes_view(const exec_program *p, int j, int k, const ref_view *v) {
  const exec_instr *ins = &p->instr[j];
  if (ins->op == IR_CONCAT) { /* every dtype; the view's walk must place in the output */
    const exec_instr *x = &p->instr[ins->in[k]];
    int64_t ost[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS];
    cpu_row_major(ins->ndim, ins->shape, ost);
    return interp_concat_dst(&(ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, v}, ost, dst);
  }
  if (interp_loop_of(p, j)) return true;
  if (ins->op == IR_PAD) /* a pad that runs copies a view walked as its own shape */
    return !v->pad && cpu_view_plain(v, p->instr[ins->in[k]].ndim, p->instr[ins->in[k]].shape);
  ref_arg a[2] = {{0}};
  if (ins->op != IR_DOT) return false;
  for (int q = 0; q < 2; q++) {
    const exec_instr *x = &p->instr[ins->in[q]];
    a[q] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, NULL};
  }
  return cpu_host_takes_view(ins, a, k, v);
}

ops_interp_path cpu_interp_route(const exec_instr *ins, const ref_arg *in) {
  if (cpu_host_kernel(ins, in)) return OPS_INTERP_HOST;
  ref_fn f = interp_pick(ins, in);
  if (!f) return OPS_INTERP_REF;
  return f == interp_move || f == interp_pad || f == interp_concat ? OPS_INTERP_COPY
                                                                            : OPS_INTERP_LOOP; /* cpu_interp.c, or cpu_reduce.c for reductions */
}

/* The executable: the plan (views, fused groups) ref_run follows. */
typedef struct {
  ref_plan plan;
  int ninstr;
} interp_exe;

static void interp_free(void *exe) {
  interp_exe *x = exe;
  cpu_views_free(x->plan.views, x->ninstr);
  cpu_groups_free(&x->plan);
  free(x);
}

static void *interp_compile(const exec_program *p) {
  interp_exe *x = calloc(1, sizeof *x);
  if (!x) return err_set(GRAFT_ERR_OOM, "out of memory planning a graph's first tier");
  x->ninstr = p->ninstr;
  x->plan.views = cpu_views_plan(p, interp_takes_view);
  if (!cpu_groups_plan(p, &x->plan, interp_loop_of)) {
    interp_free(x);
    return NULL;
  }
  return x;
}

static int interp_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                          exec_buffer **outs) {
  return ref_run(p, params, outs, interp_pick, &((interp_exe *)exe)->plan);
}

/* GRAFT_CHECK: the kernel that computed slot (one instruction at a time here). */
static void interp_explain(void *exe, const exec_program *p, int slot, char *buf, size_t n,
                           char **source) {
  (void)exe;
  const exec_instr *ins = &p->instr[slot];
  ref_arg a[16] = {{0}};
  for (int k = 0; k < ins->nin && k < 16; k++) {
    const exec_instr *x = &p->instr[ins->in[k]];
    a[k] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, NULL}; /* the picks read no data */
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
    .free_exe = interp_free,
    .explain = interp_explain,
};
