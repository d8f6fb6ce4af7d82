// graft's PyTorch bridge: view lowerings (view, permute, select, slice, expand, ...) and their
// backward ops; joining and indexing (cat, gather, scatter, index, index_put, repeat, embedding).
#include "lower.h"

#include <ATen/ExpandUtils.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/accumulate.h>

#include <algorithm>

namespace graftpt {
namespace {

// Views ---------------------------------------------------------------------------
void push_view(Stack *s, const at::Tensor &base, std::vector<int64_t> sz, std::vector<int64_t> st,
               int64_t off, G v) {
  push(s, make_view(base, sz, st, off, std::move(v)));
}

void v_view(const c10::OperatorHandle &op, Stack *s) {  // view(self, size)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = at::infer_size(a.il(1), t.numel());
  auto st = at::detail::computeStride(t.sizes(), t.strides(), sz);
  TORCH_CHECK(st.has_value(),
              "view size is not compatible with input tensor's size and stride (at least one dimension"
              " spans across two contiguous subspaces). Use .reshape(...) instead.");
  push_view(s, t, sz, *st, t.storage_offset(), reshape_to(value(t), sz));
}

void v_reshape_alias(const c10::OperatorHandle &op, Stack *s) {  // _reshape_alias(self, size, stride)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = a.il(1);
  push_view(s, t, sz, a.il(2), t.storage_offset(), reshape_to(value(t), sz));
}

void unsafe_view(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = at::infer_size(a.il(1), t.numel());
  push(s, wrap(reshape_to(value(t), sz)));
}

void v_as_strided(const c10::OperatorHandle &op, Stack *s) {  // as_strided(self, size, stride, offset?)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t off = a.none(3) ? t.storage_offset() : a.i(3);
  push_view(s, t, a.il(1), a.il(2), off, G());
}

void v_alias(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  push_view(s, t, t.sizes().vec(), t.strides().vec(), t.storage_offset(), value(t));
}

// slice_scatter / select_scatter / diagonal_scatter / as_strided_scatter: a copy of self with
// src written through the view the op names. (torch 2's composite forms of these read a
// tensor's storage, which graft tensors do not have.) The view is taken with the view ops'
// own lowerings on the fresh copy, so a write through it lands in the copy's root.
void view_scatter(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &self = a.t(0), &src = a.t(1);
  check_device(src);
  at::Tensor out = wrap(value(self));
  const std::string &name = op.schema().name();
  at::Tensor view;
  if (name == "aten::slice_scatter") {
    std::optional<int64_t> start, end;
    if (!a.none(3)) start = a.i(3);
    if (!a.none(4)) end = a.i(4);
    view = out.slice(a.i(2), start, end, a.i(5));
  } else if (name == "aten::select_scatter") {
    view = out.select(a.i(2), a.i(3));
  } else if (name == "aten::diagonal_scatter") {
    view = out.diagonal(a.i(2), a.i(3), a.i(4));
  } else {  // as_strided_scatter(self, src, size, stride, storage_offset?)
    std::optional<int64_t> off;
    if (!a.none(4)) off = a.i(4);
    view = out.as_strided(a.il(2), a.il(3), off);
  }
  TORCH_CHECK(src.sizes() == view.sizes(), name.substr(6), ": expected src to have a size equal to the "
              "slice of self. src size = ", src.sizes(), ", slice size = ", view.sizes());
  write(view, conv(value(src), self.scalar_type()));
  push(s, out);
}

// flip(self, dims): a new value (PyTorch's flip copies too), reversed along the dims.
void flip(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto dims = dims_of(a.v[1], t.dim());
  G v = value(t);
  if (!dims.empty() && t.dim() > 0) v = chk(graft_flip(v.get(), dims.data(), (int)dims.size()), "flip");
  push(s, wrap(std::move(v)));
}

void permute_impl(Stack *s, const at::Tensor &t, std::vector<int> perm) {
  auto sz = t.sizes().vec(), st = t.strides().vec();
  std::vector<int64_t> nsz, nst;
  for (int p : perm) {
    nsz.push_back(sz[p]);
    nst.push_back(st[p]);
  }
  G v = value(t);
  if (perm.size() > 1) v = chk(graft_transpose(v.get(), perm.data()), "permute");
  push_view(s, t, nsz, nst, t.storage_offset(), std::move(v));
}

void v_t(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  TORCH_CHECK(t.dim() <= 2, "t() expects a tensor with <= 2 dimensions, but self is ", t.dim(), "D");
  std::vector<int> perm;
  for (int i = t.dim() - 1; i >= 0; --i) perm.push_back(i);
  permute_impl(s, t, perm);
}

void v_transpose(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t nd = t.dim();
  if (nd == 0) {
    c10::maybe_wrap_dim(a.i(1), nd);
    c10::maybe_wrap_dim(a.i(2), nd);
    push_view(s, t, {}, {}, t.storage_offset(), value(t));
    return;
  }
  int d0 = (int)c10::maybe_wrap_dim(a.i(1), nd), d1 = (int)c10::maybe_wrap_dim(a.i(2), nd);
  std::vector<int> perm(nd);
  for (int i = 0; i < nd; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  permute_impl(s, t, perm);
}

void v_permute(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto dims = a.il(1);
  int64_t nd = t.dim();
  TORCH_CHECK((int64_t)dims.size() == nd, "permute(sparse_coo): number of dimensions in the tensor input "
              "does not match the length of the desired ordering of dimensions i.e. input.dim() = ",
              nd, " is not equal to len(dims) = ", dims.size());
  std::vector<int> perm;
  std::vector<bool> seen(nd, false);
  for (auto d : dims) {
    int w = (int)c10::maybe_wrap_dim(d, nd);
    TORCH_CHECK(!seen[w], "permute(): duplicate dims are not allowed.");
    seen[w] = true;
    perm.push_back(w);
  }
  permute_impl(s, t, perm);
}

void v_select(const c10::OperatorHandle &op, Stack *s) {  // select.int(self, dim, index)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t nd = t.dim();
  TORCH_CHECK_INDEX(nd > 0, "select() cannot be applied to a 0-dim tensor.");
  int d = (int)c10::maybe_wrap_dim(a.i(1), nd);
  int64_t size = t.size(d), idx = a.i(2);
  TORCH_CHECK_INDEX(idx >= -size && idx < size, "select(): index ", idx, " out of range for tensor of size ",
                    t.sizes(), " at dimension ", d);
  if (idx < 0) idx += size;
  auto sz = t.sizes().vec(), st = t.strides().vec();
  int64_t off = t.storage_offset() + idx * st[d];
  G v = value(t);
  std::vector<int64_t> lo(nd, 0), hi = sz;
  lo[d] = idx;
  hi[d] = idx + 1;
  v = chk(graft_slice(v.get(), lo.data(), hi.data(), nullptr), "select");
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  v = reshape_to(v, sz);
  push_view(s, t, sz, st, off, std::move(v));
}

void v_slice(const c10::OperatorHandle &op, Stack *s) {  // slice.Tensor(self, dim, start?, end?, step)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t nd = t.dim();
  TORCH_CHECK_INDEX(nd > 0, "slice() cannot be applied to a 0-dim tensor.");
  int d = (int)c10::maybe_wrap_dim(a.i(1), nd);
  int64_t size = t.size(d);
  int64_t start = a.none(2) ? 0 : a.i(2), end = a.none(3) ? INT64_MAX : a.i(3), step = a.i(4);
  TORCH_CHECK(step > 0, "slice step must be positive");
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::min(std::max<int64_t>(start, 0), size);
  end = std::min(std::max<int64_t>(end, start), size);
  int64_t len = (end - start + step - 1) / step;
  auto sz = t.sizes().vec(), st = t.strides().vec();
  int64_t off = t.storage_offset() + start * st[d];
  G v = value(t);
  if (!(start == 0 && end == size && step == 1) && len > 0) {
    std::vector<int64_t> lo(nd, 0), hi = sz, str(nd, 1);
    lo[d] = start;
    hi[d] = end;
    str[d] = step;
    v = chk(graft_slice(v.get(), lo.data(), hi.data(), str.data()), "slice");
  } else if (len == 0) {
    v = G();
  }
  sz[d] = len;
  st[d] *= step;
  push_view(s, t, sz, st, off, std::move(v));
}

void v_expand(const c10::OperatorHandle &op, Stack *s) {  // expand(self, size, implicit)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto want = a.il(1);
  int64_t nd = t.dim(), nn = (int64_t)want.size();
  TORCH_CHECK(nn >= nd, "expand(", t.toString(), "{", t.sizes(), "}, size=", want,
              "): the number of sizes provided (", nn, ") must be greater or equal to the number of "
              "dimensions in the tensor (", nd, ")");
  std::vector<int64_t> sz(nn), st(nn);
  for (int64_t i = nn - 1; i >= 0; --i) {
    int64_t k = i - (nn - nd);
    if (k >= 0) {
      int64_t have = t.size(k);
      int64_t w = want[i] == -1 ? have : want[i];
      TORCH_CHECK(have == w || have == 1, "The expanded size of the tensor (", w,
                  ") must match the existing size (", have, ") at non-singleton dimension ", i,
                  ".  Target sizes: ", want, ".  Tensor sizes: ", t.sizes());
      sz[i] = w;
      st[i] = have == w ? t.stride(k) : 0;
    } else {
      TORCH_CHECK(want[i] >= 0, "The expanded size of the tensor (", want[i],
                  ") isn't allowed in a leading, non-existing dimension ", i);
      sz[i] = want[i];
      st[i] = 0;
    }
  }
  G v = value(t);
  v = chk(graft_broadcast_to(v.get(), (int)sz.size(), sz.data()), "expand");
  push_view(s, t, sz, st, t.storage_offset(), std::move(v));
}

void v_unsqueeze(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t nd = t.dim();
  int d = (int)c10::maybe_wrap_dim(a.i(1), nd + 1);
  auto sz = t.sizes().vec(), st = t.strides().vec();
  int64_t ns = d >= nd ? 1 : sz[d] * st[d];
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, ns);
  push_view(s, t, sz, st, t.storage_offset(), reshape_to(value(t), sz));
}

void squeeze_impl(Stack *s, const at::Tensor &t, int only) {
  auto sz = t.sizes().vec(), st = t.strides().vec();
  std::vector<int64_t> nsz, nst;
  for (int i = 0; i < (int)sz.size(); ++i) {
    if (sz[i] == 1 && (only < 0 || only == i)) continue;
    nsz.push_back(sz[i]);
    nst.push_back(st[i]);
  }
  push_view(s, t, nsz, nst, t.storage_offset(), reshape_to(value(t), nsz));
}

void v_squeeze(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  squeeze_impl(s, a.t(0), -1);
}

void v_squeeze_dim(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  squeeze_impl(s, t, t.dim() == 0 ? -1 : d);
}

// select_backward(grad_output, input_sizes, dim, index): grad placed back by zero padding.
void select_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  auto in = a.il(1);
  int64_t nd = (int64_t)in.size();
  int d = (int)c10::maybe_wrap_dim(a.i(2), nd);
  int64_t idx = a.i(3);
  if (idx < 0) idx += in[d];
  auto gs = in;
  gs[d] = 1;
  G g = reshape_to(tv(a.t(0)), gs);
  std::vector<int64_t> lo(nd, 0), hi(nd, 0);
  lo[d] = idx;
  hi[d] = in[d] - idx - 1;
  push(s, wrap(chk(graft_pad(g.get(), lo.data(), hi.data(), 0.0), "select_backward")));
}

// slice_backward(grad_output, input_sizes, dim, start, end, step)
void slice_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  auto in = a.il(1);
  int64_t nd = (int64_t)in.size();
  int d = (int)c10::maybe_wrap_dim(a.i(2), nd);
  int64_t size = in[d], start = a.i(3), end = a.i(4), step = a.i(5);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::min(std::max<int64_t>(start, 0), size);
  end = std::min(std::max<int64_t>(end, start), size);
  G g = tv(a.t(0));
  auto gs = gshape(g);
  int64_t L = gs[d];
  if (L == 0) {
    push(s, wrap(chk(dev_zeros(graft_get_dtype(g.get()), (int)nd, in.data()), "slice_backward")));
    return;
  }
  int64_t span = L;
  if (step > 1) {
    auto us = gs;
    us.insert(us.begin() + d + 1, 1);
    g = reshape_to(g, us);
    std::vector<int64_t> lo(nd + 1, 0), hi(nd + 1, 0);
    hi[d + 1] = step - 1;
    g = chk(graft_pad(g.get(), lo.data(), hi.data(), 0.0), "slice_backward");
    auto ms = gs;
    ms[d] = L * step;
    g = reshape_to(g, ms);
    span = (L - 1) * step + 1;
    std::vector<int64_t> sl(nd, 0), lim = ms;
    lim[d] = span;
    g = chk(graft_slice(g.get(), sl.data(), lim.data(), nullptr), "slice_backward");
  }
  std::vector<int64_t> lo(nd, 0), hi(nd, 0);
  lo[d] = start;
  hi[d] = size - start - span;
  push(s, wrap(chk(graft_pad(g.get(), lo.data(), hi.data(), 0.0), "slice_backward")));
}
// Joining / indexing --------------------------------------------------------------
void cat(const c10::OperatorHandle &op, Stack *s) {  // cat(Tensor[] tensors, dim)
  Args a(op, s);
  auto lst = a.v[0].toTensorVector();
  TORCH_CHECK(!lst.empty(), "torch.cat(): expected a non-empty list of Tensors");
  at::native::ResultTypeState rs{};
  std::vector<at::Tensor> use;
  for (auto &t : lst) {
    rs = at::native::update_result_type_state(t, rs);
    if (t.dim() == 1 && t.numel() == 0) continue;  // legacy: skip empty 1-D tensors
    use.push_back(t);
  }
  at::ScalarType st = at::native::result_type(rs);
  if (use.empty()) {  // only empty 1-D tensors: an empty 1-D result
    int64_t zero = 0;
    push(s, wrap(chk(dev_zeros(to_gdt(st), 1, &zero), "cat")));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), use[0].dim());
  std::vector<G> vals;
  std::vector<graft_tensor *> ptrs;
  for (auto &t : use) {
    TORCH_CHECK(is_graft(t), "Expected all tensors to be on the same device, but found at least two "
                "devices, graft:", cur_device(), " and ", t.device(), "!");
    vals.push_back(conv(value(t), st));
    ptrs.push_back(vals.back().get());
  }
  push(s, wrap(chk(graft_concat(ptrs.data(), (int)ptrs.size(), d), "cat")));
}

