/* graft_grad / graft_vjp against central finite differences in float64: every op ops.def marks
 * VJP has a case (the test fails naming a row without one), on random inputs and shapes with
 * broadcasting, reductions over several axes, strides, groups and padding, plus the composites
 * a model is made of. Also: a value used twice sums both paths, non-differentiable ops pass
 * nothing, a gradient needing a rule that does not exist or a graph already synced is an error
 * that names it. Inputs are made on cpu:GRAFT_TEST_DEVICE (default 0). */
#include "check.h"
#include "graft.h"
#include "../src/core/ir.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int dev;

static unsigned rng_state = 2024;
static double urand(void) { /* [0, 1) */
  rng_state = rng_state * 1103515245u + 12345u;
  return (double)((rng_state >> 8) & 0xffffff) / 16777216.0;
}

enum { MAXIN = 3 };
typedef graft_tensor *(*build_fn)(graft_tensor *const *x);
typedef struct {
  const char *name;
  ir_op op; /* the row this case covers */
  build_fn f;
  int nin;
  int nd[MAXIN];
  int64_t shape[MAXIN][4];
  double lo, hi; /* values drawn in [lo, hi); lo == hi: away from 0, |v| in [0.2, 1.2) */
  double h, tol;  /* the finite difference's step and tolerance (0: 1e-6 and 1e-5) */
} ad_case;

static int64_t numel(int nd, const int64_t *s) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= s[d];
  return n;
}

static graft_tensor *mk(const double *v, int nd, const int64_t *s) {
  return graft_from_host(v, GRAFT_F64, nd, s, dev);
}

