/* C API: contraction (matmul, conv2d), indexing (gather, scatter_add) and pooling. */
#include "api.h"
#include "hostfn.h"
#include <stdlib.h>
#include <string.h>

/* Reshape helper (lock held): a new reference. */
static ir_node *reshape_node(ir_node *n, int ndim, const int64_t *shape) {
  return ir_make(IR_RESHAPE, 1, &n, NULL, n->dtype, ndim, shape);
}

graft_tensor *graft_matmul(graft_tensor *a, graft_tensor *b) {
  unsigned mark = err_count();
  const char *fn = "graft_matmul";
  tensor_lock();
  ir_node *na = api_in(a, fn), *nb = na ? api_in(b, fn) : NULL;
  graft_tensor *t = NULL;
  ir_node *ra = NULL, *rb = NULL, *fa = NULL, *fb = NULL, *d = NULL;
  char sa[128], sb[128];
  if (!nb) goto out;
  if (na->ndim == 0 || nb->ndim == 0) {
    err_set(GRAFT_ERR_SHAPE, "%s: operands must have at least 1 dim, got %s and %s", fn,
            ir_shape_str(na->ndim, na->shape, sa, sizeof sa),
            ir_shape_str(nb->ndim, nb->shape, sb, sizeof sb));
    goto out;
  }
  /* numpy: a 1-D left operand is a row, a 1-D right operand a column; both dropped after. */
  ra = na->ndim == 1 ? reshape_node(na, 2, (int64_t[]){1, na->shape[0]}) : (ir_retain(na), na);
  rb = nb->ndim == 1 ? reshape_node(nb, 2, (int64_t[]){nb->shape[0], 1}) : (ir_retain(nb), nb);
  if (!ra || !rb) goto out;
  int64_t M = ra->shape[ra->ndim - 2], K = ra->shape[ra->ndim - 1];
  int64_t K2 = rb->shape[rb->ndim - 2], N = rb->shape[rb->ndim - 1];
  if (K != K2) {
    err_set(GRAFT_ERR_SHAPE, "%s: inner dims differ: %s @ %s", fn,
            ir_shape_str(na->ndim, na->shape, sa, sizeof sa),
            ir_shape_str(nb->ndim, nb->shape, sb, sizeof sb));
    goto out;
  }
  ir_node ba = {.ndim = ra->ndim - 2}, bb = {.ndim = rb->ndim - 2};
  memcpy(ba.shape, ra->shape, sizeof(int64_t) * (size_t)ba.ndim);
  memcpy(bb.shape, rb->shape, sizeof(int64_t) * (size_t)bb.ndim);
  int nd;
  int64_t shape[GRAFT_MAX_DIMS + 2];
  if (api_broadcast_shape(fn, &ba, &bb, &nd, shape)) goto out;
  if (nd + 2 > GRAFT_MAX_DIMS) {
    err_set(GRAFT_ERR_SHAPE, "%s: result has more than %d dims", fn, GRAFT_MAX_DIMS);
    goto out;
  }
  shape[nd] = M, shape[nd + 1] = K;
  fa = api_broadcast(ra, nd + 2, shape);
  shape[nd] = K, shape[nd + 1] = N;
  fb = api_broadcast(rb, nd + 2, shape);
  if (!fa || !fb) goto out;
  d = ir_make(IR_DOT, 2, (ir_node *[]){fa, fb}, NULL, fa->dtype, 0, NULL);
  if (d && (na->ndim == 1 || nb->ndim == 1)) {
    int64_t os[GRAFT_MAX_DIMS];
    int on = 0;
    for (int i = 0; i < nd; i++) os[on++] = d->shape[i];
    if (na->ndim != 1) os[on++] = M;
    if (nb->ndim != 1) os[on++] = N;
    ir_node *r = reshape_node(d, on, os);
    ir_release(d);
    d = r;
  }
  t = api_node(d);
out:
  if (ra) ir_release(ra);
  if (rb) ir_release(rb);
  if (fa) ir_release(fa);
  if (fb) ir_release(fb);
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_conv2d_ex(graft_tensor *x, graft_tensor *w, const int *stride, const int *pad_lo,
                              const int *pad_hi, const int *dilation, const int *lhs_dilation,
                              int groups) {
  unsigned mark = err_count();
  const char *fn = "graft_conv2d_ex";
  tensor_lock();
  ir_node *in[2] = {api_in(x, fn), NULL};
  in[1] = in[0] ? api_in(w, fn) : NULL;
  graft_tensor *t = NULL;
  if (in[1]) {
    ir_attrs at = {0};
    for (int d = 0; d < 2; d++) {
      IR_ATTR_AT(at, CONV2D, stride, d) = stride ? stride[d] : 1;
      IR_ATTR_AT(at, CONV2D, pad_lo, d) = pad_lo ? pad_lo[d] : 0;
      IR_ATTR_AT(at, CONV2D, pad_hi, d) = pad_hi ? pad_hi[d] : 0;
      IR_ATTR_AT(at, CONV2D, dilation, d) = dilation ? dilation[d] : 1;
      IR_ATTR_AT(at, CONV2D, lhs_dilation, d) = lhs_dilation ? lhs_dilation[d] : 1;
    }
    IR_ATTR(at, CONV2D, groups) = groups;
    t = api_node(ir_make(IR_CONV2D, 2, in, &at, in[0]->dtype, 0, NULL));
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_conv2d(graft_tensor *x, graft_tensor *w, const int *stride, const int *padding,
                           const int *dilation, int groups) {
  unsigned mark = err_count();
  return err_named(graft_conv2d_ex(x, w, stride, padding, padding, dilation, NULL, groups), mark,
                   __func__);
}

graft_tensor *graft_gather(graft_tensor *a, int axis, graft_tensor *index) {
  unsigned mark = err_count();
  const char *fn = "graft_gather";
  tensor_lock();
  ir_node *in[2] = {api_in(a, fn), NULL};
  in[1] = in[0] ? api_in(index, fn) : NULL;
  int ax = in[1] ? api_axis(fn, axis, in[0]->ndim) : -1;
  ir_attrs at = {.a[IR_ATTR_AXIS_axis] = ax};
  graft_tensor *t = ax >= 0 ? api_node(ir_make(IR_GATHER, 2, in, &at, in[0]->dtype, 0, NULL)) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_scatter_add(graft_tensor *a, int axis, graft_tensor *index, graft_tensor *src) {
  unsigned mark = err_count();
  const char *fn = "graft_scatter_add";
  tensor_lock();
  ir_node *in[3] = {api_in(a, fn), NULL, NULL};
  in[1] = in[0] ? api_in(index, fn) : NULL;
  in[2] = in[1] ? api_in(src, fn) : NULL;
  int ax = in[2] ? api_axis(fn, axis, in[0]->ndim) : -1;
  ir_attrs at = {.a[IR_ATTR_AXIS_axis] = ax};
  graft_tensor *t =
      ax >= 0 ? api_node(ir_make(IR_SCATTER_ADD, 3, in, &at, in[0]->dtype, 0, NULL)) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

/* The window attributes of pooling over the last two dims of n; 0, or -1 with the error set. */
static int pool_attrs(const char *fn, int kind, const ir_node *n, const int *kernel,
                      const int *stride, const int *padding, ir_attrs *at) {
  if (n->ndim < 2)
    return err_set(GRAFT_ERR_SHAPE, "%s: needs at least 2 dims ([N,C,H,W]), got %d", fn, n->ndim), -1;
  if (!kernel) return err_set(GRAFT_ERR_NULL, "%s: kernel is NULL", fn), -1;
  *at = (ir_attrs){.a[IR_ATTR_WINDOW_kind] = kind};
  for (int i = 0; i < n->ndim; i++) {
    int d = i - (n->ndim - 2);
    IR_ATTR_AT(*at, WINDOW, window, i) = d >= 0 ? kernel[d] : 1;
    IR_ATTR_AT(*at, WINDOW, stride, i) = d >= 0 ? (stride ? stride[d] : kernel[d]) : 1;
    IR_ATTR_AT(*at, WINDOW, pad_lo, i) = IR_ATTR_AT(*at, WINDOW, pad_hi, i) =
        d >= 0 && padding ? padding[d] : 0;
  }
  return 0;
}

/* Pooling over the last two dims as a reduce_window (lock held). */
static ir_node *pool_node(const char *fn, int kind, ir_node *n, const int *kernel,
                          const int *stride, const int *padding) {
  ir_attrs at;
  if (pool_attrs(fn, kind, n, kernel, stride, padding, &at)) return NULL;
  return ir_make(IR_REDUCE_WINDOW, 1, &n, &at, n->dtype, 0, NULL);
}

/* One max_pool_grad (XLA's select-and-scatter): a pass over the windows, not a decomposition
 * into k*k compare/select/pad passes (resnet18's stem gradient: 9% of its step that way). */
graft_tensor *graft_max_pool2d_backward(graft_tensor *x, graft_tensor *dy, const int *kernel,
                                        const int *stride, const int *padding) {
  unsigned mark = err_count();
  const char *fn = "graft_max_pool2d_backward";
  tensor_lock();
  ir_node *in[2] = {api_in(x, fn), NULL};
  in[1] = in[0] ? api_in(dy, fn) : NULL;
  ir_attrs at;
  graft_tensor *t = NULL;
  if (in[1] && !pool_attrs(fn, 0, in[0], kernel, stride, padding, &at))
    t = api_node(ir_make(IR_MAX_POOL_GRAD, 2, in, &at, in[0]->dtype, 0, NULL));
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_max_pool2d(graft_tensor *x, const int *kernel, const int *stride,
                               const int *padding) {
  unsigned mark = err_count();
  const char *fn = "graft_max_pool2d";
  tensor_lock();
  ir_node *n = api_in(x, fn);
  graft_tensor *t = n ? api_node(pool_node(fn, 0, n, kernel, stride, padding)) : NULL;
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_avg_pool2d(graft_tensor *x, const int *kernel, const int *stride,
                               const int *padding) {
  unsigned mark = err_count();
  const char *fn = "graft_avg_pool2d";
  tensor_lock();
  ir_node *n = api_in(x, fn);
  graft_tensor *t = NULL;
  if (n && !dtype_is_float(n->dtype)) {
    err_set(GRAFT_ERR_DTYPE, "%s: needs a floating dtype, got %s", fn, graft_dtype_name(n->dtype));
  } else if (n) {
    ir_node *s = pool_node(fn, 1, n, kernel, stride, padding);
    ir_attrs at = {.f = s ? 1.0 / ((double)kernel[0] * kernel[1]) : 0};
    ir_node *c = s ? ir_make_on(IR_CONSTANT, 0, NULL, &at, n->dtype, 0, NULL, n->device) : NULL;
    ir_node *cb = c ? api_broadcast(c, s->ndim, s->shape) : NULL;
    if (cb) t = api_node(ir_make(IR_MUL, 2, (ir_node *[]){s, cb}, NULL, n->dtype, 0, NULL));
    if (s) ir_release(s);
    if (c) ir_release(c);
    if (cb) ir_release(cb);
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_host_call(graft_host_fn fn, void *ctx, uint64_t key, int nin,
                              graft_tensor *const *in, graft_dtype dtype, int ndim,
                              const int64_t *shape) {
  unsigned mark = err_count();
  const char *name = "graft_host_call";
  if (!fn || nin < 1 || !in)
    return err_named(err_set(GRAFT_ERR_ARG, "%s: needs a function and at least one operand "
                             "(got %d)", name, nin), mark, name);
  tensor_lock();
  ir_node *small[16], **nodes = nin <= 16 ? small : malloc(sizeof *nodes * (size_t)nin);
  graft_tensor *t = NULL;
  int k = 0;
  if (!nodes) err_set(GRAFT_ERR_OOM, "%s: out of memory", name);
  for (; nodes && k < nin; k++)
    if (!(nodes[k] = api_in(in[k], name))) break;
  if (nodes && k == nin) {
    if (nodes[0]->device >= GRAFT_CPU_DEVICES)
      err_set(GRAFT_ERR_DEVICE, "%s: host functions run on the CPU devices; operand 0 is on "
              "device %d", name, nodes[0]->device);
    else if (!hostfn_register(key, fn, ctx)) {
      ir_attrs at = {.a[IR_ATTR_HOST_CALL_key] = (int64_t)key};
      t = api_node(ir_make(IR_HOST_CALL, nin, nodes, &at, dtype, ndim, shape));
    }
  }
  if (nodes != small) free(nodes);
  tensor_unlock();
  return err_named(t, mark, name);
}