void gather(const c10::OperatorHandle &op, Stack *s) {  // gather(self, dim, index, sparse_grad)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto ist = a.t(2).scalar_type();
  if (a.t(2).numel() == 0) {
    c10::maybe_wrap_dim(a.i(1), std::max<int64_t>(t.dim(), 1));
    auto is = a.t(2).sizes().vec();
    push(s, wrap(chk(dev_zeros(to_gdt(t.scalar_type()), (int)is.size(), is.data()), "gather")));
    return;
  }
  if (ist != at::kLong && ist != at::kInt) return fall_back(op, s, a);
  if (t.dim() == 0 || a.t(2).dim() == 0) {
    // 0-dim operands: gather over [1]-shaped views, result in the index's shape.
    if (t.dim() > 1 || a.t(2).dim() > 1) return fall_back(op, s, a);
    c10::maybe_wrap_dim(a.i(1), std::max<int64_t>(t.dim(), 1));
    auto is = a.t(2).sizes().vec();
    int64_t n = a.t(2).numel();
    if (n == 0) {
      push(s, wrap(chk(dev_zeros(to_gdt(t.scalar_type()), (int)is.size(), is.data()), "gather")));
      return;
    }
    G x = reshape_to(tv(t), {t.numel()}), idx = reshape_to(tv(a.t(2)), {n});
    push(s, wrap(reshape_to(chk(graft_gather(x.get(), 0, idx.get()), "gather"), is)));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t), idx = tv(a.t(2));
  push(s, wrap(chk(graft_gather(x.get(), d, idx.get()), "gather")));
}

