/* Gradients of primitives that front-ends need as ops (conv2d), and flip, written on the public
 * API only: they decompose into primitives like any composite. (max_pool2d's gradient is an op
 * of its own, max_pool_grad: graft_max_pool2d_backward in ops_nn.c.) */
#include "graft.h"
#include "composite.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Each function opens a scope and returns through comp_finish, keeping only its result; every
 * index or constant it makes is on its input's device. */

graft_tensor *graft_flip(graft_tensor *a, const int *axes, int naxes) {
  const char *fn = "graft_flip";
  if (comp_bad_input(fn, "a", a)) return NULL;
  if (naxes && !axes) return err_set(GRAFT_ERR_NULL, "%s: axes is NULL", fn);
  int nd = graft_ndim(a);
  int64_t shape[GRAFT_MAX_DIMS];
  graft_shape(a, shape);
  graft_scope_begin();
  graft_tensor *cur = a;
  for (int i = 0; i < naxes && cur; i++) {
    int ax = axes[i] < 0 ? axes[i] + nd : axes[i];
    if (ax < 0 || ax >= nd) {
      graft_scope_end();
      return err_set(GRAFT_ERR_AXIS, "%s: axis %d out of range for %d dims", fn, axes[i], nd);
    }
    /* index = (n-1) - iota along ax, gathered along ax: computed in the graph, never uploaded */
    int dev = graft_device(a);
    graft_tensor *idx = graft_sub(graft_full_on((double)shape[ax] - 1, GRAFT_I64, 0, NULL, dev),
                                  graft_iota_on(GRAFT_I64, nd, shape, ax, dev));
    cur = graft_gather(cur, ax, idx);
  }
  /* No axes: a new handle on the same value (the scope must own it, so not graft_retain). */
  return comp_finish(fn, cur == a ? graft_broadcast_to(a, nd, shape) : cur);
}

/* "[d0,d1,...]" into buf. */
static const char *grad_shape_str(int nd, const int64_t *s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < nd && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)s[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}
#define SHP4(s) grad_shape_str(4, (s), (char[128]){0}, 128)

/* t's shape into s when t is a valid 4-D tensor; -1 with the error set otherwise (a NULL t
 * keeps the error of the op that produced it). */
static int grad_shape4(const char *fn, const char *name, graft_tensor *t, int64_t *s) {
  if (comp_bad_input(fn, name, t)) return -1;
  int nd = graft_shape(t, s);
  if (nd == 4) return 0;
  err_set(GRAFT_ERR_SHAPE, "%s: %s %s must be 4-D", fn, name,
          grad_shape_str(nd, s, (char[128]){0}, 128));
  return -1;
}

static int conv_args(const char *fn, const int64_t *s4, const int *stride, const int *padding,
                     const int *dilation, int groups, int *st, int *pd, int *dl) {
  if (!s4) return err_set(GRAFT_ERR_NULL, "%s: shape is NULL", fn), -1;
  for (int d = 0; d < 2; d++) {
    st[d] = stride ? stride[d] : 1;
    pd[d] = padding ? padding[d] : 0;
    dl[d] = dilation ? dilation[d] : 1;
    if (st[d] < 1 || dl[d] < 1 || pd[d] < 0)
      return err_set(GRAFT_ERR_ARG, "%s: stride/dilation must be >= 1, padding >= 0", fn), -1;
  }
  if (groups < 1) return err_set(GRAFT_ERR_ARG, "%s: groups %d < 1", fn, groups), -1;
  return 0;
}

/* The forward conv2d's output size on one spatial dim: (x + 2p - d*(k-1) - 1) / s + 1; -1 when
 * the kernel does not fit, -2 when a size passes int64. x, k >= 1. */
static int64_t grad_conv_out(int64_t x, int64_t k, int s, int p, int d) {
  int64_t padded, ext;
  if (__builtin_add_overflow(x, 2 * (int64_t)p, &padded) ||
      __builtin_mul_overflow((int64_t)d, k - 1, &ext))
    return -2;
  return padded - 1 < ext ? -1 : (padded - 1 - ext) / s + 1;
}

/* x fits dy on one dim when the forward conv of x (o) gives y, or x is at most max(s, d) - 1
 * past the smallest x that does: conv_transpose2d's output_padding. */
