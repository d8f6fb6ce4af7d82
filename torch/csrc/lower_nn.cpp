// graft's PyTorch bridge: neural-network lowerings: the matmul family and pooling (convolutions:
// lower_conv.cpp).
#include "lower.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace graftpt {
namespace {

// Linear algebra ------------------------------------------------------------------
void mm(const c10::OperatorHandle &op, Stack *s) {  // mm / bmm / matmul / dot / mv
  Args a(op, s);
  const at::Tensor &x = a.t(0), &y = a.t(1);
  same_dtype(x, y, op.schema().name().c_str());
  std::string n = op.schema().name();
  if (n == "aten::mm") {
    TORCH_CHECK(x.dim() == 2, "self must be a matrix");
    TORCH_CHECK(y.dim() == 2, "mat2 must be a matrix");
    TORCH_CHECK(x.size(1) == y.size(0), "mat1 and mat2 shapes cannot be multiplied (", x.size(0), "x",
                x.size(1), " and ", y.size(0), "x", y.size(1), ")");
  } else if (n == "aten::bmm") {
    TORCH_CHECK(x.dim() == 3 && y.dim() == 3, "batch1 and batch2 must be 3D tensors");
    TORCH_CHECK(x.size(0) == y.size(0) && x.size(2) == y.size(1), "Expected size for first two dimensions "
                "of batch2 tensor to be: [", x.size(0), ", ", x.size(2), "] but got: [", y.size(0), ", ",
                y.size(1), "].");
  }
  G gx = tv(x), gy = tv(y);
  push(s, wrap(chk(graft_matmul(gx.get(), gy.get()), n.c_str())));
}

// beta * self + alpha * (mat1 @ mat2) for addmm(self, mat1, mat2, beta, alpha),
// baddbmm(self, b1, b2, beta, alpha) and addmv(self, mat, vec, beta, alpha); beta == 0 ignores self.
void addmm_like(const Args &a, Stack *s, const char *what) {
  const at::Tensor &b = a.t(0), &x = a.t(1), &y = a.t(2);
  at::ScalarType st = x.scalar_type();
  G gx = tv(x), gy = tv(y);
  G r = chk(graft_matmul(gx.get(), gy.get()), what);
  double beta = a.d(3), alpha = a.d(4);
  if (alpha != 1.0) r = chk(graft_mul(r.get(), scal(alpha, st).get()), what);
  if (beta != 0.0) {
    G gb = tv(b);
    if (beta != 1.0) gb = chk(graft_mul(gb.get(), scal(beta, st).get()), what);
    r = chk(graft_add(r.get(), gb.get()), what);
  }
  push(s, wrap(std::move(r)));
}

void addmm(const c10::OperatorHandle &op, Stack *s) {  // addmm / baddbmm
  Args a(op, s);
  const at::Tensor &b = a.t(0), &x = a.t(1), &y = a.t(2);
  same_dtype(x, y, "addmm");
  same_dtype(b, x, "addmm");
  if (op.schema().name() == "aten::addmm") {
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2, "addmm: mat1 and mat2 must be matrices");
    TORCH_CHECK(x.size(1) == y.size(0), "mat1 and mat2 shapes cannot be multiplied (", x.size(0), "x",
                x.size(1), " and ", y.size(0), "x", y.size(1), ")");
  }
  addmm_like(a, s, "addmm");
}

void addmv(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  same_dtype(a.t(1), a.t(2), "addmv");
  addmm_like(a, s, "addmv");
}

// Pooling ----------------------------------------------------------------------------
std::vector<int> pair(const std::vector<int64_t> &v, int64_t dflt) {
  if (v.empty()) return {(int)dflt, (int)dflt};
  if (v.size() == 1) return {(int)v[0], (int)v[0]};
  return {(int)v[0], (int)v[1]};
}

// kernel, stride (empty: the kernel), padding[, dilation] at a.v[i...]: each an int or a pair.
struct PoolArgs {
  std::vector<int> k, st, p, dl;
  std::vector<int> e;  // ceil_mode's extra rows/cols past the high padding (set by avg_pool_args)
};

