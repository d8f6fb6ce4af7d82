// graft's PyTorch bridge: the lowering table (aten op -> graft C API calls), assembled from the
// lower_<concept>.cpp files; the helpers they share (lower.h); and the ops every tensor needs:
// creation, copies, item.
#include "lower.h"
#include <cstring>
#include <set>

#include <ATen/native/TypeProperties.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/WrapDimMinimal.h>

namespace graftpt {

// Lowerings that may hand an unsupported configuration to the CPU fallback: Args::v holds the
// popped arguments; this puts them back and runs PyTorch's kernel (counted as a fallback).
void fall_back(const c10::OperatorHandle &op, Stack *s, Args &a) {
  for (auto &iv : a.v) s->push_back(std::move(iv));
  cpu_fallback(op, s);
}

G fullc(double v, graft_dtype dt, std::vector<int64_t> shape) {
  return chk(dev_full(v, dt, (int)shape.size(), shape.data()), "constant");
}

at::ScalarType default_float() { return c10::get_default_dtype_as_scalartype(); }

// Operand helpers (lower.h) --------------------------------------------------------------------
void check_device(const at::Tensor &t) {
  TORCH_CHECK(is_graft(t) || t.dim() == 0,
              "Expected all tensors to be on the same device, but found at least two devices, graft:",
              cur_device(), " and ", t.device(), "!");
}

at::ScalarType promote(std::initializer_list<const c10::IValue *> ivs) {
  at::native::ResultTypeState st{};
  for (auto *iv : ivs) {
    if (iv->isTensor()) {
      if (iv->toTensor().defined()) st = at::native::update_result_type_state(iv->toTensor(), st);
    } else if (iv->isScalar()) {
      st = at::native::update_result_type_state(iv->toScalar(), st);
    }
  }
  return at::native::result_type(st);
}

// Device scalars are reused across steps: an optimizer's alpha and factors come back with the same
// values every step, and a new scalar cost a buffer, an upload and a graph parameter per use (2 us
// of an add_'s trace). The k-th use of a value within a step gets the k-th scalar made for it, so
// each use stays its own parameter: a graph's structure never depends on two values being equal.
// Leaked on purpose: released after graft's own state at exit, they would be freed twice.
static uint64_t scalar_gen = 1;  // the step uses count in (new_step_scalars bumps it)

void new_step_scalars() { scalar_gen++; }

static G scalar_value(double x, graft_dtype dt) {
  struct Key {
    uint64_t bits;
    int dt, dev;
    bool operator==(const Key &o) const { return bits == o.bits && dt == o.dt && dev == o.dev; }
  };
  struct Hash {
    size_t operator()(const Key &k) const {
      return std::hash<uint64_t>()(k.bits * 31 + (uint64_t)k.dt * 7 + (uint64_t)k.dev);
    }
  };
  struct Uses {
    std::vector<G> made;
    uint64_t gen = 0;
    size_t next = 0;
  };
  static auto *cache = new std::unordered_map<Key, Uses, Hash>();
  static size_t total = 0;
  if (total >= 4096) {  // a schedule's ever-new values: bounded
    cache->clear();
    total = 0;
  }
  Key k{0, (int)dt, cur_device()};
  std::memcpy(&k.bits, &x, sizeof x);
  Uses &u = (*cache)[k];
  if (u.gen != scalar_gen) u.gen = scalar_gen, u.next = 0;
  if (u.next < u.made.size()) return u.made[u.next++];
  G v = chk(dev_scalar(x, dt), "scalar");
  u.made.push_back(v);
  u.next++;
  total++;
  return v;
}

// A graft value for an operand (graft tensor, CPU 0-dim tensor or Scalar) in dtype st.
G operand(const c10::IValue &iv, at::ScalarType st) {
  graft_dtype dt = to_gdt(st);
  if (iv.isTensor()) {
    const at::Tensor &t = iv.toTensor();
    if (!is_graft(t)) {
      check_device(t);
      return scalar_value(t.item().toDouble(), dt);
    }
    G v = value(t);
    if (graft_get_dtype(v.get()) != dt) v = chk(graft_convert(v.get(), dt), "convert");
    return v;
  }
  TORCH_CHECK(iv.isScalar(), "graft: expected a tensor or a number");
  return scalar_value(iv.toScalar().toDouble(), dt);
}

G tv(const at::Tensor &t) {
  if (!is_graft(t)) {
    check_device(t);
    return scalar_value(t.item().toDouble(), to_gdt(t.scalar_type()));
  }
  return value(t);
}

G conv(G v, at::ScalarType st) {
  graft_dtype dt = to_gdt(st);
  if (graft_get_dtype(v.get()) != dt) v = chk(graft_convert(v.get(), dt), "convert");
  return v;
}

G scal(double x, at::ScalarType st) { return scalar_value(x, to_gdt(st)); }

at::ScalarType gst(const G &v) { return to_st(graft_get_dtype(v.get())); }

std::vector<int64_t> gshape(const G &v) {
  int64_t s[GRAFT_MAX_DIMS];
  int n = graft_shape(v.get(), s);
  return std::vector<int64_t>(s, s + n);
}

std::vector<int> dims_of(const c10::IValue &iv, int64_t ndim) {
  std::vector<int> out;
  if (iv.isNone()) return out;
  std::vector<int64_t> ds = iv.isInt() ? std::vector<int64_t>{iv.toInt()} : iv.toIntVector();
  for (auto d : ds) out.push_back((int)c10::maybe_wrap_dim(d, ndim));
  return out;
}

G reshape_to(const G &v, const std::vector<int64_t> &sz) {
  return chk(graft_reshape(v.get(), (int)sz.size(), sz.data()), "reshape");
}

void same_dtype(const at::Tensor &a, const at::Tensor &b, const char *what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(),
              " but found ", b.scalar_type(), " (in ", what, ")");
}

