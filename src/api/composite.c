/* Composite ops: softmax, layer_norm, gelu, cross_entropy, ... decomposed into primitives.
 *
 * This file uses ONLY the public API in graft.h (plus error.h's err_* to report errors), so it
 * doubles as a check that the public API is enough to write such ops. Each composite:
 *   1. checks its inputs (a NULL input returns NULL at once, keeping the first error),
 *   2. opens a scope so every intermediate it makes is released when it returns,
 *   3. keeps only the result (graft_keep moves it to the caller's scope, if any); an error
 *      inside names the composite (comp_finish), not the primitive that raised it.
 * Internal constants (0.5, eps, counts) are 0-d graft_full_on constants broadcast by the binary
 * ops; values a user may change at every step (dropout's p) are graft_scalar_on parameters, so
 * changing them never recompiles. Both are made on the input's device, so every composite runs
 * on any device and returns its result there.
 */
#include "graft.h"
#include "composite.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- helpers ---- */

static bool is_float(graft_dtype dt) {
  return dt == GRAFT_F32 || dt == GRAFT_F64 || dt == GRAFT_F16 || dt == GRAFT_BF16;
}
static bool is_index(graft_dtype dt) { return dt == GRAFT_I32 || dt == GRAFT_I64; }

/* Writes "[d0,d1,...]" for t into buf. */
static const char *shape_str(const graft_tensor *t, char *buf, size_t cap) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = graft_shape(t, s);
  if (nd < 0) {
    snprintf(buf, cap, "[?]");
    return buf;
  }
  size_t n = 0;
  n += (size_t)snprintf(buf + n, cap - n, "[");
  for (int i = 0; i < nd && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)s[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}
#define SHAPE(t, buf) shape_str((t), (buf), sizeof(buf))

/* Accepts a float tensor; sets GRAFT_ERR_DTYPE otherwise. */
static bool need_float(const char *fn, const char *name, const graft_tensor *t) {
  graft_dtype dt = graft_get_dtype(t);
  if (is_float(dt)) return true;
  err_set(GRAFT_ERR_DTYPE, "%s: %s has dtype %s; a float dtype (f32, f64, f16, bf16) is required",
          fn, name, graft_dtype_name(dt));
  return false;
}

/* Checks that t has dtype dt (the dtype of `ref_name`). */
static bool same_dtype(const char *fn, const char *name, const graft_tensor *t,
                       const char *ref_name, graft_dtype dt) {
  graft_dtype d = graft_get_dtype(t);
  if (d == dt) return true;
  err_set(GRAFT_ERR_DTYPE, "%s: %s has dtype %s but %s has dtype %s", fn, name,
          graft_dtype_name(d), ref_name, graft_dtype_name(dt));
  return false;
}

/* Checks that t is 1-D with n elements. */
static bool need_vec(const char *fn, const char *name, const graft_tensor *t, int64_t n,
                     const char *what) {
  if (graft_ndim(t) == 1 && graft_dim(t, 0) == n) return true;
  char b[200];
  err_set(GRAFT_ERR_SHAPE, "%s: %s shape %s must be [%lld] (%s)", fn, name, SHAPE(t, b),
          (long long)n, what);
  return false;
}

/* Normalizes axis for an ndim-d tensor; sets GRAFT_ERR_AXIS and returns -1 when out of range. */
static int norm_axis(const char *fn, const graft_tensor *t, int axis) {
  int nd = graft_ndim(t);
  int a = axis < 0 ? axis + nd : axis;
  if (a >= 0 && a < nd) return a;
  char b[200];
  err_set(GRAFT_ERR_AXIS, "%s: axis %d is out of range for shape %s", fn, axis, SHAPE(t, b));
  return -1;
}

/* A 0-d constant (part of the graph) of like's dtype, on like's device, broadcast by the binary
 * ops. Every value a composite makes is on its input's device, so it works on any device. */
static graft_tensor *cst(double v, const graft_tensor *like) {
  static const int64_t none[1] = {0};
  return graft_full_on(v, graft_get_dtype(like), 0, none, graft_device(like));
}