void scatter_add(const c10::OperatorHandle &op, Stack *s) {  // scatter_add(self, dim, index, src)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto ist = a.t(2).scalar_type();
  if (t.dim() == 0 || a.t(2).dim() == 0 || (ist != at::kLong && ist != at::kInt)) return fall_back(op, s, a);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t), idx = tv(a.t(2)), src = conv(tv(a.t(3)), t.scalar_type());
  push(s, wrap(chk(graft_scatter_add(x.get(), d, idx.get(), src.get()), "scatter_add")));
}

void index_select(const c10::OperatorHandle &op, Stack *s) {  // index_select(self, dim, index)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int64_t nd = t.dim();
  int d = (int)c10::maybe_wrap_dim(a.i(1), nd);
  G x = tv(t), idx = tv(a.t(2));
  int64_t k = graft_numel(idx.get());
  if (nd == 0) {
    push(s, wrap(x));
    return;
  }
  std::vector<int64_t> ishape(nd, 1);
  ishape[d] = k;
  idx = reshape_to(idx, ishape);
  auto osz = t.sizes().vec();
  osz[d] = k;
  idx = chk(graft_broadcast_to(idx.get(), (int)nd, osz.data()), "index_select");
  push(s, wrap(chk(graft_gather(x.get(), d, idx.get()), "index_select")));
}

