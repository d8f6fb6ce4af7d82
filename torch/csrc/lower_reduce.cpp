// graft's PyTorch bridge: reduction lowerings and what is built on them: the softmax family,
// losses (nll, mse) and normalization (layer norm, batch norm).
#include "lower.h"

#include <c10/core/WrapDimMinimal.h>

#include <algorithm>

namespace graftpt {
namespace {

// Reductions ------------------------------------------------------------------------
G reduce_input(const at::Tensor &t, const Args &a, int dtype_idx, bool to_float) {
  G x = tv(t);
  at::ScalarType st = gst(x);
  if (dtype_idx >= 0 && !a.none(dtype_idx)) st = (at::ScalarType)a.i(dtype_idx);
  else if (to_float && !at::isFloatingType(st)) st = default_float();
  else if (!to_float && (at::isIntegralType(st, true))) st = at::kLong;
  return conv(std::move(x), st);
}

using Red = graft_tensor *(*)(graft_tensor *, const int *, int, bool);

template <Red F>
G reduce(const G &x, const std::vector<int> &dims, bool keepdim, const char *what) {
  if (graft_ndim(x.get()) == 0) return x;
  return chk(F(x.get(), dims.empty() ? nullptr : dims.data(), (int)dims.size(), keepdim), what);
}

// sum / mean / prod(self, dtype?): over every dim.
template <Red F, bool ToFloat>
void reduce_all(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 1, ToFloat);
  std::string what = op.schema().name().substr(6);  // "sum", ...
  push(s, wrap(reduce<F>(x, {}, false, what.c_str())));
}

// sum.dim_IntList / mean.dim / prod.dim_int(self, dim, keepdim, dtype?)
template <Red F, bool ToFloat>
void reduce_dim(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 3, ToFloat);
  auto dims = dims_of(a.v[1], a.t(0).dim());
  std::string what = op.schema().name().substr(6);
  push(s, wrap(reduce<F>(x, dims, a.b(2), what.c_str())));
}

// any / all (self), .dim(self, dim, keepdim), .dims(self, dim?, keepdim): counts of non-zero
// elements (so an empty reduction gives any = false, all = true); uint8 in, uint8 out.
template <bool ALL>
void any_all(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  const char *what = ALL ? "all" : "any";
  G x = tv(t);
  G nz = chk(graft_ne(x.get(), scal(0, gst(x)).get()), what);
  if (ALL) nz = chk(graft_logical_not(nz.get()), what);  // all: no zero element
  G cnt = conv(std::move(nz), at::kLong);
  bool keep = a.v.size() > 2 && a.b(2);
  std::vector<int> dims = a.v.size() > 1 ? dims_of(a.v[1], t.dim()) : std::vector<int>{};
  G sum = reduce<graft_sum>(cnt, dims, keep, what);
  G r = ALL ? chk(graft_eq(sum.get(), scal(0, at::kLong).get()), what)
            : chk(graft_gt(sum.get(), scal(0, at::kLong).get()), what);
  push(s, wrap(conv(std::move(r), t.scalar_type() == at::kByte ? at::kByte : at::kBool)));
}

template <Red F>
void minmax_all(const c10::OperatorHandle &op, Stack *s) {  // max(self) / min(self)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  TORCH_CHECK(t.numel() > 0, op.schema().name(), "(): Expected reduction dim to be specified for input.numel() == 0.");
  push(s, wrap(reduce<F>(tv(t), {}, false, op.schema().name().c_str())));
}

template <Red F>
void amaxmin(const c10::OperatorHandle &op, Stack *s) {  // amax(self, dim[], keepdim)
  Args a(op, s);
  auto dims = dims_of(a.v[1], a.t(0).dim());
  push(s, wrap(reduce<F>(tv(a.t(0)), dims, a.b(2), op.schema().name().c_str())));
}

