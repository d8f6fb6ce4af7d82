/* The vector-Jacobian rule of every op ops.def marks VJP (graft_grad's; autodiff.h). Each rule
 * is written on the public API, so the gradient is IR like the forward. Rules follow PyTorch's
 * conventions where a derivative is a choice: maximum/minimum split a tie's gradient evenly,
 * a max/min reduction divides it among the elements equal to the result, pow's exponent gradient
 * is 0 where the base is 0, floor/round/trunc/sign pass none (ZERO rows). The table at the end is
 * generated from ops.def: a VJP row without its ad_vjp_<ENUM> here does not build. */
#include "autodiff.h"
#include "api.h"
#include <math.h>
#include <string.h>

/* ---- helpers ---- */

static int ad_shape(graft_tensor *t, int64_t *s) { return graft_shape(t, s); }

static graft_tensor *ad_zeros_like(graft_tensor *t) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = ad_shape(t, s);
  return nd < 0 ? NULL : graft_zeros_on(graft_get_dtype(t), nd, s, graft_device(t));
}

/* A bool tensor as 0/1 in dt. */
static graft_tensor *ad_as(graft_tensor *b, graft_dtype dt) { return graft_convert(b, dt); }

/* 1 + a, a * a and friends on scalars. */
static graft_tensor *ad_sq(graft_tensor *a) { return graft_mul(a, a); }

/* g reshaped to `to` with its reduced dims kept as 1 (mask: the reduced axes of `to`), then
 * broadcast back to `to`'s shape: the gradient of a reduction. */
static graft_tensor *ad_unreduce(graft_tensor *g, graft_tensor *to, int64_t mask) {
  int64_t s[GRAFT_MAX_DIMS], k[GRAFT_MAX_DIMS];
  int nd = ad_shape(to, s);
  if (nd < 0) return NULL;
  for (int d = 0; d < nd; d++) k[d] = (mask >> d) & 1 ? 1 : s[d];
  return graft_broadcast_to(graft_reshape(g, nd, k), nd, s);
}

/* g summed down to shape (nd, s), which is right-aligned to g's shape with dims 1 or equal:
 * the gradient of a broadcast. */
static graft_tensor *ad_sum_to(graft_tensor *g, int nd, const int64_t *s) {
  int64_t gs[GRAFT_MAX_DIMS];
  int gnd = ad_shape(g, gs), axes[GRAFT_MAX_DIMS], n = 0;
  if (gnd < 0) return NULL;
  for (int d = 0; d < gnd; d++) {
    int od = d - (gnd - nd); /* the operand's dim, or < 0 for a leading one */
    if (od < 0 || (s[od] == 1 && gs[d] != 1)) axes[n++] = d;
  }
  graft_tensor *r = n ? graft_sum(g, axes, n, false) : g;
  return graft_reshape(r, nd, s);
}

/* A tensor of shape (nd, to) whose element lo[d] + i * (interior[d] + 1) on each dim holds g's
 * element i (positions outside [0, to) dropped), zeros elsewhere: the gradient of a slice, and
 * one window offset's share of a sum pooling's gradient. */
static graft_tensor *ad_place(graft_tensor *g, int nd, const int64_t *lo, const int64_t *interior,
                              const int64_t *to) {
  int64_t gs[GRAFT_MAX_DIMS], plo[GRAFT_MAX_DIMS], phi[GRAFT_MAX_DIMS];
  int64_t start[GRAFT_MAX_DIMS], limit[GRAFT_MAX_DIMS];
  if (ad_shape(g, gs) != nd) return NULL;
  for (int d = 0; d < nd; d++) {
    int64_t crop = lo[d] < 0 ? -lo[d] : 0;
    plo[d] = lo[d] > 0 ? lo[d] : 0;
    int64_t span = plo[d] + (gs[d] ? (gs[d] - 1) * (interior[d] + 1) + 1 : 0);
    int64_t hi = to[d] + crop - span;
    phi[d] = hi > 0 ? hi : 0;
    start[d] = crop;
    limit[d] = crop + to[d];
  }
  return graft_slice(graft_pad_ex(g, plo, phi, interior, 0.0), start, limit, NULL);
}

/* ---- elementwise ---- */

#define AD_ONE(NAME, EXPR)                                                                       \
  static int ad_vjp_##NAME(const ad_op *o, graft_tensor *g, graft_tensor **gin) {                \
    graft_tensor *a = o->in[0], *y = o->y;                                                       \
    (void)a, (void)y;                                                                            \
    gin[0] = (EXPR);                                                                             \
    return gin[0] ? 0 : -1;                                                                      \
  }