// index_add(self, dim, index, source, alpha)
void index_add(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0), &src = a.t(3);
  int64_t nd = t.dim();
  int d = (int)c10::maybe_wrap_dim(a.i(1), nd);
  G x = tv(t), idx = conv(tv(a.t(2)), at::kLong), v = conv(tv(src), t.scalar_type());
  double alpha = a.none(4) ? 1.0 : a.d(4);
  if (alpha != 1.0) v = chk(graft_mul(v.get(), scal(alpha, t.scalar_type()).get()), "index_add");
  if (nd == 0) {
    push(s, wrap(chk(graft_add(x.get(), v.get()), "index_add")));
    return;
  }
  std::vector<int64_t> ishape(nd, 1);
  ishape[d] = graft_numel(idx.get());
  idx = reshape_to(idx, ishape);
  auto ssz = src.sizes().vec();
  idx = chk(graft_broadcast_to(idx.get(), (int)nd, ssz.data()), "index_add");
  push(s, wrap(chk(graft_scatter_add(x.get(), d, idx.get(), v.get()), "index_add")));
}

void embedding(const c10::OperatorHandle &op, Stack *s) {  // embedding(weight, indices, padding_idx, scale, sparse)
  Args a(op, s);
  G w = tv(a.t(0)), idx = tv(a.t(1));
  push(s, wrap(chk(graft_embedding(w.get(), idx.get()), "embedding")));
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
void embedding_dense_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &go = a.t(0);
  TORCH_CHECK(!a.b(4), "graft: embedding scale_grad_by_freq is not lowered");
  int64_t V = a.i(2), pad = a.i(3);
  int64_t D = go.size(-1);
  int64_t n = a.t(1).numel();
  G g = reshape_to(tv(go), {n, D});
  G idx = reshape_to(conv(tv(a.t(1)), at::kLong), {n, 1});
  if (pad >= 0) {
    G keep = chk(graft_ne(idx.get(), scal((double)pad, at::kLong).get()), "embedding_backward");
    G z = chk(dev_zeros(to_gdt(go.scalar_type()), 0, nullptr), "embedding_backward");
    g = chk(graft_where(keep.get(), g.get(), z.get()), "embedding_backward");
  }
  int64_t bs[2] = {n, D};
  idx = chk(graft_broadcast_to(idx.get(), 2, bs), "embedding_backward");
  int64_t zs[2] = {V, D};
  G z = chk(dev_zeros(to_gdt(go.scalar_type()), 2, zs), "embedding_backward");
  push(s, wrap(chk(graft_scatter_add(z.get(), 0, idx.get(), g.get()), "embedding_backward")));
}