template <bool Max>
void minmax_dim(const c10::OperatorHandle &op, Stack *s) {  // max.dim(self, dim, keepdim) -> (values, indices)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  bool keep = a.b(2);
  G x = tv(t);
  if (t.dim() == 0) {
    push(s, wrap(x));
    push(s, wrap(chk(dev_zeros(GRAFT_I64, 0, nullptr), "max")));
    return;
  }
  G vals = chk(Max ? graft_max(x.get(), &d, 1, keep) : graft_min(x.get(), &d, 1, keep), "max.dim");
  G src = Max ? x : chk(graft_neg(x.get()), "min.dim");
  G idx = chk(graft_argmax(src.get(), d, keep), "argmax");
  push(s, wrap(std::move(vals)));
  push(s, wrap(std::move(idx)));
}

template <bool Max>
void argmaxmin(const c10::OperatorHandle &op, Stack *s) {  // argmax/argmin(self, dim?, keepdim)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G x = tv(t);
  bool keep = a.b(2);
  if (a.none(1)) {
    int64_t n = t.numel();
    x = reshape_to(x, {n});
    G r = chk((Max ? graft_argmax : graft_argmin)(x.get(), 0, false), "argmax");
    if (keep) r = reshape_to(r, std::vector<int64_t>(t.dim(), 1));
    push(s, wrap(std::move(r)));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  if (t.dim() == 0) {
    push(s, wrap(chk(dev_zeros(GRAFT_I64, 0, nullptr), "argmax")));
    return;
  }
  push(s, wrap(chk((Max ? graft_argmax : graft_argmin)(x.get(), d, keep), "argmax")));
}

// var / std and var_mean / std_mean with correction: (self, dim?, correction?, keepdim). The
// variance (or its root) is pushed, then the mean when WithMean.
template <bool Std, bool WithMean>
void var_corr(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  const char *what = Std ? "std" : "var";
  G x = reduce_input(t, a, -1, true);
  auto dims = dims_of(a.v[1], t.dim());
  double corr = a.none(2) ? 1.0 : a.d(2);
  bool keep = a.b(3);
  int64_t n = 1;
  if (dims.empty()) n = t.numel();
  else for (int d : dims) n *= t.size(d);
  G m = reduce<graft_mean>(x, dims, true, what);
  G dx = chk(graft_sub(x.get(), m.get()), what);
  G ss = reduce<graft_sum>(chk(graft_mul(dx.get(), dx.get()), what), dims, keep, what);
  G r = chk(graft_div(ss.get(), scal(std::max(0.0, (double)n - corr), gst(ss)).get()), what);
  if (Std) r = chk(graft_sqrt(r.get()), what);
  push(s, wrap(std::move(r)));
  if (WithMean) push(s, wrap(keep ? m : reduce<graft_mean>(x, dims, false, what)));
}

// linalg_vector_norm(self, ord, dim?, keepdim, *, dtype?): what clip_grad_norm_ and
// Tensor.norm() call. ord 2 / 1 / inf / -inf / 0 / p.
void vector_norm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  const char *what = "linalg_vector_norm";
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) || !a.none(4), what,
              ": expected a floating point input, got ", t.scalar_type());
  G x = tv(t);
  if (!a.none(4)) x = conv(std::move(x), (at::ScalarType)a.i(4));
  at::ScalarType out_st = gst(x);
  if (out_st == at::kHalf || out_st == at::kBFloat16) x = conv(std::move(x), at::kFloat);  // as PyTorch accumulates
  double p = a.d(1);
  auto dims = dims_of(a.v[2], t.dim());
  bool keep = a.b(3);
  G ax = chk(graft_abs(x.get()), what), r;
  if (p == 2) {
    r = chk(graft_sqrt(reduce<graft_sum>(chk(graft_mul(x.get(), x.get()), what), dims, keep, what).get()), what);
  } else if (std::isinf(p)) {
    TORCH_CHECK(t.numel() > 0, what, ": the norm of order ", p, " of an empty tensor is undefined");
    r = p > 0 ? reduce<graft_max>(ax, dims, keep, what) : reduce<graft_min>(ax, dims, keep, what);
  } else if (p == 0) {
    G nz = conv(chk(graft_ne(x.get(), scal(0, gst(x)).get()), what), gst(x));
    r = reduce<graft_sum>(nz, dims, keep, what);
  } else if (p == 1) {
    r = reduce<graft_sum>(ax, dims, keep, what);
  } else {
    G pw = chk(graft_pow(ax.get(), scal(p, gst(x)).get()), what);
    r = chk(graft_pow(reduce<graft_sum>(pw, dims, keep, what).get(), scal(1.0 / p, gst(x)).get()), what);
  }
  push(s, wrap(conv(std::move(r), out_st)));
}

