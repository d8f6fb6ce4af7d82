/* C API: the primitive ops. Each validates, broadcasts where the API promises it, and records
 * one IR node (or a few) under the lock. */
#include "api.h"
#include <stdlib.h>
#include <string.h>

int api_broadcast_shape(const char *fn, const ir_node *a, const ir_node *b, int *nd,
                        int64_t *out) {
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  for (int i = 0; i < n; i++) {
    int64_t da = i < a->ndim ? a->shape[a->ndim - 1 - i] : 1;
    int64_t db = i < b->ndim ? b->shape[b->ndim - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      char sa[128], sb[128];
      err_set(GRAFT_ERR_SHAPE, "%s: cannot broadcast %s with %s", fn,
              ir_shape_str(a->ndim, a->shape, sa, sizeof sa),
              ir_shape_str(b->ndim, b->shape, sb, sizeof sb));
      return -1;
    }
    out[n - 1 - i] = da == 1 ? db : da;
  }
  *nd = n;
  return 0;
}

ir_node *api_broadcast(ir_node *n, int ndim, const int64_t *shape) {
  if (n->ndim == ndim && !memcmp(n->shape, shape, sizeof(int64_t) * (size_t)ndim)) {
    ir_retain(n);
    return n;
  }
  return ir_make(IR_BROADCAST, 1, &n, NULL, n->dtype, ndim, shape);
}

/* ---- elementwise ---- */
static graft_tensor *unary(ir_op op, graft_tensor *a, const char *fn) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = n ? api_node(ir_make(op, 1, &n, NULL, n->dtype, 0, NULL)) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

/* Records op over operands broadcast to one shape (lock held). */
static graft_tensor *nary_locked(ir_op op, const char *fn, int nin, ir_node **in) {
  int nd = 0;
  int64_t shape[GRAFT_MAX_DIMS];
  ir_node *b[3] = {0};
  graft_tensor *t = NULL;
  nd = in[0]->ndim;
  memcpy(shape, in[0]->shape, sizeof shape);
  for (int i = 1; i < nin; i++) {
    ir_node cur = {.ndim = nd};
    memcpy(cur.shape, shape, sizeof shape);
    if (api_broadcast_shape(fn, &cur, in[i], &nd, shape)) return NULL;
  }
  int ok = 1;
  for (int i = 0; i < nin && ok; i++) ok = (b[i] = api_broadcast(in[i], nd, shape)) != NULL;
  if (ok) t = api_node(ir_make(op, nin, b, NULL, in[0]->dtype, 0, NULL));
  for (int i = 0; i < nin; i++)
    if (b[i]) ir_release(b[i]);
  return t;
}

static graft_tensor *binary(ir_op op, graft_tensor *a, graft_tensor *b, const char *fn) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *in[2] = {api_in(a, fn), NULL};
  in[1] = in[0] ? api_in(b, fn) : NULL;
  graft_tensor *t = in[1] ? nary_locked(op, fn, 2, in) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