static bool grad_dim_ok(int64_t x, int64_t o, int64_t k, int s, int p, int d, int64_t y) {
  if (o == y) return true;
  if (o < 0 || y < 1 || y > o) return false; /* y <= o: xmin below does not overflow */
  int64_t xmin = (y - 1) * s - 2 * (int64_t)p + (int64_t)d * (k - 1) + 1;
  return x >= xmin && x - xmin < (s > d ? s : d);
}

/* Checks that x [N,C,H,W] convolved with w [O,C/g,KH,KW] gives dy's shape, as the forward
 * conv2d did: positive dims (N may be 0), channels per groups, the batch and the spatial size
 * (with conv_transpose2d's output_padding allowed).
 * xn and wn name the arguments ("x_shape" or "x"); messages name fn and the shapes. */
static int grad_conv_match(const char *fn, const char *xn, const int64_t *xs, const char *wn,
                           const int64_t *ws, const int64_t *ys, const int *st, const int *pd,
                           const int *dl, int g) {
  if (xs[0] < 0 || xs[1] < 1 || xs[2] < 1 || xs[3] < 1)
    return err_set(GRAFT_ERR_SHAPE, "%s: %s %s must have positive dims", fn, xn, SHP4(xs)), -1;
  if (ws[0] < 1 || ws[1] < 1 || ws[2] < 1 || ws[3] < 1)
    return err_set(GRAFT_ERR_SHAPE, "%s: %s %s must have positive dims", fn, wn, SHP4(ws)), -1;
  if (xs[1] % g || ws[0] % g || xs[1] / g != ws[1] || ys[1] != ws[0])
    return err_set(GRAFT_ERR_SHAPE, "%s: channels of %s %s, %s %s and dy %s do not match "
                   "(groups %d)", fn, xn, SHP4(xs), wn, SHP4(ws), SHP4(ys), g), -1;
  if (ys[0] != xs[0])
    return err_set(GRAFT_ERR_SHAPE, "%s: %s %s and dy %s differ in batch", fn, xn, SHP4(xs),
                   SHP4(ys)), -1;
  int64_t oh = grad_conv_out(xs[2], ws[2], st[0], pd[0], dl[0]);
  int64_t ow = grad_conv_out(xs[3], ws[3], st[1], pd[1], dl[1]);
  if (grad_dim_ok(xs[2], oh, ws[2], st[0], pd[0], dl[0], ys[2]) &&
      grad_dim_ok(xs[3], ow, ws[3], st[1], pd[1], dl[1], ys[3]))
    return 0;
  char out[96];
  if (oh == -2 || ow == -2) snprintf(out, sizeof out, "no output (a size passes int64)");
  else if (oh < 0 || ow < 0) snprintf(out, sizeof out, "no output (kernel past the padded input)");
  else snprintf(out, sizeof out, "output [%lld,%lld]", (long long)oh, (long long)ow);
  return err_set(GRAFT_ERR_SHAPE, "%s: %s %s with %s %s (stride [%d,%d], padding [%d,%d], "
                 "dilation [%d,%d]) gives %s, but dy is %s", fn, xn, SHP4(xs), wn, SHP4(ws),
                 st[0], st[1], pd[0], pd[1], dl[0], dl[1], out, SHP4(ys)), -1;
}

/* Padding of the transposed convolution for dx (checked shapes: no overflow); -1 when the
 * forward padding is larger than the kernel's reach, or a size passes int. */
static int grad_dx_padding(const char *fn, const int64_t *xs, const int64_t *ws,
                           const int64_t *ys, const int *st, const int *pd, const int *dl,
                           int *lo, int *hi) {
  for (int d = 0; d < 2; d++) {
    int64_t l = (ws[2 + d] - 1) * dl[d] - pd[d];
    int64_t h = xs[2 + d] - 1 + pd[d] - (ys[2 + d] - 1) * st[d];
    if (l < 0)
      return err_set(GRAFT_ERR_ARG, "%s: padding %d larger than dilation*(kernel-1) is not "
                     "supported", fn, pd[d]), -1;
    if (l > INT32_MAX || h > INT32_MAX)
      return err_set(GRAFT_ERR_SHAPE, "%s: x_shape %s and w %s need a padding past int", fn,
                     SHP4(xs), SHP4(ws)), -1;
    lo[d] = (int)l;
    hi[d] = (int)h;
  }
  return 0;
}