// Shared by index / index_put: the indexed dims, the flat row index (broadcast, negatives
// wrapped), the permutation putting indexed dims first, and the sizes of the rest.
struct IndexPlan {
  std::vector<int> dims, perm;
  std::vector<int64_t> bshape, rest;
  int64_t V = 1, D = 1;
  bool adjacent = false;
  G flat;
};

bool plan_index(const at::Tensor &x, const c10::IValue &ilist, IndexPlan &p) {
  std::vector<at::Tensor> idx;
  for (const auto &e : ilist.toListRef()) idx.push_back(e.isTensor() ? e.toTensor() : at::Tensor());
  int64_t nd = x.dim();
  for (size_t k = 0; k < idx.size(); ++k) {
    if (!idx[k].defined()) continue;
    auto st = idx[k].scalar_type();
    if (st != at::kLong && st != at::kInt) return false;
    p.dims.push_back((int)k);
  }
  if (p.dims.empty() || (int64_t)idx.size() > nd || nd == 0 || x.numel() == 0) return false;
  p.adjacent = p.dims.back() - p.dims.front() + 1 == (int)p.dims.size();
  for (int d : p.dims) p.bshape = at::infer_size(p.bshape, idx[d].sizes());
  for (int d : p.dims) p.V *= x.size(d);
  int64_t stride = p.V;
  for (int d : p.dims) {
    stride /= x.size(d);
    // Index tensors may live on the CPU (as PyTorch allows for accelerator tensors).
    G i = conv(is_graft(idx[d]) ? value(idx[d]) : from_cpu(idx[d], cur_device()), at::kLong);
    G n = fullc((double)x.size(d), GRAFT_I64), z = fullc(0, GRAFT_I64);
    G neg = chk(graft_lt(i.get(), z.get()), "index");
    G iw = chk(graft_add(i.get(), n.get()), "index");
    i = chk(graft_where(neg.get(), iw.get(), i.get()), "index");
    if (stride != 1) i = chk(graft_mul(i.get(), fullc((double)stride, GRAFT_I64).get()), "index");
    p.flat = p.flat ? chk(graft_add(p.flat.get(), i.get()), "index") : i;
  }
  p.flat = chk(graft_broadcast_to(p.flat.get(), (int)p.bshape.size(), p.bshape.data()), "index");
  p.perm.assign(p.dims.begin(), p.dims.end());
  for (int d = 0; d < nd; ++d)
    if (std::find(p.dims.begin(), p.dims.end(), d) == p.dims.end()) {
      p.perm.push_back(d);
      p.rest.push_back(x.size(d));
      p.D *= x.size(d);
    }
  return true;
}