// Softmax family ------------------------------------------------------------------
// _log_softmax / _softmax(self, dim, half_to_float)
template <bool Log>
void softmax_fwd(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *what = Log ? "log_softmax" : "softmax";
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t);
  if (a.b(2)) x = conv(std::move(x), at::kFloat);
  if (t.dim() == 0) {  // log_softmax of one element is 0, softmax 1
    push(s, wrap(chk((Log ? dev_zeros : dev_ones)(graft_get_dtype(x.get()), 0, nullptr), what)));
    return;
  }
  push(s, wrap(chk((Log ? graft_log_softmax : graft_softmax)(x.get(), d), what)));
}

// _log_softmax_backward_data / _softmax_backward_data(grad_output, output, dim, input_dtype)
template <bool Log>
void softmax_bwd(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *what = Log ? "log_softmax_backward" : "softmax_backward";
  G g = tv(a.t(0)), y = tv(a.t(1));
  if (a.t(0).dim() == 0) {
    push(s, wrap(chk(graft_mul_scalar(g.get(), 0.0), what)));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(2), a.t(0).dim());
  G r;
  if (Log) {  // g - exp(y) * sum(g)
    G e = chk(graft_exp(y.get()), what);
    G sg = chk(graft_sum(g.get(), &d, 1, true), what);
    G p = chk(graft_mul(e.get(), sg.get()), what);
    r = chk(graft_sub(g.get(), p.get()), what);
  } else {  // y * (g - sum(g * y))
    G gy = chk(graft_mul(g.get(), y.get()), what);
    G sg = chk(graft_sum(gy.get(), &d, 1, true), what);
    G df = chk(graft_sub(g.get(), sg.get()), what);
    r = chk(graft_mul(y.get(), df.get()), what);
  }
  push(s, wrap(conv(std::move(r), (at::ScalarType)a.i(3))));
}

// Losses -------------------------------------------------------------------------
// nll_loss's (self, target, weight?, reduction, ignore_index) at a.v[k...]: the per-sample weight
// w (w[target] or 1) masked by ignore_index, shape [N]; the safe target.
struct NllParts {
  G w, tsafe;
  int64_t red;
};