AD_ONE(NEG, graft_neg(g))
AD_ONE(ABS, graft_mul(g, graft_sign(a)))
AD_ONE(EXP, graft_mul(g, y))
AD_ONE(LOG, graft_div(g, a))
AD_ONE(SQRT, graft_div(g, graft_mul_scalar(y, 2.0)))
AD_ONE(RSQRT, graft_mul(g, graft_mul_scalar(graft_mul(y, ad_sq(y)), -0.5)))
AD_ONE(TANH, graft_mul(g, graft_add_scalar(graft_neg(ad_sq(y)), 1.0)))
AD_ONE(ERF, graft_mul(g, graft_mul_scalar(graft_exp(graft_neg(ad_sq(a))), 1.1283791670955126 /* 2 / sqrt(pi) */)))
AD_ONE(SIGMOID, graft_mul(g, graft_mul(y, graft_add_scalar(graft_neg(y), 1.0))))
AD_ONE(SIN, graft_mul(g, graft_cos(a)))
AD_ONE(COS, graft_neg(graft_mul(g, graft_sin(a))))
AD_ONE(RECIPROCAL, graft_neg(graft_mul(g, ad_sq(y))))
AD_ONE(LOG1P, graft_div(g, graft_add_scalar(a, 1.0)))
AD_ONE(EXPM1, graft_mul(g, graft_add_scalar(y, 1.0)))
AD_ONE(ATAN, graft_div(g, graft_add_scalar(ad_sq(a), 1.0)))
AD_ONE(TAN, graft_mul(g, graft_add_scalar(ad_sq(y), 1.0)))
AD_ONE(ASIN, graft_div(g, graft_sqrt(graft_add_scalar(graft_neg(ad_sq(a)), 1.0))))
AD_ONE(ACOS, graft_neg(graft_div(g, graft_sqrt(graft_add_scalar(graft_neg(ad_sq(a)), 1.0)))))
AD_ONE(SINH, graft_mul(g, graft_cosh(a)))
AD_ONE(COSH, graft_mul(g, graft_sinh(a)))
AD_ONE(ASINH, graft_div(g, graft_sqrt(graft_add_scalar(ad_sq(a), 1.0))))
AD_ONE(ACOSH, graft_div(g, graft_sqrt(graft_add_scalar(ad_sq(a), -1.0))))
AD_ONE(ATANH, graft_div(g, graft_add_scalar(graft_neg(ad_sq(a)), 1.0)))
AD_ONE(LOG2, graft_div(g, graft_mul_scalar(a, 0.6931471805599453 /* ln 2 */)))
AD_ONE(LOG10, graft_div(g, graft_mul_scalar(a, 2.302585092994046 /* ln 10 */)))
AD_ONE(EXP2, graft_mul(g, graft_mul_scalar(y, 0.6931471805599453 /* ln 2 */)))
AD_ONE(ERFC, graft_mul(g, graft_mul_scalar(graft_exp(graft_neg(ad_sq(a))), -1.1283791670955126 /* -2 / sqrt(pi) */)))

/* Integer sources carry no gradient (the driver only asks for float operands). */
static int ad_vjp_CONVERT(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  gin[0] = graft_convert(g, graft_get_dtype(o->in[0]));
  return gin[0] ? 0 : -1;
}

/* Both operands' gradients; each computed only where needed. */
#define AD_TWO(NAME, EA, EB)                                                                     \
  static int ad_vjp_##NAME(const ad_op *o, graft_tensor *g, graft_tensor **gin) {                \
    graft_tensor *a = o->in[0], *b = o->in[1], *y = o->y;                                        \
    (void)a, (void)b, (void)y;                                                                   \
    if (o->need[0] && !(gin[0] = (EA))) return -1;                                               \
    if (o->need[1] && !(gin[1] = (EB))) return -1;                                               \
    return 0;                                                                                    \
  }

AD_TWO(ADD, g, g)
AD_TWO(SUB, g, graft_neg(g))
AD_TWO(MUL, graft_mul(g, b), graft_mul(g, a))
AD_TWO(DIV, graft_div(g, b), graft_neg(graft_div(graft_mul(g, y), b)))
/* d/da a^b = b a^(b-1), taken as 0 where b == 0 (0^-1 would make it NaN at a == 0);
 * d/db = a^b log a, taken as 0 where a == 0 and b >= 0 (PyTorch's choices). */
