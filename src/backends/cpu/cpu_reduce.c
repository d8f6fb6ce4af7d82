/* The first tier's float reductions (sum, max, min, prod over an axis mask): batch norm's
 * statistics and their gradients are a CNN's reductions, and on the reference kernels (a
 * dtype dispatch and an index unravel per element) they were the first tier's largest cost
 * (a quarter of a mobilenet_v2 step). Same order and the same double accumulator as
 * ref_reduce, so the same results; only the walk is cheaper (odometers, a strided inner loop). */
#include "cpu_internal.h"
#include <math.h>

/* Folds v into acc as ref_acc_add does for floats. */
#define CPU_RED_ADD(op, acc, v)                                                                  \
  switch (op) {                                                                                  \
  case IR_REDUCE_SUM: acc += (v); break;                                                         \
  case IR_REDUCE_PROD: acc *= (v); break;                                                        \
  case IR_REDUCE_MAX: if (!isnan(acc) && (isnan(v) || (v) > acc)) acc = (v); break;              \
  default: if (!isnan(acc) && (isnan(v) || (v) < acc)) acc = (v); break;                         \
  }

typedef struct {
  int nk, nr;
  int64_t kshape[GRAFT_MAX_DIMS], kst[GRAFT_MAX_DIMS], rshape[GRAFT_MAX_DIMS], rst[GRAFT_MAX_DIMS];
} cpu_red_axes;

/* Appends an axis, merged into the last one when that steps as this one continued (the walk
 * over the merged axes visits the same elements in the same order). */
static void cpu_red_push(int *n, int64_t *shape, int64_t *st, int64_t len, int64_t stride) {
  if (len == 1) return;
  if (*n > 0 && st[*n - 1] == stride * len) {
    shape[*n - 1] *= len;
    st[*n - 1] = stride;
    return;
  }
  shape[*n] = len, st[(*n)++] = stride;
}

/* Kept and reduced axes of x (mask: reduced), each with its stride in x, as ref_reduce. */
static void cpu_red_split(const ref_arg *x, int64_t mask, cpu_red_axes *ax) {
  int64_t st = 1, strides[GRAFT_MAX_DIMS];
  for (int d = x->ndim - 1; d >= 0; d--) strides[d] = st, st *= x->shape[d];
  ax->nk = ax->nr = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask >> d & 1) cpu_red_push(&ax->nr, ax->rshape, ax->rst, x->shape[d], strides[d]);
    else cpu_red_push(&ax->nk, ax->kshape, ax->kst, x->shape[d], strides[d]);
  }
}

/* Advances odometer c over shape (n axes), keeping off = sum c[k]*st[k]. */
static void cpu_red_next(int n, const int64_t *shape, const int64_t *st, int64_t *c, int64_t *off) {
  for (int k = n - 1; k >= 0; k--) {
    *off += st[k];
    if (++c[k] < shape[k]) return;
    *off -= c[k] * st[k];
    c[k] = 0;
  }
}

typedef struct {
  const exec_instr *ins;
  const void *x;
  void *y;
  cpu_red_axes ax;
  int64_t rcount;
  double init;
} cpu_red_job;

/* CPU_RED_LANES outputs at a time share the walk over the reduced axes: independent
 * accumulators, so the adds overlap instead of waiting on one another (each output's own
 * order, hence its value, is unchanged). */
enum { CPU_RED_LANES = 8 };

#define CPU_RED_WALK(T, L, ADD)                                                                    do {                                                                                               double acc[L];                                                                                   for (int j = 0; j < (L); j++) acc[j] = J->init;                                                  int64_t rc[GRAFT_MAX_DIMS] = {0}, roff = 0;                                                      for (int64_t r = 0; r < outer; r++) {                                                              for (int64_t i = 0; i < inner; i++)                                                                for (int j = 0; j < (L); j++) {                                                                    double v = x[b[j] + roff + i * ist];                                                             ADD(acc[j], v);                                                                                }                                                                                              cpu_red_next(ax->nr - 1, ax->rshape, ax->rst, rc, &roff);                                      }                                                                                                for (int j = 0; j < (L); j++) y[oi + j] = (T)acc[j];                                           } while (0)