NllParts nll_parts(const Args &a, int k) {
  const at::Tensor &self = a.t(k), &target = a.t(k + 1);
  const c10::IValue &weight = a.v[k + 2];
  int64_t ignore_index = a.i(k + 4);
  NllParts r;
  r.red = a.i(k + 3);
  G &w = r.w, &tsafe = r.tsafe;
  TORCH_CHECK(self.dim() >= 1 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  TORCH_CHECK(self.dim() == 1 || self.size(0) == target.size(0), "Expected input batch_size (",
              self.size(0), ") to match target batch_size (", target.size(0), ").");
  at::ScalarType st = self.scalar_type();
  G t = conv(tv(target), at::kLong);
  G ig = scal((double)ignore_index, at::kLong);
  G keep = chk(graft_ne(t.get(), ig.get()), "nll_loss");
  G z = chk(dev_zeros(GRAFT_I64, 0, nullptr), "nll_loss");
  tsafe = chk(graft_where(keep.get(), t.get(), z.get()), "nll_loss");
  if (weight.isTensor() && weight.toTensor().defined()) {
    G gw = conv(tv(weight.toTensor()), st);
    int64_t n = graft_numel(tsafe.get());
    G tf = reshape_to(tsafe, {n});
    w = chk(graft_gather(gw.get(), 0, tf.get()), "nll_loss");
    w = reshape_to(w, gshape(tsafe));
  } else {
    w = chk(dev_ones(to_gdt(st), 0, nullptr), "nll_loss");
    w = chk(graft_broadcast_to(w.get(), graft_ndim(tsafe.get()), gshape(tsafe).data()), "nll_loss");
  }
  G zf = chk(dev_zeros(to_gdt(st), 0, nullptr), "nll_loss");
  w = chk(graft_where(keep.get(), w.get(), zf.get()), "nll_loss");
  return r;
}

// nll_loss_forward(self, target, weight?, reduction, ignore_index) -> (output, total_weight)
void nll_loss_forward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  NllParts np = nll_parts(a, 0);
  const G &w = np.w, &ts = np.tsafe;
  G gx = tv(x);
  G picked;
  if (x.dim() == 2) {
    int64_t n = x.size(0);
    G ti = reshape_to(ts, {n, 1});
    picked = chk(graft_gather(gx.get(), 1, ti.get()), "nll_loss");
    picked = reshape_to(picked, {n});
  } else {
    G ti = reshape_to(ts, {1});
    picked = chk(graft_gather(gx.get(), 0, ti.get()), "nll_loss");
    picked = reshape_to(picked, {});
  }
  G l = chk(graft_mul(picked.get(), w.get()), "nll_loss");
  l = chk(graft_neg(l.get()), "nll_loss");
  G tw = reduce<graft_sum>(w, {}, false, "nll_loss");
  G out;
  if (np.red == 0) out = l;
  else {
    out = reduce<graft_sum>(l, {}, false, "nll_loss");
    if (np.red == 1) out = chk(graft_div(out.get(), tw.get()), "nll_loss");
  }
  push(s, wrap(std::move(out)));
  push(s, wrap(std::move(tw)));
}

// nll_loss_backward(grad_output, self, target, weight?, reduction, ignore_index, total_weight)
void nll_loss_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  NllParts np = nll_parts(a, 1);
  const G &w = np.w, &ts = np.tsafe;
  at::ScalarType st = x.scalar_type();
  G g = conv(tv(a.t(0)), st);
  G coef = chk(graft_mul(w.get(), g.get()), "nll_loss_backward");  // [N] (g scalar or [N])
  if (np.red == 1) {
    G tw = conv(tv(a.t(6)), st);
    coef = chk(graft_div(coef.get(), tw.get()), "nll_loss_backward");
  }
  coef = chk(graft_neg(coef.get()), "nll_loss_backward");
  auto xs = x.sizes().vec();
  G onehot, c2;
  if (x.dim() == 2) {
    int64_t n = xs[0];
    G io = chk(dev_iota(GRAFT_I64, 2, xs.data(), 1), "nll_loss_backward");
    G ti = reshape_to(ts, {n, 1});
    onehot = chk(graft_eq(io.get(), ti.get()), "nll_loss_backward");
    c2 = reshape_to(coef, {n, 1});
  } else {
    G io = chk(dev_iota(GRAFT_I64, 1, xs.data(), 0), "nll_loss_backward");
    onehot = chk(graft_eq(io.get(), ts.get()), "nll_loss_backward");
    c2 = coef;
  }
  G z = chk(dev_zeros(to_gdt(st), 0, nullptr), "nll_loss_backward");
  push(s, wrap(chk(graft_where(onehot.get(), c2.get(), z.get()), "nll_loss_backward")));
}

// mse_loss(self, target, reduction)
void mse_loss(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  G d = chk(graft_sub(x.get(), y.get()), "mse_loss");
  G sq = chk(graft_mul(d.get(), d.get()), "mse_loss");
  int64_t red = a.i(2);
  if (red == 1) sq = reduce<graft_mean>(sq, {}, false, "mse_loss");
  else if (red == 2) sq = reduce<graft_sum>(sq, {}, false, "mse_loss");
  push(s, wrap(std::move(sq)));
}

