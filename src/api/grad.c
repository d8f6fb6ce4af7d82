/* Gradients of primitives that front-ends need as ops (conv2d, max_pool2d), and flip, written
 * on the public API only: they decompose into primitives like any composite. */
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

/* Non-overlapping windows (stride == kernel, the usual 2x2/2): each element of the padded x
 * lies in at most one window, so the gradient is one elementwise pass over x viewed as
 * [..., OH, kh, OW, kw]: the element whose offset is its window's first maximum gets dy. The
 * first maximum's offset is found on the pooled grid (a min over the k*k strided views). */
static graft_tensor *pool_backward_tiled(graft_tensor *xpad, graft_tensor *pooled, graft_tensor *dy,
                                         graft_tensor *zero, const int *kernel, int nd,
                                         const int64_t *xp, const int64_t *ys) {
  int kh = kernel[0], kw = kernel[1];
  int64_t start[GRAFT_MAX_DIMS] = {0}, limit[GRAFT_MAX_DIMS], step[GRAFT_MAX_DIMS];
  for (int i = 0; i < nd; i++) limit[i] = xp[i], step[i] = 1;
  step[nd - 2] = kh;
  step[nd - 1] = kw;
  int dev = graft_device(dy);
  graft_tensor *none = graft_scalar_on(kh * kw, GRAFT_I32, dev);
  graft_tensor *idx = graft_full_on(kh * kw, GRAFT_I32, nd, ys, dev);
  for (int i = 0; i < kh; i++)
    for (int j = 0; j < kw; j++) {
      start[nd - 2] = i;
      start[nd - 1] = j;
      limit[nd - 2] = i + (ys[nd - 2] - 1) * kh + 1;
      limit[nd - 1] = j + (ys[nd - 1] - 1) * kw + 1;
      graft_tensor *hit = graft_eq(graft_slice(xpad, start, limit, step), pooled);
      idx = graft_minimum(idx, graft_where(hit, graft_scalar_on(i * kw + j, GRAFT_I32, dev), none));
    }
  int64_t t6[GRAFT_MAX_DIMS], w6[GRAFT_MAX_DIMS]; /* [..., OH, kh, OW, kw] and [..., OH, 1, OW, 1] */
  for (int i = 0; i < nd - 2; i++) t6[i] = w6[i] = xp[i];
  int64_t OH = ys[nd - 2], OW = ys[nd - 1];
  t6[nd - 2] = w6[nd - 2] = OH;
  t6[nd - 1] = kh, w6[nd - 1] = 1;
  t6[nd] = w6[nd] = OW;
  t6[nd + 1] = kw, w6[nd + 1] = 1;
  graft_tensor *off = graft_add(graft_mul(graft_iota_on(GRAFT_I32, nd + 2, t6, nd - 1, dev),
                                          graft_scalar_on(kw, GRAFT_I32, dev)),
                                graft_iota_on(GRAFT_I32, nd + 2, t6, nd + 1, dev));
  graft_tensor *first = graft_eq(off, graft_reshape(idx, nd + 2, w6));
  graft_tensor *g = graft_where(first, graft_reshape(dy, nd + 2, w6), zero);
  int64_t gs[GRAFT_MAX_DIMS], plo[GRAFT_MAX_DIMS] = {0}, phi[GRAFT_MAX_DIMS] = {0};
  memcpy(gs, xp, sizeof(int64_t) * (size_t)nd);
  gs[nd - 2] = OH * kh;
  gs[nd - 1] = OW * kw;
  phi[nd - 2] = xp[nd - 2] - gs[nd - 2]; /* rows and columns no window covers */
  phi[nd - 1] = xp[nd - 1] - gs[nd - 1];
  return graft_pad(graft_reshape(g, nd, gs), plo, phi, 0);
}

/* For each offset in the window: the strided view of x at that offset, equal to the window's
 * max and not yet claimed by an earlier offset, receives dy; interior padding puts it back. */