/* ---- activations ---- */

graft_tensor *graft_relu(graft_tensor *x) {
  static const char fn[] = "graft_relu";
  if (comp_bad_input(fn, "x", x)) return NULL;
  graft_dtype dt = graft_get_dtype(x);
  if (dt == GRAFT_BOOL) return err_set(GRAFT_ERR_DTYPE, "%s: dtype bool is not supported", fn);
  graft_scope_begin();
  return comp_finish(fn, graft_maximum(x, cst(0.0, x)));
}

graft_tensor *graft_gelu(graft_tensor *x, bool tanh_approx) {
  static const char fn[] = "graft_gelu";
  if (comp_bad_input(fn, "x", x)) return NULL;
  if (!need_float(fn, "x", x)) return NULL;
  graft_scope_begin();
  graft_tensor *inner;
  if (tanh_approx) {
    /* tanh(sqrt(2/pi) * (x + 0.044715 x^3)) */
    graft_tensor *x3 = graft_mul(graft_mul(x, x), x);
    graft_tensor *poly = graft_add(x, graft_mul(x3, cst(0.044715, x)));
    inner = graft_tanh(graft_mul(poly, cst(0.79788456080286535588 /* sqrt(2/pi) */, x)));
  } else {
    /* erf(x / sqrt 2) */
    inner = graft_erf(graft_mul(x, cst(1.0 / sqrt(2.0), x)));
  }
  graft_tensor *y = graft_mul(graft_mul(x, cst(0.5, x)), graft_add(inner, cst(1.0, x)));
  return comp_finish(fn, y);
}

/* ---- softmax family ---- */

/* Shared body of softmax / log_softmax; x valid and float, axis normalized. */
static graft_tensor *softmax_impl(const char *fn, graft_tensor *x, int axis, bool log_form) {
  graft_scope_begin();
  if (graft_ndim(x) == 0) {
    /* A 0-d tensor is one element along its only "axis": compute on [1] and reshape back. */
    static const int64_t one[1] = {1}, none[1] = {0};
    /* r is owned by this scope */
    graft_tensor *r = softmax_impl(fn, graft_reshape(x, 1, one), 0, log_form);
    return comp_finish(fn, graft_reshape(r, 0, none));
  }
  int ax[1] = {axis};
  /* Subtracting the max keeps exp from overflowing (large logits stay finite). */
  graft_tensor *m = graft_max(x, ax, 1, true);
  graft_tensor *shifted = graft_sub(x, m);
  graft_tensor *e = graft_exp(shifted);
  graft_tensor *s = graft_sum(e, ax, 1, true);
  graft_tensor *y = log_form ? graft_sub(shifted, graft_log(s)) : graft_div(e, s);
  return comp_finish(fn, y);
}

static graft_tensor *softmax_entry(const char *fn, graft_tensor *x, int axis, bool log_form) {
  if (comp_bad_input(fn, "x", x)) return NULL;
  if (!need_float(fn, "x", x)) return NULL;
  int a;
  if (graft_ndim(x) == 0) {
    if (axis != 0 && axis != -1)
      return err_set(GRAFT_ERR_AXIS, "%s: axis %d is out of range for shape []", fn, axis);
    a = 0;
  } else if ((a = norm_axis(fn, x, axis)) < 0) {
    return NULL;
  }
  return softmax_impl(fn, x, a, log_form);
}

graft_tensor *graft_softmax(graft_tensor *x, int axis) {
  return softmax_entry("graft_softmax", x, axis, false);
}

graft_tensor *graft_log_softmax(graft_tensor *x, int axis) {
  return softmax_entry("graft_log_softmax", x, axis, true);
}

/* ---- reductions ---- */