// mse_loss_backward(grad_output, self, target, reduction)
void mse_loss_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[1], &a.v[2]});
  G g = operand(a.v[0], st), x = operand(a.v[1], st), y = operand(a.v[2], st);
  G d = chk(graft_sub(x.get(), y.get()), "mse_loss_backward");
  double k = 2.0;
  if (a.i(3) == 1) k /= (double)std::max<int64_t>(1, a.t(1).numel());
  d = chk(graft_mul(d.get(), scal(k, st).get()), "mse_loss_backward");
  push(s, wrap(chk(graft_mul(d.get(), g.get()), "mse_loss_backward")));
}
// nll_loss2d_forward / _backward: the class dim moved last and the rest flattened into rows,
// then the 1-D lowerings (same argument layout) on those rows.
void nll2d_rows(const at::Tensor &x, const at::Tensor &t, at::Tensor &x2, at::Tensor &t2) {
  int64_t nd = x.dim(), C = x.size(1);
  std::vector<int> perm = {0};
  for (int i = 2; i < nd; ++i) perm.push_back(i);
  perm.push_back(1);
  G gx = chk(graft_transpose(tv(x).get(), perm.data()), "nll_loss2d");
  int64_t M = x.numel() / std::max<int64_t>(C, 1);
  x2 = wrap(reshape_to(gx, {M, C}));
  t2 = wrap(reshape_to(tv(t), {M}));
}

void nll_loss2d_forward(const c10::OperatorHandle &op, Stack *s) {  // (self, target, weight?, reduction, ignore_index)
  Args a(op, s);
  at::Tensor x = a.t(0), t = a.t(1);  // copies: a.v is rewritten below
  if (x.dim() != 4 || t.dim() != 3 || x.numel() == 0 || x.size(0) != t.size(0) ||
      x.size(2) != t.size(1) || x.size(3) != t.size(2))
    return fall_back(op, s, a);
  at::Tensor x2, t2;
  nll2d_rows(x, t, x2, t2);
  int64_t red = a.i(3);
  a.v[0] = x2;
  a.v[1] = t2;
  for (auto &iv : a.v) s->push_back(iv);
  nll_loss_forward(op, s);
  if (red == 0) {
    at::Tensor tw = s->back().toTensor();
    s->pop_back();
    at::Tensor out = s->back().toTensor();
    s->pop_back();
    push(s, wrap(reshape_to(value(out), t.sizes().vec())));
    push(s, tw);
  }
}

// (grad_output, self, target, weight?, reduction, ignore_index, total_weight)
void nll_loss2d_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::Tensor x = a.t(1), t = a.t(2);  // copies: a.v is rewritten below
  if (x.dim() != 4 || t.dim() != 3 || x.numel() == 0) return fall_back(op, s, a);
  at::Tensor x2, t2;
  nll2d_rows(x, t, x2, t2);
  if (a.i(4) == 0) a.v[0] = wrap(reshape_to(tv(a.t(0)), {t.numel()}));
  a.v[1] = x2;
  a.v[2] = t2;
  for (auto &iv : a.v) s->push_back(iv);
  nll_loss_backward(op, s);
  at::Tensor g2 = s->back().toTensor();
  s->pop_back();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  G g = reshape_to(value(g2), {N, H, W, C});
  int perm[4] = {0, 3, 1, 2};
  push(s, wrap(chk(graft_transpose(g.get(), perm), "nll_loss2d_backward")));
}
// Normalization -------------------------------------------------------------------
// x normalized over dims (kept): mean m, variance var, rstd = 1/sqrt(var + eps), y = (x - m) * rstd.
struct Normalized {
  G m, var, rstd, y;
};

Normalized normalize(const G &gx, const std::vector<int> &dims, double eps, at::ScalarType st, const char *what) {
  Normalized r;
  r.m = reduce<graft_mean>(gx, dims, true, what);
  G dx = chk(graft_sub(gx.get(), r.m.get()), what);
  G sq = chk(graft_mul(dx.get(), dx.get()), what);
  r.var = reduce<graft_mean>(sq, dims, true, what);
  r.rstd = chk(graft_add(r.var.get(), scal(eps, st).get()), what);
  r.rstd = chk(graft_rsqrt(r.rstd.get()), what);
  r.y = chk(graft_mul(dx.get(), r.rstd.get()), what);
  return r;
}