PoolArgs pool_args(const Args &a, int i, bool dilation) {
  PoolArgs r;
  r.k = pair(a.il(i), 1);
  r.st = a.il(i + 1).empty() ? r.k : pair(a.il(i + 1), 1);
  r.p = pair(a.il(i + 2), 0);
  r.dl = dilation ? pair(a.il(i + 3), 1) : std::vector<int>{1, 1};
  return r;
}

// One window offset: x's last two dims sliced from (r, c) at stride st, OH x OW points.
G window_at(const G &x, int64_t r, int64_t c, int64_t OH, int64_t OW, const std::vector<int> &st,
            const char *what) {
  auto xs = gshape(x);
  int nd = (int)xs.size();
  std::vector<int64_t> a0(nd, 0), a1 = xs, step(nd, 1);
  a0[nd - 2] = r;
  a1[nd - 2] = r + (OH - 1) * st[0] + 1;
  a0[nd - 1] = c;
  a1[nd - 1] = c + (OW - 1) * st[1] + 1;
  step[nd - 2] = st[0];
  step[nd - 1] = st[1];
  return chk(graft_slice(x.get(), a0.data(), a1.data(), step.data()), what);
}

// The adjoint of window_at: g [..., OH, OW] spread from (r, c) at stride st over an HP x WP
// plane of zeros; empty when the window runs past the plane.
G window_place(const G &g, int64_t r, int64_t c, int64_t HP, int64_t WP, const std::vector<int> &st,
               const char *what) {
  auto gs = gshape(g);
  int nd = (int)gs.size();
  std::vector<int64_t> lo(nd, 0), hi(nd, 0), in(nd, 0);
  lo[nd - 2] = r;
  hi[nd - 2] = HP - (r + (gs[nd - 2] - 1) * st[0] + 1);
  lo[nd - 1] = c;
  hi[nd - 1] = WP - (c + (gs[nd - 1] - 1) * st[1] + 1);
  if (hi[nd - 2] < 0 || hi[nd - 1] < 0) return G();
  in[nd - 2] = st[0] - 1;
  in[nd - 1] = st[1] - 1;
  return chk(graft_pad_ex(g.get(), lo.data(), hi.data(), in.data(), 0.0), what);
}

// acc + t (t alone while acc is empty).
G accumulate(const G &acc, const G &t, const char *what) {
  return acc ? chk(graft_add(acc.get(), t.get()), what) : t;
}

// x's last two dims cropped to [r, r + H) x [c, c + W).
G crop_hw(const G &x, int64_t r, int64_t c, int64_t H, int64_t W, const char *what) {
  auto xs = gshape(x);
  int nd = (int)xs.size();
  std::vector<int64_t> a0(nd, 0), a1 = xs;
  a0[nd - 2] = r;
  a0[nd - 1] = c;
  a1[nd - 2] = r + H;
  a1[nd - 1] = c + W;
  return chk(graft_slice(x.get(), a0.data(), a1.data(), nullptr), what);
}

// Sum over every kernel offset of g [..., OH, OW] placed back at its window positions in an
// input of spatial size H, W (padding p, plus ceil_mode's extra rows/cols e past the high
// padding; stride st): the adjoint of a sliding-window gather.
G window_scatter(const G &g, int64_t H, int64_t W, const std::vector<int> &k,
                 const std::vector<int> &st, const std::vector<int> &p,
                 const std::vector<int> &e = {0, 0}) {
  auto gs = gshape(g);
  int nd = (int)gs.size();
  int64_t OH = gs[nd - 2], OW = gs[nd - 1];
  if (k[0] == st[0] && k[1] == st[1] && p[0] == 0 && p[1] == 0 && OH * k[0] == H && OW * k[1] == W) {
    // Non-overlapping windows tiling the input: broadcast each cell over its window.
    std::vector<int64_t> s6(gs.begin(), gs.end() - 2), b6;
    s6.insert(s6.end(), {OH, 1, OW, 1});
    b6 = s6;
    b6[nd - 1] = k[0];
    b6[nd + 1] = k[1];
    G r = reshape_to(g, s6);
    r = chk(graft_broadcast_to(r.get(), (int)b6.size(), b6.data()), "pool backward");
    std::vector<int64_t> os(gs.begin(), gs.end() - 2);
    os.insert(os.end(), {H, W});
    return reshape_to(r, os);
  }
  int64_t HP = H + 2 * p[0] + e[0], WP = W + 2 * p[1] + e[1];
  G acc;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      G t = window_place(g, i, j, HP, WP, st, "pool backward");
      if (t) acc = accumulate(acc, t, "pool backward");  // empty: offset past the padded input
    }
  return crop_hw(acc, p[0], p[1], H, W, "pool backward");
}