graft_tensor *graft_mean(graft_tensor *a, const int *axes, int naxes, bool keepdim) {
  static const char fn[] = "graft_mean";
  if (comp_bad_input(fn, "a", a)) return NULL;
  if (!need_float(fn, "a", a)) return NULL;
  graft_scope_begin();
  /* graft_sum validates the axes; once it succeeds they are in range and distinct. */
  graft_tensor *s = graft_sum(a, axes, naxes, keepdim);
  if (!s) return comp_finish(fn, NULL);
  int64_t shape[GRAFT_MAX_DIMS];
  int nd = graft_shape(a, shape);
  double count = 1;
  if (naxes <= 0) {
    for (int i = 0; i < nd; i++) count *= (double)shape[i];
  } else {
    unsigned seen = 0;
    for (int i = 0; i < naxes; i++) {
      int ax = axes[i] < 0 ? axes[i] + nd : axes[i];
      if (ax < 0 || ax >= nd || (seen & (1u << ax))) continue;
      seen |= 1u << ax;
      count *= (double)shape[ax];
    }
  }
  /* An empty reduction gives 0/0 = NaN, as in numpy and PyTorch. */
  return comp_finish(fn, graft_div(s, cst(count, a)));
}

/* ---- normalization ---- */

graft_tensor *graft_layer_norm(graft_tensor *x, graft_tensor *weight, graft_tensor *bias,
                               double eps) {
  static const char fn[] = "graft_layer_norm";
  if (comp_bad_input(fn, "x", x)) return NULL;
  if ((weight == NULL) != (bias == NULL)) {
    /* A NULL here may come from a failed op upstream: keep that error if there is one. */
    if (err_pending()) return NULL;
    return err_set(GRAFT_ERR_ARG, "%s: weight and bias must both be given or both be NULL (got %s)",
                   fn, weight ? "weight only" : "bias only");
  }
  if (weight && (comp_bad_input(fn, "weight", weight) || comp_bad_input(fn, "bias", bias)))
    return NULL;
  if (!need_float(fn, "x", x)) return NULL;
  char b[200];
  if (graft_ndim(x) < 1)
    return err_set(GRAFT_ERR_SHAPE, "%s: x shape %s needs at least 1 dim", fn, SHAPE(x, b));
  graft_dtype dt = graft_get_dtype(x);
  int64_t d = graft_dim(x, -1);
  if (weight) {
    if (!same_dtype(fn, "weight", weight, "x", dt) || !same_dtype(fn, "bias", bias, "x", dt))
      return NULL;
    char bx[200];
    SHAPE(x, bx);
    if (!need_vec(fn, "weight", weight, d, bx) || !need_vec(fn, "bias", bias, d, bx)) return NULL;
  }
  graft_scope_begin();
  int last[1] = {-1};
  graft_tensor *mu = graft_mean(x, last, 1, true);
  graft_tensor *xc = graft_sub(x, mu);
  graft_tensor *var = graft_mean(graft_mul(xc, xc), last, 1, true); /* biased */
  graft_tensor *y = graft_mul(xc, graft_rsqrt(graft_add(var, cst(eps, x))));
  if (weight) y = graft_add(graft_mul(y, weight), bias);
  return comp_finish(fn, y);
}