// The input gradient of a normalization over dims from the (weighted) output gradient gh:
// rstd * (gh - mean(gh) - xhat * mean(gh * xhat)).
G normalize_backward(const G &gh, const G &xhat, const G &rstd, const std::vector<int> &dims, const char *what) {
  G m1 = reduce<graft_mean>(gh, dims, true, what);
  G gx2 = chk(graft_mul(gh.get(), xhat.get()), what);
  G m2 = reduce<graft_mean>(gx2, dims, true, what);
  G t2 = chk(graft_mul(xhat.get(), m2.get()), what);
  G r = chk(graft_sub(gh.get(), m1.get()), what);
  r = chk(graft_sub(r.get(), t2.get()), what);
  return chk(graft_mul(r.get(), rstd.get()), what);
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
void native_layer_norm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  auto ns = a.il(1);
  int64_t nd = x.dim(), k = (int64_t)ns.size();
  std::vector<int> dims;
  for (int64_t i = nd - k; i < nd; ++i) dims.push_back((int)i);
  G gx = tv(x);
  at::ScalarType st = x.scalar_type();
  Normalized nz = normalize(gx, dims, a.d(4), st, "layer_norm");
  G y = nz.y;
  if (!a.none(2) && a.t(2).defined()) y = chk(graft_mul(y.get(), tv(a.t(2)).get()), "layer_norm");
  if (!a.none(3) && a.t(3).defined()) y = chk(graft_add(y.get(), tv(a.t(3)).get()), "layer_norm");
  push(s, wrap(std::move(y)));
  push(s, wrap(std::move(nz.m)));
  push(s, wrap(std::move(nz.rstd)));
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, mask[3])
void native_layer_norm_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  auto ns = a.il(2);
  int64_t nd = x.dim(), k = (int64_t)ns.size();
  std::vector<int> dims, outer;
  int64_t n = 1;
  for (int64_t i = 0; i < nd; ++i) {
    if (i >= nd - k) { dims.push_back((int)i); n *= x.size(i); }
    else outer.push_back((int)i);
  }
  auto mask = a.v[7].toBoolList();
  at::ScalarType st = x.scalar_type();
  G g = tv(a.t(0)), gx = tv(x), m = tv(a.t(3)), rstd = tv(a.t(4));
  G xhat = chk(graft_sub(gx.get(), m.get()), "layer_norm_backward");
  xhat = chk(graft_mul(xhat.get(), rstd.get()), "layer_norm_backward");
  bool hasw = !a.none(5) && a.t(5).defined();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    G gh = hasw ? chk(graft_mul(g.get(), tv(a.t(5)).get()), "layer_norm_backward") : g;
    gi = wrap(normalize_backward(gh, xhat, rstd, dims, "layer_norm_backward"));
  }
  if (mask[1] && hasw) {
    G p = chk(graft_mul(g.get(), xhat.get()), "layer_norm_backward");
    gw = wrap(outer.empty() ? p : reduce<graft_sum>(p, outer, false, "layer_norm_backward"));
  }
  if (mask[2] && !a.none(6) && a.t(6).defined()) {
    gb = wrap(outer.empty() ? g : reduce<graft_sum>(g, outer, false, "layer_norm_backward"));
  }
  (void)st;
  (void)n;
  push(s, gi);
  push(s, gw);
  push(s, gb);
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
//   -> (out, save_mean, save_invstd); updates running stats in place when training.
// _native_batch_norm_legit has the same arguments (AOTAutograd's graphs call it); its no_stats
// overload has none of the running stats: (input, weight?, bias?, training, momentum, eps).
void batch_norm_args(const Args &a, Stack *s, bool stats);

void native_batch_norm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  batch_norm_args(a, s, op.schema().overload_name() != "no_stats");
}