namespace {

// Creation ----------------------------------------------------------------------
at::ScalarType dtype_arg(const Args &a, int k) {
  return a.none(k) ? default_float() : (at::ScalarType)a.i(k);
}

void check_dev_arg(const Args &a, int k) {
  if (!a.none(k)) {
    auto d = a.v[k].toDevice();
    TORCH_CHECK(d.type() == kDevType, "graft: factory with device ", d);
  }
}

void empty_mf(const c10::OperatorHandle &op, Stack *s) {  // empty.memory_format(size, dtype, layout, device, pin, mf)
  Args a(op, s);
  auto sz = a.il(0);
  for (auto v : sz) TORCH_CHECK(v >= 0, "Trying to create tensor with negative dimension ", v, ": ", sz);
  TORCH_CHECK(sz.size() <= GRAFT_MAX_DIMS, "graft: at most ", GRAFT_MAX_DIMS, " dims");
  push(s, wrap(chk(dev_zeros(to_gdt(dtype_arg(a, 1)), (int)sz.size(), sz.data()), "empty")));
}

void empty_strided(const c10::OperatorHandle &op, Stack *s) {  // (size, stride, dtype, layout, device, pin)
  Args a(op, s);
  auto sz = a.il(0);
  TORCH_CHECK(sz.size() <= GRAFT_MAX_DIMS, "graft: at most ", GRAFT_MAX_DIMS, " dims");
  push(s, wrap(chk(dev_zeros(to_gdt(dtype_arg(a, 2)), (int)sz.size(), sz.data()), "empty_strided")));
}

void zero_(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  write(t, chk(dev_zeros(to_gdt(t.scalar_type()), (int)sz.size(), sz.data()), "zero_"));
  push(s, t);
}

void fill_(const c10::OperatorHandle &op, Stack *s) {  // fill_.Scalar / fill_.Tensor
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G v = operand(a.v[1], t.scalar_type());
  write(t, std::move(v));
  push(s, t);
}

void new_empty_strided(const c10::OperatorHandle &op, Stack *s) {  // (self, size, stride, dtype?, ...)
  Args a(op, s);
  auto sz = a.il(1);
  at::ScalarType st = a.none(3) ? a.t(0).scalar_type() : (at::ScalarType)a.i(3);
  push(s, wrap(chk(dev_zeros(to_gdt(st), (int)sz.size(), sz.data()), "new_empty_strided")));
}

// Memory overlap, as ATen's MemoryOverlap judges it for views of one storage (graft views of one
// store have the same geometry, but no storage for ATen's own check to read).
enum class Overlap { No, Full, Partial, TooHard };

Overlap overlap_of(const at::Tensor &a, const at::Tensor &b) {
  if (!is_graft(a) || !is_graft(b) || gimpl(a)->store != gimpl(b)->store) return Overlap::No;
  if (a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl()) return Overlap::Full;
  if (a.numel() == 0 || b.numel() == 0) return Overlap::No;
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return Overlap::TooHard;
  int64_t a0 = a.storage_offset() * (int64_t)a.element_size(), a1 = a0 + a.numel() * (int64_t)a.element_size();
  int64_t b0 = b.storage_offset() * (int64_t)b.element_size(), b1 = b0 + b.numel() * (int64_t)b.element_size();
  if (a0 == b0 && a1 == b1) return a.strides() == b.strides() ? Overlap::Full : Overlap::Partial;
  return a0 < b1 && b0 < a1 ? Overlap::Partial : Overlap::No;
}

// The products PyTorch lets alias their output (BLAS-style ops check nothing).
bool overlap_unchecked(const std::string &name) {
  static const std::set<std::string> skip = {"aten::addmm", "aten::addmv", "aten::addbmm", "aten::baddbmm",
                                             "aten::addr", "aten::mm", "aten::bmm", "aten::mv",
                                             "aten::matmul", "aten::dot", "aten::vdot"};
  std::string n = name;
  if (n.size() > 1 && n.back() == '_') n.pop_back();
  return skip.count(n) > 0;
}

// PyTorch's errors for a write into out that partly aliases an input (x[1:].mul_(x[:-1])), and
// for one into a tensor whose elements alias each other (an expanded tensor) from an input.
const char *kPartialOverlap =
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
    "single memory location. Please clone() the tensor before performing the operation.";
const char *kInternalOverlap =
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation.";

bool internal_overlap(const at::Tensor &out) {
  if (!is_graft(out) || out.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < out.dim(); ++d)
    if (out.stride(d) == 0 && out.size(d) > 1) return true;
  return false;
}

}  // namespace

