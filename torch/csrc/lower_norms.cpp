// graft's PyTorch bridge: lowerings composed of other lowered aten ops for layers whose
// PyTorch kernels are CPU/CUDA-only: group norm's backward (native_group_norm is decomposed by
// PyTorch, its backward is not) and adaptive max pooling where the input divides evenly into
// the output (then it is max pooling with a window of input/output, indices included).
#include "lower.h"

#include <ATen/ATen.h>

namespace graftpt {
namespace {

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group,
// output_mask[3]) -> (grad_input, grad_weight, grad_bias): per group of C/G channels,
// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) with dxhat = dy * weight.
void group_norm_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &dy = a.t(0), &x = a.t(1);
  int64_t N = a.i(5), C = a.i(6), HxW = a.i(7), G = a.i(8);
  auto mask = a.v[9].toBoolList();
  TORCH_CHECK(G > 0 && C % G == 0, "native_group_norm_backward: ", C, " channels in ", G, " groups");
  int64_t D = C / G * HxW;
  at::Tensor xg = x.reshape({N, G, D}), mean = a.t(2).reshape({N, G, 1}), rstd = a.t(3).reshape({N, G, 1});
  at::Tensor xhat = xg.sub(mean).mul(rstd);
  at::Tensor dyc = dy.reshape({N, C, HxW});
  at::Tensor gi, gw, gb;
  if (mask[1]) gw = dyc.mul(xhat.reshape({N, C, HxW})).sum({0, 2});
  if (mask[2]) gb = dyc.sum({0, 2});
  if (mask[0]) {
    at::Tensor dxhat = a.none(4) ? dyc : dyc.mul(a.t(4).reshape({1, C, 1}));
    dxhat = dxhat.reshape({N, G, D});
    at::Tensor m1 = dxhat.mean({2}, true), m2 = dxhat.mul(xhat).mean({2}, true);
    gi = dxhat.sub(m1).sub(xhat.mul(m2)).mul(rstd).reshape(x.sizes());
  }
  push(s, gi);
  push(s, gw);
  push(s, gb);
}

// adaptive_max_pool2d(self, output_size) -> (out, indices): max pooling with window and stride
// input/output when each output divides its input, else PyTorch's CPU kernel.
void adaptive_max_pool2d(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  auto out = a.il(1);
  int64_t H = x.size(-2), W = x.size(-1);
  if (out.size() != 2 || out[0] <= 0 || out[1] <= 0 || H % out[0] || W % out[1])
    return fall_back(op, s, a);
  std::vector<int64_t> k{H / out[0], W / out[1]};
  auto r = at::max_pool2d_with_indices(x, k, k, {0, 0}, {1, 1}, false);
  push(s, std::get<0>(r));
  push(s, std::get<1>(r));
}

// adaptive_max_pool2d_backward(grad_output, self, indices): the indices are flat positions in
// each input plane, as max pooling's are.
void adaptive_max_pool2d_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &g = a.t(0), &x = a.t(1);
  int64_t H = x.size(-2), W = x.size(-1), oh = g.size(-2), ow = g.size(-1);
  if (oh <= 0 || ow <= 0 || H % oh || W % ow) return fall_back(op, s, a);
  std::vector<int64_t> k{H / oh, W / ow};
  push(s, at::max_pool2d_with_indices_backward(g, x, k, k, {0, 0}, {1, 1}, false, a.t(2)));
}

}  // namespace

void add_norm_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::native_group_norm_backward", &group_norm_backward},
      {"aten::adaptive_max_pool2d", &adaptive_max_pool2d},
      {"aten::adaptive_max_pool2d_backward", &adaptive_max_pool2d_backward},
  });
}

}  // namespace graftpt
