/* Reduction reference kernels: reduce_sum/max/min/prod over an axis bitmask, argmax, and
 * reduce_window (max/sum pooling of any rank). Floats accumulate in double, integers in
 * wrapping int64; max/min of floats propagate NaN. */
#include "ref_util.h"
#include "error.h"
#include <math.h>
#include <stdlib.h>

/* Running accumulator for one output element. */
typedef struct {
  double f;
  int64_t i;
} ref_acc;

static void ref_acc_init(ref_acc *acc, ir_op op, graft_dtype dt) {
  switch (op) {
  case IR_REDUCE_SUM: acc->f = 0; acc->i = 0; break;
  case IR_REDUCE_PROD: acc->f = 1; acc->i = 1; break;
  case IR_REDUCE_MAX: acc->f = -INFINITY; acc->i = ref_int_min(dt); break;
  default: /* IR_REDUCE_MIN */ acc->f = INFINITY; acc->i = ref_int_max(dt); break;
  }
}

/* Folds element si of x into acc. */
static void ref_acc_add(ref_acc *acc, ir_op op, graft_dtype dt, const void *x, int64_t si) {
  if (dtype_is_float(dt)) {
    double v = dtype_load(x, dt, si);
    switch (op) {
    case IR_REDUCE_SUM: acc->f += v; break;
    case IR_REDUCE_PROD: acc->f *= v; break;
    case IR_REDUCE_MAX: if (!isnan(acc->f) && (isnan(v) || v > acc->f)) acc->f = v; break;
    default: if (!isnan(acc->f) && (isnan(v) || v < acc->f)) acc->f = v; break;
    }
  } else { /* bool holds 0/1, so max is any and min is all */
    int64_t v = dtype_load_i(x, dt, si);
    switch (op) {
    case IR_REDUCE_SUM: acc->i = ref_wrap_add(acc->i, v); break;
    case IR_REDUCE_PROD: acc->i = ref_wrap_mul(acc->i, v); break;
    case IR_REDUCE_MAX: if (v > acc->i) acc->i = v; break;
    default: if (v < acc->i) acc->i = v; break;
    }
  }
}

static void ref_acc_store(const ref_acc *acc, graft_dtype dt, void *out, int64_t oi) {
  if (dtype_is_float(dt)) dtype_store(out, dt, oi, acc->f);
  else dtype_store_i(out, dt, oi, acc->i);
}

int ref_reduce(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0];
  int64_t mask = IR_ATTR(ins->attr, REDUCE, mask);
  graft_dtype dt = ins->dtype;
  /* Split operand axes into kept and reduced. The output's row-major order is the order of
   * the kept axes (keepdim only inserts size-1 dims, which don't change linear indices). */
  int64_t st[GRAFT_MAX_DIMS], kshape[GRAFT_MAX_DIMS], kst[GRAFT_MAX_DIMS];
  int64_t rshape[GRAFT_MAX_DIMS], rst[GRAFT_MAX_DIMS];
  int nk = 0, nr = 0;
  int64_t rcount = 1;
  ref_strides(x->ndim, x->shape, st);
  for (int d = 0; d < x->ndim; d++) {
    if (mask >> d & 1) {
      rshape[nr] = x->shape[d];
      rst[nr++] = st[d];
      rcount *= x->shape[d];
    } else {
      kshape[nk] = x->shape[d];
      kst[nk++] = st[d];
    }
  }
  int64_t kc[GRAFT_MAX_DIMS], rc[GRAFT_MAX_DIMS];
  for (int64_t oi = 0; oi < ins->numel; oi++) {
    ref_unravel(oi, nk, kshape, kc);
    int64_t base = 0;
    for (int k = 0; k < nk; k++) base += kc[k] * kst[k];
    ref_acc acc;
    ref_acc_init(&acc, ins->op, dt);
    for (int64_t r = 0; r < rcount; r++) {
      ref_unravel(r, nr, rshape, rc);
      int64_t si = base;
      for (int k = 0; k < nr; k++) si += rc[k] * rst[k];
      ref_acc_add(&acc, ins->op, dt, x->data, si);
    }
    ref_acc_store(&acc, dt, out, oi);
  }
  return 0;
}

int ref_argmax(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0];
  int axis = (int)IR_ATTR(ins->attr, ARG, axis);
  int64_t outer = 1, inner = 1, n = x->shape[axis];
  for (int d = 0; d < axis; d++) outer *= x->shape[d];
  for (int d = axis + 1; d < x->ndim; d++) inner *= x->shape[d];
  int64_t *o = out;
  bool fl = dtype_is_float(x->dtype);
  bool mn = ins->op == IR_ARGMIN; /* same walk, reversed order */
  for (int64_t b = 0; b < outer; b++) {
    for (int64_t j = 0; j < inner; j++) {
      int64_t base = b * n * inner + j, best = 0;
      if (fl) { /* the first NaN counts as the extreme (PyTorch) */
        double bv = n ? dtype_load(x->data, x->dtype, base) : 0;
        for (int64_t k = 1; k < n && !isnan(bv); k++) {
          double v = dtype_load(x->data, x->dtype, base + k * inner);
          if (isnan(v) || (mn ? v < bv : v > bv)) { bv = v; best = k; }
        }
      } else {
        int64_t bv = n ? dtype_load_i(x->data, x->dtype, base) : 0;
        for (int64_t k = 1; k < n; k++) {
          int64_t v = dtype_load_i(x->data, x->dtype, base + k * inner);
          if (mn ? v < bv : v > bv) { bv = v; best = k; } /* strict: the first wins */
        }
      }
      o[b * inner + j] = best;
    }
  }
  return 0;
}

