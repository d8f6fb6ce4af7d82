// graft's PyTorch bridge: the fused optimizer kernels torch 2 calls for `fused=True`
// (aten::_fused_adam_, _fused_adamw_, _fused_sgd_) as graft IR, so an optimizer step stays part
// of the step's graph instead of a CPU fallback that syncs every parameter. The math is that of
// PyTorch's CPU kernels (ATen/native/cpu/Fused*Kernel.cpp); the bias corrections are computed in
// float64 from the step tensors on the device, as those kernels compute them in double, and stay
// lazy (no .item()). A grad_scale or found_inf (AMP's GradScaler) goes to the CPU kernel.
#include "lower.h"

namespace graftpt {
namespace {

std::vector<at::Tensor> tensors(const c10::IValue &iv) {
  std::vector<at::Tensor> v;
  if (iv.isNone()) return v;
  auto l = iv.toTensorList();
  for (size_t i = 0; i < l.size(); ++i) v.push_back(l.get(i));
  return v;
}

// lr as a float64 graft value: a float argument, or the tensor of the .tensor_lr overloads.
G lr_value(const c10::IValue &iv) {
  if (iv.isTensor()) return conv(tv(iv.toTensor()), at::kDouble);
  return scal(iv.toDouble(), at::kDouble);
}

bool scaled(const Args &a, int grad_scale, int found_inf) {
  return !a.none(grad_scale) || !a.none(found_inf);
}

// _fused_adam_(self[], grads[], exp_avgs[], exp_avg_sqs[], max_exp_avg_sqs[], state_steps[], *,
//              lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)
template <bool ADAMW>
void fused_adam(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  if (scaled(a, 13, 14)) return fall_back(op, s, a);
  const char *what = ADAMW ? "_fused_adamw_" : "_fused_adam_";
  auto params = tensors(a.v[0]), grads = tensors(a.v[1]), m1 = tensors(a.v[2]),
       m2 = tensors(a.v[3]), mx = tensors(a.v[4]), steps = tensors(a.v[5]);
  G lr = lr_value(a.v[6]);
  double beta1 = a.v[7].toDouble(), beta2 = a.v[8].toDouble(), wd = a.v[9].toDouble(),
         eps = a.v[10].toDouble();
  bool amsgrad = a.b(11), maximize = a.b(12);
  TORCH_CHECK(grads.size() == params.size() && m1.size() == params.size() &&
                  m2.size() == params.size() && steps.size() == params.size() &&
                  (!amsgrad || mx.size() == params.size()),
              "graft: ", what, ": the tensor lists differ in length");
  for (size_t i = 0; i < params.size(); ++i) {
    at::ScalarType st = params[i].scalar_type();
    G p = value(params[i]), g = conv(value(grads[i]), st), m = value(m1[i]), v = value(m2[i]);
    if (maximize) g = chk(graft_neg(g.get()), what);
    if (wd != 0) {
      if (ADAMW) {  // p *= 1 - lr * wd
        G f = gbin(graft_sub, scal(1.0, at::kDouble),
                  gbin(graft_mul, lr, scal(wd, at::kDouble), what), what);
        p = gbin(graft_mul, p, conv(f, st), what);
      } else {
        g = gbin(graft_add, g, gbin(graft_mul, p, scal(wd, st), what), what);
      }
    }
    m = gbin(graft_add, gbin(graft_mul, m, scal(beta1, st), what),
            gbin(graft_mul, g, scal(1 - beta1, st), what), what);
    G gg = gbin(graft_mul, g, g, what);
    v = gbin(graft_add, gbin(graft_mul, v, scal(beta2, st), what),
            gbin(graft_mul, gg, scal(1 - beta2, st), what), what);
    G second = v, newmx;
    if (amsgrad) second = newmx = gbin(graft_maximum, value(mx[i]), v, what);
    // bias corrections in float64 from the (already incremented) step
    G step = conv(value(steps[i]), at::kDouble);
    G bc1 = gbin(graft_sub, scal(1.0, at::kDouble), gbin(graft_pow, scal(beta1, at::kDouble), step, what), what);
    G bc2 = gbin(graft_sub, scal(1.0, at::kDouble), gbin(graft_pow, scal(beta2, at::kDouble), step, what), what);
    G step_size = conv(gbin(graft_div, lr, bc1, what), st);
    G bc2_sqrt = conv(chk(graft_sqrt(bc2.get()), what), st);
    G denom = gbin(graft_add, gbin(graft_div, chk(graft_sqrt(second.get()), what), bc2_sqrt, what),
                  scal(eps, st), what);
    p = gbin(graft_sub, p, gbin(graft_div, gbin(graft_mul, m, step_size, what), denom, what), what);
    write(params[i], std::move(p));
    write(m1[i], std::move(m));
    write(m2[i], std::move(v));
    if (amsgrad) write(mx[i], std::move(newmx));
  }
}

// _fused_sgd_(self[], grads[], momentum_buffer_list[], *, weight_decay, momentum, lr, dampening,
//             nesterov, maximize, is_first_step, grad_scale, found_inf)
void fused_sgd(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  if (scaled(a, 10, 11)) return fall_back(op, s, a);
  const char *what = "_fused_sgd_";
  auto params = tensors(a.v[0]), grads = tensors(a.v[1]), bufs = tensors(a.v[2]);
  double wd = a.v[3].toDouble(), momentum = a.v[4].toDouble(), dampening = a.v[6].toDouble();
  G lr = lr_value(a.v[5]);
  bool nesterov = a.b(7), maximize = a.b(8), first = a.b(9);
  TORCH_CHECK(grads.size() == params.size() && (momentum == 0 || bufs.size() == params.size()),
              "graft: ", what, ": the tensor lists differ in length");
  for (size_t i = 0; i < params.size(); ++i) {
    at::ScalarType st = params[i].scalar_type();
    G p = value(params[i]), g = conv(value(grads[i]), st);
    if (maximize) g = chk(graft_neg(g.get()), what);
    if (wd != 0) g = gbin(graft_add, g, gbin(graft_mul, p, scal(wd, st), what), what);
    if (momentum != 0) {
      G buf = first ? g
                    : gbin(graft_add, gbin(graft_mul, value(bufs[i]), scal(momentum, st), what),
                          gbin(graft_mul, g, scal(1 - dampening, st), what), what);
      g = nesterov ? gbin(graft_add, g, gbin(graft_mul, buf, scal(momentum, st), what), what) : buf;
      write(bufs[i], std::move(buf));
    }
    p = gbin(graft_sub, p, gbin(graft_mul, g, conv(lr, st), what), what);
    write(params[i], std::move(p));
  }
}

}  // namespace

void add_optim_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::_fused_adam_", &fused_adam<false>},
      {"aten::_fused_adam_.tensor_lr", &fused_adam<false>},
      {"aten::_fused_adamw_", &fused_adam<true>},
      {"aten::_fused_adamw_.tensor_lr", &fused_adam<true>},
      {"aten::_fused_sgd_", &fused_sgd},
      {"aten::_fused_sgd_.tensor_lr", &fused_sgd},
  });
}

}  // namespace graftpt
