// graft's PyTorch bridge: parametrized activations and pointwise losses with their backward ops
// (softplus, leaky_relu, elu/selu/celu, log_sigmoid, smooth_l1/huber, bitwise_not): what real
// models call beyond relu and gelu. Each is a few elementwise graft ops, so it fuses into the
// step's kernels; the formulas are those of PyTorch's CPU kernels (same branches and limits).
#include "lower.h"

namespace graftpt {
namespace {

G sel(const G &c, const G &a, const G &b, const char *what) {
  return chk(graft_where(c.get(), a.get(), b.get()), what);
}

// softplus(x, beta, threshold) = x where x*beta > threshold, else log1p(exp(x*beta)) / beta
void softplus(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "softplus";
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G xb = gbin(graft_mul, x, scal(a.d(1), st), w);
  G soft = gbin(graft_div, gun(graft_log1p, gun(graft_exp, xb, w), w), scal(a.d(1), st), w);
  push(s, wrap(sel(gbin(graft_gt, xb, scal(a.d(2), st), w), x, soft, w)));
}

// softplus_backward(grad, x, beta, threshold): grad * sigmoid(x*beta) below the threshold
void softplus_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "softplus_backward";
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(x);
  G xb = gbin(graft_mul, x, scal(a.d(2), st), w);
  G d = sel(gbin(graft_gt, xb, scal(a.d(3), st), w), scal(1.0, st), gun(graft_sigmoid, xb, w), w);
  push(s, wrap(gbin(graft_mul, g, d, w)));
}

// leaky_relu(x, slope) = x > 0 ? x : x * slope
void leaky_relu(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "leaky_relu";
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G pos = gbin(graft_gt, x, scal(0.0, st), w);
  push(s, wrap(sel(pos, x, gbin(graft_mul, x, scal(a.d(1), st), w), w)));
}

// leaky_relu_backward(grad, self, slope, self_is_result): the sign of self and of the result agree
void leaky_relu_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "leaky_relu_backward";
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(g);
  G pos = gbin(graft_gt, x, scal(0.0, gst(x)), w);
  push(s, wrap(sel(pos, g, gbin(graft_mul, g, scal(a.d(2), st), w), w)));
}

// elu(x, alpha, scale, input_scale) = x > 0 ? x * scale : expm1(x * input_scale) * alpha * scale
// (selu and celu are elu with their constants)
void elu(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "elu";
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  double alpha = a.d(1), scale = a.d(2), in_scale = a.d(3);
  G neg = gbin(graft_mul, gun(graft_expm1, gbin(graft_mul, x, scal(in_scale, st), w), w),
             scal(alpha * scale, st), w);
  push(s, wrap(sel(gbin(graft_gt, x, scal(0.0, st), w), gbin(graft_mul, x, scal(scale, st), w), neg, w)));
}

// elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result)
void elu_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "elu_backward";
  G g = tv(a.t(0)), y = tv(a.t(5));
  at::ScalarType st = gst(g);
  double alpha = a.d(1), scale = a.d(2), in_scale = a.d(3);
  G pos = gbin(graft_gt, y, scal(0.0, gst(y)), w);
  G neg;
  if (a.b(4))  // y is the result: its slope below 0 is input_scale * (y + alpha * scale)
    neg = gbin(graft_mul, gbin(graft_add, y, scal(alpha * scale, st), w), scal(in_scale, st), w);
  else         // y is the input: input_scale * alpha * scale * exp(x * input_scale)
    neg = gbin(graft_mul, gun(graft_exp, gbin(graft_mul, y, scal(in_scale, st), w), w),
             scal(in_scale * alpha * scale, st), w);
  push(s, wrap(gbin(graft_mul, g, sel(pos, scal(scale, st), neg, w), w)));
}

// log_sigmoid_forward(x) -> (min(x, 0) - log1p(exp(-|x|)), buffer): the buffer is PyTorch's
// CPU scratch; the backward below does not read it.
void log_sigmoid_forward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "log_sigmoid";
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G tail = gun(graft_log1p, gun(graft_exp, gun(graft_neg, gun(graft_abs, x, w), w), w), w);
  push(s, wrap(gbin(graft_sub, gbin(graft_minimum, x, scal(0.0, st), w), tail, w)));
  int64_t zero = 0;
  push(s, wrap(chk(dev_zeros(to_gdt(st), 1, &zero), w)));
}