/* dx = conv(dy dilated by the stride, w flipped and with in/out channels swapped per group). */
graft_tensor *graft_conv2d_backward_input(graft_tensor *dy, graft_tensor *w, const int64_t *xs,
                                          const int *stride, const int *padding,
                                          const int *dilation, int groups) {
  const char *fn = "graft_conv2d_backward_input";
  int st[2], pd[2], dl[2], lo[2], hi[2];
  int64_t ws[GRAFT_MAX_DIMS], ys[GRAFT_MAX_DIMS];
  if (grad_shape4(fn, "dy", dy, ys) || grad_shape4(fn, "w", w, ws) ||
      conv_args(fn, xs, stride, padding, dilation, groups, st, pd, dl) ||
      grad_conv_match(fn, "x_shape", xs, "w", ws, ys, st, pd, dl, groups) ||
      grad_dx_padding(fn, xs, ws, ys, st, pd, dl, lo, hi))
    return NULL;
  int64_t O = ws[0], Cg = ws[1], g = groups;
  graft_scope_begin();
  /* w [O, C/g, K, K] -> [g, O/g, C/g, K, K] -> [g, C/g, O/g, K, K] -> [C, O/g, K, K], flipped */
  graft_tensor *wt = graft_reshape(w, 5, (int64_t[]){g, O / g, Cg, ws[2], ws[3]});
  wt = graft_transpose(wt, (int[]){0, 2, 1, 3, 4});
  wt = graft_reshape(wt, 4, (int64_t[]){g * Cg, O / g, ws[2], ws[3]});
  wt = graft_flip(wt, (int[]){2, 3}, 2);
  return comp_finish(fn, graft_conv2d_ex(dy, wt, NULL, lo, hi, dl, st, groups));
}

/* dw = conv over the batch: x as [C/g, g*N, H, W] with dy as kernels [O, N, OH, OW], kernel
 * dilation = stride and stride = dilation, per group; then back to [O, C/g, K, K]. */
graft_tensor *graft_conv2d_backward_weight(graft_tensor *x, graft_tensor *dy, const int64_t *wsz,
                                           const int *stride, const int *padding,
                                           const int *dilation, int groups) {
  const char *fn = "graft_conv2d_backward_weight";
  int st[2], pd[2], dl[2];
  int64_t xs[GRAFT_MAX_DIMS], ys[GRAFT_MAX_DIMS];
  if (grad_shape4(fn, "x", x, xs) || grad_shape4(fn, "dy", dy, ys) ||
      conv_args(fn, wsz, stride, padding, dilation, groups, st, pd, dl) ||
      grad_conv_match(fn, "x", xs, "w_shape", wsz, ys, st, pd, dl, groups))
    return NULL;
  int64_t N = xs[0], O = wsz[0], g = groups, Cg = xs[1] / g;
  graft_scope_begin();
  graft_tensor *xt = graft_reshape(x, 5, (int64_t[]){N, g, Cg, xs[2], xs[3]});
  xt = graft_transpose(xt, (int[]){2, 1, 0, 3, 4});
  xt = graft_reshape(xt, 4, (int64_t[]){Cg, g * N, xs[2], xs[3]});
  graft_tensor *k = graft_reshape(dy, 5, (int64_t[]){N, g, O / g, ys[2], ys[3]});
  k = graft_transpose(k, (int[]){1, 2, 0, 3, 4});
  k = graft_reshape(k, 4, (int64_t[]){O, N, ys[2], ys[3]});
  /* [C/g, O, K', K'] with K' >= K: the forward output size was checked */
  graft_tensor *r = graft_conv2d_ex(xt, k, dl, pd, pd, st, NULL, groups);
  r = graft_transpose(r, (int[]){1, 0, 2, 3});
  return comp_finish(fn, graft_slice(r, (int64_t[]){0, 0, 0, 0},
                                     (int64_t[]){O, Cg, wsz[2], wsz[3]}, NULL));
}