// Both checks for an op writing out from its other tensor arguments, the top n of the stack
// (pointer comparisons on the traced path; the op's name is read only when one fails; also
// the host calls' out= forms, hostcall.cpp).
void check_write_overlap(const c10::OperatorHandle &op, const Stack &s, size_t n, const at::Tensor &out) {
  if (!is_graft(out)) return;
  bool has_input = false, partial = false;
  for (size_t i = s.size() - n; i < s.size(); ++i) {
    if (!s[i].isTensor()) continue;
    const at::Tensor &t = s[i].toTensor();
    if (!t.defined() || t.unsafeGetTensorImpl() == out.unsafeGetTensorImpl()) continue;
    has_input = true;
    partial = partial || overlap_of(out, t) == Overlap::Partial;
  }
  bool internal = has_input && internal_overlap(out);
  if (!(partial || internal) || overlap_unchecked(op.schema().name())) return;
  TORCH_CHECK(!partial, kPartialOverlap);
  TORCH_CHECK(false, kInternalOverlap);
}

namespace {

// Copies ------------------------------------------------------------------------
// _copy_from(self=src, dst, non_blocking) / _copy_from_and_resize(self=src, dst)
template <bool Resize>
void copy_from(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &src = a.t(0);
  const at::Tensor &dst = a.t(1);
  if (is_graft(dst)) {
    if (!Resize) {
      TORCH_CHECK(!internal_overlap(dst), kInternalOverlap);
      TORCH_CHECK(overlap_of(dst, src) != Overlap::Partial, kPartialOverlap);
    }
    G v = is_graft(src) ? value(src) : from_cpu(src, gdevice(dst));
    if (graft_device(v.get()) != gdevice(dst)) v = chk(graft_to_device(v.get(), gdevice(dst)), "copy between devices");
    if (Resize) write_resize(dst, std::move(v));
    else write(dst, std::move(v));
  } else {
    at::Tensor c = to_cpu(src);
    if (Resize) dst.resize_(c.sizes());
    dst.copy_(c);
  }
  push(s, dst);
}

void clone(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  push(s, wrap(value(a.t(0))));
}

void detach_(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  push(s, a.t(0));
}

void local_scalar_dense(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  TORCH_CHECK(t.numel() == 1, "a Tensor with ", t.numel(), " elements cannot be converted to Scalar");
  G v = value(t);
  double d = 0;
  chk_status(graft_item(v.get(), &d), "item");
  auto st = t.scalar_type();
  if (at::isFloatingType(st)) s->emplace_back(c10::Scalar(d));
  else if (st == at::kBool) s->emplace_back(c10::Scalar(d != 0));
  else s->emplace_back(c10::Scalar((int64_t)d));
}

// The table ---------------------------------------------------------------------------
const LoweringTable &table() {
  static const LoweringTable t = [] {
    LoweringTable t = {
        {"aten::empty.memory_format", &empty_mf},
        {"aten::empty_strided", &empty_strided},
        {"aten::zero_", &zero_},
        {"aten::fill_.Scalar", &fill_},
        {"aten::fill_.Tensor", &fill_},
        {"aten::_copy_from", &copy_from<false>},
        {"aten::_copy_from_and_resize", &copy_from<true>},
        {"aten::clone", &clone},
        {"aten::detach_", &detach_},
        {"aten::_local_scalar_dense", &local_scalar_dense},
        {"aten::new_empty_strided", &new_empty_strided},
    };
    add_elementwise_lowerings(t);
    add_view_lowerings(t);
    add_reduce_lowerings(t);
    add_nn_lowerings(t);
    add_conv_lowerings(t);
    add_optim_lowerings(t);
    add_rnn_lowerings(t);
    add_attention_lowerings(t);
    add_activation_lowerings(t);
    add_resample_lowerings(t);
    add_norm_lowerings(t);
    add_scan_lowerings(t);
    return t;
  }();
  return t;
}

// Runs the functional lowering fn of an in-place op; self is the op's first argument; returns
// fn's result (popped).
at::Tensor run_functional(Lowering fn, const c10::OperatorHandle &op, Stack *s, at::Tensor &self) {
  size_t n = op.schema().arguments().size();
  self = (*s)[s->size() - n].toTensor();
  fn(op, s);
  at::Tensor r = s->back().toTensor();
  s->pop_back();
  return r;
}

// An in-place op (name ending in '_') with a functional lowering: compute, then write into self.
void inplace_via(Lowering fn, const c10::OperatorHandle &op, Stack *s) {
  size_t n = op.schema().arguments().size();
  check_write_overlap(op, *s, n, (*s)[s->size() - n].toTensor());
  at::Tensor self;
  at::Tensor r = run_functional(fn, op, s, self);
  write(self, value(r));
  push(s, self);
}

// An out= variant with one out argument (last) and a functional lowering: pop out, run the
// functional form on the remaining arguments, write its result into out (resized as PyTorch does).
void out_via(Lowering fn, const c10::OperatorHandle &functional, Stack *s) {
  at::Tensor out = s->back().toTensor();
  check_write_overlap(functional, *s, functional.schema().arguments().size() + 1, out);
  s->pop_back();
  fn(functional, s);
  at::Tensor r = s->back().toTensor();
  s->pop_back();
  TORCH_CHECK(c10::canCast(r.scalar_type(), out.scalar_type()), "result type ", r.scalar_type(),
              " can't be cast to the desired output type ", out.scalar_type());
  write_resize(out, value(r));
  push(s, out);
}

// The functional form of an out= overload ("self_out" -> "self", "out" -> ""), when its arguments
// are the out form's less the one out tensor and it returns one tensor.
std::optional<c10::OperatorHandle> functional_of_out(const c10::OperatorHandle &op) {
  const auto &sch = op.schema();
  const std::string &ov = sch.overload_name();
  std::string fov;
  if (ov == "out") fov = "";
  else if (ov.size() > 4 && ov.compare(ov.size() - 4, 4, "_out") == 0) fov = ov.substr(0, ov.size() - 4);
  else return std::nullopt;
  const auto &args = sch.arguments();
  if (args.empty() || sch.returns().size() != 1 || !args.back().alias_info() ||
      !args.back().alias_info()->isWrite() || !args.back().type()->isSubtypeOf(*c10::TensorType::get()))
    return std::nullopt;
  // The functional overload is usually the out overload's name less "_out" (where.self_out);
  // otherwise (sum.IntList_out for sum.dim_IntList) the overload whose arguments are the out
  // form's less out, by name and type.
  auto same_args = [&](const c10::FunctionSchema &fs) {
    if (fs.arguments().size() + 1 != args.size() || fs.returns().size() != 1) return false;
    for (size_t i = 0; i < fs.arguments().size(); ++i)
      if (fs.arguments()[i].name() != args[i].name() || *fs.arguments()[i].type() != *args[i].type())
        return false;
    return true;
  };
  auto &disp = c10::Dispatcher::singleton();
  auto f = disp.findSchema(c10::OperatorName(sch.name(), fov));
  if (f && same_args(f->schema())) return f;
  for (const c10::OperatorName &on : disp.getAllOpNames()) {
    if (on.name != sch.name() || on.overload_name == ov) continue;
    auto g = disp.findSchema(on);
    if (g && same_args(g->schema())) return g;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> lowered_ops() {
  std::vector<std::string> out;
  for (auto &kv : table()) out.push_back(kv.first);
  return out;
}

// An in-place view op (squeeze_, t_, ...): the functional view's geometry and value become self's.
void inplace_view_via(Lowering fn, const c10::OperatorHandle &op, Stack *s) {
  at::Tensor self;
  at::Tensor r = run_functional(fn, op, s, self);
  G v = value(r);
  GraftImpl *g = gimpl(self);
  g->set_sizes_and_strides(r.sizes(), r.strides());
  g->set_storage_offset(r.storage_offset());
  if (g->cache) graft_release(g->cache);
  g->cache = nullptr;
  g->cache_gen = ~0ull;
  if (!g->is_identity()) {
    g->cache = v.release();
    g->cache_gen = g->store->gen;
  }
  push(s, self);
}

// The lowering for an op: its own entry, or the functional form of an in-place op
// (aten::add_.Tensor -> aten::add.Tensor, written back into self).
Resolved resolve_lowering(const std::string &key, const c10::OperatorHandle &op) {
  const auto &t = table();
  auto it = t.find(key);
  if (it != t.end()) return {it->second, false};
  static const std::unordered_map<std::string, std::string> inplace_views = {
      {"aten::squeeze_", "aten::squeeze"},     {"aten::squeeze_.dim", "aten::squeeze.dim"},
      {"aten::unsqueeze_", "aten::unsqueeze"}, {"aten::t_", "aten::t"},
      {"aten::transpose_", "aten::transpose.int"}, {"aten::as_strided_", "aten::as_strided"}};
  auto iv = inplace_views.find(key);
  if (iv != inplace_views.end()) return {t.at(iv->second), false, true};
  auto dot = key.find('.');
  std::string base = key.substr(0, dot);
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') {
    std::string fk = base.substr(0, base.size() - 1) + (dot == std::string::npos ? "" : key.substr(dot));
    auto jt = t.find(fk);
    if (jt != t.end() && op.schema().returns().size() == 1) return {jt->second, true};
  }
  if (auto f = functional_of_out(op)) {
    std::string fk = f->schema().name();
    if (!f->schema().overload_name().empty()) fk += "." + f->schema().overload_name();
    auto jt = t.find(fk);
    if (jt != t.end()) {
      Resolved r{jt->second};
      r.functional = f;
      return r;
    }
  }
  return {nullptr, false};
}

void run_lowering(const Resolved &r, const c10::OperatorHandle &op, Stack *s) {
  if (r.functional) out_via(r.fn, *r.functional, s);
  else if (r.view_inplace) inplace_view_via(r.fn, op, s);
  else if (r.inplace) inplace_via(r.fn, op, s);
  else r.fn(op, s);
}

bool try_lower(const std::string &key, const c10::OperatorHandle &op, Stack *s) {
  Resolved r = resolve_lowering(key, op);
  if (!r.fn) return false;
  run_lowering(r, op, s);
  return true;
}

}  // namespace graftpt