#define CPU_RED_SUM(acc, v) (acc) += (v)
#define CPU_RED_ANY(acc, v) CPU_RED_ADD(op, acc, v)

#define CPU_RED_BODY(T, ADD)                                                                       do {                                                                                               const T *x = J->x;                                                                               T *y = J->y;                                                                                     for (int64_t oi = lo; oi < hi;) {                                                                  int64_t b[CPU_RED_LANES];                                                                        int n = hi - oi >= CPU_RED_LANES ? CPU_RED_LANES : 1;                                            for (int j = 0; j < n; j++) b[j] = base, cpu_red_next(ax->nk, ax->kshape, ax->kst, kc, &base);       if (n == CPU_RED_LANES) CPU_RED_WALK(T, CPU_RED_LANES, ADD);                                     else CPU_RED_WALK(T, 1, ADD);                                                                    oi += n;                                                                                       }                                                                                              } while (0)

/* Outputs [lo, hi). */
static void cpu_red_range(void **S, int64_t lo, int64_t hi) {
  const cpu_red_job *J = S[0];
  const cpu_red_axes *ax = &J->ax;
  ir_op op = J->ins->op;
  int64_t inner = ax->nr ? ax->rshape[ax->nr - 1] : 1, ist = ax->nr ? ax->rst[ax->nr - 1] : 0;
  int64_t outer = inner ? J->rcount / inner : 0;
  int64_t kc[GRAFT_MAX_DIMS] = {0}, base = 0;
  for (int64_t k = ax->nk - 1, q = lo; k >= 0; k--) { /* output lo's place */
    kc[k] = q % ax->kshape[k];
    q /= ax->kshape[k];
    base += kc[k] * ax->kst[k];
  }
  bool f32 = J->ins->dtype == GRAFT_F32;
  if (op == IR_REDUCE_SUM) {
    if (f32) CPU_RED_BODY(float, CPU_RED_SUM);
    else CPU_RED_BODY(double, CPU_RED_SUM);
  } else {
    if (f32) CPU_RED_BODY(float, CPU_RED_ANY);
    else CPU_RED_BODY(double, CPU_RED_ANY);
  }
}

static int cpu_reduce_float(const exec_instr *ins, const ref_arg *in, void *out) {
  cpu_red_job J = {.ins = ins, .x = in[0].data, .y = out, .rcount = 1};
  cpu_red_split(&in[0], ins->attr.a[0], &J.ax);
  for (int k = 0; k < J.ax.nr; k++) J.rcount *= J.ax.rshape[k];
  ir_op op = ins->op;
  J.init = op == IR_REDUCE_SUM ? 0 : op == IR_REDUCE_PROD ? 1 : op == IR_REDUCE_MAX ? -INFINITY : INFINITY;
  void *S[1] = {&J};
  /* big ones on the pool, in whole lane blocks */
  if (ins->numel >= 2 * CPU_RED_LANES && ins->numel * J.rcount >= 32768)
    cpu_parallel_run(cpu_red_range, S, ins->numel);
  else
    cpu_red_range(S, 0, ins->numel);
  return 0;
}

cpu_host_fn cpu_reduce_kernel(const exec_instr *ins, const ref_arg *in) {
  switch (ins->op) { /* in[0] only for a reduction: other instructions may have no operand */
  case IR_REDUCE_SUM: case IR_REDUCE_MAX: case IR_REDUCE_MIN: case IR_REDUCE_PROD:
    return (ins->dtype == GRAFT_F32 || ins->dtype == GRAFT_F64) && in[0].dtype == ins->dtype
               ? cpu_reduce_float : NULL;
  default:
    return NULL;
  }
}