// PyTorch's pooling output size (with ceil_mode).
int64_t pool_out(int64_t H, int k, int s, int p, int d, bool ceil) {
  int64_t num = H + 2 * p - (int64_t)d * (k - 1) - 1;
  int64_t o = (ceil ? (num + s - 1) / s : num / s) + 1;
  if (ceil && (o - 1) * s >= H + p) --o;
  return o;
}

// Pads the last two dims: lo = p, hi = p + e, with value.
G pad_hw(const G &v, const std::vector<int> &p, const std::vector<int> &e, double value) {
  auto sh = gshape(v);
  int nd = (int)sh.size();
  std::vector<int64_t> lo(nd, 0), hi(nd, 0);
  for (int d = 0; d < 2; ++d) {
    lo[nd - 2 + d] = p[d];
    hi[nd - 2 + d] = p[d] + e[d];
  }
  return chk(graft_pad(v.get(), lo.data(), hi.data(), value), "pool");
}

// Pooling windows as sums / maxima of k*k strided slices when GRAFT_TORCH_POOL=slices (all
// natively compiled, but today's fusion recomputes the pooled producer inside a following
// im2col: 15 ms instead of 1 in the demo CNN); graft's pooling primitives by default.
bool use_slices(const std::vector<int> &k) {
  static const char *m = getenv("GRAFT_TORCH_POOL");
  return m && std::string(m) == "slices" && k[0] * k[1] <= 64;
}

// Mean over each window of an (already padded) x: sum of the offsets' strided slices / (kh*kw).
G window_avg(const G &x, const std::vector<int> &k, const std::vector<int> &st) {
  if (!use_slices(k)) {
    std::vector<int> z = {0, 0};
    return chk(graft_avg_pool2d(x.get(), k.data(), st.data(), z.data()), "avg_pool2d");
  }
  auto xs = gshape(x);
  int nd = (int)xs.size();
  int64_t OH = (xs[nd - 2] - k[0]) / st[0] + 1, OW = (xs[nd - 1] - k[1]) / st[1] + 1;
  G acc;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) acc = accumulate(acc, window_at(x, i, j, OH, OW, st, "avg_pool2d"), "avg_pool2d");
  return chk(graft_mul(acc.get(), fullc(1.0 / ((double)k[0] * k[1]), graft_get_dtype(acc.get())).get()), "avg_pool2d");
}

// Rows/cols past the high padding that ceil_mode's last window reaches (0 without ceil_mode).
std::vector<int> ceil_extra(const at::Tensor &x, const PoolArgs &pa, bool ceil) {
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &dl = pa.dl;
  std::vector<int> e = {0, 0};
  for (int d = 0; d < 2 && ceil; ++d) {
    int64_t n = x.size(x.dim() - 2 + d), o = pool_out(n, k[d], st[d], p[d], dl[d], true);
    e[d] = (int)std::max<int64_t>(0, (o - 1) * st[d] + (int64_t)dl[d] * (k[d] - 1) + 1 - (n + 2 * p[d]));
  }
  return e;
}

// Max pooling by window offsets: out = the max over the offsets' strided slices of the padded
// input (graft's max_pool2d when native: no dilation); hits[q]: offset q holds the first maximum
// of its window (as PyTorch's CPU kernel picks), for the indices and the gradient.
struct MaxWindows {
  G xpad, out;
  std::vector<G> hits;
  std::vector<int64_t> lin;  // per offset: (i*dl0 - p0)*W + (j*dl1 - p1)
};