// log_sigmoid_backward(grad, x, buffer) = grad * sigmoid(-x)
void log_sigmoid_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = "log_sigmoid_backward";
  G g = tv(a.t(0)), x = tv(a.t(1));
  push(s, wrap(gbin(graft_mul, g, gun(graft_sigmoid, gun(graft_neg, x, w), w), w)));
}

// The reduction of a loss (0 none, 1 mean, 2 sum).
G reduce_loss(const G &l, int64_t reduction, const char *w) {
  if (reduction == 0 || graft_ndim(l.get()) == 0) return l;
  return chk((reduction == 1 ? graft_mean : graft_sum)(l.get(), nullptr, 0, false), w);
}

// smooth_l1_loss(self, target, reduction, beta) and huber_loss(self, target, reduction, delta):
// |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta (smooth L1); huber is beta times it.
template <bool Huber>
void smooth_l1(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = Huber ? "huber_loss" : "smooth_l1_loss";
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G d = gbin(graft_sub, x, conv(tv(a.t(1)), st), w), ad = gun(graft_abs, d, w);
  double beta = a.d(3);
  G l;
  if (beta == 0) {
    l = ad;
  } else {
    G quad = gbin(graft_mul, gbin(graft_mul, d, d, w), scal(Huber ? 0.5 : 0.5 / beta, st), w);
    G lin = Huber ? gbin(graft_mul, gbin(graft_sub, ad, scal(0.5 * beta, st), w), scal(beta, st), w)
                  : gbin(graft_sub, ad, scal(0.5 * beta, st), w);
    l = sel(gbin(graft_lt, ad, scal(beta, st), w), quad, lin, w);
  }
  push(s, wrap(reduce_loss(l, a.i(2), w)));
}

// smooth_l1_loss_backward(grad, self, target, reduction, beta) / huber_loss_backward(..., delta)
template <bool Huber>
void smooth_l1_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *w = Huber ? "huber_loss_backward" : "smooth_l1_loss_backward";
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(x);
  G d = gbin(graft_sub, x, conv(tv(a.t(2)), st), w), ad = gun(graft_abs, d, w);
  double beta = a.d(4);
  G sg = gun(graft_sign, d, w);
  G slope = beta == 0 ? sg
          : sel(gbin(graft_lt, ad, scal(beta, st), w),
                gbin(graft_mul, d, scal(Huber ? 1.0 : 1.0 / beta, st), w),
                Huber ? gbin(graft_mul, sg, scal(beta, st), w) : sg, w);
  if (a.i(3) == 1) slope = gbin(graft_div, slope, scal((double)a.t(1).numel(), st), w);
  push(s, wrap(gbin(graft_mul, slope, g, w)));
}

// bitwise_not: logical not of a bool, ~ of an integer (graft_logical_not does both)
void bitwise_not(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  TORCH_CHECK(!at::isFloatingType(a.t(0).scalar_type()), "bitwise_not: expected an integral or "
              "bool tensor, got ", a.t(0).scalar_type());
  push(s, wrap(gun(graft_logical_not, tv(a.t(0)), "bitwise_not")));
}

}  // namespace

void add_activation_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::softplus", &softplus},
      {"aten::softplus_backward", &softplus_backward},
      {"aten::leaky_relu", &leaky_relu},
      {"aten::leaky_relu_backward", &leaky_relu_backward},
      {"aten::elu", &elu},
      {"aten::elu_backward", &elu_backward},
      {"aten::log_sigmoid_forward", &log_sigmoid_forward},
      {"aten::log_sigmoid_backward", &log_sigmoid_backward},
      {"aten::smooth_l1_loss", &smooth_l1<false>},
      {"aten::smooth_l1_loss_backward", &smooth_l1_backward<false>},
      {"aten::huber_loss", &smooth_l1<true>},
      {"aten::huber_loss_backward", &smooth_l1_backward<true>},
      {"aten::bitwise_not", &bitwise_not},
  });
}

}  // namespace graftpt
