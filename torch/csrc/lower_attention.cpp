// graft's PyTorch bridge: the fast paths torch 2's nn.MultiheadAttention and
// nn.TransformerEncoderLayer take at inference on a PrivateUse1 device
// (aten::_native_multi_head_attention, aten::_transformer_encoder_layer_fwd). PyTorch has only
// CPU and CUDA kernels for them; here they are composed of the aten ops graft lowers (linear,
// matmul, softmax, layer_norm), called on graft tensors, so they trace into the step's graph.
// The math follows PyTorch's native kernels (ATen/native/transformers/attention.cpp,
// transformer.cpp): q scaled by 1/sqrt(head dim) before q k^T, a mask is boolean (non-zero =
// masked out; a float mask counts as its non-zero entries, as the kernels convert it), a row
// masked everywhere gets zero weights.
#include "lower.h"

#include <ATen/ATen.h>

#include <cmath>

namespace graftpt {
namespace {

// [B, T, E] -> [B, heads, T, E / heads]
at::Tensor split_heads(const at::Tensor &x, int64_t heads) {
  return x.view({x.size(0), x.size(1), heads, x.size(2) / heads}).transpose(1, 2);
}

// The mask as [B or 1, heads or 1, L, S] booleans (true: masked out), by PyTorch's mask_type:
// 0 an attention mask [L, S], 1 a key padding mask [B, S], 2 merged [B, heads, L, S].
at::Tensor attn_mask_4d(const at::Tensor &mask, std::optional<int64_t> mask_type, int64_t B) {
  at::Tensor m = mask.scalar_type() == at::kBool ? mask : mask.ne(0);
  if (m.dim() == 4) return m;
  if (mask_type && *mask_type == 1) {
    TORCH_CHECK(m.dim() == 2 && m.size(0) == B, "_native_multi_head_attention: a key padding mask "
                "is [batch, source length], got ", m.sizes());
    return m.view({B, 1, 1, m.size(1)});
  }
  TORCH_CHECK(m.dim() == 2, "_native_multi_head_attention: an attention mask is [target length, "
              "source length], got ", m.sizes());
  return m.view({1, 1, m.size(0), m.size(1)});
}

// Multi-head attention of [B, L, E] queries over [B, S, E] keys and values; returns the
// projected output [B, L, E] and the weights [B, heads, L, S] (undefined unless asked).
std::pair<at::Tensor, at::Tensor> mha(const at::Tensor &query, const at::Tensor &key,
                                      const at::Tensor &value, int64_t E, int64_t heads,
                                      const at::Tensor &qkv_w, const at::Tensor &qkv_b,
                                      const at::Tensor &proj_w, const at::Tensor &proj_b,
                                      const std::optional<at::Tensor> &mask,
                                      std::optional<int64_t> mask_type, bool need_weights) {
  TORCH_CHECK(query.dim() == 3 && query.size(2) == E && E % heads == 0,
              "_native_multi_head_attention: query must be [batch, length, ", E, "] with ", E,
              " divisible by ", heads, " heads, got ", query.sizes());
  at::Tensor q, k, v;
  if (query.is_same(key) && key.is_same(value)) {
    auto qkv = at::linear(query, qkv_w, qkv_b).chunk(3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    auto w = qkv_w.chunk(3, 0), b = qkv_b.chunk(3, 0);
    q = at::linear(query, w[0], b[0]), k = at::linear(key, w[1], b[1]), v = at::linear(value, w[2], b[2]);
  }
  int64_t B = query.size(0), L = query.size(1), D = E / heads;
  q = split_heads(q, heads).mul(1.0 / std::sqrt((double)D));
  k = split_heads(k, heads), v = split_heads(v, heads);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1));  // [B, heads, L, S]
  at::Tensor attn;
  if (mask && mask->defined()) {
    at::Tensor m = attn_mask_4d(*mask, mask_type, B);
    attn = at::softmax(scores.masked_fill(m, -INFINITY), -1);
    attn = attn.masked_fill(m.all(-1, true), 0.0);  // a row masked everywhere: zero weights
  } else {
    attn = at::softmax(scores, -1);
  }
  at::Tensor out = at::matmul(attn, v).transpose(1, 2).reshape({B, L, E});
  return {at::linear(out, proj_w, proj_b), need_weights ? attn : at::Tensor()};
}

std::optional<at::Tensor> opt_tensor(const Args &a, int i) {
  if (a.none(i)) return std::nullopt;
  return a.t(i);
}

std::optional<int64_t> opt_int(const Args &a, int i) {
  if (a.none(i)) return std::nullopt;
  return a.i(i);
}

// (query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask?,
//  need_weights, average_attn_weights, mask_type?) -> (output, weights)
void native_mha(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  bool need = a.b(10), average = a.b(11);
  auto r = mha(a.t(0), a.t(1), a.t(2), a.i(3), a.i(4), a.t(5), a.t(6), a.t(7), a.t(8),
               opt_tensor(a, 9), opt_int(a, 12), need);
  at::Tensor w = r.second;
  if (need && average) w = w.mean(1);
  if (!need) w = at::empty({0}, a.t(0).options());
  push(s, r.first);
  push(s, w);
}

// (src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
//  norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1,
//  ffn_bias_1, ffn_weight_2, ffn_bias_2, mask?, mask_type?) -> output
void encoder_layer_fwd(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &src = a.t(0);
  int64_t E = a.i(1);
  bool gelu = a.b(7), norm_first = a.b(8);
  double eps = a.d(9);
  auto norm = [&](const at::Tensor &x, int w) { return at::layer_norm(x, {E}, a.t(w), a.t(w + 1), eps); };
  at::Tensor x = norm_first ? norm(src, 10) : src;
  x = mha(x, x, x, E, a.i(2), a.t(3), a.t(4), a.t(5), a.t(6), opt_tensor(a, 18), opt_int(a, 19),
          false).first.add(src);
  if (!norm_first) x = norm(x, 10);
  at::Tensor res = x;
  if (norm_first) x = norm(x, 12);
  x = at::linear(x, a.t(14), a.t(15));
  x = gelu ? at::gelu(x) : at::relu(x);
  x = at::linear(x, a.t(16), a.t(17)).add(res);
  if (!norm_first) x = norm(x, 12);
  push(s, x);
}

}  // namespace

void add_attention_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::_native_multi_head_attention", &native_mha},
      {"aten::_transformer_encoder_layer_fwd", &encoder_layer_fwd},
  });
}

}  // namespace graftpt