static graft_tensor *ad_pow_base(graft_tensor *g, graft_tensor *a, graft_tensor *b) {
  graft_tensor *z = ad_zeros_like(b);
  return graft_where(graft_eq(b, z), z, graft_mul(g, graft_mul(b, graft_pow(a, graft_add_scalar(b, -1.0)))));
}
static graft_tensor *ad_pow_exp(graft_tensor *g, graft_tensor *a, graft_tensor *b, graft_tensor *y) {
  graft_tensor *z = ad_zeros_like(a);
  graft_tensor *skip = graft_logical_and(graft_eq(a, z), graft_ge(b, z));
  return graft_where(skip, z, graft_mul(g, graft_mul(y, graft_log(a))));
}
AD_TWO(POW, ad_pow_base(g, a, b), ad_pow_exp(g, a, b, y))
/* fmod(a, b) = a - trunc(a / b) b. */
AD_TWO(REM, g, graft_neg(graft_mul(g, graft_trunc(graft_div(a, b)))))

/* maximum / minimum: the gradient goes to the operand that won, half to each on a tie. */
static int ad_pick(const ad_op *o, graft_tensor *g, graft_tensor **gin, bool max) {
  graft_tensor *a = o->in[0], *b = o->in[1];
  graft_dtype dt = graft_get_dtype(a);
  graft_tensor *win = ad_as(max ? graft_gt(a, b) : graft_lt(a, b), dt);
  graft_tensor *wa = graft_add(win, graft_mul_scalar(ad_as(graft_eq(a, b), dt), 0.5));
  graft_tensor *ga = graft_mul(g, wa);
  if (o->need[0] && !(gin[0] = ga)) return -1;
  if (o->need[1] && !(gin[1] = graft_sub(g, ga))) return -1;
  return 0;
}
static int ad_vjp_MAX(const ad_op *o, graft_tensor *g, graft_tensor **gin) { return ad_pick(o, g, gin, true); }
static int ad_vjp_MIN(const ad_op *o, graft_tensor *g, graft_tensor **gin) { return ad_pick(o, g, gin, false); }

/* select(p, x, y): operand 0 is bool (never needed). */
static int ad_vjp_SELECT(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  graft_tensor *p = o->in[0], *z = ad_zeros_like(g);
  if (o->need[1] && !(gin[1] = graft_where(p, g, z))) return -1;
  if (o->need[2] && !(gin[2] = graft_where(p, z, g))) return -1;
  return 0;
}

/* ---- movement ---- */

static int ad_vjp_BROADCAST(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = ad_shape(o->in[0], s);
  gin[0] = nd < 0 ? NULL : ad_sum_to(g, nd, s);
  return gin[0] ? 0 : -1;
}

static int ad_vjp_RESHAPE(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = ad_shape(o->in[0], s);
  gin[0] = nd < 0 ? NULL : graft_reshape(g, nd, s);
  return gin[0] ? 0 : -1;
}

static int ad_vjp_TRANSPOSE(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int nd = graft_ndim(g), inv[GRAFT_MAX_DIMS];
  for (int d = 0; d < nd; d++) inv[IR_ATTR_AT(*o->attr, TRANSPOSE, perm, d)] = d;
  gin[0] = graft_transpose(g, inv);
  return gin[0] ? 0 : -1;
}

static int ad_vjp_SLICE(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int64_t s[GRAFT_MAX_DIMS], lo[GRAFT_MAX_DIMS], in[GRAFT_MAX_DIMS];
  int nd = ad_shape(o->in[0], s);
  for (int d = 0; d < nd; d++) {
    lo[d] = IR_ATTR_AT(*o->attr, SLICE, start, d);
    in[d] = IR_ATTR_AT(*o->attr, SLICE, stride, d) - 1;
  }
  gin[0] = nd < 0 ? NULL : ad_place(g, nd, lo, in, s);
  return gin[0] ? 0 : -1;
}

/* pad(a, lo, hi, interior): a's element i sits at lo + i * (interior + 1) (negative lo / hi
 * crop: those elements get no gradient), so the gradient is a strided slice of g, padded first
 * with the cropped cells as zeros. */
