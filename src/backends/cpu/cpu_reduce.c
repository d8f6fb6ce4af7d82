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

/* Kept and reduced axes of x (mask: reduced), each with its stride in x, as ref_reduce. */
static void cpu_red_split(const ref_arg *x, int64_t mask, cpu_red_axes *ax) {
  int64_t st = 1, strides[GRAFT_MAX_DIMS];
  for (int d = x->ndim - 1; d >= 0; d--) strides[d] = st, st *= x->shape[d];
  ax->nk = ax->nr = 0;
  for (int d = 0; d < x->ndim; d++) {
    if (mask >> d & 1) ax->rshape[ax->nr] = x->shape[d], ax->rst[ax->nr++] = strides[d];
    else ax->kshape[ax->nk] = x->shape[d], ax->kst[ax->nk++] = strides[d];
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

#define CPU_RED_BODY(T)                                                                          \
  do {                                                                                           \
    const T *x = in[0].data;                                                                     \
    T *y = out;                                                                                  \
    int64_t inner = ax.nr ? ax.rshape[ax.nr - 1] : 1, ist = ax.nr ? ax.rst[ax.nr - 1] : 0;       \
    int64_t outer = inner ? rcount / inner : 0;                                                  \
    int64_t kc[GRAFT_MAX_DIMS] = {0}, base = 0;                                                  \
    for (int64_t oi = 0; oi < ins->numel; oi++) {                                                \
      double acc = init;                                                                         \
      int64_t rc[GRAFT_MAX_DIMS] = {0}, roff = 0;                                                \
      for (int64_t r = 0; r < outer; r++) {                                                      \
        const T *p = x + base + roff;                                                            \
        for (int64_t i = 0; i < inner; i++) {                                                    \
          double v = p[i * ist];                                                                 \
          CPU_RED_ADD(op, acc, v)                                                                \
        }                                                                                        \
        cpu_red_next(ax.nr - 1, ax.rshape, ax.rst, rc, &roff);                                   \
      }                                                                                          \
      y[oi] = (T)acc;                                                                            \
      cpu_red_next(ax.nk, ax.kshape, ax.kst, kc, &base);                                         \
    }                                                                                            \
  } while (0)

static int cpu_reduce_float(const exec_instr *ins, const ref_arg *in, void *out) {
  cpu_red_axes ax;
  cpu_red_split(&in[0], ins->attr.a[0], &ax);
  int64_t rcount = 1;
  for (int k = 0; k < ax.nr; k++) rcount *= ax.rshape[k];
  ir_op op = ins->op;
  double init = op == IR_REDUCE_SUM ? 0 : op == IR_REDUCE_PROD ? 1
              : op == IR_REDUCE_MAX ? -INFINITY : INFINITY;
  if (ins->dtype == GRAFT_F32) CPU_RED_BODY(float);
  else CPU_RED_BODY(double);
  return 0;
}

cpu_host_fn cpu_reduce_kernel(const exec_instr *ins, const ref_arg *in) {
  bool fl = (ins->dtype == GRAFT_F32 || ins->dtype == GRAFT_F64) && in[0].dtype == ins->dtype;
  switch (ins->op) {
  case IR_REDUCE_SUM: case IR_REDUCE_MAX: case IR_REDUCE_MIN: case IR_REDUCE_PROD:
    return fl ? cpu_reduce_float : NULL;
  default:
    return NULL;
  }
}
