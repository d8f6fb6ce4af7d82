// graft's PyTorch bridge: nearest and (bi/tri)linear upsampling in 1, 2 and 3 dims and their
// backward ops (F.interpolate, nn.Upsample: segmentation heads, U-Nets, FPNs). Separable: a
// gather along each spatial dim in turn (index_select), weighted for linear modes; the backward
// scatters back with index_add. The source indices and weights are PyTorch's (ATen/native/UpSample.h: the same
// scale, the same float arithmetic), computed once per geometry on the host and kept on the
// device.
#include "lower.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <tuple>

namespace graftpt {
namespace {

// One axis of a resampling: source indices i0, i1 ([out] int64) and the weight of i1 ([out],
// the input's dtype; nearest has none).
struct AxisTable {
  at::Tensor i0, i1, w1;
};

// PyTorch's scale of an axis (area_pixel_compute_scale), in the opmath type T.
template <typename T>
T axis_scale(int64_t in, int64_t out, bool align, std::optional<double> scale) {
  if (align) return out > 1 ? (T)(in - 1) / (T)(out - 1) : (T)0;
  return scale && *scale > 0 ? (T)(1.0 / *scale) : (T)in / (T)out;
}

template <typename T>
AxisTable linear_axis(int64_t in, int64_t out, bool align, std::optional<double> scale,
                      at::ScalarType st) {
  T sc = axis_scale<T>(in, out, align, scale);
  at::Tensor i0 = at::empty({out}, at::kLong), i1 = at::empty({out}, at::kLong),
             w1 = at::empty({out}, at::kDouble);
  for (int64_t d = 0; d < out; ++d) {
    T src = align ? sc * (T)d : std::max(sc * ((T)d + (T)0.5) - (T)0.5, (T)0);
    int64_t lo = std::min((int64_t)src, in - 1);
    i0.data_ptr<int64_t>()[d] = lo;
    i1.data_ptr<int64_t>()[d] = lo + (lo < in - 1 ? 1 : 0);
    w1.data_ptr<double>()[d] = (double)(src - (T)lo);
  }
  return {i0, i1, w1.to(st)};
}

AxisTable nearest_axis(int64_t in, int64_t out, std::optional<double> scale) {
  at::Tensor i0 = at::empty({out}, at::kLong);
  float sc = axis_scale<float>(in, out, false, scale);
  for (int64_t d = 0; d < out; ++d)
    i0.data_ptr<int64_t>()[d] = out == in ? d : out == 2 * in ? d >> 1
                                : std::min((int64_t)std::floor((float)d * sc), in - 1);
  return {i0, at::Tensor(), at::Tensor()};
}

// The axis table on the current graft device, made once per geometry (leaked at exit, like
// the bridge's other device constants: graft's state is gone before static destructors run).
const AxisTable &axis_table(bool linear, int64_t in, int64_t out, bool align,
                            std::optional<double> scale, at::ScalarType st) {
  using Key = std::tuple<bool, int64_t, int64_t, bool, double, int, int>;
  static auto *cache = new std::map<Key, AxisTable>();
  Key k{linear, in, out, align, scale ? *scale : -1.0, (int)st, cur_device()};
  auto it = cache->find(k);
  if (it != cache->end()) return it->second;
  AxisTable t = !linear ? nearest_axis(in, out, scale)
              : st == at::kDouble ? linear_axis<double>(in, out, align, scale, st)
                                  : linear_axis<float>(in, out, align, scale, st);
  c10::Device dev(kDevType, (c10::DeviceIndex)cur_device());
  AxisTable d{t.i0.to(dev), t.i1.defined() ? t.i1.to(dev) : t.i1, t.w1.defined() ? t.w1.to(dev) : t.w1};
  return cache->emplace(k, d).first->second;
}

std::optional<double> opt_double(const Args &a, int i) {
  if (a.none(i)) return std::nullopt;
  return a.d(i);
}

// The weights of dim of an x of ndim dims: [out, 1, ..., 1], broadcasting over the dims after.
at::Tensor dim_weights(const at::Tensor &w1, int64_t dim, int64_t ndim) {
  std::vector<int64_t> sh(ndim - dim, 1);
  sh[0] = w1.size(0);
  return w1.view(sh);
}

// x resampled along dim.
at::Tensor resample_dim(const at::Tensor &x, int64_t dim, const AxisTable &t) {
  at::Tensor lo = x.index_select(dim, t.i0);
  if (!t.w1.defined()) return lo;
  at::Tensor w1 = dim_weights(t.w1, dim, x.dim());
  return lo.mul(w1.neg().add(1)).add(x.index_select(dim, t.i1).mul(w1));
}

// The gradient of resample_dim: g scattered back onto an axis of length in.
at::Tensor resample_dim_backward(const at::Tensor &g, int64_t dim, int64_t in, const AxisTable &t) {
  auto sz = g.sizes().vec();
  sz[dim] = in;
  at::Tensor z = at::zeros(sz, g.options());
  if (!t.w1.defined()) return z.index_add(dim, t.i0, g);
  at::Tensor w1 = dim_weights(t.w1, dim, g.dim());
  return z.index_add(dim, t.i0, g.mul(w1.neg().add(1))).index_add(dim, t.i1, g.mul(w1));
}

// upsample_nearest{1,2,3}d(self, output_size, scales...?) /
// upsample_{linear1d,bilinear2d,trilinear3d}(self, output_size, align_corners, scales...?)
template <bool Linear, int N>
void upsample(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  TORCH_CHECK(x.dim() == N + 2, op.schema().name(), ": expected a ", N + 2, "-D input (batch, "
              "channels and ", N, " spatial dims), got ", x.sizes());
  auto out = a.il(1);
  TORCH_CHECK((int)out.size() == N, op.schema().name(), ": expected ", N, " output sizes, got ", out);
  bool align = Linear && a.b(2);
  int sc = Linear ? 3 : 2;
  at::Tensor y = x;
  for (int d = 0; d < N; ++d)
    y = resample_dim(y, 2 + d, axis_table(Linear, x.size(2 + d), out[d], align, opt_double(a, sc + d),
                                          x.scalar_type()));
  push(s, y);
}

// upsample_nearest{1,2,3}d_backward(grad, output_size, input_size, scales...?) /
// upsample_{linear1d,bilinear2d,trilinear3d}_backward(grad, output_size, input_size,
// align_corners, scales...?)
template <bool Linear, int N>
void upsample_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &g = a.t(0);
  auto out = a.il(1), in = a.il(2);
  TORCH_CHECK((int)in.size() == N + 2 && (int)out.size() == N && g.dim() == N + 2,
              op.schema().name(), ": expected ", N + 2, "-D sizes, got input ", in, " and output ", out);
  bool align = Linear && a.b(3);
  int sc = Linear ? 4 : 3;
  at::Tensor r = g;
  for (int d = N - 1; d >= 0; --d)
    r = resample_dim_backward(r, 2 + d, in[2 + d],
                              axis_table(Linear, in[2 + d], out[d], align, opt_double(a, sc + d),
                                         g.scalar_type()));
  push(s, r);
}

}  // namespace

void add_resample_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::upsample_nearest1d", &upsample<false, 1>},
      {"aten::upsample_nearest1d_backward", &upsample_backward<false, 1>},
      {"aten::upsample_nearest2d", &upsample<false, 2>},
      {"aten::upsample_nearest2d_backward", &upsample_backward<false, 2>},
      {"aten::upsample_nearest3d", &upsample<false, 3>},
      {"aten::upsample_nearest3d_backward", &upsample_backward<false, 3>},
      {"aten::upsample_linear1d", &upsample<true, 1>},
      {"aten::upsample_linear1d_backward", &upsample_backward<true, 1>},
      {"aten::upsample_bilinear2d", &upsample<true, 2>},
      {"aten::upsample_bilinear2d_backward", &upsample_backward<true, 2>},
      {"aten::upsample_trilinear3d", &upsample<true, 3>},
      {"aten::upsample_trilinear3d_backward", &upsample_backward<true, 3>},
  });
}

}  // namespace graftpt
