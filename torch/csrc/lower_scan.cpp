// graft's PyTorch bridge: cumulative sums (aten::cumsum; its backward is a flipped cumsum),
// what is built on them (embedding bags, nn.EmbeddingBag sum and mean), and arange.
//
// graft's IR has no scan op, so a cumsum is a product with a triangular matrix of ones: along a
// dim of n <= 16, x[M, n] x U[n, n] (U[i][j] = i <= j) runs as one GEMM; a longer dim is cut in
// blocks of b (a power of two near sqrt(n), 16 to 256), each summed that way, and the running
// totals of the blocks (a cumsum of n / b values, the same way) added back: O(n * b) work, on
// BLAS. A fixed block of 256 made an embedding bag's 385 positions a 2x256x256 float64 product
// (34 us of a 250 us step); blocks of 32 do 13x32x32.
// Integers are summed in float64 (exact to 2^53) and converted back.
#include "lower.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <tuple>

namespace graftpt {
namespace {

constexpr int64_t kScanMinBlock = 16, kScanMaxBlock = 256;

// The block for a dim of n: the power of two nearest sqrt(n) from above, in [16, 256] (the
// in-block work n * b and the totals' (n / b)^2 balance there; BLAS wants b not too small).
int64_t scan_block(int64_t n) {
  int64_t b = kScanMinBlock;
  while (b < kScanMaxBlock && b * b < n) b *= 2;
  return b;
}

// U[i][j] = (i <= j) as an [n, n] tensor of dtype st on the current graft device: made once per
// (n, dtype, device) and kept as data, so a step's graph reads it instead of computing it again
// (an embedding bag's 384 indices: a 256x256 float64 block built every step took 0.045 of its
// 0.217 ms). Past kUpperBytes the cache is emptied (a steady loop refills it once); leaked at
// exit like the bridge's other device constants.
at::Tensor upper_ones(int64_t n, at::ScalarType st) {
  static constexpr size_t kUpperBytes = 32u << 20;
  using Key = std::tuple<int64_t, int, int>;
  static auto *cache = new std::map<Key, at::Tensor>();
  static size_t bytes = 0;
  Key k{n, (int)st, cur_device()};
  auto it = cache->find(k);
  if (it != cache->end()) return it->second;
  size_t b = (size_t)(n * n) * c10::elementSize(st);
  if (bytes + b > kUpperBytes) {
    cache->clear();
    bytes = 0;
  }
  bytes += b;
  c10::Device dev(kDevType, (c10::DeviceIndex)cur_device());
  return cache->emplace(k, at::ones({n, n}, at::TensorOptions().dtype(st)).triu().to(dev)).first->second;
}

// Inclusive cumsum along the last dim of a 2-D float [M, n] graft tensor of finite values.
at::Tensor cumsum_rows(const at::Tensor &x) {
  int64_t M = x.size(0), n = x.size(1), b = scan_block(n);
  if (n <= b) {
    return at::matmul(x, upper_ones(n, x.scalar_type()));
  }
  int64_t nb = (n + b - 1) / b, padded = nb * b;
  at::Tensor xp = padded == n ? x : at::constant_pad_nd(x, {0, padded - n}, 0);
  at::Tensor in_block = cumsum_rows(xp.reshape({M * nb, b})).reshape({M, nb, b});
  at::Tensor totals = in_block.select(2, b - 1);                          // [M, nb]
  at::Tensor before = cumsum_rows(totals).sub(totals).unsqueeze(2);        // exclusive
  at::Tensor r = in_block.add(before).reshape({M, padded});
  return padded == n ? r : r.slice(1, 0, n);
}

// cumsum_rows for any values: a product would make inf * 0 = NaN before an inf, so the finite
// part and the running counts of NaN, +inf and -inf are summed (one product over 4M rows) and
// the result is NaN after a NaN or after both infinities, else the infinity seen, else the sum.
at::Tensor cumsum_rows_nonfinite(const at::Tensor &x) {
  int64_t M = x.size(0);
  at::Tensor fin = x.isfinite();
  at::Tensor rows = at::cat({at::where(fin, x, 0.0), x.isnan().to(x.scalar_type()),
                             x.isposinf().to(x.scalar_type()), x.isneginf().to(x.scalar_type())}, 0);
  auto parts = cumsum_rows(rows).split(M, 0);
  at::Tensor nan = parts[1].gt(0), pinf = parts[2].gt(0), ninf = parts[3].gt(0);
  at::Tensor r = at::where(ninf, -INFINITY, parts[0]);
  r = at::where(pinf, INFINITY, r);
  return at::where(nan.logical_or(pinf.logical_and(ninf)), NAN, r);
}

// cumsum(self, dim, *, dtype?)
void cumsum(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  at::ScalarType out_st = !a.none(2) ? (at::ScalarType)a.i(2)
                        : at::isIntegralType(t.scalar_type(), true) ? at::kLong : t.scalar_type();
  if (t.dim() == 0 || t.numel() == 0) {
    push(s, t.to(out_st).clone());
    return;
  }
  int64_t d = c10::maybe_wrap_dim(a.i(1), t.dim());
  at::ScalarType work = out_st == at::kDouble || !at::isFloatingType(out_st) ? at::kDouble : at::kFloat;
  at::Tensor x = t.to(out_st).to(work).movedim(d, -1);  // dtype= converts before summing
  auto moved = x.sizes().vec();
  at::Tensor x2 = x.reshape({-1, moved.back()});
  at::Tensor r = (at::isFloatingType(out_st) ? cumsum_rows_nonfinite(x2) : cumsum_rows(x2))
                     .reshape(moved).movedim(-1, d);
  push(s, r.to(out_st));
}

// Embedding bags, sum and mean modes: each index's bag (offset2bag) is a cumsum of the bag
// starts; the rows, weighted (per-sample weights, 0 at padding_idx), are index_add'ed into
// their bags. Max mode, sparse gradients and scale_grad_by_freq take PyTorch's kernels.
enum { kBagSum = 0, kBagMean = 1 };

// _embedding_bag / _embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq,
// mode, sparse, per_sample_weights?, include_last_offset, padding_idx)
//   -> (output, offset2bag, bag_size, max_indices), as the CPU kernel fills them
void embedding_bag(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &weight = a.t(0), &indices = a.t(1), &offsets = a.t(2);
  int64_t mode = a.i(4);
  if ((mode != kBagSum && mode != kBagMean) || a.b(5) || indices.dim() != 1 || offsets.dim() != 1 ||
      weight.dim() != 2 || (!a.none(6) && mode != kBagSum))
    return fall_back(op, s, a);
  int64_t n = indices.numel(), B = offsets.numel() - (a.b(7) ? 1 : 0), D = weight.size(1);
  TORCH_CHECK(B >= 0, "embedding_bag: include_last_offset needs at least one offset");
  at::Tensor idx = indices.to(at::kLong), offs = offsets.to(at::kLong).slice(0, 0, B);
  at::Tensor starts = at::zeros({n + 1}, idx.options()).index_add(0, offs, at::ones({B}, idx.options()));
  at::Tensor bag = n ? cumsum_rows(starts.slice(0, 0, n).to(at::kDouble).unsqueeze(0)).squeeze(0)
                           .to(at::kLong).sub(1)
                     : at::zeros({0}, idx.options());
  int64_t pad = a.i(8);
  at::Tensor keep = pad >= 0 ? idx.ne(pad) : at::ones({n}, idx.options().dtype(at::kBool));
  at::Tensor w = keep.to(weight.scalar_type());
  if (!a.none(6)) w = w.mul(a.t(6));
  at::Tensor rows = weight.index_select(0, idx).mul(w.unsqueeze(1));
  at::Tensor out = at::zeros({B, D}, weight.options()).index_add(0, bag, rows);
  at::Tensor size = at::zeros({B}, idx.options());
  if (mode == kBagMean) {
    size = size.index_add(0, bag, keep.to(at::kLong));
    out = out.div(size.clamp_min(1).to(weight.scalar_type()).unsqueeze(1));
  }
  push(s, out);
  push(s, bag);
  push(s, size);
  push(s, size.clone());
}

// _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices,
// num_weights, scale_grad_by_freq, mode, per_sample_weights?, padding_idx) and
// _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices,
// num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights?, padding_idx): the same,
// with an offsets and a sparse argument (sparse gradients take PyTorch's kernel).
template <bool WithOffsets>
void embedding_bag_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const int k = WithOffsets ? 1 : 0;  // arguments after indices shift by one
  const at::Tensor &grad = a.t(0), &indices = a.t(1);
  int64_t mode = a.i(7 + k);
  bool sparse = WithOffsets && a.b(9);
  if ((mode != kBagSum && mode != kBagMean) || a.b(6 + k) || sparse || indices.dim() != 1)
    return fall_back(op, s, a);
  int psw = WithOffsets ? 10 : 8, pad_at = psw + 1;
  at::Tensor idx = indices.to(at::kLong), bag = a.t(2 + k).to(at::kLong);
  at::Tensor g = grad.index_select(0, bag);
  if (mode == kBagMean)
    g = g.div(a.t(3 + k).to(at::kLong).clamp_min(1).index_select(0, bag).to(grad.scalar_type()).unsqueeze(1));
  int64_t pad = a.i(pad_at);
  at::Tensor w = pad >= 0 ? idx.ne(pad).to(grad.scalar_type()) : at::ones({idx.numel()}, grad.options());
  if (!a.none(psw)) w = w.mul(a.t(psw));
  g = g.mul(w.unsqueeze(1));
  push(s, at::zeros({a.i(5 + k), grad.size(1)}, grad.options()).index_add(0, idx, g));
}

// _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode,
// padding_idx): each index's gradient is its bag's gradient . its row (0 at padding_idx)
void embedding_bag_psw_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  TORCH_CHECK(a.i(5) == kBagSum, "embedding_bag: per_sample_weights are only supported in sum mode");
  at::Tensor idx = a.t(2).to(at::kLong), bag = a.t(4).to(at::kLong);
  at::Tensor d = a.t(0).index_select(0, bag).mul(a.t(1).index_select(0, idx)).sum(1);
  if (a.i(6) >= 0) d = d.mul(idx.ne(a.i(6)).to(d.scalar_type()));
  push(s, d);
}

