// graft's PyTorch bridge: aten::lstm (what nn.LSTM calls) as ONE autograd node whose forward is
// graft_lstm and whose backward is graft_lstm_backward (src/api/rnn.c), layer after layer.
//
// Why here: aten::lstm is CompositeImplicitAutograd, so PyTorch decomposes it on the autograd
// key into per-timestep ops (~45 per step forward and backward, each through the dispatcher and
// the boxed kernel): a training step of the bench's LSTM LM was trace-bound. A kernel registered
// on the autograd key of graft's dispatch key is reached before that decomposition. It only
// translates: the math is graft's. What graft does not fuse (bidirectional, dropout between
// layers while training, proj_size, dtypes other than f32/f64, tensors off graft's device,
// empty or mis-shaped inputs, double backward) takes PyTorch's decomposition (at::native::lstm,
// the kernel the composite registration runs), so it behaves exactly as before.
#include "lower.h"  // gshape

#include <ATen/ops/lstm_native.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace graftpt {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

static_assert(kKey == c10::DispatchKey::PrivateUse1, "the registration below names PrivateUse1's autograd key");

// Layer l's slice of a [L,B,H] state, as [B,H] (NULL stays NULL).
G layer_state(const G &all, int64_t l) {
  if (!all) return G();
  auto s = gshape(all);
  const int64_t lo[3] = {l, 0, 0}, hi[3] = {l + 1, s[1], s[2]}, bh[2] = {s[1], s[2]};
  G one = chk(graft_slice(all.get(), lo, hi, nullptr), "lstm");
  return chk(graft_reshape(one.get(), 2, bh), "lstm");
}

// Per-layer [B,H] states stacked as [L,B,H].
G stack_layers(const std::vector<G> &per_layer) {
  std::vector<G> rows;
  std::vector<graft_tensor *> ptrs;
  for (const G &v : per_layer) {
    auto s = gshape(v);
    const int64_t sh[3] = {1, s[0], s[1]};
    rows.push_back(chk(graft_reshape(v.get(), 3, sh), "lstm"));
    ptrs.push_back(rows.back().get());
  }
  if (rows.size() == 1) return rows[0];
  return chk(graft_concat(ptrs.data(), (int)ptrs.size(), 0), "lstm");
}

G opt_value(const at::Tensor &t) { return t.defined() ? value(t) : G(); }

// Parameters of layer l in aten::lstm's flat list: w_ih, w_hh[, b_ih, b_hh].
struct LayerParams {
  G w_ih, w_hh, b_ih, b_hh;
};
LayerParams layer_params(at::TensorList params, bool has_biases, int64_t l) {
  size_t k = (size_t)l * (has_biases ? 4 : 2);
  LayerParams p{value(params[k]), value(params[k + 1]), G(), G()};
  if (has_biases) p.b_ih = value(params[k + 2]), p.b_hh = value(params[k + 3]);
  return p;
}

struct LstmFn : public torch::autograd::Function<LstmFn> {
  // x, h0 [L,B,H], c0 [L,B,H], the flat parameters; returns y, h_n, c_n as aten::lstm does.
  static variable_list forward(AutogradContext *ctx, const at::Tensor &x, const at::Tensor &h0,
                               const at::Tensor &c0, at::TensorList params, bool has_biases,
                               int64_t layers, bool batch_first) {
    std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
    G in = value(x), hv = value(h0), cv = value(c0);
    std::vector<G> hn, cn;
    std::vector<at::Tensor> saved;  // per layer: y, state (what graft_lstm_backward reads)
    for (int64_t l = 0; l < layers; ++l) {
      LayerParams p = layer_params(params, has_biases, l);
      G h = layer_state(hv, l), c = layer_state(cv, l);
      graft_tensor *out[4];
      chk_status(graft_lstm(in.get(), h.get(), c.get(), p.w_ih.get(), p.w_hh.get(), p.b_ih.get(),
                            p.b_hh.get(), batch_first, out), "lstm");
      G y(out[0]), st(out[3]);
      hn.emplace_back(out[1]);
      cn.emplace_back(out[2]);
      saved.push_back(wrap(y));
      saved.push_back(wrap(st));
      in = y;
    }
    variable_list to_save = {x, h0, c0};
    to_save.insert(to_save.end(), params.begin(), params.end());
    to_save.insert(to_save.end(), saved.begin(), saved.end());
    ctx->save_for_backward(std::move(to_save));
    ctx->saved_data["nparams"] = (int64_t)params.size();
    ctx->saved_data["has_biases"] = has_biases;
    ctx->saved_data["batch_first"] = batch_first;
    ctx->set_materialize_grads(false);  // an unused output's gradient stays NULL: no zeros traced
    return {wrap(in), wrap(stack_layers(hn)), wrap(stack_layers(cn))};
  }