static int ad_vjp_PAD(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int64_t s[GRAFT_MAX_DIMS], plo[GRAFT_MAX_DIMS], phi[GRAFT_MAX_DIMS], zero[GRAFT_MAX_DIMS] = {0};
  int64_t start[GRAFT_MAX_DIMS], limit[GRAFT_MAX_DIMS], step[GRAFT_MAX_DIMS];
  int nd = ad_shape(o->in[0], s);
  for (int d = 0; d < nd; d++) {
    int64_t lo = IR_ATTR_AT(*o->attr, PAD, lo, d), hi = IR_ATTR_AT(*o->attr, PAD, hi, d);
    step[d] = IR_ATTR_AT(*o->attr, PAD, interior, d) + 1;
    plo[d] = lo < 0 ? -lo : 0;
    phi[d] = hi < 0 ? -hi : 0;
    start[d] = lo + plo[d];
    limit[d] = s[d] ? start[d] + (s[d] - 1) * step[d] + 1 : start[d];
  }
  gin[0] = nd < 0 ? NULL : graft_slice(graft_pad_ex(g, plo, phi, zero, 0.0), start, limit, step);
  return gin[0] ? 0 : -1;
}

static int ad_vjp_CONCAT(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int64_t gs[GRAFT_MAX_DIMS], start[GRAFT_MAX_DIMS] = {0}, limit[GRAFT_MAX_DIMS];
  int nd = ad_shape(g, gs), ax = (int)IR_ATTR(*o->attr, AXIS, axis);
  if (nd < 0) return -1;
  memcpy(limit, gs, sizeof limit);
  for (int i = 0; i < o->nin; i++) {
    limit[ax] = start[ax] + graft_dim(o->in[i], ax);
    if (o->need[i] && !(gin[i] = graft_slice(g, start, limit, NULL))) return -1;
    start[ax] = limit[ax];
  }
  return 0;
}

/* ---- reductions ---- */

static int ad_vjp_REDUCE_SUM(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  gin[0] = ad_unreduce(g, o->in[0], IR_ATTR(*o->attr, REDUCE, mask));
  return gin[0] ? 0 : -1;
}

/* max / min: the gradient divided among the elements equal to the result. */
static int ad_extreme(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  graft_tensor *a = o->in[0];
  int64_t mask = IR_ATTR(*o->attr, REDUCE, mask);
  int axes[GRAFT_MAX_DIMS], n = 0, nd = graft_ndim(a);
  for (int d = 0; d < nd; d++)
    if ((mask >> d) & 1) axes[n++] = d;
  graft_tensor *hit = ad_as(graft_eq(a, ad_unreduce(o->y, a, mask)), graft_get_dtype(a));
  graft_tensor *count = graft_sum(hit, axes, n, IR_ATTR(*o->attr, REDUCE, keepdim) != 0);
  gin[0] = graft_mul(hit, ad_unreduce(graft_div(g, count), a, mask));
  return gin[0] ? 0 : -1;
}
static int ad_vjp_REDUCE_MAX(const ad_op *o, graft_tensor *g, graft_tensor **gin) { return ad_extreme(o, g, gin); }
static int ad_vjp_REDUCE_MIN(const ad_op *o, graft_tensor *g, graft_tensor **gin) { return ad_extreme(o, g, gin); }

/* prod: g * y / a where no element of the reduced group is 0; where one is, that element gets g
 * times the product of the others and the rest 0; where two or more are, all get 0 (PyTorch's
 * prod_backward, without dividing by 0). */
static int ad_vjp_REDUCE_PROD(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  graft_tensor *a = o->in[0], *z = ad_zeros_like(a);
  int64_t mask = IR_ATTR(*o->attr, REDUCE, mask);
  bool keep = IR_ATTR(*o->attr, REDUCE, keepdim) != 0;
  int axes[GRAFT_MAX_DIMS], n = 0, nd = graft_ndim(a);
  for (int d = 0; d < nd; d++)
    if ((mask >> d) & 1) axes[n++] = d;
  graft_tensor *zero = graft_eq(a, z);
  graft_tensor *safe = graft_where(zero, graft_add_scalar(z, 1.0), a); /* zeros as ones */
  graft_tensor *zeros = ad_unreduce(graft_sum(ad_as(zero, graft_get_dtype(a)), axes, n, keep), a, mask);
  graft_tensor *others = ad_unreduce(graft_prod(safe, axes, n, keep), a, mask);
  graft_tensor *none = graft_div(ad_unreduce(o->y, a, mask), safe);
  graft_tensor *one = graft_where(zero, others, z);
  graft_tensor *w = graft_where(graft_eq(zeros, z), none,
                                graft_where(graft_eq(zeros, graft_add_scalar(z, 1.0)), one, z));
  gin[0] = graft_mul(ad_unreduce(g, a, mask), w);
  return gin[0] ? 0 : -1;
}

/* ---- contractions ---- */

/* [..., M, K] x [..., K, N]: dA = G B^T, dB = A^T G. */
AD_TWO(DOT, graft_matmul(g, graft_t(b)), graft_matmul(graft_t(a), g))