graft_tensor *graft_max_pool2d_backward(graft_tensor *x, graft_tensor *dy, const int *kernel,
                                        const int *stride, const int *padding) {
  const char *fn = "graft_max_pool2d_backward";
  int64_t xs[GRAFT_MAX_DIMS], ys[GRAFT_MAX_DIMS];
  if (comp_bad_input(fn, "x", x) || comp_bad_input(fn, "dy", dy)) return NULL;
  int nd = graft_shape(x, xs);
  graft_shape(dy, ys);
  if (!kernel) return err_set(GRAFT_ERR_NULL, "%s: kernel is NULL", fn);
  if (nd < 2 || graft_ndim(dy) != nd)
    return err_set(GRAFT_ERR_SHAPE, "%s: x and dy need the same rank >= 2", fn);
  graft_dtype dt = graft_get_dtype(x);
  graft_scope_begin();
  graft_tensor *pooled = graft_max_pool2d(x, kernel, stride, padding);
  int64_t ps[GRAFT_MAX_DIMS];
  if (!pooled || graft_shape(pooled, ps) < 0) return comp_finish(fn, NULL);
  if (memcmp(ps, ys, sizeof(int64_t) * (size_t)nd)) {
    graft_scope_end();
    return err_set(GRAFT_ERR_SHAPE, "%s: dy does not have the pooled shape", fn);
  }
  if ((int64_t)kernel[0] * kernel[1] > INT32_MAX) { /* window offsets are i32; one pass each */
    graft_scope_end();
    return err_set(GRAFT_ERR_SHAPE, "%s: kernel %dx%d has more than 2^31-1 elements", fn,
                   kernel[0], kernel[1]);
  }
  int64_t lo[GRAFT_MAX_DIMS] = {0}, hi[GRAFT_MAX_DIMS] = {0}, inner[GRAFT_MAX_DIMS] = {0};
  int64_t st[2], pd[2], xp[GRAFT_MAX_DIMS];
  for (int d = 0; d < 2; d++) {
    st[d] = stride ? stride[d] : kernel[d];
    pd[d] = padding ? padding[d] : 0;
    lo[nd - 2 + d] = hi[nd - 2 + d] = pd[d];
  }
  memcpy(xp, xs, sizeof xp);
  xp[nd - 2] += 2 * pd[0];
  xp[nd - 1] += 2 * pd[1];
  graft_tensor *xpad = graft_pad(x, lo, hi, -INFINITY);
  int dev = graft_device(x); /* every value made here goes on x's device */
  graft_tensor *zero = graft_zeros_on(dt, 0, NULL, dev);
  if (st[0] == kernel[0] && st[1] == kernel[1] && nd + 2 <= GRAFT_MAX_DIMS) {
    graft_tensor *g = pool_backward_tiled(xpad, pooled, dy, zero, kernel, nd, xp, ys);
    for (int d = 0; d < 2; d++) {
      lo[nd - 2 + d] = pd[d];
      hi[nd - 2 + d] = pd[d] + xs[nd - 2 + d];
    }
    for (int i = 0; i < nd - 2; i++) lo[i] = 0, hi[i] = xs[i];
    return comp_finish(fn, graft_slice(g, lo, hi, NULL));
  }
  graft_tensor *taken = graft_full_on(0, GRAFT_BOOL, nd, ys, dev);
  graft_tensor *acc = graft_zeros_on(dt, nd, xp, dev);
  int64_t start[GRAFT_MAX_DIMS] = {0}, limit[GRAFT_MAX_DIMS], sstep[GRAFT_MAX_DIMS];
  for (int i = 0; i < nd; i++) limit[i] = xp[i], sstep[i] = 1;
  for (int d = 0; d < 2; d++) sstep[nd - 2 + d] = st[d], inner[nd - 2 + d] = st[d] - 1;
  for (int i = 0; i < kernel[0]; i++)
    for (int j = 0; j < kernel[1]; j++) {
      int off[2] = {i, j};
      for (int d = 0; d < 2; d++) {
        int ax = nd - 2 + d;
        start[ax] = off[d];
        limit[ax] = off[d] + (ys[ax] - 1) * st[d] + 1;
        lo[ax] = off[d];
        hi[ax] = xp[ax] - limit[ax];
      }
      graft_tensor *xv = graft_slice(xpad, start, limit, sstep);
      graft_tensor *hit = graft_logical_and(graft_eq(xv, pooled), graft_logical_not(taken));
      taken = graft_logical_or(taken, hit);
      graft_tensor *g = graft_where(hit, dy, zero);
      acc = graft_add(acc, graft_pad_ex(g, lo, hi, inner, 0));
    }
  for (int d = 0; d < 2; d++) {
    start[nd - 2 + d] = pd[d];
    limit[nd - 2 + d] = pd[d] + xs[nd - 2 + d];
  }
  for (int i = 0; i < nd - 2; i++) start[i] = 0, limit[i] = xs[i];
  return comp_finish(fn, graft_slice(acc, start, limit, NULL));
}