  static variable_list backward(AutogradContext *ctx, variable_list grads);
};

// What forward saved: x, h0, c0, the parameters, then y and the state of each layer. All are
// saved variables (not saved_data), so the autograd engine releases them once backward ran.
struct Saved {
  variable_list sv;
  size_t np;
  int64_t layers;
  bool has_biases, batch_first;
  explicit Saved(AutogradContext *ctx)
      : sv(ctx->get_saved_variables()), np((size_t)ctx->saved_data["nparams"].toInt()),
        layers((int64_t)(sv.size() - 3 - np) / 2), has_biases(ctx->saved_data["has_biases"].toBool()),
        batch_first(ctx->saved_data["batch_first"].toBool()) {}
  variable_list params() const { return variable_list(sv.begin() + 3, sv.begin() + 3 + np); }
  const at::Tensor &y(int64_t l) const { return sv[3 + np + 2 * (size_t)l]; }
  const at::Tensor &state(int64_t l) const { return sv[3 + np + 2 * (size_t)l + 1]; }
};

// create_graph=True: the gradients must be differentiable, which graft's are not as autograd
// sees them. Recompute through PyTorch's decomposition from the same inputs and differentiate it.
variable_list lstm_double_backward(AutogradContext *ctx, const variable_list &grads) {
  Saved s(ctx);
  const variable_list &sv = s.sv;
  variable_list params = s.params();
  auto r = at::native::lstm(sv[0], {sv[1], sv[2]}, params, s.has_biases, s.layers, 0.0, false,
                            false, s.batch_first);
  at::Tensor outs[3] = {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
  variable_list o, go, wrt;
  for (int k = 0; k < 3; ++k)
    if (grads[k].defined()) o.push_back(outs[k]), go.push_back(grads[k]);
  variable_list all = {sv[0], sv[1], sv[2]};
  all.insert(all.end(), params.begin(), params.end());
  for (auto &t : all)
    if (t.requires_grad()) wrt.push_back(t);
  variable_list res(all.size() + 3);
  if (o.empty() || wrt.empty()) return res;
  auto g = torch::autograd::grad(o, wrt, go, /*retain_graph=*/true, /*create_graph=*/true,
                                 /*allow_unused=*/true);
  for (size_t k = 0, j = 0; k < all.size(); ++k)
    if (all[k].requires_grad()) res[k] = g[j++];
  return res;
}

variable_list LstmFn::backward(AutogradContext *ctx, variable_list grads) {
  if (torch::autograd::GradMode::is_enabled()) return lstm_double_backward(ctx, grads);
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  Saved s(ctx);
  const variable_list &sv = s.sv;
  variable_list params = s.params();
  bool has_biases = s.has_biases, batch_first = s.batch_first;
  int64_t layers = s.layers;
  size_t per = has_biases ? 4 : 2;

  G hv = value(sv[1]), cv = value(sv[2]);
  G dy = opt_value(grads[0]), dhn = opt_value(grads[1]), dcn = opt_value(grads[2]);
  variable_list res(3 + params.size() + 3);  // x, h0, c0, params, then the non-tensor arguments
  std::vector<G> dh0(layers), dc0(layers);
  for (int64_t l = layers - 1; l >= 0; --l) {
    LayerParams p = layer_params(params, has_biases, l);
    G in = l ? value(s.y(l - 1)) : value(sv[0]);
    G h = layer_state(hv, l), c = layer_state(cv, l);
    G dh = layer_state(dhn, l), dc = layer_state(dcn, l);
    G y = value(s.y(l)), st = value(s.state(l));
    graft_tensor *out[6];
    chk_status(graft_lstm_backward(in.get(), h.get(), c.get(), p.w_ih.get(), p.w_hh.get(), y.get(),
                                   st.get(), dy.get(), dh.get(), dc.get(), batch_first, out),
               "lstm backward");
    dy = G(out[0]);  // the gradient of this layer's input: the previous layer's dy
    dh0[l] = G(out[1]), dc0[l] = G(out[2]);
    G db(out[5]);
    size_t k = 3 + (size_t)l * per;
    res[k] = wrap(G(out[3]));
    res[k + 1] = wrap(G(out[4]));
    if (has_biases) res[k + 2] = wrap(db), res[k + 3] = wrap(db);  // b_ih and b_hh alike
  }
  if (ctx->needs_input_grad(0)) res[0] = wrap(dy);
  if (ctx->needs_input_grad(1)) res[1] = wrap(stack_layers(dh0));
  if (ctx->needs_input_grad(2)) res[2] = wrap(stack_layers(dc0));
  return res;
}

// t is a graft tensor on like's device, in like's dtype.
bool graft_like(const at::Tensor &t, const at::Tensor &like) {
  return t.defined() && is_graft(t) && t.scalar_type() == like.scalar_type() &&
         t.device() == like.device();
}

// Whether graft's LSTM takes this call: a unidirectional stack without projections and without
// dropout between layers, every tensor on the input's graft device in its dtype (f32 or f64),
// shapes as nn.LSTM makes them. Anything else keeps PyTorch's decomposition (and its errors).
bool fusable(const at::Tensor &x, at::TensorList hx, at::TensorList params, bool has_biases,
             int64_t layers, double dropout, bool train, bool bidirectional, bool batch_first) {
  if (bidirectional || (dropout > 0 && train && layers > 1) || hx.size() != 2 || layers < 1) return false;
  // a graft value: dynamo's fake tensors on graft's device take the decomposition, which they
  // can trace (graft's LSTM function reads values)
  if (!is_graft(x) || !dynamic_cast<GraftImpl *>(x.unsafeGetTensorImpl()) ||
      (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble))
    return false;
  if (x.dim() != 3 || x.numel() == 0) return false;
  size_t per = has_biases ? 4 : 2;
  if (params.size() != (size_t)layers * per) return false;  // proj_size adds w_hr per layer
  int64_t B = batch_first ? x.size(0) : x.size(1), I = x.size(2);
  for (const auto &h : hx)
    if (!graft_like(h, x) || h.dim() != 3 || h.size(0) != layers || h.size(1) != B) return false;
  int64_t H = hx[0].size(2);
  if (H < 1 || hx[1].size(2) != H) return false;
  for (int64_t l = 0; l < layers; ++l) {
    int64_t in = l ? H : I;
    for (size_t k = 0; k < per; ++k) {
      const at::Tensor &p = params[(size_t)l * per + k];
      if (!graft_like(p, x)) return false;
      bool ok = k == 0 ? p.dim() == 2 && p.size(0) == 4 * H && p.size(1) == in
              : k == 1 ? p.dim() == 2 && p.size(0) == 4 * H && p.size(1) == H
                       : p.dim() == 1 && p.size(0) == 4 * H;
      if (!ok) return false;
    }
  }
  return true;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_autograd(const at::Tensor &x, at::TensorList hx,
                                                             at::TensorList params, bool has_biases,
                                                             int64_t layers, double dropout, bool train,
                                                             bool bidirectional, bool batch_first) {
  if (!fusable(x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first)) {
    count_lowering("lstm_decomposed");
    return at::native::lstm(x, hx, params, has_biases, layers, dropout, train, bidirectional, batch_first);
  }
  count_lowering("lstm_fused");
  auto out = LstmFn::apply(x, hx[0], hx[1], params, has_biases, layers, batch_first);
  return {out[0], out[1], out[2]};
}

// ---- the fused cells PyTorch's RNN decomposition calls on a PrivateUse1 device ----------------
// (_thnn_fused_lstm_cell / _gru_cell and their backwards: what the decomposition of a
// bidirectional or projected LSTM, or of a GRU, runs per timestep.) Gates as PyTorch's CUDA
// kernels lay them out; the workspace holds what the backward needs: LSTM [i, f, g, o]
// activated ([B, 4H]), GRU [r, z, n, hn, hx] ([B, 5H]).
const char *kCell = "rnn cell";

G ew(graft_tensor *(*f)(graft_tensor *, graft_tensor *), const G &a, const G &b) {
  return chk(f(a.get(), b.get()), kCell);
}
G un(graft_tensor *(*f)(graft_tensor *), const G &a) { return chk(f(a.get()), kCell); }

// Column block k (of width h) of a [B, n*h] value.
G block(const G &v, int64_t k, int64_t h) {
  auto sh = gshape(v);
  const int64_t lo[2] = {0, k * h}, hi[2] = {sh[0], (k + 1) * h};
  return chk(graft_slice(v.get(), lo, hi, nullptr), kCell);
}

G cat_cols(std::initializer_list<G> vs) {
  std::vector<graft_tensor *> p;
  for (const G &v : vs) p.push_back(v.get());
  return chk(graft_concat(p.data(), (int)p.size(), 1), kCell);
}

G one_minus(const G &v) { return ew(graft_sub, scal(1.0, gst(v)), v); }

// Input and hidden gates summed, with the biases that are given.
G gates_sum(const Args &a) {
  G g = ew(graft_add, value(a.t(0)), value(a.t(1)));
  if (!a.none(3)) g = ew(graft_add, g, value(a.t(3)));
  if (!a.none(4)) g = ew(graft_add, g, value(a.t(4)));
  return g;
}

void fused_lstm_cell(const c10::OperatorHandle &op, Stack *s) {  // -> (hy, cy, workspace)
  Args a(op, s);
  G gates = gates_sum(a), cx = value(a.t(2));
  int64_t H = gshape(cx).back();
  G i = un(graft_sigmoid, block(gates, 0, H)), f = un(graft_sigmoid, block(gates, 1, H));
  G g = un(graft_tanh, block(gates, 2, H)), o = un(graft_sigmoid, block(gates, 3, H));
  G cy = ew(graft_add, ew(graft_mul, f, cx), ew(graft_mul, i, g));
  G hy = ew(graft_mul, o, un(graft_tanh, cy));
  push(s, wrap(std::move(hy)));
  push(s, wrap(std::move(cy)));
  push(s, wrap(cat_cols({i, f, g, o})));
}

// (grad_hy?, grad_cy?, cx, cy, workspace, has_bias) -> (grad_gates, grad_cx, grad_bias?)
void fused_lstm_cell_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G cx = value(a.t(2)), cy = value(a.t(3)), ws = value(a.t(4));
  int64_t H = gshape(cx).back();
  G i = block(ws, 0, H), f = block(ws, 1, H), g = block(ws, 2, H), o = block(ws, 3, H);
  G zero = fullc(0, graft_get_dtype(cx.get()), gshape(cx));
  G ghy = a.none(0) ? zero : value(a.t(0)), gcy = a.none(1) ? zero : value(a.t(1));
  G tcy = un(graft_tanh, cy);
  G go = ew(graft_mul, ghy, tcy);
  G dc = ew(graft_add, ew(graft_mul, ew(graft_mul, ghy, o), one_minus(ew(graft_mul, tcy, tcy))), gcy);
  G gi = ew(graft_mul, ew(graft_mul, dc, g), ew(graft_mul, i, one_minus(i)));
  G gf = ew(graft_mul, ew(graft_mul, dc, cx), ew(graft_mul, f, one_minus(f)));
  G gg = ew(graft_mul, ew(graft_mul, dc, i), one_minus(ew(graft_mul, g, g)));
  go = ew(graft_mul, go, ew(graft_mul, o, one_minus(o)));
  G grad_gates = cat_cols({gi, gf, gg, go});
  G gcx = ew(graft_mul, dc, f);
  const int axis0 = 0;
  at::Tensor gb;
  if (a.b(5)) gb = wrap(chk(graft_sum(grad_gates.get(), &axis0, 1, false), kCell));
  push(s, wrap(std::move(grad_gates)));
  push(s, wrap(std::move(gcx)));
  push(s, gb);
}

void fused_gru_cell(const c10::OperatorHandle &op, Stack *s) {  // -> (hy, workspace)
  Args a(op, s);
  G ig = value(a.t(0)), hg = value(a.t(1)), hx = value(a.t(2));
  if (!a.none(3)) ig = ew(graft_add, ig, value(a.t(3)));
  if (!a.none(4)) hg = ew(graft_add, hg, value(a.t(4)));
  int64_t H = gshape(hx).back();
  G r = un(graft_sigmoid, ew(graft_add, block(ig, 0, H), block(hg, 0, H)));
  G z = un(graft_sigmoid, ew(graft_add, block(ig, 1, H), block(hg, 1, H)));
  G hn = block(hg, 2, H);
  G n = un(graft_tanh, ew(graft_add, block(ig, 2, H), ew(graft_mul, r, hn)));
  G hy = ew(graft_add, n, ew(graft_mul, z, ew(graft_sub, hx, n)));
  push(s, wrap(std::move(hy)));
  push(s, wrap(cat_cols({r, z, n, hn, hx})));
}

// (grad_hy, workspace, has_bias) -> (grad_input_gates, grad_hidden_gates, grad_hx,
// grad_input_bias?, grad_hidden_bias?)
void fused_gru_cell_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G ghy = value(a.t(0)), ws = value(a.t(1));
  int64_t H = gshape(ghy).back();
  G r = block(ws, 0, H), z = block(ws, 1, H), n = block(ws, 2, H), hn = block(ws, 3, H),
    hx = block(ws, 4, H);
  G gz = ew(graft_mul, ew(graft_mul, ghy, ew(graft_sub, hx, n)), ew(graft_mul, z, one_minus(z)));
  G ghx = ew(graft_mul, ghy, z);
  G gn = ew(graft_mul, ew(graft_mul, ghy, one_minus(z)), one_minus(ew(graft_mul, n, n)));
  G ghn = ew(graft_mul, gn, r);
  G gr = ew(graft_mul, ew(graft_mul, gn, hn), ew(graft_mul, r, one_minus(r)));
  G gin = cat_cols({gr, gz, gn}), ghid = cat_cols({gr, gz, ghn});
  const int axis0 = 0;
  at::Tensor gib, ghb;
  if (a.b(2)) {
    gib = wrap(chk(graft_sum(gin.get(), &axis0, 1, false), kCell));
    ghb = wrap(chk(graft_sum(ghid.get(), &axis0, 1, false), kCell));
  }
  push(s, wrap(std::move(gin)));
  push(s, wrap(std::move(ghid)));
  push(s, wrap(std::move(ghx)));
  push(s, gib);
  push(s, ghb);
}

}  // namespace

void add_rnn_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::_thnn_fused_lstm_cell", &fused_lstm_cell},
      {"aten::_thnn_fused_lstm_cell_backward_impl", &fused_lstm_cell_backward},
      {"aten::_thnn_fused_gru_cell", &fused_gru_cell},
      {"aten::_thnn_fused_gru_cell_backward", &fused_gru_cell_backward},
  });
}

}  // namespace graftpt

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("lstm.input", TORCH_FN(graftpt::lstm_autograd));
}