// arange(end) / arange.start(start, end) / arange.start_step(start, end, step), then dtype?,
// layout?, device?, pin_memory?: start + i * step for i < ceil((end - start) / step), computed
// in float64 (PyTorch's accumulate type) and converted; integers when every bound is one.
void arange(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const std::string &ov = op.schema().overload_name();
  int nb = ov.empty() ? 1 : ov == "start" ? 2 : 3;  // scalar bounds before dtype
  c10::Scalar start = nb > 1 ? a.sc(0) : c10::Scalar(0), end = a.sc(nb > 1 ? 1 : 0),
              step = nb > 2 ? a.sc(2) : c10::Scalar(1);
  bool ints = !start.isFloatingPoint() && !end.isFloatingPoint() && !step.isFloatingPoint();
  at::ScalarType st = !a.none(nb) ? (at::ScalarType)a.i(nb) : ints ? at::kLong : default_float();
  double b = start.toDouble(), e = end.toDouble(), d = step.toDouble();
  TORCH_CHECK(d != 0, "arange: step must be nonzero");
  TORCH_CHECK((d > 0 && e >= b) || (d < 0 && e <= b), "arange: upper bound and larger bound "
              "inconsistent with step sign");
  int64_t n = (int64_t)std::ceil((e - b) / d);
  G i = chk(dev_iota(GRAFT_F64, 1, &n, 0), "arange");
  G v = chk(graft_add(chk(graft_mul(i.get(), scal(d, at::kDouble).get()), "arange").get(),
                      scal(b, at::kDouble).get()), "arange");
  push(s, wrap(conv(std::move(v), st)));
}

}  // namespace

void add_scan_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::cumsum", &cumsum},
      {"aten::_embedding_bag", &embedding_bag},
      {"aten::_embedding_bag_forward_only", &embedding_bag},
      {"aten::_embedding_bag_dense_backward", &embedding_bag_backward<false>},
      {"aten::_embedding_bag_backward", &embedding_bag_backward<true>},
      {"aten::_embedding_bag_per_sample_weights_backward", &embedding_bag_psw_backward},
      {"aten::arange", &arange},
      {"aten::arange.start", &arange},
      {"aten::arange.start_step", &arange},
  });
}

}  // namespace graftpt