MaxWindows max_windows(const G &gx, int64_t W, const PoolArgs &pa, const std::vector<int> &e, double ninf,
                       bool native) {
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &dl = pa.dl;
  MaxWindows r;
  bool padded = p[0] || p[1] || e[0] || e[1];
  r.xpad = padded || !native ? pad_hw(gx, p, e, ninf) : gx;
  auto xs = gshape(r.xpad);
  int nd = (int)xs.size();
  int64_t OH = (xs[nd - 2] - (int64_t)dl[0] * (k[0] - 1) - 1) / st[0] + 1;
  int64_t OW = (xs[nd - 1] - (int64_t)dl[1] * (k[1] - 1) - 1) / st[1] + 1;
  if (native) {
    std::vector<int> z = {0, 0};
    r.out = chk(graft_max_pool2d(r.xpad.get(), k.data(), st.data(), z.data()), "max_pool2d");
  }
  std::vector<G> views;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      views.push_back(window_at(r.xpad, (int64_t)i * dl[0], (int64_t)j * dl[1], OH, OW, st, "max_pool2d"));
      r.lin.push_back(((int64_t)i * dl[0] - p[0]) * W + ((int64_t)j * dl[1] - p[1]));
      if (!native) r.out = r.out ? chk(graft_maximum(r.out.get(), views.back().get()), "max_pool2d") : views.back();
    }
  G taken = fullc(0, GRAFT_BOOL, gshape(r.out));
  for (auto &v : views) {
    G eq = chk(graft_eq(v.get(), r.out.get()), "max_pool2d");
    G nt = chk(graft_logical_not(taken.get()), "max_pool2d");
    G hit = chk(graft_logical_and(eq.get(), nt.get()), "max_pool2d");
    taken = chk(graft_logical_or(taken.get(), hit.get()), "max_pool2d");
    r.hits.push_back(hit);
  }
  return r;
}

bool pool_ok(const at::Tensor &x, const PoolArgs &pa) {
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &dl = pa.dl;
  // an empty batch is lowered (empty result); empty planes are PyTorch's error, through the fallback
  if ((x.dim() != 3 && x.dim() != 4) || x.size(-1) == 0 || x.size(-2) == 0) return false;
  for (int d = 0; d < 2; ++d) {
    if (dl[d] < 1 || k[d] <= 0 || st[d] <= 0 || p[d] < 0 || p[d] > k[d] / 2) return false;
    if (pool_out(x.size(x.dim() - 2 + d), k[d], st[d], p[d], dl[d], false) < 1) return false;
  }
  return true;
}

// Cells each average-pooling window divides by, as PyTorch counts them: the window clipped to
// the padded input (count_include_pad) or to the input itself; a constant (folded) tensor.
G pool_counts(const at::Tensor &x, const std::vector<int> &k, const std::vector<int> &st,
              const std::vector<int> &p, const std::vector<int> &e, bool include_pad) {
  graft_dtype dt = to_gdt(x.scalar_type());
  int64_t H = x.size(-2), W = x.size(-1);
  G m;
  if (include_pad) {
    m = fullc(1, dt, {H + 2 * p[0], W + 2 * p[1]});
    m = pad_hw(m, {0, 0}, e, 0.0);
  } else {
    m = pad_hw(fullc(1, dt, {H, W}), p, e, 0.0);
  }
  std::vector<int> z = {0, 0};
  G c = chk(graft_avg_pool2d(m.get(), k.data(), st.data(), z.data()), "avg_pool2d");
  return chk(graft_mul(c.get(), fullc((double)k[0] * k[1], dt).get()), "avg_pool2d");
}

// avg_pool2d(_backward)'s kernel, stride, padding at a.v[i...] (then ceil_mode, count_include_pad,
// divisor_override?) and ceil_mode's extra rows/cols e; false: the CPU fallback's case.
bool avg_pool_args(const Args &a, const at::Tensor &x, int i, PoolArgs &pa) {
  pa = pool_args(a, i, false);
  if (!pool_ok(x, pa) || !at::isFloatingType(x.scalar_type()) || (!a.none(i + 5) && a.i(i + 5) == 0)) return false;
  pa.e = ceil_extra(x, pa, a.b(i + 3));
  return true;
}