graft_tensor *graft_batch_norm(graft_tensor *x, graft_tensor *weight, graft_tensor *bias,
                               graft_tensor *running_mean, graft_tensor *running_var,
                               bool training, double eps) {
  static const char fn[] = "graft_batch_norm";
  if (comp_bad_input(fn, "x", x)) return NULL;
  if (!training &&
      (comp_bad_input(fn, "running_mean", running_mean) ||
       comp_bad_input(fn, "running_var", running_var)))
    return NULL;
  if (!need_float(fn, "x", x)) return NULL;
  char b[200], bx[200];
  int nd = graft_ndim(x);
  if (nd < 2)
    return err_set(GRAFT_ERR_SHAPE, "%s: x shape %s must be [N,C,...] (at least 2 dims)", fn,
                   SHAPE(x, b));
  SHAPE(x, bx);
  graft_dtype dt = graft_get_dtype(x);
  int64_t c = graft_dim(x, 1);
  /* Optional per-channel tensors: each, when given, must be [C] of x's dtype. */
  graft_tensor *vecs[4] = {weight, bias, training ? NULL : running_mean,
                           training ? NULL : running_var};
  static const char *names[4] = {"weight", "bias", "running_mean", "running_var"};
  for (int i = 0; i < 4; i++) {
    if (!vecs[i]) continue;
    if (comp_bad_input(fn, names[i], vecs[i])) return NULL;
    if (!same_dtype(fn, names[i], vecs[i], "x", dt)) return NULL;
    if (!need_vec(fn, names[i], vecs[i], c, bx)) return NULL;
  }
  graft_scope_begin();
  /* [C] vectors broadcast as [1,C,1,...]. */
  int64_t cshape[GRAFT_MAX_DIMS];
  for (int i = 0; i < nd; i++) cshape[i] = i == 1 ? c : 1;
  graft_tensor *mu, *var;
  if (training) {
    int axes[GRAFT_MAX_DIMS], na = 0;
    for (int i = 0; i < nd; i++)
      if (i != 1) axes[na++] = i;
    mu = graft_mean(x, axes, na, true);
    graft_tensor *xc = graft_sub(x, mu);
    var = graft_mean(graft_mul(xc, xc), axes, na, true); /* biased, as PyTorch normalizes */
  } else {
    mu = graft_reshape(running_mean, nd, cshape);
    var = graft_reshape(running_var, nd, cshape);
  }
  graft_tensor *y = graft_mul(graft_sub(x, mu), graft_rsqrt(graft_add(var, cst(eps, x))));
  if (weight) y = graft_mul(y, graft_reshape(weight, nd, cshape));
  if (bias) y = graft_add(y, graft_reshape(bias, nd, cshape));
  return comp_finish(fn, y);
}

/* ---- layers and losses ---- */

graft_tensor *graft_linear(graft_tensor *x, graft_tensor *w, graft_tensor *b) {
  static const char fn[] = "graft_linear";
  if (comp_bad_input(fn, "x", x) || comp_bad_input(fn, "w", w)) return NULL;
  if (b && comp_bad_input(fn, "b", b)) return NULL;
  char bx[200], bw[200];
  SHAPE(x, bx);
  SHAPE(w, bw);
  if (graft_ndim(w) != 2)
    return err_set(GRAFT_ERR_SHAPE, "%s: w shape %s must be [out,in]", fn, bw);
  if (graft_ndim(x) < 1 || graft_dim(x, -1) != graft_dim(w, 1))
    return err_set(GRAFT_ERR_SHAPE, "%s: x shape %s does not match w %s (x's last dim must be in=%lld)",
                   fn, bx, bw, (long long)graft_dim(w, 1));
  graft_dtype dt = graft_get_dtype(x);
  if (!same_dtype(fn, "w", w, "x", dt)) return NULL;
  if (b && (!same_dtype(fn, "b", b, "x", dt) || !need_vec(fn, "b", b, graft_dim(w, 0), bw)))
    return NULL;
  graft_scope_begin();
  graft_tensor *y = graft_matmul(x, graft_t(w));
  if (b) y = graft_add(y, b);
  return comp_finish(fn, y);
}

graft_tensor *graft_cross_entropy(graft_tensor *logits, graft_tensor *target) {
  static const char fn[] = "graft_cross_entropy";
  if (comp_bad_input(fn, "logits", logits) || comp_bad_input(fn, "target", target)) return NULL;
  char bl[200], bt[200];
  SHAPE(logits, bl);
  SHAPE(target, bt);
  if (graft_ndim(logits) != 2)
    return err_set(GRAFT_ERR_SHAPE, "%s: logits shape %s must be [N,C]", fn, bl);
  if (!need_float(fn, "logits", logits)) return NULL;
  if (!is_index(graft_get_dtype(target)))
    return err_set(GRAFT_ERR_DTYPE, "%s: target has dtype %s; class indices must be i32 or i64", fn,
                   graft_dtype_name(graft_get_dtype(target)));
  int64_t n = graft_dim(logits, 0);
  if (graft_ndim(target) != 1 || graft_dim(target, 0) != n)
    return err_set(GRAFT_ERR_SHAPE, "%s: target shape %s does not match logits %s batch", fn, bt, bl);
  graft_scope_begin();
  graft_tensor *lsm = graft_log_softmax(logits, 1);
  /* Pick log p[n, target[n]] with a gather along the class axis: index [N,1] -> [N,1]. */
  graft_tensor *idx = target;
  if (graft_get_dtype(idx) != GRAFT_I64) idx = graft_convert(idx, GRAFT_I64);
  int64_t col[2] = {n, 1};
  graft_tensor *picked = graft_gather(lsm, 1, graft_reshape(idx, 2, col));
  graft_tensor *y = graft_neg(graft_mean(picked, NULL, 0, false));
  return comp_finish(fn, y);
}