static graft_tensor *with_scalar(ir_op op, graft_tensor *a, double s, const char *fn) {
  unsigned mark = err_count();
  tensor_lock();
  graft_tensor *t = NULL;
  ir_node *in[2] = {api_in(a, fn), NULL};
  if (in[0] && (in[1] = api_scalar_node(s, in[0]->dtype, in[0]->device))) {
    t = nary_locked(op, fn, 2, in);
    ir_release(in[1]);
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

/* graft_<fn> for every row of ops.def whose api column is UNARY, UNARY_FLOAT or BINARY
 * (compare rows included: they are binary in the C API). */
#define API_GEN_UNARY(fn, e)                                                                    \
  graft_tensor *graft_##fn(graft_tensor *a) { return unary(IR_##e, a, "graft_" #fn); }
#define API_GEN_UNARY_FLOAT API_GEN_UNARY
#define API_GEN_BINARY(fn, e)                                                                   \
  graft_tensor *graft_##fn(graft_tensor *a, graft_tensor *b) {                                  \
    return binary(IR_##e, a, b, "graft_" #fn);                                                  \
  }
#define API_GEN_OWN(fn, e)
#define API_GEN_NONE(fn, e)
#define X(e, nm, ar, k, dts, api, fn, ...) API_GEN_##api(fn, e)
#include "ops.def"

graft_tensor *graft_add_scalar(graft_tensor *a, double s) { return with_scalar(IR_ADD, a, s, __func__); }
graft_tensor *graft_mul_scalar(graft_tensor *a, double s) { return with_scalar(IR_MUL, a, s, __func__); }
graft_tensor *graft_div_scalar(graft_tensor *a, double s) { return with_scalar(IR_DIV, a, s, __func__); }
graft_tensor *graft_pow_scalar(graft_tensor *a, double s) { return with_scalar(IR_POW, a, s, __func__); }

graft_tensor *graft_where(graft_tensor *cond, graft_tensor *a, graft_tensor *b) {
  unsigned mark = err_count();
  const char *fn = "graft_where";
  tensor_lock();
  ir_node *in[3] = {api_in(cond, fn), NULL, NULL};
  in[1] = in[0] ? api_in(a, fn) : NULL;
  in[2] = in[1] ? api_in(b, fn) : NULL;
  graft_tensor *t = in[2] ? nary_locked(IR_SELECT, fn, 3, in) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_convert(graft_tensor *a, graft_dtype dt) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *n = api_in(a, __func__);
  graft_tensor *t = n ? api_node(ir_make(IR_CONVERT, 1, &n, NULL, dt, 0, NULL)) : NULL;
  tensor_unlock();
  return err_named(t, mark, __func__);
}

/* ---- movement ---- */
static int check_nd(const char *fn, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > GRAFT_MAX_DIMS) {
    err_set(GRAFT_ERR_SHAPE, "%s: ndim %d out of range [0, %d]", fn, ndim, GRAFT_MAX_DIMS);
    return -1;
  }
  if (ndim && !shape) {
    err_set(GRAFT_ERR_NULL, "%s: shape is NULL", fn);
    return -1;
  }
  return 0;
}

graft_tensor *graft_broadcast_to(graft_tensor *a, int ndim, const int64_t *shape) {
  unsigned mark = err_count();
  const char *fn = "graft_broadcast_to";
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  if (n && !check_nd(fn, ndim, shape)) t = api_node(api_broadcast(n, ndim, shape));
  tensor_unlock();
  return err_named(t, mark, fn);
}

/* shape with its -1 (if any) inferred from n's element count into s; -1 with the error set when
 * no shape fits. The known dims' product is checked before it overflows. */
static int reshape_dims(const char *fn, const ir_node *n, int ndim, const int64_t *shape,
                        int64_t *s) {
  int64_t known = 1;
  int infer = -1, bad = 0;
  for (int i = 0; i < ndim; i++) {
    s[i] = shape[i];
    if (s[i] == -1 && infer < 0) infer = i;
    else if (s[i] < 0 || __builtin_mul_overflow(known, s[i], &known)) bad = 1;
  }
  if (infer >= 0 && !bad) {
    if (known == 0 || n->numel % known) bad = 1;
    else s[infer] = n->numel / known;
  }
  if (!bad) return 0;
  char sa[128], sb[128];
  err_set(GRAFT_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", fn,
          ir_shape_str(n->ndim, n->shape, sa, sizeof sa), (long long)n->numel,
          ir_shape_str(ndim, shape, sb, sizeof sb));
  return -1;
}

graft_tensor *graft_reshape(graft_tensor *a, int ndim, const int64_t *shape) {
  unsigned mark = err_count();
  const char *fn = "graft_reshape";
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  int64_t s[GRAFT_MAX_DIMS];
  if (n && !check_nd(fn, ndim, shape) && !reshape_dims(fn, n, ndim, shape, s))
    t = api_node(ir_make(IR_RESHAPE, 1, &n, NULL, n->dtype, ndim, s));
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_transpose(graft_tensor *a, const int *perm) {
  unsigned mark = err_count();
  const char *fn = "graft_transpose";
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  if (n && n->ndim && !perm) {
    err_set(GRAFT_ERR_NULL, "%s: perm is NULL", fn);
  } else if (n) {
    ir_attrs at = {0};
    for (int i = 0; i < n->ndim; i++)
      IR_ATTR_AT(at, TRANSPOSE, perm, i) = perm[i] < 0 ? perm[i] + n->ndim : perm[i];
    t = api_node(ir_make(IR_TRANSPOSE, 1, &n, &at, n->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_t(graft_tensor *a) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *n = api_in(a, "graft_t");
  graft_tensor *t = NULL;
  if (n && n->ndim < 2) {
    err_set(GRAFT_ERR_SHAPE, "graft_t: needs at least 2 dims, got %d", n->ndim);
  } else if (n) {
    ir_attrs at = {0};
    for (int i = 0; i < n->ndim; i++) IR_ATTR_AT(at, TRANSPOSE, perm, i) = i;
    IR_ATTR_AT(at, TRANSPOSE, perm, n->ndim - 2) = n->ndim - 1;
    IR_ATTR_AT(at, TRANSPOSE, perm, n->ndim - 1) = n->ndim - 2;
    t = api_node(ir_make(IR_TRANSPOSE, 1, &n, &at, n->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, "graft_t");
}

graft_tensor *graft_slice(graft_tensor *a, const int64_t *start, const int64_t *limit,
                          const int64_t *stride) {
  unsigned mark = err_count();
  const char *fn = "graft_slice";
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  if (n && n->ndim && (!start || !limit)) {
    err_set(GRAFT_ERR_NULL, "%s: start or limit is NULL", fn);
  } else if (n) {
    ir_attrs at = {0};
    for (int i = 0; i < n->ndim; i++) {
      IR_ATTR_AT(at, SLICE, start, i) = start[i];
      IR_ATTR_AT(at, SLICE, limit, i) = limit[i];
      IR_ATTR_AT(at, SLICE, stride, i) = stride ? stride[i] : 1;
    }
    t = api_node(ir_make(IR_SLICE, 1, &n, &at, n->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_concat(graft_tensor *const *ts, int n, int axis) {
  unsigned mark = err_count();
  const char *fn = "graft_concat";
  if (n < 1 || !ts) return err_set(GRAFT_ERR_ARG, "%s: needs at least one tensor", fn);
  ir_node *small[16], **in = n <= 16 ? small : malloc(sizeof *in * (size_t)n);
  if (!in) return err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
  tensor_lock();
  graft_tensor *t = NULL;
  int ok = 1;
  for (int i = 0; i < n && ok; i++) ok = (in[i] = api_in(ts[i], fn)) != NULL;
  int ax = ok ? api_axis(fn, axis, in[0]->ndim) : -1;
  if (ax >= 0) {
    ir_attrs at = {.a[IR_ATTR_AXIS_axis] = ax};
    t = api_node(ir_make(IR_CONCAT, n, in, &at, in[0]->dtype, 0, NULL));
  }
  tensor_unlock();
  if (in != small) free(in);
  return err_named(t, mark, fn);
}

graft_tensor *graft_pad(graft_tensor *a, const int64_t *lo, const int64_t *hi, double value) {
  unsigned mark = err_count();
  return err_named(graft_pad_ex(a, lo, hi, NULL, value), mark, __func__);
}

graft_tensor *graft_pad_ex(graft_tensor *a, const int64_t *lo, const int64_t *hi,
                           const int64_t *interior, double value) {
  unsigned mark = err_count();
  const char *fn = "graft_pad_ex";
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  if (n && n->ndim && (!lo || !hi)) {
    err_set(GRAFT_ERR_NULL, "%s: lo or hi is NULL", fn);
  } else if (n) {
    ir_attrs at = {.f = value};
    for (int i = 0; i < n->ndim; i++) {
      IR_ATTR_AT(at, PAD, lo, i) = lo[i];
      IR_ATTR_AT(at, PAD, hi, i) = hi[i];
      IR_ATTR_AT(at, PAD, interior, i) = interior ? interior[i] : 0;
    }
    t = api_node(ir_make(IR_PAD, 1, &n, &at, n->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

/* ---- reductions ---- */
static graft_tensor *reduce(ir_op op, graft_tensor *a, const int *axes, int naxes, bool keepdim,
                            const char *fn) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *n = api_in(a, fn);
  graft_tensor *t = NULL;
  if (n && naxes && !axes) {
    err_set(GRAFT_ERR_NULL, "%s: axes is NULL", fn);
  } else if (n && naxes < 0) {
    err_set(GRAFT_ERR_ARG, "%s: negative axis count %d", fn, naxes);
  } else if (n) {
    int64_t mask = naxes ? 0 : (INT64_C(1) << n->ndim) - 1;
    int ok = 1;
    for (int i = 0; i < naxes && ok; i++) {
      int ax = api_axis(fn, axes[i], n->ndim);
      if (ax < 0) ok = 0;
      else if (mask >> ax & 1) {
        err_set(GRAFT_ERR_AXIS, "%s: axis %d repeated", fn, axes[i]);
        ok = 0;
      } else {
        mask |= INT64_C(1) << ax;
      }
    }
    ir_attrs at = {.a[IR_ATTR_REDUCE_mask] = mask, .a[IR_ATTR_REDUCE_keepdim] = keepdim};
    if (ok) t = api_node(ir_make(op, 1, &n, &at, n->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_sum(graft_tensor *a, const int *axes, int naxes, bool keepdim) {
  return reduce(IR_REDUCE_SUM, a, axes, naxes, keepdim, __func__);
}
graft_tensor *graft_max(graft_tensor *a, const int *axes, int naxes, bool keepdim) {
  return reduce(IR_REDUCE_MAX, a, axes, naxes, keepdim, __func__);
}
graft_tensor *graft_min(graft_tensor *a, const int *axes, int naxes, bool keepdim) {
  return reduce(IR_REDUCE_MIN, a, axes, naxes, keepdim, __func__);
}
graft_tensor *graft_prod(graft_tensor *a, const int *axes, int naxes, bool keepdim) {
  return reduce(IR_REDUCE_PROD, a, axes, naxes, keepdim, __func__);
}

static graft_tensor *arg_extreme(ir_op op, graft_tensor *a, int axis, bool keepdim,
                                 const char *fn) {
  unsigned mark = err_count();
  tensor_lock();
  ir_node *n = api_in(a, fn);
  int ax = n ? api_axis(fn, axis, n->ndim) : -1;
  ir_attrs at = {.a[IR_ATTR_ARG_axis] = ax, .a[IR_ATTR_ARG_keepdim] = keepdim};
  graft_tensor *t = ax >= 0 ? api_node(ir_make(op, 1, &n, &at, GRAFT_I64, 0, NULL)) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_argmax(graft_tensor *a, int axis, bool keepdim) {
  return arg_extreme(IR_ARGMAX, a, axis, keepdim, __func__);
}

graft_tensor *graft_argmin(graft_tensor *a, int axis, bool keepdim) {
  return arg_extreme(IR_ARGMIN, a, axis, keepdim, __func__);
}