// avg_pool2d(self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override?)
void avg_pool2d(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  PoolArgs pa;
  if (!avg_pool_args(a, x, 1, pa)) return fall_back(op, s, a);
  bool include_pad = a.b(5);
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &e = pa.e;
  G gx = tv(x);
  graft_dtype dt = to_gdt(x.scalar_type());
  if (e[0] == 0 && e[1] == 0 && a.none(6) && (include_pad || (p[0] == 0 && p[1] == 0))) {
    push(s, wrap(window_avg((p[0] || p[1]) ? pad_hw(gx, p, {0, 0}, 0.0) : gx, k, st)));
    return;
  }
  G xp = pad_hw(gx, p, e, 0.0);
  G sum = window_avg(xp, k, st);
  sum = chk(graft_mul(sum.get(), fullc((double)k[0] * k[1], dt).get()), "avg_pool2d");
  G r = a.none(6) ? chk(graft_div(sum.get(), pool_counts(x, k, st, p, e, include_pad).get()), "avg_pool2d")
                  : chk(graft_mul(sum.get(), fullc(1.0 / (double)a.i(6), dt).get()), "avg_pool2d");
  push(s, wrap(std::move(r)));
}

// avg_pool2d_backward(grad_output, self, kernel, stride, padding, ceil_mode, count_include_pad, divisor?)
void avg_pool2d_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  PoolArgs pa;
  if (!avg_pool_args(a, x, 2, pa)) return fall_back(op, s, a);
  G g = conv(tv(a.t(0)), x.scalar_type());
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &e = pa.e;
  graft_dtype dt = to_gdt(x.scalar_type());
  if (!a.none(7)) g = chk(graft_mul(g.get(), fullc(1.0 / (double)a.i(7), dt).get()), "avg_pool2d_backward");
  else if (e[0] == 0 && e[1] == 0 && (a.b(6) || (p[0] == 0 && p[1] == 0)))
    g = chk(graft_mul(g.get(), fullc(1.0 / ((double)k[0] * k[1]), dt).get()), "avg_pool2d_backward");
  else
    g = chk(graft_div(g.get(), pool_counts(x, k, st, p, e, a.b(6)).get()), "avg_pool2d_backward");
  push(s, wrap(window_scatter(g, x.size(-2), x.size(-1), k, st, p, e)));
}

// Max pooling by slices of window offsets (dilation, or GRAFT_TORCH_POOL=slices), not graft's
// max_pool2d primitives.
bool max_by_slices(const PoolArgs &pa) { return pa.dl[0] != 1 || pa.dl[1] != 1 || use_slices(pa.k); }

// max_pool2d_with_indices(self, kernel, stride, padding, dilation, ceil_mode) -> (out, indices)
// The indices (flat positions in each H*W plane of the first maximum, as PyTorch's CPU kernel
// picks) are computed in graft from the window offsets; lazily, so nothing runs unless used.
void max_pool2d_with_indices(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  PoolArgs pa = pool_args(a, 1, true);
  const at::Tensor &x = a.t(0);
  if (!pool_ok(x, pa) || x.scalar_type() == at::kBool) return fall_back(op, s, a);
  auto e = ceil_extra(x, pa, a.b(5));
  double ninf = at::isFloatingType(x.scalar_type()) ? -INFINITY : -9.2e18;  // pads never win
  MaxWindows mw = max_windows(tv(x), x.size(-1), pa, e, ninf, !max_by_slices(pa));
  auto os = gshape(mw.out);
  int nd = (int)os.size();
  std::vector<int64_t> sp = {os[nd - 2], os[nd - 1]};
  G rows = chk(dev_iota(GRAFT_I64, 2, sp.data(), 0), "max_pool2d");
  G cols = chk(dev_iota(GRAFT_I64, 2, sp.data(), 1), "max_pool2d");
  rows = chk(graft_mul(rows.get(), fullc((double)pa.st[0] * x.size(-1), GRAFT_I64).get()), "max_pool2d");
  cols = chk(graft_mul(cols.get(), fullc(pa.st[1], GRAFT_I64).get()), "max_pool2d");
  G base = chk(graft_add(rows.get(), cols.get()), "max_pool2d");  // (oh*s0)*W + ow*s1
  G idx = fullc(0, GRAFT_I64, os);
  for (size_t q = 0; q < mw.hits.size(); ++q) {
    G lin = chk(graft_add(base.get(), fullc((double)mw.lin[q], GRAFT_I64).get()), "max_pool2d");
    idx = chk(graft_where(mw.hits[q].get(), lin.get(), idx.get()), "max_pool2d");
  }
  push(s, wrap(std::move(mw.out)));
  push(s, wrap(std::move(idx)));
}

