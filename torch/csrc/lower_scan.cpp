// graft's PyTorch bridge: cumulative sums (aten::cumsum; its backward is a flipped cumsum),
// what is built on them (embedding bags, nn.EmbeddingBag sum and mean), and arange.
//
// graft's IR has no scan op, so a cumsum is a product with a triangular matrix of ones: along a
// dim of n <= kScanBlock, x[M, n] x U[n, n] (U[i][j] = i <= j) runs as one GEMM; a longer dim is
// cut in blocks of kScanBlock, each summed that way, and the running totals of the blocks (a
// cumsum of n / kScanBlock values, the same way) added back: O(n * kScanBlock) work, on BLAS.
// Integers are summed in float64 (exact to 2^53) and converted back.
#include "lower.h"

#include <ATen/ATen.h>

namespace graftpt {
namespace {

constexpr int64_t kScanBlock = 256;

// U[i][j] = (i <= j) as an [n, n] tensor of dtype st on the current graft device.
at::Tensor upper_ones(int64_t n, at::ScalarType st) {
  const int64_t sh[2] = {n, n};
  G rows = chk(dev_iota(GRAFT_I64, 2, sh, 0), "cumsum"), cols = chk(dev_iota(GRAFT_I64, 2, sh, 1), "cumsum");
  return wrap(conv(chk(graft_le(rows.get(), cols.get()), "cumsum"), st));
}

// Inclusive cumsum along the last dim of a 2-D float [M, n] graft tensor.
at::Tensor cumsum_rows(const at::Tensor &x) {
  int64_t M = x.size(0), n = x.size(1);
  if (n <= kScanBlock) {
    return at::matmul(x, upper_ones(n, x.scalar_type()));
  }
  int64_t nb = (n + kScanBlock - 1) / kScanBlock, padded = nb * kScanBlock;
  at::Tensor xp = padded == n ? x : at::constant_pad_nd(x, {0, padded - n}, 0);
  at::Tensor in_block = cumsum_rows(xp.reshape({M * nb, kScanBlock})).reshape({M, nb, kScanBlock});
  at::Tensor totals = in_block.select(2, kScanBlock - 1);                 // [M, nb]
  at::Tensor before = cumsum_rows(totals).sub(totals).unsqueeze(2);        // exclusive
  at::Tensor r = in_block.add(before).reshape({M, padded});
  return padded == n ? r : r.slice(1, 0, n);
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
  at::Tensor x = t.to(work).movedim(d, -1);
  auto moved = x.sizes().vec();
  at::Tensor r = cumsum_rows(x.reshape({-1, moved.back()})).reshape(moved).movedim(-1, d);
  push(s, r.to(out_st));
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
      {"aten::arange", &arange},
      {"aten::arange.start", &arange},
      {"aten::arange.start_step", &arange},
  });
}

}  // namespace graftpt