void batch_norm_args(const Args &a, Stack *s, bool stats) {
  const int at_train = stats ? 5 : 3;  // running_mean, running_var at 3, 4 when there are stats
  const at::Tensor &x = a.t(0);
  int64_t nd = x.dim();
  TORCH_CHECK(nd >= 2, "batch_norm: expected at least 2-D input");
  int64_t C = x.size(1);
  std::vector<int> dims;
  int64_t cnt = 1;
  for (int i = 0; i < nd; ++i)
    if (i != 1) { dims.push_back(i); cnt *= x.size(i); }
  std::vector<int64_t> bshape(nd, 1);
  bshape[1] = C;
  at::ScalarType st = x.scalar_type();
  bool training = a.b(at_train);
  double mom = a.d(at_train + 1), eps = a.d(at_train + 2);
  bool has_rm = stats && !a.none(3) && a.t(3).defined(), has_rv = stats && !a.none(4) && a.t(4).defined();
  G gx = tv(x);
  G mean, invstd, y;
  if (training) {
    Normalized nz = normalize(gx, dims, eps, st, "batch_norm");
    const G &var = nz.var;
    y = nz.y;
    mean = reshape_to(nz.m, {C});
    invstd = reshape_to(nz.rstd, {C});
    if (has_rm) {
      G rm = tv(a.t(3));
      G upd = chk(graft_mul(rm.get(), scal(1 - mom, st).get()), "batch_norm");
      G mm_ = chk(graft_mul(mean.get(), scal(mom, st).get()), "batch_norm");
      write(a.t(3), chk(graft_add(upd.get(), mm_.get()), "batch_norm"));
    }
    if (has_rv) {
      G rv = tv(a.t(4));
      G v1 = reshape_to(var, {C});
      double unb = cnt > 1 ? (double)cnt / (double)(cnt - 1) : 1.0;
      v1 = chk(graft_mul(v1.get(), scal(mom * unb, st).get()), "batch_norm");
      G upd = chk(graft_mul(rv.get(), scal(1 - mom, st).get()), "batch_norm");
      write(a.t(4), chk(graft_add(upd.get(), v1.get()), "batch_norm"));
    }
  } else {
    TORCH_CHECK(has_rm && has_rv, "batch_norm: running_mean and running_var must be defined in eval mode");
    G rm = reshape_to(tv(a.t(3)), bshape), rv = reshape_to(tv(a.t(4)), bshape);
    G is = chk(graft_add(rv.get(), scal(eps, st).get()), "batch_norm");
    is = chk(graft_rsqrt(is.get()), "batch_norm");
    G dx = chk(graft_sub(gx.get(), rm.get()), "batch_norm");
    y = chk(graft_mul(dx.get(), is.get()), "batch_norm");
    int64_t zero = 0;  // PyTorch returns empty save_mean / save_invstd in eval mode
    mean = chk(dev_zeros(to_gdt(st), 1, &zero), "batch_norm");
    invstd = chk(dev_zeros(to_gdt(st), 1, &zero), "batch_norm");
  }
  if (!a.none(1) && a.t(1).defined()) y = chk(graft_mul(y.get(), reshape_to(tv(a.t(1)), bshape).get()), "batch_norm");
  if (!a.none(2) && a.t(2).defined()) y = chk(graft_add(y.get(), reshape_to(tv(a.t(2)), bshape).get()), "batch_norm");
  push(s, wrap(std::move(y)));
  push(s, wrap(std::move(mean)));
  push(s, wrap(std::move(invstd)));
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
//   save_invstd?, train, eps, output_mask[3])
void native_batch_norm_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  int64_t nd = x.dim(), C = x.size(1);
  std::vector<int> dims;
  for (int i = 0; i < nd; ++i)
    if (i != 1) dims.push_back(i);
  std::vector<int64_t> bshape(nd, 1);
  bshape[1] = C;
  at::ScalarType st = x.scalar_type();
  bool train = a.b(7);
  double eps = a.d(8);
  auto mask = a.v[9].toBoolList();
  G g = tv(a.t(0)), gx = tv(x);
  G mean, is;
  if (train) {
    mean = reshape_to(tv(a.t(5)), bshape);
    is = reshape_to(tv(a.t(6)), bshape);
  } else {
    mean = reshape_to(tv(a.t(3)), bshape);
    G rv = reshape_to(tv(a.t(4)), bshape);
    is = chk(graft_add(rv.get(), scal(eps, st).get()), "batch_norm_backward");
    is = chk(graft_rsqrt(is.get()), "batch_norm_backward");
  }
  G xhat = chk(graft_sub(gx.get(), mean.get()), "batch_norm_backward");
  xhat = chk(graft_mul(xhat.get(), is.get()), "batch_norm_backward");
  bool hasw = !a.none(2) && a.t(2).defined();
  G w = hasw ? reshape_to(tv(a.t(2)), bshape) : G();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    G gh = hasw ? chk(graft_mul(g.get(), w.get()), "batch_norm_backward") : g;
    G r;
    if (train) {
      r = normalize_backward(gh, xhat, is, dims, "batch_norm_backward");
    } else {
      r = chk(graft_mul(gh.get(), is.get()), "batch_norm_backward");
    }
    gi = wrap(std::move(r));
  }
  if (mask[1]) {
    G p = chk(graft_mul(g.get(), xhat.get()), "batch_norm_backward");
    gw = wrap(reduce<graft_sum>(p, dims, false, "batch_norm_backward"));
  }
  if (mask[2]) gb = wrap(reduce<graft_sum>(g, dims, false, "batch_norm_backward"));
  push(s, gi);
  push(s, gw);
  push(s, gb);
}

}  // namespace