// max_pool2d_with_indices_backward(grad_output, self, kernel, stride, padding, dilation, ceil_mode,
// indices): graft's own gradient (first maximum of each window) from self; indices unused.
void max_pool2d_with_indices_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  PoolArgs pa = pool_args(a, 2, true);
  const at::Tensor &x = a.t(1);
  if (!pool_ok(x, pa) || !at::isFloatingType(x.scalar_type())) return fall_back(op, s, a);
  const auto &k = pa.k, &st = pa.st, &p = pa.p, &dl = pa.dl;
  auto e = ceil_extra(x, pa, a.b(6));
  G gx = tv(x), g = conv(tv(a.t(0)), x.scalar_type());
  if (max_by_slices(pa)) {
    MaxWindows mw = max_windows(gx, x.size(-1), pa, e, -INFINITY, false);
    auto xs = gshape(mw.xpad);
    int nd = (int)xs.size();
    G z = fullc(0, to_gdt(x.scalar_type()));
    G acc;
    size_t q = 0;
    for (int i = 0; i < k[0]; ++i)
      for (int j = 0; j < k[1]; ++j, ++q) {
        G gq = chk(graft_where(mw.hits[q].get(), g.get(), z.get()), "max_pool2d_backward");
        G t = window_place(gq, (int64_t)i * dl[0], (int64_t)j * dl[1], xs[nd - 2], xs[nd - 1], st,
                           "max_pool2d_backward");
        acc = accumulate(acc, t, "max_pool2d_backward");
      }
    push(s, wrap(crop_hw(acc, p[0], p[1], x.size(-2), x.size(-1), "max_pool2d_backward")));
    return;
  }
  if (e[0] == 0 && e[1] == 0) {
    push(s, wrap(chk(graft_max_pool2d_backward(gx.get(), g.get(), k.data(), st.data(), p.data()),
                     "max_pool2d_backward")));
    return;
  }
  // ceil_mode windows past the padding: the gradient for the explicitly padded input, cropped.
  std::vector<int> z = {0, 0};
  G xp = pad_hw(gx, p, e, -INFINITY);
  G r = chk(graft_max_pool2d_backward(xp.get(), g.get(), k.data(), st.data(), z.data()), "max_pool2d_backward");
  push(s, wrap(crop_hw(r, p[0], p[1], x.size(-2), x.size(-1), "max_pool2d_backward")));
}

// Adaptive average pooling. Output cell i of a dim of size n -> m covers [floor(i*n/m),
// ceil((i+1)*n/m)). Divisible sizes are avg_pool with kernel = stride = n/m; otherwise a
// pooling matrix P [m, n] (built from iota in the graph, so constant-folded) and P x P^T.
G adaptive_matrix(int64_t n, int64_t m, graft_dtype dt) {
  std::vector<int64_t> sh = {m, n};
  G io = chk(dev_iota(GRAFT_I64, 2, sh.data(), 0), "adaptive_avg_pool2d");
  G ih = chk(dev_iota(GRAFT_I64, 2, sh.data(), 1), "adaptive_avg_pool2d");
  G N = fullc((double)n, GRAFT_I64), M = fullc((double)m, GRAFT_I64);
  G start = chk(graft_mul(io.get(), N.get()), "adaptive_avg_pool2d");
  start = chk(graft_div(start.get(), M.get()), "adaptive_avg_pool2d");
  G end = chk(graft_add(io.get(), fullc(1, GRAFT_I64).get()), "adaptive_avg_pool2d");
  end = chk(graft_mul(end.get(), N.get()), "adaptive_avg_pool2d");
  end = chk(graft_add(end.get(), fullc((double)(m - 1), GRAFT_I64).get()), "adaptive_avg_pool2d");
  end = chk(graft_div(end.get(), M.get()), "adaptive_avg_pool2d");
  G in1 = chk(graft_ge(ih.get(), start.get()), "adaptive_avg_pool2d");
  G in2 = chk(graft_lt(ih.get(), end.get()), "adaptive_avg_pool2d");
  G in = chk(graft_logical_and(in1.get(), in2.get()), "adaptive_avg_pool2d");
  G len = chk(graft_sub(end.get(), start.get()), "adaptive_avg_pool2d");
  len = chk(graft_convert(len.get(), dt), "adaptive_avg_pool2d");
  G w = chk(graft_reciprocal(len.get()), "adaptive_avg_pool2d");
  return chk(graft_where(in.get(), w.get(), fullc(0, dt).get()), "adaptive_avg_pool2d");
}