// Permutation between the [bshape, rest] layout and PyTorch's result layout (bshape in the
// middle when the indexed dims are adjacent and not first); empty when they agree.
std::vector<int> result_perm(const IndexPlan &p) {
  std::vector<int> p2;
  if (!(p.adjacent && p.dims.front() > 0)) return p2;
  int nb = (int)p.bshape.size(), first = p.dims.front(), tot = nb + (int)p.rest.size();
  for (int k = 0; k < first; ++k) p2.push_back(nb + k);
  for (int k = 0; k < nb; ++k) p2.push_back(k);
  for (int k = nb + first; k < tot; ++k) p2.push_back(k);
  return p2;
}

G permuted_rows(const at::Tensor &x, const IndexPlan &p) {
  G gx = tv(x);
  bool ident = true;
  for (size_t d = 0; d < p.perm.size(); ++d) ident &= p.perm[d] == (int)d;
  if (!ident) gx = chk(graft_transpose(gx.get(), p.perm.data()), "index");
  return reshape_to(gx, {p.V, p.D});
}

// index.Tensor(self, Tensor?[] indices): advanced indexing with integer index tensors (bool masks
// have data-dependent shapes and fall back): one row gather over the flattened indexed dims.
void index_tensor(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  IndexPlan p;
  if (!plan_index(a.t(0), a.v[1], p)) return fall_back(op, s, a);
  G r = chk(graft_embedding(permuted_rows(a.t(0), p).get(), p.flat.get()), "index");  // bshape + [D]
  std::vector<int64_t> os = p.bshape;
  os.insert(os.end(), p.rest.begin(), p.rest.end());
  r = reshape_to(r, os);
  auto p2 = result_perm(p);
  if (!p2.empty()) r = chk(graft_transpose(r.get(), p2.data()), "index");
  push(s, wrap(std::move(r)));
}