static int ad_vjp_CONV2D(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  const ir_attrs *at = o->attr;
  int st[2], pd[2], dl[2], groups = (int)IR_ATTR(*at, CONV2D, groups);
  for (int d = 0; d < 2; d++) {
    st[d] = (int)IR_ATTR_AT(*at, CONV2D, stride, d);
    pd[d] = (int)IR_ATTR_AT(*at, CONV2D, pad_lo, d);
    dl[d] = (int)IR_ATTR_AT(*at, CONV2D, dilation, d);
    if (IR_ATTR_AT(*at, CONV2D, pad_hi, d) != pd[d] || IR_ATTR_AT(*at, CONV2D, lhs_dilation, d) != 1)
      return err_set(GRAFT_ERR_ARG, "graft_grad: conv2d with uneven padding or input "
                     "dilation (a convolution's own gradient) has no gradient rule"), -1;
  }
  int64_t xs[GRAFT_MAX_DIMS], ws[GRAFT_MAX_DIMS];
  if (ad_shape(o->in[0], xs) != 4 || ad_shape(o->in[1], ws) != 4) return -1;
  if (o->need[0] && !(gin[0] = graft_conv2d_backward_input(g, o->in[1], xs, st, pd, dl, groups)))
    return -1;
  if (o->need[1] && !(gin[1] = graft_conv2d_backward_weight(o->in[0], g, ws, st, pd, dl, groups)))
    return -1;
  return 0;
}

/* ---- indexing ---- */

static int ad_vjp_GATHER(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int ax = (int)IR_ATTR(*o->attr, AXIS, axis);
  gin[0] = graft_scatter_add(ad_zeros_like(o->in[0]), ax, o->in[1], g);
  return gin[0] ? 0 : -1;
}

static int ad_vjp_SCATTER_ADD(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  int ax = (int)IR_ATTR(*o->attr, AXIS, axis);
  if (o->need[0]) gin[0] = g;
  if (o->need[2] && !(gin[2] = graft_gather(g, ax, o->in[1]))) return -1;
  return 0;
}

/* ---- windows ---- */

/* max: max_pool_grad with the same windows (each window's gradient to its first maximum);
 * sum: every window offset places g back where that offset read. */
static int ad_vjp_REDUCE_WINDOW(const ad_op *o, graft_tensor *g, graft_tensor **gin) {
  const ir_attrs *at = o->attr;
  graft_tensor *x = o->in[0];
  if (IR_ATTR(*at, WINDOW, kind) == 0) {
    tensor_lock();
    ir_node *in[2] = {api_in(x, "graft_grad"), api_in(g, "graft_grad")};
    gin[0] = in[0] && in[1] ? api_node(ir_make_on(IR_MAX_POOL_GRAD, 2, in, at, in[0]->dtype, 0,
                                                  NULL, in[0]->device))
                            : NULL;
    tensor_unlock();
    return gin[0] ? 0 : -1;
  }
  int64_t s[GRAFT_MAX_DIMS], off[GRAFT_MAX_DIMS] = {0}, lo[GRAFT_MAX_DIMS], in[GRAFT_MAX_DIMS];
  int nd = ad_shape(x, s);
  if (nd < 0) return -1;
  for (int d = 0; d < nd; d++) in[d] = IR_ATTR_AT(*at, WINDOW, stride, d) - 1;
  graft_tensor *sum = NULL;
  for (;;) { /* every offset in the window, the last dim fastest */
    for (int d = 0; d < nd; d++) lo[d] = off[d] - IR_ATTR_AT(*at, WINDOW, pad_lo, d);
    graft_tensor *part = ad_place(g, nd, lo, in, s);
    sum = sum ? graft_add(sum, part) : part;
    if (!sum) return -1;
    int d = nd - 1;
    while (d >= 0 && ++off[d] == IR_ATTR_AT(*at, WINDOW, window, d)) off[d--] = 0;
    if (d < 0) break;
  }
  gin[0] = sum;
  return 0;
}

/* ---- the table ---- */

#define AD_RULE_VJP(e) ad_vjp_##e
#define AD_RULE_ZERO(e) NULL
#define AD_RULE_LEAF(e) NULL
#define AD_RULE_NONE(e) NULL
const ad_rule ad_rules[IR_OP_COUNT] = {
#define X(e, nm, ar, k, dts, api_, fn, cost_, ref_, cpu_, interp_, grad_) [IR_##e] = AD_RULE_##grad_(e),
#include "../core/ops.def"
};