// _adaptive_avg_pool2d(self, output_size)
void adaptive_avg_pool2d(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  auto os = a.il(1);
  if ((x.dim() != 3 && x.dim() != 4) || os.size() != 2 || !at::isFloatingType(x.scalar_type()) ||
      os[0] <= 0 || os[1] <= 0 || x.numel() == 0)
    return fall_back(op, s, a);
  int64_t H = x.size(-2), W = x.size(-1);
  G gx = tv(x);
  if (H % os[0] == 0 && W % os[1] == 0) {
    std::vector<int> k = {(int)(H / os[0]), (int)(W / os[1])}, p = {0, 0};
    push(s, wrap(window_avg(gx, k, k)));
    return;
  }
  graft_dtype dt = to_gdt(x.scalar_type());
  G ph = adaptive_matrix(H, os[0], dt), pw = adaptive_matrix(W, os[1], dt);
  G pwt = chk(graft_t(pw.get()), "adaptive_avg_pool2d");
  G r = chk(graft_matmul(ph.get(), gx.get()), "adaptive_avg_pool2d");
  push(s, wrap(chk(graft_matmul(r.get(), pwt.get()), "adaptive_avg_pool2d")));
}

// _adaptive_avg_pool2d_backward(grad_output, self)
void adaptive_avg_pool2d_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1), &go = a.t(0);
  if ((x.dim() != 3 && x.dim() != 4) || !at::isFloatingType(x.scalar_type()) || x.numel() == 0)
    return fall_back(op, s, a);
  int64_t H = x.size(-2), W = x.size(-1), OH = go.size(-2), OW = go.size(-1);
  G g = conv(tv(go), x.scalar_type());
  if (H % OH == 0 && W % OW == 0) {
    std::vector<int> k = {(int)(H / OH), (int)(W / OW)}, p = {0, 0};
    g = chk(graft_mul(g.get(), fullc(1.0 / ((double)k[0] * k[1]), graft_get_dtype(g.get())).get()),
            "adaptive_avg_pool2d_backward");
    push(s, wrap(window_scatter(g, H, W, k, k, p)));
    return;
  }
  graft_dtype dt = to_gdt(x.scalar_type());
  G ph = adaptive_matrix(H, OH, dt), pw = adaptive_matrix(W, OW, dt);
  G pht = chk(graft_t(ph.get()), "adaptive_avg_pool2d_backward");
  G r = chk(graft_matmul(pht.get(), g.get()), "adaptive_avg_pool2d_backward");
  push(s, wrap(chk(graft_matmul(r.get(), pw.get()), "adaptive_avg_pool2d_backward")));
}

}  // namespace

void add_nn_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::mm", &mm},
      {"aten::bmm", &mm},
      {"aten::dot", &mm},
      {"aten::mv", &mm},
      {"aten::addmm", &addmm},
      {"aten::addmv", &addmv},
      {"aten::baddbmm", &addmm},
      {"aten::avg_pool2d", &avg_pool2d},
      {"aten::avg_pool2d_backward", &avg_pool2d_backward},
      {"aten::max_pool2d_with_indices", &max_pool2d_with_indices},
      {"aten::max_pool2d_with_indices_backward", &max_pool2d_with_indices_backward},
      {"aten::_adaptive_avg_pool2d", &adaptive_avg_pool2d},
      {"aten::_adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward},
  });
}

}  // namespace graftpt