// The new value of self after index_put(self, indices, values, accumulate).
G index_put_value(const at::Tensor &x, const IndexPlan &p, const at::Tensor &vals, bool accumulate) {
  // values broadcast to the result layout, then brought to [B, D]
  std::vector<int64_t> os = p.bshape;
  os.insert(os.end(), p.rest.begin(), p.rest.end());
  auto p2 = result_perm(p);
  std::vector<int64_t> ros = os;
  if (!p2.empty())
    for (size_t k = 0; k < p2.size(); ++k) ros[k] = os[p2[k]];
  G v = conv(tv(vals), x.scalar_type());
  v = chk(graft_broadcast_to(v.get(), (int)ros.size(), ros.data()), "index_put");
  if (!p2.empty()) {
    std::vector<int> inv(p2.size());
    for (size_t k = 0; k < p2.size(); ++k) inv[p2[k]] = (int)k;
    v = chk(graft_transpose(v.get(), inv.data()), "index_put");
  }
  int64_t B = 1;
  for (auto b : p.bshape) B *= b;
  v = reshape_to(v, {B, p.D});
  G fi = reshape_to(p.flat, {B, 1});
  int64_t bd[2] = {B, p.D}, vd[2] = {p.V, p.D};
  fi = chk(graft_broadcast_to(fi.get(), 2, bd), "index_put");
  graft_dtype dt = to_gdt(x.scalar_type());
  G rows = permuted_rows(x, p);
  G sc = chk(graft_scatter_add(fullc(0, dt, {p.V, p.D}).get(), 0, fi.get(), v.get()), "index_put");
  G nv;
  if (accumulate) {
    nv = chk(graft_add(rows.get(), sc.get()), "index_put");
  } else {  // duplicates are undefined behaviour in PyTorch too
    G ones = fullc(1, GRAFT_I32, {B, p.D});
    G cnt = chk(graft_scatter_add(fullc(0, GRAFT_I32, {p.V, p.D}).get(), 0, fi.get(), ones.get()), "index_put");
    G hit = chk(graft_gt(cnt.get(), fullc(0, GRAFT_I32).get()), "index_put");
    nv = chk(graft_where(hit.get(), sc.get(), rows.get()), "index_put");
  }
  (void)vd;
  // back to x's layout
  std::vector<int64_t> ps;
  for (int d : p.perm) ps.push_back(x.size(d));
  nv = reshape_to(nv, ps);
  std::vector<int> inv(p.perm.size());
  for (size_t k = 0; k < p.perm.size(); ++k) inv[p.perm[k]] = (int)k;
  return chk(graft_transpose(nv.get(), inv.data()), "index_put");
}

// index_put(self, indices, values, accumulate) -> new tensor
void index_put(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  IndexPlan p;
  if (!is_graft(a.t(2)) && a.t(2).dim() > 0) return fall_back(op, s, a);
  if (!plan_index(a.t(0), a.v[1], p)) return fall_back(op, s, a);
  push(s, wrap(index_put_value(a.t(0), p, a.t(2), a.b(3))));
}

// index_put_ / _index_put_impl_(self, indices, values, accumulate[, unsafe]) -> self
void index_put_(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  IndexPlan p;
  if (!is_graft(a.t(2)) && a.t(2).dim() > 0) return fall_back(op, s, a);
  if (!plan_index(a.t(0), a.v[1], p)) return fall_back(op, s, a);
  write(a.t(0), index_put_value(a.t(0), p, a.t(2), a.b(3)));
  push(s, a.t(0));
}