void add_reduce_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::nll_loss2d_forward", &nll_loss2d_forward},
      {"aten::nll_loss2d_backward", &nll_loss2d_backward},
      {"aten::sum", &reduce_all<graft_sum, false>},
      {"aten::sum.dim_IntList", &reduce_dim<graft_sum, false>},
      {"aten::mean", &reduce_all<graft_mean, true>},
      {"aten::mean.dim", &reduce_dim<graft_mean, true>},
      {"aten::prod", &reduce_all<graft_prod, false>},
      {"aten::prod.dim_int", &reduce_dim<graft_prod, false>},
      {"aten::any", &any_all<false>},
      {"aten::any.dim", &any_all<false>},
      {"aten::any.dims", &any_all<false>},
      {"aten::all", &any_all<true>},
      {"aten::all.dim", &any_all<true>},
      {"aten::all.dims", &any_all<true>},
      {"aten::max", &minmax_all<graft_max>},
      {"aten::min", &minmax_all<graft_min>},
      {"aten::amax", &amaxmin<graft_max>},
      {"aten::amin", &amaxmin<graft_min>},
      {"aten::max.dim", &minmax_dim<true>},
      {"aten::min.dim", &minmax_dim<false>},
      {"aten::argmax", &argmaxmin<true>},
      {"aten::argmin", &argmaxmin<false>},
      {"aten::var.correction", &var_corr<false, false>},
      {"aten::std.correction", &var_corr<true, false>},
      {"aten::var_mean.correction", &var_corr<false, true>},
      {"aten::std_mean.correction", &var_corr<true, true>},
      {"aten::linalg_vector_norm", &vector_norm},
      {"aten::_log_softmax", &softmax_fwd<true>},
      {"aten::_softmax", &softmax_fwd<false>},
      {"aten::_log_softmax_backward_data", &softmax_bwd<true>},
      {"aten::_softmax_backward_data", &softmax_bwd<false>},
      {"aten::nll_loss_forward", &nll_loss_forward},
      {"aten::nll_loss_backward", &nll_loss_backward},
      {"aten::mse_loss", &mse_loss},
      {"aten::mse_loss_backward", &mse_loss_backward},
      {"aten::native_layer_norm", &native_layer_norm},
      {"aten::native_layer_norm_backward", &native_layer_norm_backward},
      {"aten::native_batch_norm", &native_batch_norm},
      {"aten::_native_batch_norm_legit", &native_batch_norm},
      {"aten::_native_batch_norm_legit.no_stats", &native_batch_norm},
      {"aten::native_batch_norm_backward", &native_batch_norm_backward},
  });
}

}  // namespace graftpt