/* sum(f(x) * r) for inputs vals; r is drawn at the first call (shape of f's output). */
static double loss_at(const ad_case *c, double *const *vals, double **r, graft_tensor **grads) {
  graft_scope_begin();
  graft_tensor *x[MAXIN];
  for (int i = 0; i < c->nin; i++) x[i] = mk(vals[i], c->nd[i], c->shape[i]);
  graft_tensor *y = c->f(x);
  double out = NAN;
  if (!y) {
    fprintf(stderr, "  %s: %s\n", c->name, graft_last_error());
    graft_scope_end();
    return out;
  }
  int64_t ys[GRAFT_MAX_DIMS];
  int ynd = graft_shape(y, ys);
  if (!*r) {
    int64_t n = numel(ynd, ys);
    *r = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t k = 0; k < n; k++) (*r)[k] = 2 * urand() - 1;
  }
  graft_tensor *loss = graft_sum(graft_mul(y, mk(*r, ynd, ys)), NULL, 0, false);
  if (grads) {
    graft_tensor *g[MAXIN];
    if (graft_grad(loss, c->nin, x, g) != GRAFT_OK) {
      fprintf(stderr, "  %s: %s\n", c->name, graft_last_error());
      check_failed_in_test = 1;
      graft_scope_end();
      return NAN;
    }
    for (int i = 0; i < c->nin; i++) {
      CHECK(g[i] && graft_get_dtype(g[i]) == GRAFT_F64 && graft_device(g[i]) == dev);
      grads[i] = g[i] ? graft_keep(g[i]) : NULL; /* survives the scope: the caller reads it */
    }
  }
  CHECK(graft_to_host(loss, &out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  return out;
}

/* Every element of every input: the analytic gradient against (L(x+h) - L(x-h)) / 2h. */
static void check_case(const ad_case *c) {
  double *vals[MAXIN] = {0}, *r = NULL;
  int64_t n[MAXIN];
  for (int i = 0; i < c->nin; i++) {
    n[i] = numel(c->nd[i], c->shape[i]);
    vals[i] = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
    for (int64_t k = 0; k < n[i]; k++) {
      double u = urand();
      vals[i][k] = c->lo == c->hi ? (urand() < 0.5 ? -1 : 1) * (0.2 + u) : c->lo + (c->hi - c->lo) * u;
    }
  }
  graft_tensor *g[MAXIN] = {0};
  loss_at(c, vals, &r, g);
  const double h = c->h ? c->h : 1e-6, tol = c->tol ? c->tol : 1e-5;
  int bad = 0;
  for (int i = 0; i < c->nin; i++) {
    if (!g[i]) continue;
    double *an = malloc(sizeof(double) * (size_t)(n[i] ? n[i] : 1));
    CHECK(graft_to_host(g[i], an, sizeof(double) * (size_t)n[i]) == GRAFT_OK);
    for (int64_t k = 0; k < n[i] && bad < 3; k++) {
      double v = vals[i][k];
      vals[i][k] = v + h;
      double up = loss_at(c, vals, &r, NULL);
      vals[i][k] = v - h;
      double dn = loss_at(c, vals, &r, NULL);
      vals[i][k] = v;
      double fd = (up - dn) / (2 * h);
      if (!(fabs(an[k] - fd) <= tol * (1 + fabs(fd)))) {
        fprintf(stderr, "  %s: d/dx%d[%lld] = %.9g, finite differences %.9g\n", c->name, i,
                (long long)k, an[k], fd);
        check_failed_in_test = 1;
        bad++;
      }
    }
    free(an);
    graft_release(g[i]);
  }
  for (int i = 0; i < c->nin; i++) free(vals[i]);
  free(r);
}

/* ---- the cases ---- */
#define U(NAME, CALL)                                                                           \
  static graft_tensor *f_##NAME(graft_tensor *const *x) { return CALL; }
U(neg, graft_neg(x[0]))
U(abs, graft_abs(x[0]))
U(exp, graft_exp(x[0]))
U(log, graft_log(x[0]))
U(sqrt, graft_sqrt(x[0]))
U(rsqrt, graft_rsqrt(x[0]))
U(tanh, graft_tanh(x[0]))
U(erf, graft_erf(x[0]))
U(sigmoid, graft_sigmoid(x[0]))
U(sin, graft_sin(x[0]))
U(cos, graft_cos(x[0]))
U(reciprocal, graft_reciprocal(x[0]))
U(log1p, graft_log1p(x[0]))
U(expm1, graft_expm1(x[0]))
U(atan, graft_atan(x[0]))
U(tan, graft_tan(x[0]))
U(asin, graft_asin(x[0]))
U(acos, graft_acos(x[0]))
U(sinh, graft_sinh(x[0]))
U(cosh, graft_cosh(x[0]))
U(asinh, graft_asinh(x[0]))
U(acosh, graft_acosh(x[0]))
U(atanh, graft_atanh(x[0]))
U(log2, graft_log2(x[0]))
U(log10, graft_log10(x[0]))
U(exp2, graft_exp2(x[0]))
U(erfc, graft_erfc(x[0]))
/* through f32 and back: the rule converts the gradient back to each side's dtype */
U(convert, graft_convert(graft_mul(graft_convert(x[0], GRAFT_F32), graft_convert(x[0], GRAFT_F32)), GRAFT_F64))
U(add, graft_add(x[0], x[1]))
U(sub, graft_sub(x[0], x[1]))
U(mul, graft_mul(x[0], x[1]))
U(div, graft_div(x[0], x[1]))
U(pow, graft_pow(x[0], x[1]))
U(maximum, graft_maximum(x[0], x[1]))
U(minimum, graft_minimum(x[0], x[1]))
U(rem, graft_rem(x[0], x[1]))
U(where, graft_where(graft_gt(x[0], graft_zeros_on(GRAFT_F64, 2, (int64_t[]){3, 4}, dev)), x[1], x[2]))
U(broadcast, graft_broadcast_to(x[0], 3, (int64_t[]){2, 3, 4}))
U(bcast_add, graft_mul(x[0], x[1])) /* [2,3,1] * [4]: the API broadcasts both */
U(reshape, graft_reshape(x[0], 3, (int64_t[]){2, 2, 3}))
U(transpose, graft_transpose(x[0], (int[]){2, 0, 1}))
U(slice, graft_slice(x[0], (int64_t[]){1, 0}, (int64_t[]){5, 5}, (int64_t[]){2, 3}))
static graft_tensor *f_concat(graft_tensor *const *x) { return graft_concat(x, 3, 1); }
U(pad, graft_pad_ex(x[0], (int64_t[]){1, 0}, (int64_t[]){0, 2}, (int64_t[]){1, 2}, 0.5))
U(sum, graft_sum(x[0], (int[]){0, 2}, 2, false))
U(sum_keep, graft_sum(x[0], (int[]){1}, 1, true))
U(max, graft_max(x[0], (int[]){1, 2}, 2, false))
U(min, graft_min(x[0], (int[]){0}, 1, true))
U(prod, graft_prod(x[0], (int[]){1}, 1, false))
/* rows of x * m with no zero, one zero and two zeros: each case of prod's rule */
U(prod_zeros, graft_prod(graft_mul(x[0], graft_from_host((double[]){1, 1, 1, 1, 0, 1, 0, 1, 1, 0},
                                                         GRAFT_F64, 2, (int64_t[]){2, 5}, dev)),
                         (int[]){1}, 1, true))
/* x^b with b = 0 somewhere and x = 0 somewhere: no NaN, PyTorch's masks */
U(pow_zero, graft_pow(graft_mul(x[0], graft_from_host((double[]){0, 1, 1, 0, 1, 1}, GRAFT_F64, 1,
                                                      (int64_t[]){6}, dev)),
                      graft_from_host((double[]){0, 2, 0, 3, 1.5, 2}, GRAFT_F64, 1, (int64_t[]){6}, dev)))
U(mean, graft_mean(x[0], NULL, 0, false))
U(matmul, graft_matmul(x[0], x[1]))
U(bmm, graft_matmul(x[0], x[1]))
U(conv, graft_conv2d(x[0], x[1], (int[]){2, 1}, (int[]){1, 1}, NULL, 1))
U(conv_grouped, graft_conv2d(x[0], x[1], NULL, (int[]){2, 1}, (int[]){2, 1}, 2))
static graft_tensor *idx(const int64_t *v, int nd, const int64_t *s) {
  return graft_from_host(v, GRAFT_I64, nd, s, dev);
}
U(gather, graft_gather(x[0], 1, idx((int64_t[]){0, 2, 2, 1, 0, 0}, 2, (int64_t[]){3, 2})))
U(scatter_add, graft_scatter_add(x[0], 0, idx((int64_t[]){1, 0, 1, 2, 1, 1}, 2, (int64_t[]){2, 3}), x[1]))
U(max_pool, graft_max_pool2d(x[0], (int[]){2, 2}, (int[]){2, 1}, NULL))
U(avg_pool, graft_avg_pool2d(x[0], (int[]){3, 3}, (int[]){2, 2}, (int[]){1, 1}))
U(softmax, graft_softmax(x[0], 1))
U(log_softmax, graft_log_softmax(x[0], 0))
U(layer_norm, graft_layer_norm(x[0], x[1], x[2], 1e-5))
U(gelu, graft_gelu(x[0], false))
U(gelu_tanh, graft_gelu(x[0], true))
U(relu, graft_relu(x[0]))
U(linear, graft_linear(x[0], x[1], x[2]))
U(cross_entropy, graft_cross_entropy(x[0], idx((int64_t[]){2, 0, 1, 2}, 1, (int64_t[]){4})))
U(batch_norm, graft_batch_norm(x[0], x[1], x[2], NULL, NULL, true, 1e-5))
U(embedding, graft_embedding(x[0], idx((int64_t[]){3, 1, 3}, 1, (int64_t[]){3})))
U(twice, graft_add(graft_mul(x[0], x[0]), graft_sin(x[0]))) /* x used three times */

#define S1(a) {a}
#define C1(NAME, OP, ND, SH, LO, HI) {#NAME, IR_##OP, f_##NAME, 1, {ND}, {SH}, LO, HI, 0, 0}
#define C2(NAME, OP, ND0, SH0, ND1, SH1, LO, HI) {#NAME, IR_##OP, f_##NAME, 2, {ND0, ND1}, {SH0, SH1}, LO, HI, 0, 0}
#define C3(NAME, OP, ND0, SH0, ND1, SH1, ND2, SH2, LO, HI)                                    \
  {#NAME, IR_##OP, f_##NAME, 3, {ND0, ND1, ND2}, {SH0, SH1, SH2}, LO, HI, 0, 0}
#define SH(...) {__VA_ARGS__}

static const ad_case cases[] = {
    C1(neg, NEG, 2, SH(2, 3), -1, 1),
    C1(abs, ABS, 2, SH(2, 3), 0, 0),
    C1(exp, EXP, 2, SH(2, 3), -1, 1),
    C1(log, LOG, 2, SH(2, 3), 0.5, 2),
    C1(sqrt, SQRT, 2, SH(2, 3), 0.5, 2),
    C1(rsqrt, RSQRT, 2, SH(2, 3), 0.5, 2),
    C1(tanh, TANH, 2, SH(2, 3), -1, 1),
    C1(erf, ERF, 2, SH(2, 3), -1, 1),
    C1(sigmoid, SIGMOID, 2, SH(2, 3), -2, 2),
    C1(sin, SIN, 2, SH(2, 3), -2, 2),
    C1(cos, COS, 2, SH(2, 3), -2, 2),
    C1(reciprocal, RECIPROCAL, 2, SH(2, 3), 0, 0),
    C1(log1p, LOG1P, 2, SH(2, 3), -0.5, 2),
    C1(expm1, EXPM1, 2, SH(2, 3), -1, 1),
    C1(atan, ATAN, 2, SH(2, 3), -2, 2),
    C1(tan, TAN, 2, SH(2, 3), -1, 1),
    C1(asin, ASIN, 2, SH(2, 3), -0.9, 0.9),
    C1(acos, ACOS, 2, SH(2, 3), -0.9, 0.9),
    C1(sinh, SINH, 2, SH(2, 3), -2, 2),
    C1(cosh, COSH, 2, SH(2, 3), -2, 2),
    C1(asinh, ASINH, 2, SH(2, 3), -2, 2),
    C1(acosh, ACOSH, 2, SH(2, 3), 1.2, 3),
    C1(atanh, ATANH, 2, SH(2, 3), -0.9, 0.9),
    C1(log2, LOG2, 2, SH(2, 3), 0.5, 2),
    C1(log10, LOG10, 2, SH(2, 3), 0.5, 2),
    C1(exp2, EXP2, 2, SH(2, 3), -1, 1),
    C1(erfc, ERFC, 2, SH(2, 3), -2, 2),
    {"convert", IR_CONVERT, f_convert, 1, {2}, {SH(2, 3)}, -1, 1, 1e-3, 1e-3}, /* via f32 */
    C2(add, ADD, 2, SH(2, 3), 2, SH(2, 3), -1, 1),
    C2(sub, SUB, 2, SH(2, 3), 2, SH(2, 3), -1, 1),
    C2(mul, MUL, 2, SH(2, 3), 2, SH(2, 3), -1, 1),
    C2(div, DIV, 2, SH(2, 3), 2, SH(2, 3), 0, 0),
    C2(pow, POW, 2, SH(2, 3), 2, SH(2, 3), 0.5, 2),
    C2(maximum, MAX, 2, SH(3, 3), 2, SH(3, 3), -1, 1),
    C2(minimum, MIN, 2, SH(3, 3), 2, SH(3, 3), -1, 1),
    C2(rem, REM, 1, SH(6), 1, SH(6), 0, 0),
    C3(where, SELECT, 2, SH(3, 4), 2, SH(3, 4), 2, SH(3, 4), -1, 1),
    C1(broadcast, BROADCAST, 2, SH(3, 1), -1, 1),
    C2(bcast_add, BROADCAST, 3, SH(2, 3, 1), 1, SH(4), -1, 1),
    C1(reshape, RESHAPE, 2, SH(3, 4), -1, 1),
    C1(transpose, TRANSPOSE, 3, SH(2, 3, 4), -1, 1),
    C1(slice, SLICE, 2, SH(6, 5), -1, 1),
    C3(concat, CONCAT, 2, SH(2, 1), 2, SH(2, 3), 2, SH(2, 2), -1, 1),
    C1(pad, PAD, 2, SH(2, 3), -1, 1),
    C1(sum, REDUCE_SUM, 3, SH(2, 3, 4), -1, 1),
    C1(sum_keep, REDUCE_SUM, 2, SH(3, 4), -1, 1),
    C1(max, REDUCE_MAX, 3, SH(2, 3, 4), -1, 1),
    C1(min, REDUCE_MIN, 2, SH(3, 4), -1, 1),
    C1(prod, REDUCE_PROD, 2, SH(3, 4), 0.5, 1.5),
    C1(prod_zeros, REDUCE_PROD, 2, SH(2, 5), 0.5, 1.5),
    C1(pow_zero, POW, 1, SH(6), 0.5, 1.5),
    C1(mean, REDUCE_SUM, 3, SH(2, 2, 3), -1, 1),
    C2(matmul, DOT, 2, SH(3, 4), 2, SH(4, 2), -1, 1),
    C2(bmm, DOT, 3, SH(2, 3, 2), 3, SH(2, 2, 3), -1, 1),
    C2(conv, CONV2D, 4, SH(2, 2, 5, 4), 4, SH(3, 2, 3, 2), -1, 1),
    C2(conv_grouped, CONV2D, 4, SH(1, 4, 6, 5), 4, SH(4, 2, 2, 2), -1, 1),
    C1(gather, GATHER, 2, SH(3, 3), -1, 1),
    C2(scatter_add, SCATTER_ADD, 2, SH(3, 3), 2, SH(2, 3), -1, 1),
    C1(max_pool, REDUCE_WINDOW, 4, SH(1, 2, 4, 5), -1, 1),
    C1(avg_pool, REDUCE_WINDOW, 4, SH(2, 1, 5, 4), -1, 1),
    C1(softmax, REDUCE_MAX, 2, SH(3, 4), -2, 2),
    C1(log_softmax, REDUCE_MAX, 2, SH(3, 4), -2, 2),
    C3(layer_norm, REDUCE_SUM, 2, SH(3, 5), 1, SH(5), 1, SH(5), -1, 1),
    C1(gelu, ERF, 2, SH(2, 3), -2, 2),
    C1(gelu_tanh, TANH, 2, SH(2, 3), -2, 2),
    C1(relu, MAX, 2, SH(2, 3), 0, 0),
    C3(linear, DOT, 2, SH(4, 3), 2, SH(2, 3), 1, SH(2), -1, 1),
    C1(cross_entropy, GATHER, 2, SH(4, 3), -2, 2),
    C3(batch_norm, REDUCE_SUM, 4, SH(3, 2, 2, 2), 1, SH(2), 1, SH(2), -1, 1),
    C1(embedding, GATHER, 2, SH(5, 3), -1, 1),
    C1(twice, MUL, 2, SH(2, 3), -1, 1),
};
enum { NCASES = sizeof cases / sizeof cases[0] };

TEST(every_vjp_row_has_a_case) {
  for (int op = 0; op < IR_OP_COUNT; op++) {
    if (ir_ops[op].grad != OPS_GRAD_VJP) continue;
    bool found = false;
    for (int k = 0; k < NCASES && !found; k++) found = cases[k].op == (ir_op)op;
    if (!found) {
      fprintf(stderr, "  %s: a VJP row with no finite-difference case\n", ir_ops[op].name);
      check_failed_in_test = 1;
    }
  }
}

TEST(gradients_match_finite_differences) {
  for (int k = 0; k < NCASES; k++) check_case(&cases[k]);
}

/* d/dx of sum(out * cot) through graft_vjp equals cot * f'(x) for an elementwise f. */
TEST(vjp_with_a_cotangent) {
  double xv[4] = {0.1, -0.4, 0.7, 1.3}, cv[4] = {1, -2, 0.5, 3}, g[4];
  int64_t s[2] = {2, 2};
  graft_scope_begin();
  graft_tensor *x = mk(xv, 2, s), *y = graft_tanh(x), *d;
  CHECK(graft_vjp(y, mk(cv, 2, s), 1, &x, &d) == GRAFT_OK);
  CHECK(graft_to_host(d, g, sizeof g) == GRAFT_OK);
  for (int i = 0; i < 4; i++) CHECK_NEAR(g[i], cv[i] * (1 - tanh(xv[i]) * tanh(xv[i])), 1e-12);
  /* a cotangent of another shape is refused */
  graft_tensor *bad;
  CHECK(graft_vjp(y, mk(cv, 1, (int64_t[]){4}), 1, &x, &bad) == GRAFT_ERR_SHAPE);
  CHECK(strstr(graft_last_error(), "cotangent") != NULL);
  graft_scope_end();
}

/* A tensor the loss does not depend on, or only through a comparison or argmax, gets zeros;
 * a tensor listed twice gets its gradient twice. */
TEST(unreached_and_nondifferentiable_give_zeros) {
  double av[3] = {1, 2, 3}, bv[3] = {4, 5, 6}, out[3];
  int64_t s[1] = {3};
  graft_scope_begin();
  graft_tensor *a = mk(av, 1, s), *b = mk(bv, 1, s);
  graft_tensor *mask = graft_convert(graft_gt(b, graft_full_on(4.5, GRAFT_F64, 1, s, dev)), GRAFT_F64);
  graft_tensor *loss = graft_sum(graft_add(graft_mul(a, mask), graft_floor(b)), NULL, 0, false);
  graft_tensor *w[3] = {a, b, a}, *g[3];
  CHECK(graft_grad(loss, 3, w, g) == GRAFT_OK);
  CHECK(g[0] != g[2]);
  CHECK(graft_to_host(g[0], out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 0 && out[1] == 1 && out[2] == 1);
  CHECK(graft_to_host(g[1], out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 0 && out[1] == 0 && out[2] == 0);
  CHECK(graft_to_host(g[2], out, sizeof out) == GRAFT_OK);
  CHECK(out[1] == 1);
  graft_scope_end();
}

TEST(bad_calls_are_errors_that_name_the_problem) {
  double v[4] = {1, 2, 3, 4};
  int64_t s[1] = {4};
  graft_scope_begin();
  graft_tensor *x = mk(v, 1, s), *y = graft_mul(x, x), *g;
  CHECK(graft_grad(y, 1, &x, &g) == GRAFT_ERR_SHAPE); /* not one element */
  CHECK(strstr(graft_last_error(), "graft_grad") && strstr(graft_last_error(), "4 elements"));
  graft_tensor *loss = graft_sum(y, NULL, 0, false);
  graft_tensor *ix = graft_from_host((int64_t[]){1, 2, 3, 4}, GRAFT_I64, 1, s, dev);
  CHECK(graft_grad(loss, 1, &ix, &g) == GRAFT_ERR_DTYPE); /* an integer wrt */
  CHECK(strstr(graft_last_error(), "wrt[0]") != NULL);
  graft_clear_error(); /* a NULL tensor keeps the error of the op that made it, if any */
  CHECK(graft_grad(NULL, 1, &x, &g) == GRAFT_ERR_NULL);
  CHECK(graft_grad(loss, 1, NULL, &g) == GRAFT_ERR_NULL);
  CHECK(graft_sync(&loss, 1) == GRAFT_OK); /* the graph behind it is gone */
  CHECK(graft_grad(loss, 1, &x, &g) == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "earlier sync") != NULL);
  /* the loss itself: d loss / d loss = 1 */
  double one = 0;
  CHECK(graft_grad(loss, 1, &loss, &g) == GRAFT_OK);
  CHECK(graft_to_host(g, &one, sizeof one) == GRAFT_OK && one == 1);
  graft_scope_end();
}

/* max_pool_grad is a gradient itself: differentiating through it is refused by name. */
TEST(an_op_without_a_rule_is_named) {
  double v[16], d[4] = {1, 2, 3, 4};
  for (int i = 0; i < 16; i++) v[i] = (double)((i * 7) % 16);
  int64_t s[4] = {1, 1, 4, 4}, ds[4] = {1, 1, 2, 2};
  graft_scope_begin();
  graft_tensor *x = mk(v, 4, s), *dy = mk(d, 4, ds), *g;
  graft_tensor *mp = graft_max_pool2d_backward(x, dy, (int[]){2, 2}, (int[]){2, 2}, NULL);
  graft_tensor *loss = graft_sum(mp, NULL, 0, false);
  CHECK(graft_grad(loss, 1, &dy, &g) == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "max_pool_grad") != NULL);
  graft_scope_end();
}

int main(void) {
  dev = check_test_device();
  if (dev < 0) {
    fprintf(stderr, "no such test device\n");
    return 1;
  }
  RUN(every_vjp_row_has_a_case);
  RUN(gradients_match_finite_differences);
  RUN(vjp_with_a_cotangent);
  RUN(unreached_and_nondifferentiable_give_zeros);
  RUN(bad_calls_are_errors_that_name_the_problem);
  RUN(an_op_without_a_rule_is_named);
  graft_shutdown();
  printf("%d passed, %d failed\n", check_passed, check_failed);
  return check_failed ? 1 : 0;
}