// repeat(self, repeats): each dim i of the (left-padded) input tiled repeats[i] times:
// broadcast [1, s0, 1, s1, ...] to [r0, s0, r1, s1, ...], then merge the pairs.
void repeat(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  auto r = a.il(1);
  int64_t nd = x.dim(), nr = (int64_t)r.size();
  TORCH_CHECK(nr >= nd, "Number of dimensions of repeat dims can not be smaller than number of dimensions of tensor");
  for (auto v : r) TORCH_CHECK(v >= 0, "Trying to create tensor with negative dimension ", v, ": ", r);
  std::vector<int64_t> xs(nr - nd, 1);
  for (auto v : x.sizes()) xs.push_back(v);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < nr; ++i) out.push_back(xs[i] * r[i]);
  if (x.numel() == 0 || c10::multiply_integers(out) == 0) {
    push(s, wrap(chk(dev_zeros(to_gdt(x.scalar_type()), (int)out.size(), out.data()), "repeat")));
    return;
  }
  if (2 * nr > GRAFT_MAX_DIMS) return fall_back(op, s, a);
  std::vector<int64_t> s1, s2;
  for (int64_t i = 0; i < nr; ++i) {
    s1.insert(s1.end(), {1, xs[i]});
    s2.insert(s2.end(), {r[i], xs[i]});
  }
  G v = reshape_to(tv(x), s1);
  v = chk(graft_broadcast_to(v.get(), (int)s2.size(), s2.data()), "repeat");
  push(s, wrap(reshape_to(v, out)));
}
// embedding_renorm_(self, indices, max_norm, norm_type): rows named by indices whose p-norm
// exceeds max_norm are scaled to max_norm / (norm + 1e-7), in place.
void embedding_renorm_(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &w = a.t(0);
  if (w.dim() != 2 || w.numel() == 0 || !at::isFloatingType(w.scalar_type())) return fall_back(op, s, a);
  double maxn = a.d(2), p = a.d(3);
  at::ScalarType st = w.scalar_type();
  graft_dtype dt = to_gdt(st);
  int64_t V = w.size(0), n = a.t(1).numel();
  G gw = tv(w);
  G ab = chk(graft_abs(gw.get()), "embedding_renorm_");
  G pw = p == 1.0 ? ab : p == 2.0 ? chk(graft_mul(ab.get(), ab.get()), "embedding_renorm_")
                                   : chk(graft_pow_scalar(ab.get(), p), "embedding_renorm_");
  int ax = 1;
  G norm = chk(graft_sum(pw.get(), &ax, 1, true), "embedding_renorm_");  // [V,1]
  if (p == 2.0) norm = chk(graft_sqrt(norm.get()), "embedding_renorm_");
  else if (p != 1.0) norm = chk(graft_pow_scalar(norm.get(), 1.0 / p), "embedding_renorm_");
  G idx = reshape_to(conv(tv(a.t(1)), at::kLong), {n, 1});
  G hits = chk(graft_scatter_add(fullc(0, GRAFT_I32, {V, 1}).get(), 0, idx.get(), fullc(1, GRAFT_I32, {n, 1}).get()),
               "embedding_renorm_");
  G used = chk(graft_gt(hits.get(), fullc(0, GRAFT_I32).get()), "embedding_renorm_");
  G big = chk(graft_gt(norm.get(), fullc(maxn, dt).get()), "embedding_renorm_");
  G sel = chk(graft_logical_and(used.get(), big.get()), "embedding_renorm_");
  G den = chk(graft_add(norm.get(), fullc(1e-7, dt).get()), "embedding_renorm_");
  G scale = chk(graft_div(fullc(maxn, dt).get(), den.get()), "embedding_renorm_");
  G scaled = chk(graft_mul(gw.get(), scale.get()), "embedding_renorm_");
  write(w, chk(graft_where(sel.get(), scaled.get(), gw.get()), "embedding_renorm_"));
  push(s, w);
}

}  // namespace

void add_view_lowerings(LoweringTable &t) {
  t.insert({
      {"aten::embedding_renorm_", &embedding_renorm_},
      {"aten::view", &v_view},
      {"aten::_reshape_alias", &v_reshape_alias},
      {"aten::_unsafe_view", &unsafe_view},
      {"aten::as_strided", &v_as_strided},
      {"aten::flip", &flip},
      {"aten::slice_scatter", &view_scatter},
      {"aten::select_scatter", &view_scatter},
      {"aten::diagonal_scatter", &view_scatter},
      {"aten::as_strided_scatter", &view_scatter},
      {"aten::alias", &v_alias},
      {"aten::t", &v_t},
      {"aten::transpose.int", &v_transpose},
      {"aten::permute", &v_permute},
      {"aten::select.int", &v_select},
      {"aten::slice.Tensor", &v_slice},
      {"aten::expand", &v_expand},
      {"aten::unsqueeze", &v_unsqueeze},
      {"aten::squeeze", &v_squeeze},
      {"aten::squeeze.dim", &v_squeeze_dim},
      {"aten::select_backward", &select_backward},
      {"aten::slice_backward", &slice_backward},
      {"aten::index_add", &index_add},
      {"aten::cat", &cat},
      {"aten::gather", &gather},
      {"aten::scatter_add", &scatter_add},
      {"aten::index_select", &index_select},
      {"aten::embedding", &embedding},
      {"aten::embedding_dense_backward", &embedding_dense_backward},
      {"aten::index.Tensor", &index_tensor},
      {"aten::repeat", &repeat},
      {"aten::index_put", &index_put},
      {"aten::index_put_", &index_put_},
      {"aten::_index_put_impl_", &index_put_},
  });
}

}  // namespace graftpt