int ref_reduce_window(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0];
  int nd = x->ndim;
  const int64_t *win = &IR_ATTR_AT(ins->attr, WINDOW, window, 0);
  const int64_t *stride = &IR_ATTR_AT(ins->attr, WINDOW, stride, 0);
  const int64_t *lo = &IR_ATTR_AT(ins->attr, WINDOW, pad_lo, 0);
  ir_op op = IR_ATTR(ins->attr, WINDOW, kind) == 0 ? IR_REDUCE_MAX : IR_REDUCE_SUM;
  graft_dtype dt = ins->dtype;
  int64_t st[GRAFT_MAX_DIMS], oc[GRAFT_MAX_DIMS], wc[GRAFT_MAX_DIMS];
  int64_t wcount = 1;
  ref_strides(nd, x->shape, st);
  for (int d = 0; d < nd; d++) wcount *= win[d];
  for (int64_t oi = 0; oi < ins->numel; oi++) {
    ref_unravel(oi, nd, ins->shape, oc);
    ref_acc acc;
    ref_acc_init(&acc, op, dt);
    for (int64_t w = 0; w < wcount; w++) {
      ref_unravel(w, nd, win, wc);
      int64_t si = 0;
      bool inside = true;
      for (int d = 0; d < nd && inside; d++) {
        int64_t p = oc[d] * stride[d] + wc[d] - lo[d]; /* coordinate in the unpadded input */
        inside = p >= 0 && p < x->shape[d];
        si += p * st[d];
      }
      if (inside) ref_acc_add(&acc, op, dt, x->data, si); /* padding is the identity */
    }
    ref_acc_store(&acc, dt, out, oi);
  }
  return 0;
}

/* Offset in x of window offset wc of the window at oc, or -1 on padding. */
static int64_t ref_window_at(int nd, const int64_t *oc, const int64_t *wc, const int64_t *stride,
                             const int64_t *lo, const int64_t *shape, const int64_t *st) {
  int64_t si = 0;
  for (int d = 0; d < nd; d++) {
    int64_t p = oc[d] * stride[d] + wc[d] - lo[d];
    if (p < 0 || p >= shape[d]) return -1;
    si += p * st[d];
  }
  return si;
}

/* Each window's dy goes to its first element equal to the window's max (pads are -inf and
 * drop what they receive; a NaN max selects nothing). Sums in double, rounded once. */
int ref_max_pool_grad(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0], *dy = &in[1];
  int nd = x->ndim;
  const int64_t *win = &IR_ATTR_AT(ins->attr, WINDOW, window, 0);
  const int64_t *stride = &IR_ATTR_AT(ins->attr, WINDOW, stride, 0);
  const int64_t *lo = &IR_ATTR_AT(ins->attr, WINDOW, pad_lo, 0);
  int64_t st[GRAFT_MAX_DIMS], oc[GRAFT_MAX_DIMS], wc[GRAFT_MAX_DIMS], wcount = 1;
  double *acc = calloc((size_t)x->numel + 1, sizeof(double));
  if (!acc) return err_set(GRAFT_ERR_OOM, "max_pool_grad: out of memory"), -1;
  ref_strides(nd, x->shape, st);
  for (int d = 0; d < nd; d++) wcount *= win[d];
  for (int64_t oi = 0; oi < dy->numel; oi++) {
    ref_unravel(oi, nd, dy->shape, oc);
    double m = -INFINITY;
    bool nan = false;
    for (int64_t w = 0; w < wcount; w++) {
      ref_unravel(w, nd, win, wc);
      int64_t si = ref_window_at(nd, oc, wc, stride, lo, x->shape, st);
      double v = si < 0 ? -INFINITY : dtype_load(x->data, x->dtype, si);
      nan |= isnan(v);
      if (v > m) m = v;
    }
    for (int64_t w = 0; w < wcount && !nan; w++) {
      ref_unravel(w, nd, win, wc);
      int64_t si = ref_window_at(nd, oc, wc, stride, lo, x->shape, st);
      if ((si < 0 ? -INFINITY : dtype_load(x->data, x->dtype, si)) != m) continue;
      if (si >= 0) acc[si] += dtype_load(dy->data, dy->dtype, oi);
      break;
    }
  }
  for (int64_t i = 0; i < x->numel; i++) dtype_store(out, ins->dtype, i, acc[i]);
  free(acc);
  return 0;
}
