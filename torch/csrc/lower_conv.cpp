// graft's PyTorch bridge: convolutions (1-D, 2-D and 3-D, transposed, any groups) and their
// gradients.
//
// A convolution is an im2col: the kernel's window offsets of the padded input as strided
// slices, stacked into a [C*K, N*L] matrix (K kernel taps, L output points), so the convolution,
// its weight gradient and its input gradient are matrix products plus data movement that
// graft's compiling backend generates natively; with groups the products are batched over the
// groups. 1-D convolutions run as 2-D ones over [N, C, 1, L]. Grouped 2-D convolutions (the
// depthwise ones above all) run on graft's conv2d primitive instead, whose direct kernels beat
// a batch of one-row products; GRAFT_TORCH_CONV=native sends every 2-D convolution there.
// A strided convolution's input gradient sums, at each input point, only the taps that reach
// it (col2im_strided).
#include "lower.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace graftpt {
namespace {

// A conv's stride / padding / dilation / output_padding per spatial dim (a 1-D conv's unit
// height: dflt).
std::vector<int> conv_dims(const std::vector<int64_t> &v, int64_t dflt, int S, bool one_d) {
  std::vector<int> r(S, (int)dflt);
  for (int d = 0; d < S; ++d)
    if (!v.empty()) r[d] = (int)v[v.size() == 1 ? 0 : std::min<size_t>(d, v.size() - 1)];
  if (one_d) {
    r[0] = (int)dflt;
    if (!v.empty()) r[1] = (int)v[0];
  }
  return r;
}

// [N, C, 1, L] back to [N, C, L] for a 1-D conv.
G from_4d(const G &v, bool one_d) {
  if (!one_d) return v;
  auto sh = gshape(v);
  return reshape_to(v, {sh[0], sh[1], sh[3]});
}

G as_4d(const G &v) {
  auto sh = gshape(v);
  if (sh.size() != 3) return v;
  sh.insert(sh.end() - 1, 1);
  return reshape_to(v, sh);
}

// GRAFT_TORCH_CONV: "native" (every 2-D convolution on graft's primitives), "placed" (strided
// input gradients by strided placement, the A/B of col2im_strided), else the default.
bool conv_mode(const char *mode) {
  static const char *m = getenv("GRAFT_TORCH_CONV");
  return m && std::string(m) == mode;
}

bool native_2d(int S, int groups) { return S == 2 && (groups > 1 || conv_mode("native")); }

// Whether any dim has a nonzero value (padding).
bool any_nonzero(const std::vector<int> &v) {
  for (int x : v)
    if (x) return true;
  return false;
}

// The geometry of x [N, C, *in] convolved with w [O, C/G, *k].
struct Conv {
  int S, G;
  int64_t N, C, O, K = 1, L = 1;  // K kernel taps, L output points per image
  std::vector<int64_t> in, k, out, padded;
  std::vector<int> st, p, dl;
};

Conv conv_geom(const std::vector<int64_t> &xs, const std::vector<int64_t> &ws, const std::vector<int> &st,
               const std::vector<int> &p, const std::vector<int> &dl, int groups) {
  Conv g;
  g.S = (int)xs.size() - 2, g.G = groups, g.N = xs[0], g.C = xs[1], g.O = ws[0], g.st = st, g.p = p, g.dl = dl;
  for (int d = 0; d < g.S; ++d) {
    g.in.push_back(xs[2 + d]);
    g.k.push_back(ws[2 + d]);
    g.padded.push_back(xs[2 + d] + 2 * p[d]);
    g.out.push_back((g.padded[d] - (int64_t)dl[d] * (g.k[d] - 1) - 1) / st[d] + 1);
    g.K *= g.k[d];
    g.L *= g.out[d];
  }
  return g;
}

// g with dy's spatial size as its output: a transposed convolution's output_padding may leave
// dy short of the last output points the geometry allows (those add nothing).
Conv with_out(Conv g, const G &dy) {
  auto ys = gshape(dy);
  g.L = 1;
  for (int d = 0; d < g.S; ++d) g.out[d] = ys[2 + d], g.L *= g.out[d];
  return g;
}

// The kernel tap q's offset on each spatial dim (taps in row-major order).
std::vector<int64_t> tap(const Conv &g, int64_t q) {
  std::vector<int64_t> o(g.S);
  for (int d = g.S - 1; d >= 0; --d) {
    o[d] = q % g.k[d] * g.dl[d];
    q /= g.k[d];
  }
  return o;
}

// [A, B, ...] <-> [B, A, ...]: the batch and channel dims swapped.
G swap01(const G &v, const char *what) {
  int nd = (int)gshape(v).size();
  std::vector<int> perm(nd);
  for (int d = 0; d < nd; ++d) perm[d] = d;
  perm[0] = 1, perm[1] = 0;
  return chk(graft_transpose(v.get(), perm.data()), what);
}

// A [..., R, C] matrix (or batch of them) transposed.
G mt(const G &v, const char *what) {
  int nd = (int)gshape(v).size();
  if (nd == 2) return chk(graft_t(v.get()), what);
  int perm[3] = {0, 2, 1};
  return chk(graft_transpose(v.get(), perm), what);
}

// A [rows, cols] matrix as the groups' [G, rows / G, cols] (unchanged without groups).
G by_group(const G &v, int64_t rows, int64_t cols, int G) {
  if (G == 1 && gshape(v) == std::vector<int64_t>{rows, cols}) return v;
  return G == 1 ? reshape_to(v, {rows, cols}) : reshape_to(v, {G, rows / G, cols});
}

// cols [C*K, N*L] of x [N, C, *in].
G im2col(const G &x, const Conv &g) {
  G xt = swap01(x, "conv");  // [C, N, *in]
  int nd = g.S + 2;
  if (any_nonzero(g.p)) {
    std::vector<int64_t> lo(nd, 0);
    for (int d = 0; d < g.S; ++d) lo[2 + d] = g.p[d];
    xt = chk(graft_pad(xt.get(), lo.data(), lo.data(), 0.0), "conv");
  }
  std::vector<G> parts;
  std::vector<graft_tensor *> ptrs;
  for (int64_t q = 0; q < g.K; ++q) {
    auto o = tap(g, q);
    std::vector<int64_t> a0(nd, 0), a1(nd), step(nd, 1);
    a1[0] = g.C, a1[1] = g.N;
    for (int d = 0; d < g.S; ++d) {
      a0[2 + d] = o[d];
      a1[2 + d] = o[d] + (g.out[d] - 1) * g.st[d] + 1;
      step[2 + d] = g.st[d];
    }
    G v = chk(graft_slice(xt.get(), a0.data(), a1.data(), step.data()), "conv");
    parts.push_back(reshape_to(v, {g.C, 1, g.N * g.L}));
    ptrs.push_back(parts.back().get());
  }
  G c = ptrs.size() == 1 ? parts[0] : chk(graft_concat(ptrs.data(), (int)ptrs.size(), 1), "conv");
  return reshape_to(c, {g.C * g.K, g.N * g.L});
}

// dy [N, O, *out] as [O, N*L] (per group: [G, O/G, N*L]).
G dy_rows(const G &dy, const Conv &g) {
  return by_group(swap01(dy, "conv"), g.O, g.N * g.L, g.G);
}

// [O, N*L] (or per group) back to [N, O, *out].
G from_rows(const G &y, const Conv &g) {
  std::vector<int64_t> sz = {g.O, g.N};
  sz.insert(sz.end(), g.out.begin(), g.out.end());
  return swap01(reshape_to(y, sz), "conv");
}

G im2col_conv(const G &x, const G &w, const Conv &g) {
  for (int d = 0; d < g.S; ++d)
    TORCH_CHECK(g.out[d] > 0, "graft: convolution output would be empty (input ", g.in[d], " padded by ", g.p[d],
                " on each side is smaller than the dilated kernel, ", (int64_t)g.dl[d] * (g.k[d] - 1) + 1, ")");
  G cols = by_group(im2col(x, g), g.C * g.K, g.N * g.L, g.G);
  G w2 = by_group(w, g.O, g.C / g.G * g.K, g.G);
  return from_rows(chk(graft_matmul(w2.get(), cols.get()), "conv"), g);
}

G im2col_conv_bwd_weight(const G &x, const G &dy, const std::vector<int64_t> &ws, const Conv &g) {
  G cols = by_group(im2col(x, g), g.C * g.K, g.N * g.L, g.G);
  G dw = chk(graft_matmul(dy_rows(dy, g).get(), mt(cols, "conv_backward_weight").get()), "conv_backward_weight");
  return reshape_to(dw, ws);
}

// x's spatial dims cropped to [lo, lo + size).
G crop(const G &x, const std::vector<int> &lo, const std::vector<int64_t> &size, const char *what) {
  auto xs = gshape(x);
  int S = (int)xs.size() - 2;
  std::vector<int64_t> a0(xs.size(), 0), a1 = xs;
  for (int d = 0; d < S; ++d) a0[2 + d] = lo[d], a1[2 + d] = lo[d] + size[2 + d];
  return chk(graft_slice(x.get(), a0.data(), a1.data(), nullptr), what);
}

// dc [C, K, N, *out] (the columns' gradient) as tap q's part [C, N, *out].
G tap_part(const G &dc, const Conv &g, int64_t q, const char *what) {
  auto sz = gshape(dc);
  std::vector<int64_t> a0(sz.size(), 0), a1 = sz, psz = {g.C, g.N};
  a0[1] = q, a1[1] = q + 1;
  psz.insert(psz.end(), g.out.begin(), g.out.end());
  return reshape_to(chk(graft_slice(dc.get(), a0.data(), a1.data(), nullptr), what), psz);
}

// Each tap's part placed at its offset in the padded input, stride apart, summed.
G col2im_placed(const G &dc, const Conv &g, const char *what) {
  int nd = g.S + 2;
  G acc;
  for (int64_t q = 0; q < g.K; ++q) {
    auto o = tap(g, q);
    std::vector<int64_t> lo(nd, 0), hi(nd, 0), inner(nd, 0);
    bool inside = true;  // a tap past the padded input adds nothing
    for (int d = 0; d < g.S; ++d) {
      lo[2 + d] = o[d], hi[2 + d] = g.padded[d] - (o[d] + (g.out[d] - 1) * g.st[d] + 1);
      inner[2 + d] = g.st[d] - 1;
      inside &= hi[2 + d] >= 0;
    }
    if (!inside) continue;
    G t = chk(graft_pad_ex(tap_part(dc, g, q, what).get(), lo.data(), hi.data(), inner.data(), 0.0), what);
    acc = acc ? chk(graft_add(acc.get(), t.get()), what) : t;
  }
  return acc;
}

// Strided: a tap at offset o reaches only the input points congruent to o modulo the stride.
// Per residue class r the sub-grid (every stride-th point from r, M = ceil(padded / stride) of
// them per dim) sums its own taps' parts, each placed unstrided at o / stride; the classes are
// then interleaved. A placement at stride s with s-1 zeros between points would make every
// point of the input sum all K taps, most of them zeros (s^S times the work).
G col2im_strided(const G &dc, const Conv &g, const char *what) {
  int S = g.S, nd = S + 2;
  std::vector<int64_t> M(S);
  int64_t classes = 1;
  for (int d = 0; d < S; ++d) M[d] = (g.padded[d] + g.st[d] - 1) / g.st[d], classes *= g.st[d];
  std::vector<G> sub(classes);
  for (int64_t q = 0; q < g.K; ++q) {
    auto o = tap(g, q);
    int64_t r = 0;
    bool inside = true;
    std::vector<int64_t> lo(nd, 0), hi(nd, 0);
    for (int d = 0; d < S; ++d) {
      r = r * g.st[d] + o[d] % g.st[d];
      lo[2 + d] = o[d] / g.st[d];
      hi[2 + d] = M[d] - lo[2 + d] - g.out[d];
      inside &= hi[2 + d] >= 0;
    }
    if (!inside) continue;
    G t = chk(graft_pad(tap_part(dc, g, q, what).get(), lo.data(), hi.data(), 0.0), what);
    sub[r] = sub[r] ? chk(graft_add(sub[r].get(), t.get()), what) : t;
  }
  // [C, N, M_1, 1, ..., M_S, 1] per class; concatenated over the classes' last residue first.
  std::vector<int64_t> cell = {g.C, g.N};
  for (int d = 0; d < S; ++d) cell.push_back(M[d]), cell.push_back(1);
  for (auto &v : sub) v = v ? reshape_to(v, cell) : fullc(0.0, graft_get_dtype(dc.get()), cell);
  for (int d = S - 1; d >= 0; --d) {
    std::vector<G> next;
    for (size_t i = 0; i < sub.size(); i += g.st[d]) {
      std::vector<graft_tensor *> ptrs;
      for (int j = 0; j < g.st[d]; ++j) ptrs.push_back(sub[i + j].get());
      next.push_back(chk(graft_concat(ptrs.data(), (int)ptrs.size(), 3 + 2 * d), what));
    }
    sub = next;
  }
  std::vector<int64_t> full = {g.C, g.N}, a0(nd, 0), a1 = {g.C, g.N};
  for (int d = 0; d < S; ++d) full.push_back(M[d] * g.st[d]), a1.push_back(g.padded[d]);
  G r = reshape_to(sub[0], full);
  return full == a1 ? r : chk(graft_slice(r.get(), a0.data(), a1.data(), nullptr), what);
}

// g's output gradient spread back over the padded input, then the padding cropped.
G im2col_conv_bwd_input(const G &dy, const G &w, const Conv &g) {
  const char *what = "conv_backward_input";
  G w2 = by_group(w, g.O, g.C / g.G * g.K, g.G);
  G dc = chk(graft_matmul(mt(w2, what).get(), dy_rows(dy, g).get()), what);  // [C*K, N*L]
  std::vector<int64_t> sz = {g.C, g.K, g.N};
  sz.insert(sz.end(), g.out.begin(), g.out.end());
  dc = reshape_to(dc, sz);
  bool strided = false;
  for (int d = 0; d < g.S; ++d) strided |= g.st[d] > 1;
  G acc = strided && !conv_mode("placed") ? col2im_strided(dc, g, what) : col2im_placed(dc, g, what);
  if (any_nonzero(g.p)) {
    std::vector<int64_t> size = {g.C, g.N};
    size.insert(size.end(), g.in.begin(), g.in.end());
    acc = crop(acc, g.p, size, what);
  }
  return swap01(acc, what);
}

// Input gradient of a grouped 2-D conv on graft's primitive, also when padding exceeds
// dilation*(kernel-1): computed for the explicitly padded input with no padding, then cropped.
G native_bwd_input(const G &dy, const G &w, std::vector<int64_t> xs, const std::vector<int> &st,
                   const std::vector<int> &p, const std::vector<int> &dl, int groups) {
  auto ws = gshape(w);
  bool direct = p[0] <= dl[0] * (ws[2] - 1) && p[1] <= dl[1] * (ws[3] - 1);
  if (direct)
    return chk(graft_conv2d_backward_input(dy.get(), w.get(), xs.data(), st.data(), p.data(), dl.data(), groups),
               "conv2d_backward_input");
  std::vector<int64_t> big = xs;
  big[2] += 2 * p[0];
  big[3] += 2 * p[1];
  std::vector<int> zp = {0, 0};
  G r = chk(graft_conv2d_backward_input(dy.get(), w.get(), big.data(), st.data(), zp.data(), dl.data(), groups),
            "conv2d_backward_input");
  return crop(r, p, xs, "conv2d_backward_input");
}

// The convolution y = conv(x, w) (x [N, C, *in], w [O, C/G, *k]).
G conv_fwd(const G &x, const G &w, const std::vector<int> &st, const std::vector<int> &p,
           const std::vector<int> &dl, int groups) {
  int S = (int)gshape(x).size() - 2;
  if (native_2d(S, groups)) return chk(graft_conv2d(x.get(), w.get(), st.data(), p.data(), dl.data(), groups), "conv2d");
  return im2col_conv(x, w, conv_geom(gshape(x), gshape(w), st, p, dl, groups));
}

// dx of y = conv(x, w), x of shape xs.
G conv_bwd_input(const G &dy, const G &w, const std::vector<int64_t> &xs, const std::vector<int> &st,
                 const std::vector<int> &p, const std::vector<int> &dl, int groups) {
  int S = (int)xs.size() - 2;
  if (native_2d(S, groups)) return native_bwd_input(dy, w, xs, st, p, dl, groups);
  return im2col_conv_bwd_input(dy, w, with_out(conv_geom(xs, gshape(w), st, p, dl, groups), dy));
}

// dw of y = conv(x, w), w of shape ws.
G conv_bwd_weight(const G &x, const G &dy, const std::vector<int64_t> &ws, const std::vector<int> &st,
                  const std::vector<int> &p, const std::vector<int> &dl, int groups) {
  int S = (int)ws.size() - 2;
  if (native_2d(S, groups))
    return chk(graft_conv2d_backward_weight(x.get(), dy.get(), ws.data(), st.data(), p.data(), dl.data(), groups),
               "conv2d_backward_weight");
  return im2col_conv_bwd_weight(x, dy, ws, with_out(conv_geom(gshape(x), ws, st, p, dl, groups), dy));
}

// A convolution's operands as graft values, 1-D ones as 2-D: S spatial dims, or 0 when graft
// has no lowering for them (another rank, an integer dtype).
int conv_rank(const at::Tensor &x, const at::Tensor &w) {
  if (x.dim() != w.dim() || x.dim() < 3 || x.dim() > 5 || !at::isFloatingType(x.scalar_type())) return 0;
  return (int)x.dim() - 2;
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
void convolution(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0), &w = a.t(1);
  int S0 = conv_rank(x, w);
  if (!S0) return fall_back(op, s, a);
  same_dtype(x, w, "convolution");
  bool one_d = S0 == 1;
  int S = one_d ? 2 : S0;
  auto st = conv_dims(a.il(3), 1, S, one_d), p = conv_dims(a.il(4), 0, S, one_d),
       dl = conv_dims(a.il(5), 1, S, one_d), opad = conv_dims(a.il(7), 0, S, one_d);
  int groups = (int)a.i(8);
  G gx = as_4d(tv(x)), gw = as_4d(tv(w));
  G r;
  if (!a.b(6)) {
    r = conv_fwd(gx, gw, st, p, dl, groups);
  } else {
    // conv_transpose(x, w) is the input gradient of conv(., w) with x as dy, computed for the
    // padded output with no padding, then cropped.
    auto ws = gshape(gw), xs = gshape(gx);
    std::vector<int64_t> osz = {xs[0], ws[1] * groups}, big;
    for (int d = 0; d < S; ++d)
      osz.push_back((xs[2 + d] - 1) * st[d] - 2 * p[d] + (int64_t)dl[d] * (ws[2 + d] - 1) + opad[d] + 1);
    big = osz;
    for (int d = 0; d < S; ++d) big[2 + d] += 2 * p[d];
    r = conv_bwd_input(gx, gw, big, st, std::vector<int>(S, 0), dl, groups);
    if (any_nonzero(p)) r = crop(r, p, osz, "conv_transpose");
  }
  if (!a.none(2) && a.t(2).defined()) {
    std::vector<int64_t> bs(S + 2, 1);
    bs[1] = a.t(2).numel();
    G b = reshape_to(conv(tv(a.t(2)), x.scalar_type()), bs);
    r = chk(graft_add(r.get(), b.get()), "conv");
  }
  push(s, wrap(from_4d(r, one_d)));
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
//   transposed, output_padding, groups, output_mask[3]) -> (grad_input, grad_weight, grad_bias)
void convolution_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &go = a.t(0), &x = a.t(1), &w = a.t(2);
  int S0 = conv_rank(x, w);
  if (!S0 || go.dim() != x.dim()) return fall_back(op, s, a);
  bool one_d = S0 == 1;
  int S = one_d ? 2 : S0;
  auto st = conv_dims(a.il(4), 1, S, one_d), p = conv_dims(a.il(5), 0, S, one_d),
       dl = conv_dims(a.il(6), 1, S, one_d);
  bool transposed = a.b(7);
  int groups = (int)a.i(9);
  auto mask = a.v[10].toBoolList();
  at::ScalarType stp = x.scalar_type();
  G g = as_4d(conv(tv(go), stp)), gx = as_4d(tv(x)), gw = as_4d(conv(tv(w), stp));
  auto xs = gshape(gx), ws = gshape(gw);
  at::Tensor gi, gwt, gb;
  if (mask[0]) {
    G r = transposed ? conv_fwd(g, gw, st, p, dl, groups) : conv_bwd_input(g, gw, xs, st, p, dl, groups);
    auto rs = gshape(r);
    // output_padding >= stride (possible with dilation) leaves extra rows: crop
    if (transposed && rs != xs) r = crop(r, std::vector<int>(S, 0), xs, "conv_transpose backward");
    gi = wrap(from_4d(r, one_d));
  }
  if (mask[1]) {
    // y = conv_transpose(x, w) is the adjoint of conv(., w): dw = backward_weight(input = dy, dy = x)
    G r = transposed ? conv_bwd_weight(g, gx, ws, st, p, dl, groups) : conv_bwd_weight(gx, g, ws, st, p, dl, groups);
    gwt = wrap(from_4d(r, one_d));
  }
  if (mask[2]) {
    std::vector<int> dims = {0};
    for (int d = 0; d < S; ++d) dims.push_back(2 + d);
    gb = wrap(chk(graft_sum(g.get(), dims.data(), (int)dims.size(), false), "convolution_backward (bias)"));
  }
  push(s, gi);
  push(s, gwt);
  push(s, gb);
}

}  // namespace

void add_conv_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::convolution", &convolution},
      {"aten::convolution_backward", &convolution_backward},
  });
}

}  // namespace graftpt