graft_tensor *graft_dropout(graft_tensor *x, double p, bool training) {
  static const char fn[] = "graft_dropout";
  if (comp_bad_input(fn, "x", x)) return NULL;
  if (!(p >= 0.0 && p < 1.0))
    return err_set(GRAFT_ERR_ARG, "%s: p = %g must be in [0, 1)", fn, p);
  if (!need_float(fn, "x", x)) return NULL;
  int64_t shape[GRAFT_MAX_DIMS];
  int nd = graft_shape(x, shape);
  /* Identity: a new handle on x's value. Not graft_retain(x), which returns the same handle
   * without registering it with the caller's scope; broadcasting to its own shape makes a new
   * handle like any op result, and adds no IR node. */
  if (!training || p == 0.0) return graft_broadcast_to(x, nd, shape);
  graft_dtype dt = graft_get_dtype(x);
  graft_scope_begin();
  /* keep = u >= p with u uniform in [0,1): P(keep) = 1-p. p and 1/(1-p) are parameters, so
   * changing p between steps reuses the compiled graph. */
  int dev = graft_device(x);
  graft_tensor *u = graft_rand_uniform_on(dt, nd, shape, dev);
  graft_tensor *keep = graft_convert(graft_ge(u, graft_scalar_on(p, dt, dev)), dt);
  graft_tensor *y = graft_mul(graft_mul(x, keep), graft_scalar_on(1.0 / (1.0 - p), dt, dev));
  return comp_finish(fn, y);
}

graft_tensor *graft_embedding(graft_tensor *weight, graft_tensor *index) {
  static const char fn[] = "graft_embedding";
  if (comp_bad_input(fn, "weight", weight) || comp_bad_input(fn, "index", index)) return NULL;
  char bw[200], bi[200];
  SHAPE(weight, bw);
  SHAPE(index, bi);
  if (graft_ndim(weight) != 2)
    return err_set(GRAFT_ERR_SHAPE, "%s: weight shape %s must be [V,D]", fn, bw);
  if (!is_index(graft_get_dtype(index)))
    return err_set(GRAFT_ERR_DTYPE, "%s: index has dtype %s; it must be i32 or i64", fn,
                   graft_dtype_name(graft_get_dtype(index)));
  int64_t ishape[GRAFT_MAX_DIMS];
  int ind = graft_shape(index, ishape);
  if (ind + 1 > GRAFT_MAX_DIMS)
    return err_set(GRAFT_ERR_SHAPE, "%s: index shape %s has too many dims (output adds one; max %d)",
                   fn, bi, GRAFT_MAX_DIMS);
  int64_t n = graft_numel(index), d = graft_dim(weight, 1);
  graft_scope_begin();
  /* Flatten to [n,1], broadcast to [n,D], gather rows along axis 0, then restore index's shape. */
  graft_tensor *idx = index;
  if (graft_get_dtype(idx) != GRAFT_I64) idx = graft_convert(idx, GRAFT_I64);
  int64_t col[2] = {n, 1}, rows[2] = {n, d};
  idx = graft_broadcast_to(graft_reshape(idx, 2, col), 2, rows);
  graft_tensor *g = graft_gather(weight, 0, idx);
  ishape[ind] = d;
  return comp_finish(fn, graft_reshape(g, ind + 1, ishape));
}
