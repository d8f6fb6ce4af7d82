// graft's PyTorch bridge: the lowering table (aten op -> graft C API calls).
#include "bridge.h"

#include <ATen/ExpandUtils.h>
#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

namespace graftpt {
namespace {

using Stack = torch::jit::Stack;

struct Args {
  std::vector<c10::IValue> v;
  Args(const c10::OperatorHandle &op, Stack *s) {
    size_t n = op.schema().arguments().size();
    v = torch::jit::last(*s, n).vec();
    torch::jit::drop(*s, n);
  }
  const at::Tensor &t(int i) const { return v[i].toTensor(); }
  bool none(int i) const { return (size_t)i >= v.size() || v[i].isNone(); }
  double d(int i) const { return v[i].toScalar().toDouble(); }
  int64_t i(int k) const { return v[k].toInt(); }
  bool b(int k) const { return v[k].toBool(); }
  std::vector<int64_t> il(int k) const { return v[k].toIntVector(); }
  c10::Scalar sc(int k) const { return v[k].toScalar(); }
};

inline void push(Stack *s, at::Tensor t) { s->emplace_back(std::move(t)); }

// Lowerings that may hand an unsupported configuration to the CPU fallback: Args::v holds the
// popped arguments; this puts them back and runs PyTorch's kernel (counted as a fallback).
void fall_back(const c10::OperatorHandle &op, Stack *s, Args &a) {
  for (auto &iv : a.v) s->push_back(std::move(iv));
  cpu_fallback(op, s);
}

G fullc(double v, graft_dtype dt, std::vector<int64_t> shape = {}) {
  return chk(graft_full(v, dt, (int)shape.size(), shape.data()), "constant");
}


at::ScalarType default_float() { return c10::get_default_dtype_as_scalartype(); }

// Operand helpers --------------------------------------------------------------------
void check_device(const at::Tensor &t) {
  TORCH_CHECK(is_graft(t) || t.dim() == 0,
              "Expected all tensors to be on the same device, but found at least two devices, "
              "xla:0 (graft) and ", t.device(), "!");
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

// A graft value for an operand (graft tensor, CPU 0-dim tensor or Scalar) in dtype st.
G operand(const c10::IValue &iv, at::ScalarType st) {
  graft_dtype dt = to_gdt(st);
  if (iv.isTensor()) {
    const at::Tensor &t = iv.toTensor();
    if (!is_graft(t)) {
      check_device(t);
      return chk(graft_scalar(t.item().toDouble(), dt), "scalar");
    }
    G v = value(t);
    if (graft_get_dtype(v.get()) != dt) v = chk(graft_convert(v.get(), dt), "convert");
    return v;
  }
  TORCH_CHECK(iv.isScalar(), "graft: expected a tensor or a number");
  return chk(graft_scalar(iv.toScalar().toDouble(), dt), "scalar");
}

G tv(const at::Tensor &t) {
  if (!is_graft(t)) {
    check_device(t);
    return chk(graft_scalar(t.item().toDouble(), to_gdt(t.scalar_type())), "scalar");
  }
  return value(t);
}

G conv(G v, at::ScalarType st) {
  graft_dtype dt = to_gdt(st);
  if (graft_get_dtype(v.get()) != dt) v = chk(graft_convert(v.get(), dt), "convert");
  return v;
}

G scal(double x, at::ScalarType st) { return chk(graft_scalar(x, to_gdt(st)), "scalar"); }

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

// Elementwise --------------------------------------------------------------------
using Bin = graft_tensor *(*)(graft_tensor *, graft_tensor *);
using Un = graft_tensor *(*)(graft_tensor *);

template <Bin F, bool ToFloat = false, bool Cmp = false>
void binop(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  if (ToFloat && !at::isFloatingType(st)) st = default_float();
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  Bin f = F;
  if (st == at::kBool && F == &graft_mul) f = &graft_logical_and;  // bool * bool is and
  push(s, wrap(chk(f(x.get(), y.get()), op.schema().name().c_str())));
}

// add/sub with alpha: out = x (+|-) alpha*y
template <Bin F>
void addsub(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  if (st == at::kBool && F == &graft_add) {  // bool + bool is or
    push(s, wrap(chk(graft_logical_or(x.get(), y.get()), "add")));
    return;
  }
  if (!a.none(2) && a.d(2) != 1.0) y = chk(graft_mul(y.get(), scal(a.d(2), st).get()), "alpha");
  push(s, wrap(chk(F(x.get(), y.get()), op.schema().name().c_str())));
}

void rsub(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  if (!a.none(2) && a.d(2) != 1.0) x = chk(graft_mul(x.get(), scal(a.d(2), st).get()), "alpha");
  push(s, wrap(chk(graft_sub(y.get(), x.get()), "rsub")));
}

void div_mode(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  c10::optional<std::string> mode;
  if (!a.none(2)) mode = a.v[2].toStringRef();
  if (!mode) {
    if (!at::isFloatingType(st)) st = default_float();
    G x = operand(a.v[0], st), y = operand(a.v[1], st);
    push(s, wrap(chk(graft_div(x.get(), y.get()), "div")));
    return;
  }
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  G q = chk(graft_div(x.get(), y.get()), "div");
  if (*mode == "floor") {
    if (at::isFloatingType(st)) {
      q = chk(graft_floor(q.get()), "div");
    } else {
      // integer floor division: trunc - ((x % y != 0) & ((x < 0) != (y < 0)))
      G r = chk(graft_rem(x.get(), y.get()), "div");
      G z = scal(0, st);
      G nz = chk(graft_ne(r.get(), z.get()), "div");
      G sx = chk(graft_lt(x.get(), z.get()), "div"), sy = chk(graft_lt(y.get(), z.get()), "div");
      G diff = chk(graft_ne(sx.get(), sy.get()), "div");
      G m = chk(graft_logical_and(nz.get(), diff.get()), "div");
      G one = scal(1, st);
      G adj = chk(graft_where(m.get(), one.get(), z.get()), "div");
      q = chk(graft_sub(q.get(), adj.get()), "div");
    }
  } else {
    TORCH_CHECK(*mode == "trunc", "div expected rounding_mode to be one of None, 'trunc', or 'floor'");
    if (at::isFloatingType(st)) {
      // trunc = sign(q) * floor(|q|)
      G aq = chk(graft_abs(q.get()), "div");
      G fl = chk(graft_floor(aq.get()), "div");
      G sg = chk(graft_sign(q.get()), "div");
      q = chk(graft_mul(sg.get(), fl.get()), "div");
    }
  }
  push(s, wrap(std::move(q)));
}

template <Un F, bool ToFloat = true>
void unop(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  if (ToFloat && !at::isFloatingType(st)) x = conv(std::move(x), default_float());
  push(s, wrap(chk(F(x.get()), op.schema().name().c_str())));
}

graft_tensor *g_relu(graft_tensor *x) { return graft_relu(x); }
graft_tensor *g_bitnot(graft_tensor *x) { return graft_logical_not(x); }

void logical_not(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = conv(tv(a.t(0)), at::kBool);
  push(s, wrap(chk(graft_logical_not(x.get()), "logical_not")));
}

template <Bin F>
void logical_bin(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = operand(a.v[0], at::kBool), y = operand(a.v[1], at::kBool);
  push(s, wrap(chk(F(x.get(), y.get()), op.schema().name().c_str())));
}

void pow_scalar_base(const c10::OperatorHandle &op, Stack *s) {  // pow.Scalar(Scalar self, Tensor exponent)
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  if (!at::isFloatingType(st)) st = default_float();
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  push(s, wrap(chk(graft_pow(x.get(), y.get()), "pow")));
}

void pow_ts(const c10::OperatorHandle &op, Stack *s) {  // pow.Tensor_Scalar
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st);
  double e = a.d(1);
  if (e == 2.0) {
    push(s, wrap(chk(graft_mul(x.get(), x.get()), "pow")));
    return;
  }
  if (e == 1.0) {
    push(s, wrap(std::move(x)));
    return;
  }
  if (!at::isFloatingType(st)) {
    st = default_float();
    x = conv(std::move(x), st);
  }
  push(s, wrap(chk(graft_pow_scalar(x.get(), e), "pow")));
}

void pow_tt(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  if (!at::isFloatingType(st)) st = default_float();
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  push(s, wrap(chk(graft_pow(x.get(), y.get()), "pow")));
}

void where_self(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G c = conv(tv(a.t(0)), at::kBool);
  at::ScalarType st = promote({&a.v[1], &a.v[2]});
  G x = operand(a.v[1], st), y = operand(a.v[2], st);
  push(s, wrap(chk(graft_where(c.get(), x.get(), y.get()), "where")));
}

void masked_fill(const c10::OperatorHandle &op, Stack *s) {  // masked_fill.Scalar / .Tensor
  Args a(op, s);
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G m = conv(tv(a.t(1)), at::kBool);
  G v = operand(a.v[2], st);
  push(s, wrap(chk(graft_where(m.get(), v.get(), x.get()), "masked_fill")));
}

void clamp(const c10::OperatorHandle &op, Stack *s) {  // clamp(self, Scalar? min, Scalar? max)
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1], &a.v[2]});
  G x = operand(a.v[0], st);
  if (!a.none(1)) x = chk(graft_maximum(x.get(), operand(a.v[1], st).get()), "clamp");
  if (!a.none(2)) x = chk(graft_minimum(x.get(), operand(a.v[2], st).get()), "clamp");
  push(s, wrap(std::move(x)));
}

void clamp_min(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st);
  push(s, wrap(chk(graft_maximum(x.get(), operand(a.v[1], st).get()), "clamp_min")));
}

void clamp_max(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st);
  push(s, wrap(chk(graft_minimum(x.get(), operand(a.v[1], st).get()), "clamp_max")));
}

void threshold(const c10::OperatorHandle &op, Stack *s) {  // threshold(self, threshold, value)
  Args a(op, s);
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  G le = chk(graft_le(x.get(), scal(a.d(1), st).get()), "threshold");
  push(s, wrap(chk(graft_where(le.get(), scal(a.d(2), st).get(), x.get()), "threshold")));
}

void threshold_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad_output, self, threshold)
  Args a(op, s);
  G g = tv(a.t(0));
  G x = tv(a.t(1));
  at::ScalarType st = gst(g);
  G le = chk(graft_le(x.get(), scal(a.d(2), gst(x)).get()), "threshold_backward");
  G z = chk(graft_zeros(to_gdt(st), 0, nullptr), "threshold_backward");
  push(s, wrap(chk(graft_where(le.get(), z.get(), g.get()), "threshold_backward")));
}

void gelu(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  bool tanh_approx = !a.none(1) && a.v[1].toStringRef() == "tanh";
  push(s, wrap(chk(graft_gelu(x.get(), tanh_approx), "gelu")));
}

void gelu_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad_output, self, approximate)
  Args a(op, s);
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(x);
  bool tanh_approx = !a.none(2) && a.v[2].toStringRef() == "tanh";
  G r;
  if (!tanh_approx) {
    // d/dx x*Phi(x) = Phi(x) + x*phi(x)
    G cdf = chk(graft_mul_scalar(x.get(), M_SQRT1_2), "gelu_backward");
    cdf = chk(graft_erf(cdf.get()), "gelu_backward");
    cdf = chk(graft_add_scalar(cdf.get(), 1.0), "gelu_backward");
    cdf = chk(graft_mul_scalar(cdf.get(), 0.5), "gelu_backward");
    G x2 = chk(graft_mul(x.get(), x.get()), "gelu_backward");
    G pdf = chk(graft_mul_scalar(x2.get(), -0.5), "gelu_backward");
    pdf = chk(graft_exp(pdf.get()), "gelu_backward");
    pdf = chk(graft_mul_scalar(pdf.get(), 0.3989422804014327), "gelu_backward");
    G xp = chk(graft_mul(x.get(), pdf.get()), "gelu_backward");
    r = chk(graft_add(cdf.get(), xp.get()), "gelu_backward");
  } else {
    const double k = 0.7978845608028654, c = 0.044715;
    G x2 = chk(graft_mul(x.get(), x.get()), "gelu_backward");
    G x3 = chk(graft_mul(x2.get(), x.get()), "gelu_backward");
    G inner = chk(graft_mul_scalar(x3.get(), c), "gelu_backward");
    inner = chk(graft_add(inner.get(), x.get()), "gelu_backward");
    inner = chk(graft_mul_scalar(inner.get(), k), "gelu_backward");
    G th = chk(graft_tanh(inner.get()), "gelu_backward");
    G left = chk(graft_add_scalar(th.get(), 1.0), "gelu_backward");
    left = chk(graft_mul_scalar(left.get(), 0.5), "gelu_backward");
    G th2 = chk(graft_mul(th.get(), th.get()), "gelu_backward");
    G sech2 = chk(graft_sub(scal(1.0, st).get(), th2.get()), "gelu_backward");
    G dinner = chk(graft_mul_scalar(x2.get(), 3 * c), "gelu_backward");
    dinner = chk(graft_add_scalar(dinner.get(), 1.0), "gelu_backward");
    dinner = chk(graft_mul_scalar(dinner.get(), k), "gelu_backward");
    G right = chk(graft_mul(sech2.get(), dinner.get()), "gelu_backward");
    right = chk(graft_mul(right.get(), x.get()), "gelu_backward");
    right = chk(graft_mul_scalar(right.get(), 0.5), "gelu_backward");
    r = chk(graft_add(left.get(), right.get()), "gelu_backward");
  }
  push(s, wrap(chk(graft_mul(g.get(), r.get()), "gelu_backward")));
}

void sigmoid_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad_output, output)
  Args a(op, s);
  G g = tv(a.t(0)), y = tv(a.t(1));
  G one_m = chk(graft_sub(scal(1.0, gst(y)).get(), y.get()), "sigmoid_backward");
  G d = chk(graft_mul(y.get(), one_m.get()), "sigmoid_backward");
  push(s, wrap(chk(graft_mul(g.get(), d.get()), "sigmoid_backward")));
}

void tanh_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad_output, output)
  Args a(op, s);
  G g = tv(a.t(0)), y = tv(a.t(1));
  G y2 = chk(graft_mul(y.get(), y.get()), "tanh_backward");
  G d = chk(graft_sub(scal(1.0, gst(y)).get(), y2.get()), "tanh_backward");
  push(s, wrap(chk(graft_mul(g.get(), d.get()), "tanh_backward")));
}

// addcmul(self, t1, t2, value): self + value*t1*t2 ; addcdiv: self + value*t1/t2
template <bool Div>
void addc(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1], &a.v[2]});
  G x = operand(a.v[0], st), t1 = operand(a.v[1], st), t2 = operand(a.v[2], st);
  G p = chk(Div ? graft_div(t1.get(), t2.get()) : graft_mul(t1.get(), t2.get()), "addc");
  if (!a.none(3) && a.d(3) != 1.0) p = chk(graft_mul(p.get(), scal(a.d(3), st).get()), "addc");
  push(s, wrap(chk(graft_add(x.get(), p.get()), "addc")));
}

void lerp(const c10::OperatorHandle &op, Stack *s) {  // lerp.Scalar / lerp.Tensor(self, end, weight)
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), e = operand(a.v[1], st), w = operand(a.v[2], st);
  G d = chk(graft_sub(e.get(), x.get()), "lerp");
  d = chk(graft_mul(d.get(), w.get()), "lerp");
  push(s, wrap(chk(graft_add(x.get(), d.get()), "lerp")));
}

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
  push(s, wrap(chk(graft_zeros(to_gdt(dtype_arg(a, 1)), (int)sz.size(), sz.data()), "empty")));
}

void empty_strided(const c10::OperatorHandle &op, Stack *s) {  // (size, stride, dtype, layout, device, pin)
  Args a(op, s);
  auto sz = a.il(0);
  TORCH_CHECK(sz.size() <= GRAFT_MAX_DIMS, "graft: at most ", GRAFT_MAX_DIMS, " dims");
  push(s, wrap(chk(graft_zeros(to_gdt(dtype_arg(a, 2)), (int)sz.size(), sz.data()), "empty_strided")));
}

void zero_(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  write(t, chk(graft_zeros(to_gdt(t.scalar_type()), (int)sz.size(), sz.data()), "zero_"));
  push(s, t);
}

void fill_(const c10::OperatorHandle &op, Stack *s) {  // fill_.Scalar / fill_.Tensor
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G v = operand(a.v[1], t.scalar_type());
  write(t, std::move(v));
  push(s, t);
}

void normal_(const c10::OperatorHandle &op, Stack *s) {  // normal_(self, mean, std, generator)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  at::ScalarType st = t.scalar_type();
  G r = chk(graft_rand_normal(to_gdt(st), (int)sz.size(), sz.data()), "normal_");
  r = chk(graft_mul(r.get(), scal(a.d(2), st).get()), "normal_");
  r = chk(graft_add(r.get(), scal(a.d(1), st).get()), "normal_");
  write(t, std::move(r));
  push(s, t);
}

void uniform_(const c10::OperatorHandle &op, Stack *s) {  // uniform_(self, from, to, generator)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  at::ScalarType st = t.scalar_type();
  G r = chk(graft_rand_uniform(to_gdt(st), (int)sz.size(), sz.data()), "uniform_");
  r = chk(graft_mul(r.get(), scal(a.d(2) - a.d(1), st).get()), "uniform_");
  r = chk(graft_add(r.get(), scal(a.d(1), st).get()), "uniform_");
  write(t, std::move(r));
  push(s, t);
}

void bernoulli_f(const c10::OperatorHandle &op, Stack *s) {  // bernoulli_.float(self, p, generator)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  G r = chk(graft_rand_uniform(GRAFT_F32, (int)sz.size(), sz.data()), "bernoulli_");
  r = chk(graft_lt(r.get(), scal(a.d(1), at::kFloat).get()), "bernoulli_");
  write(t, std::move(r));
  push(s, t);
}

void native_dropout(const c10::OperatorHandle &op, Stack *s) {  // (input, p, train?) -> (out, mask)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  double p = a.d(1);
  bool train = a.none(2) ? true : a.b(2);
  G x = tv(t);
  auto sz = t.sizes().vec();
  if (!train || p == 0) {
    push(s, wrap(x));
    push(s, wrap(chk(graft_ones(GRAFT_BOOL, (int)sz.size(), sz.data()), "dropout")));
    return;
  }
  G u = chk(graft_rand_uniform(GRAFT_F32, (int)sz.size(), sz.data()), "dropout");
  G keep = chk(graft_ge(u.get(), scal(p, at::kFloat).get()), "dropout");
  double scale = p >= 1 ? 0.0 : 1.0 / (1.0 - p);
  G xs = chk(graft_mul(x.get(), scal(scale, t.scalar_type()).get()), "dropout");
  G z = chk(graft_zeros(to_gdt(t.scalar_type()), 0, nullptr), "dropout");
  push(s, wrap(chk(graft_where(keep.get(), xs.get(), z.get()), "dropout")));
  push(s, wrap(std::move(keep)));
}

void native_dropout_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad, mask, scale)
  Args a(op, s);
  G g = tv(a.t(0));
  G m = conv(tv(a.t(1)), gst(g));
  G r = chk(graft_mul(g.get(), m.get()), "dropout_backward");
  push(s, wrap(chk(graft_mul(r.get(), scal(a.d(2), gst(g)).get()), "dropout_backward")));
}

void new_empty_strided(const c10::OperatorHandle &op, Stack *s) {  // (self, size, stride, dtype?, ...)
  Args a(op, s);
  auto sz = a.il(1);
  at::ScalarType st = a.none(3) ? a.t(0).scalar_type() : (at::ScalarType)a.i(3);
  push(s, wrap(chk(graft_zeros(to_gdt(st), (int)sz.size(), sz.data()), "new_empty_strided")));
}

// Copies ------------------------------------------------------------------------
void copy_from(const c10::OperatorHandle &op, Stack *s) {  // _copy_from(self=src, dst, non_blocking)
  Args a(op, s);
  const at::Tensor &src = a.t(0);
  const at::Tensor &dst = a.t(1);
  if (is_graft(dst)) {
    write(dst, is_graft(src) ? value(src) : from_cpu(src));
  } else {
    at::Tensor c = to_cpu(src);
    dst.copy_(c);
  }
  push(s, dst);
}

void copy_from_and_resize(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &src = a.t(0);
  const at::Tensor &dst = a.t(1);
  if (is_graft(dst)) {
    write_resize(dst, is_graft(src) ? value(src) : from_cpu(src));
  } else {
    at::Tensor c = to_cpu(src);
    dst.resize_(c.sizes());
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

// Views ---------------------------------------------------------------------------
void push_view(Stack *s, const at::Tensor &base, std::vector<int64_t> sz, std::vector<int64_t> st,
               int64_t off, G v) {
  push(s, make_view(base, sz, st, off, std::move(v)));
}

G reshape_to(const G &v, const std::vector<int64_t> &sz) {
  return chk(graft_reshape(v.get(), (int)sz.size(), sz.data()), "reshape");
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
    push(s, wrap(chk(graft_zeros(graft_get_dtype(g.get()), (int)nd, in.data()), "slice_backward")));
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

// Reductions ------------------------------------------------------------------------
G reduce_input(const at::Tensor &t, const Args &a, int dtype_idx, bool to_float) {
  G x = tv(t);
  at::ScalarType st = gst(x);
  if (dtype_idx >= 0 && !a.none(dtype_idx)) st = (at::ScalarType)a.i(dtype_idx);
  else if (to_float && !at::isFloatingType(st)) st = default_float();
  else if (!to_float && (at::isIntegralType(st, true))) st = at::kLong;
  return conv(std::move(x), st);
}

using Red = graft_tensor *(*)(graft_tensor *, const int *, int, bool);

template <Red F>
G reduce(const G &x, const std::vector<int> &dims, bool keepdim, const char *what) {
  if (graft_ndim(x.get()) == 0) return x;
  return chk(F(x.get(), dims.empty() ? nullptr : dims.data(), (int)dims.size(), keepdim), what);
}

void sum_all(const c10::OperatorHandle &op, Stack *s) {  // sum(self, dtype?)
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 1, false);
  push(s, wrap(reduce<graft_sum>(x, {}, false, "sum")));
}

void sum_dim(const c10::OperatorHandle &op, Stack *s) {  // sum.dim_IntList(self, dim?, keepdim, dtype?)
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 3, false);
  auto dims = dims_of(a.v[1], a.t(0).dim());
  push(s, wrap(reduce<graft_sum>(x, dims, a.b(2), "sum")));
}

void mean_all(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 1, true);
  push(s, wrap(reduce<graft_mean>(x, {}, false, "mean")));
}

void mean_dim(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 3, true);
  auto dims = dims_of(a.v[1], a.t(0).dim());
  push(s, wrap(reduce<graft_mean>(x, dims, a.b(2), "mean")));
}

void prod_all(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = reduce_input(a.t(0), a, 1, false);
  push(s, wrap(reduce<graft_prod>(x, {}, false, "prod")));
}

template <Red F>
void minmax_all(const c10::OperatorHandle &op, Stack *s) {  // max(self) / min(self)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  TORCH_CHECK(t.numel() > 0, op.schema().name(), "(): Expected reduction dim to be specified for input.numel() == 0.");
  push(s, wrap(reduce<F>(tv(t), {}, false, op.schema().name().c_str())));
}

template <Red F>
void amaxmin(const c10::OperatorHandle &op, Stack *s) {  // amax(self, dim[], keepdim)
  Args a(op, s);
  auto dims = dims_of(a.v[1], a.t(0).dim());
  push(s, wrap(reduce<F>(tv(a.t(0)), dims, a.b(2), op.schema().name().c_str())));
}

template <bool Max>
void minmax_dim(const c10::OperatorHandle &op, Stack *s) {  // max.dim(self, dim, keepdim) -> (values, indices)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  bool keep = a.b(2);
  G x = tv(t);
  if (t.dim() == 0) {
    push(s, wrap(x));
    push(s, wrap(chk(graft_zeros(GRAFT_I64, 0, nullptr), "max")));
    return;
  }
  G vals = chk(Max ? graft_max(x.get(), &d, 1, keep) : graft_min(x.get(), &d, 1, keep), "max.dim");
  G src = Max ? x : chk(graft_neg(x.get()), "min.dim");
  G idx = chk(graft_argmax(src.get(), d, keep), "argmax");
  push(s, wrap(std::move(vals)));
  push(s, wrap(std::move(idx)));
}

template <bool Max>
void argmaxmin(const c10::OperatorHandle &op, Stack *s) {  // argmax/argmin(self, dim?, keepdim)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G x = tv(t);
  bool keep = a.b(2);
  if (a.none(1)) {
    int64_t n = t.numel();
    x = reshape_to(x, {n});
    G r = chk((Max ? graft_argmax : graft_argmin)(x.get(), 0, false), "argmax");
    if (keep) r = reshape_to(r, std::vector<int64_t>(t.dim(), 1));
    push(s, wrap(std::move(r)));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  if (t.dim() == 0) {
    push(s, wrap(chk(graft_zeros(GRAFT_I64, 0, nullptr), "argmax")));
    return;
  }
  push(s, wrap(chk((Max ? graft_argmax : graft_argmin)(x.get(), d, keep), "argmax")));
}

// var / std with correction (var.correction(self, dim?, correction?, keepdim))
template <bool Std>
void var_corr(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G x = reduce_input(t, a, -1, true);
  auto dims = dims_of(a.v[1], t.dim());
  double corr = a.none(2) ? 1.0 : a.d(2);
  bool keep = a.b(3);
  int64_t n = 1;
  if (dims.empty()) n = t.numel();
  else for (int d : dims) n *= t.size(d);
  G m = reduce<graft_mean>(x, dims, true, "var");
  G dx = chk(graft_sub(x.get(), m.get()), "var");
  G sq = chk(graft_mul(dx.get(), dx.get()), "var");
  G ss = reduce<graft_sum>(sq, dims, keep, "var");
  G r = chk(graft_div(ss.get(), scal(std::max(0.0, (double)n - corr), gst(ss)).get()), "var");
  if (Std) r = chk(graft_sqrt(r.get()), "std");
  push(s, wrap(std::move(r)));
}

// Linear algebra ------------------------------------------------------------------
void same_dtype(const at::Tensor &a, const at::Tensor &b, const char *what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(),
              " but found ", b.scalar_type(), " (in ", what, ")");
}

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

// addmm(self, mat1, mat2, beta, alpha) / baddbmm(self, b1, b2, beta, alpha)
void addmm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &b = a.t(0), &x = a.t(1), &y = a.t(2);
  same_dtype(x, y, "addmm");
  same_dtype(b, x, "addmm");
  if (op.schema().name() == "aten::addmm") {
    TORCH_CHECK(x.dim() == 2 && y.dim() == 2, "addmm: mat1 and mat2 must be matrices");
    TORCH_CHECK(x.size(1) == y.size(0), "mat1 and mat2 shapes cannot be multiplied (", x.size(0), "x",
                x.size(1), " and ", y.size(0), "x", y.size(1), ")");
  }
  at::ScalarType st = x.scalar_type();
  G gx = tv(x), gy = tv(y);
  G r = chk(graft_matmul(gx.get(), gy.get()), "addmm");
  double beta = a.d(3), alpha = a.d(4);
  if (alpha != 1.0) r = chk(graft_mul(r.get(), scal(alpha, st).get()), "addmm");
  if (beta != 0.0) {
    G gb = tv(b);
    if (beta != 1.0) gb = chk(graft_mul(gb.get(), scal(beta, st).get()), "addmm");
    r = chk(graft_add(r.get(), gb.get()), "addmm");
  }
  push(s, wrap(std::move(r)));
}

// addmv(self, mat, vec, beta, alpha)
void addmv(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &b = a.t(0), &x = a.t(1), &y = a.t(2);
  same_dtype(x, y, "addmv");
  at::ScalarType st = x.scalar_type();
  G gx = tv(x), gy = tv(y);
  G r = chk(graft_matmul(gx.get(), gy.get()), "addmv");
  double beta = a.d(3), alpha = a.d(4);
  if (alpha != 1.0) r = chk(graft_mul(r.get(), scal(alpha, st).get()), "addmv");
  if (beta != 0.0) {
    G gb = tv(b);
    if (beta != 1.0) gb = chk(graft_mul(gb.get(), scal(beta, st).get()), "addmv");
    r = chk(graft_add(r.get(), gb.get()), "addmv");
  }
  push(s, wrap(std::move(r)));
}

// Softmax family ------------------------------------------------------------------
void log_softmax(const c10::OperatorHandle &op, Stack *s) {  // _log_softmax(self, dim, half_to_float)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t);
  if (a.b(2)) x = conv(std::move(x), at::kFloat);
  if (t.dim() == 0) {
    push(s, wrap(chk(graft_zeros(graft_get_dtype(x.get()), 0, nullptr), "log_softmax")));
    return;
  }
  push(s, wrap(chk(graft_log_softmax(x.get(), d), "log_softmax")));
}

void softmax(const c10::OperatorHandle &op, Stack *s) {  // _softmax(self, dim, half_to_float)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t);
  if (a.b(2)) x = conv(std::move(x), at::kFloat);
  if (t.dim() == 0) {
    push(s, wrap(chk(graft_ones(graft_get_dtype(x.get()), 0, nullptr), "softmax")));
    return;
  }
  push(s, wrap(chk(graft_softmax(x.get(), d), "softmax")));
}

// _log_softmax_backward_data(grad_output, output, dim, input_dtype)
void log_softmax_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G g = tv(a.t(0)), y = tv(a.t(1));
  if (a.t(0).dim() == 0) {
    push(s, wrap(chk(graft_mul_scalar(g.get(), 0.0), "log_softmax_backward")));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(2), a.t(0).dim());
  G e = chk(graft_exp(y.get()), "log_softmax_backward");
  G sg = chk(graft_sum(g.get(), &d, 1, true), "log_softmax_backward");
  G p = chk(graft_mul(e.get(), sg.get()), "log_softmax_backward");
  G r = chk(graft_sub(g.get(), p.get()), "log_softmax_backward");
  push(s, wrap(conv(std::move(r), (at::ScalarType)a.i(3))));
}

// _softmax_backward_data(grad_output, output, dim, input_dtype)
void softmax_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G g = tv(a.t(0)), y = tv(a.t(1));
  if (a.t(0).dim() == 0) {
    push(s, wrap(chk(graft_mul_scalar(g.get(), 0.0), "softmax_backward")));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(2), a.t(0).dim());
  G gy = chk(graft_mul(g.get(), y.get()), "softmax_backward");
  G sg = chk(graft_sum(gy.get(), &d, 1, true), "softmax_backward");
  G df = chk(graft_sub(g.get(), sg.get()), "softmax_backward");
  G r = chk(graft_mul(y.get(), df.get()), "softmax_backward");
  push(s, wrap(conv(std::move(r), (at::ScalarType)a.i(3))));
}

// Losses -------------------------------------------------------------------------
// Per-sample weight (w[target] or 1) masked by ignore_index, shape [N]; the safe target.
void nll_parts(const at::Tensor &self, const at::Tensor &target, const c10::IValue &weight,
               int64_t ignore_index, G &w, G &tsafe) {
  TORCH_CHECK(self.dim() >= 1 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  TORCH_CHECK(self.dim() == 1 || self.size(0) == target.size(0), "Expected input batch_size (",
              self.size(0), ") to match target batch_size (", target.size(0), ").");
  at::ScalarType st = self.scalar_type();
  G t = conv(tv(target), at::kLong);
  G ig = scal((double)ignore_index, at::kLong);
  G keep = chk(graft_ne(t.get(), ig.get()), "nll_loss");
  G z = chk(graft_zeros(GRAFT_I64, 0, nullptr), "nll_loss");
  tsafe = chk(graft_where(keep.get(), t.get(), z.get()), "nll_loss");
  if (weight.isTensor() && weight.toTensor().defined()) {
    G gw = conv(tv(weight.toTensor()), st);
    int64_t n = graft_numel(tsafe.get());
    G tf = reshape_to(tsafe, {n});
    w = chk(graft_gather(gw.get(), 0, tf.get()), "nll_loss");
    w = reshape_to(w, gshape(tsafe));
  } else {
    w = chk(graft_ones(to_gdt(st), 0, nullptr), "nll_loss");
    w = chk(graft_broadcast_to(w.get(), graft_ndim(tsafe.get()), gshape(tsafe).data()), "nll_loss");
  }
  G zf = chk(graft_zeros(to_gdt(st), 0, nullptr), "nll_loss");
  w = chk(graft_where(keep.get(), w.get(), zf.get()), "nll_loss");
}

// nll_loss_forward(self, target, weight?, reduction, ignore_index) -> (output, total_weight)
void nll_loss_forward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0), &target = a.t(1);
  int64_t red = a.i(3), ig = a.i(4);
  G w, ts;
  nll_parts(x, target, a.v[2], ig, w, ts);
  G gx = tv(x);
  G picked;
  if (x.dim() == 2) {
    int64_t n = x.size(0);
    G ti = reshape_to(ts, {n, 1});
    picked = chk(graft_gather(gx.get(), 1, ti.get()), "nll_loss");
    picked = reshape_to(picked, {n});
  } else {
    G ti = reshape_to(ts, {1});
    picked = chk(graft_gather(gx.get(), 0, ti.get()), "nll_loss");
    picked = reshape_to(picked, {});
  }
  G l = chk(graft_mul(picked.get(), w.get()), "nll_loss");
  l = chk(graft_neg(l.get()), "nll_loss");
  G tw = reduce<graft_sum>(w, {}, false, "nll_loss");
  G out;
  if (red == 0) out = l;
  else {
    out = reduce<graft_sum>(l, {}, false, "nll_loss");
    if (red == 1) out = chk(graft_div(out.get(), tw.get()), "nll_loss");
  }
  push(s, wrap(std::move(out)));
  push(s, wrap(std::move(tw)));
}

// nll_loss_backward(grad_output, self, target, weight?, reduction, ignore_index, total_weight)
void nll_loss_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1), &target = a.t(2);
  int64_t red = a.i(4), ig = a.i(5);
  G w, ts;
  nll_parts(x, target, a.v[3], ig, w, ts);
  at::ScalarType st = x.scalar_type();
  G g = conv(tv(a.t(0)), st);
  G coef = chk(graft_mul(w.get(), g.get()), "nll_loss_backward");  // [N] (g scalar or [N])
  if (red == 1) {
    G tw = conv(tv(a.t(6)), st);
    coef = chk(graft_div(coef.get(), tw.get()), "nll_loss_backward");
  }
  coef = chk(graft_neg(coef.get()), "nll_loss_backward");
  auto xs = x.sizes().vec();
  G onehot, c2;
  if (x.dim() == 2) {
    int64_t n = xs[0];
    G io = chk(graft_iota(GRAFT_I64, 2, xs.data(), 1), "nll_loss_backward");
    G ti = reshape_to(ts, {n, 1});
    onehot = chk(graft_eq(io.get(), ti.get()), "nll_loss_backward");
    c2 = reshape_to(coef, {n, 1});
  } else {
    G io = chk(graft_iota(GRAFT_I64, 1, xs.data(), 0), "nll_loss_backward");
    onehot = chk(graft_eq(io.get(), ts.get()), "nll_loss_backward");
    c2 = coef;
  }
  G z = chk(graft_zeros(to_gdt(st), 0, nullptr), "nll_loss_backward");
  push(s, wrap(chk(graft_where(onehot.get(), c2.get(), z.get()), "nll_loss_backward")));
}

// mse_loss(self, target, reduction)
void mse_loss(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
  G d = chk(graft_sub(x.get(), y.get()), "mse_loss");
  G sq = chk(graft_mul(d.get(), d.get()), "mse_loss");
  int64_t red = a.i(2);
  if (red == 1) sq = reduce<graft_mean>(sq, {}, false, "mse_loss");
  else if (red == 2) sq = reduce<graft_sum>(sq, {}, false, "mse_loss");
  push(s, wrap(std::move(sq)));
}

// mse_loss_backward(grad_output, self, target, reduction)
void mse_loss_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[1], &a.v[2]});
  G g = operand(a.v[0], st), x = operand(a.v[1], st), y = operand(a.v[2], st);
  G d = chk(graft_sub(x.get(), y.get()), "mse_loss_backward");
  double k = 2.0;
  if (a.i(3) == 1) k /= (double)std::max<int64_t>(1, a.t(1).numel());
  d = chk(graft_mul(d.get(), scal(k, st).get()), "mse_loss_backward");
  push(s, wrap(chk(graft_mul(d.get(), g.get()), "mse_loss_backward")));
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
    push(s, wrap(chk(graft_zeros(to_gdt(st), 1, &zero), "cat")));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), use[0].dim());
  std::vector<G> vals;
  std::vector<graft_tensor *> ptrs;
  for (auto &t : use) {
    TORCH_CHECK(is_graft(t), "Expected all tensors to be on the same device, but found at least two "
                "devices, xla:0 (graft) and ", t.device(), "!");
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
    push(s, wrap(chk(graft_zeros(to_gdt(t.scalar_type()), (int)is.size(), is.data()), "gather")));
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
      push(s, wrap(chk(graft_zeros(to_gdt(t.scalar_type()), (int)is.size(), is.data()), "gather")));
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
    G z = chk(graft_zeros(to_gdt(go.scalar_type()), 0, nullptr), "embedding_backward");
    g = chk(graft_where(keep.get(), g.get(), z.get()), "embedding_backward");
  }
  int64_t bs[2] = {n, D};
  idx = chk(graft_broadcast_to(idx.get(), 2, bs), "embedding_backward");
  int64_t zs[2] = {V, D};
  G z = chk(graft_zeros(to_gdt(go.scalar_type()), 2, zs), "embedding_backward");
  push(s, wrap(chk(graft_scatter_add(z.get(), 0, idx.get(), g.get()), "embedding_backward")));
}

// NN ------------------------------------------------------------------------------
// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
void native_layer_norm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  auto ns = a.il(1);
  int64_t nd = x.dim(), k = (int64_t)ns.size();
  std::vector<int> dims;
  for (int64_t i = nd - k; i < nd; ++i) dims.push_back((int)i);
  G gx = tv(x);
  at::ScalarType st = x.scalar_type();
  G m = reduce<graft_mean>(gx, dims, true, "layer_norm");
  G dx = chk(graft_sub(gx.get(), m.get()), "layer_norm");
  G sq = chk(graft_mul(dx.get(), dx.get()), "layer_norm");
  G var = reduce<graft_mean>(sq, dims, true, "layer_norm");
  G rstd = chk(graft_add(var.get(), scal(a.d(4), st).get()), "layer_norm");
  rstd = chk(graft_rsqrt(rstd.get()), "layer_norm");
  G y = chk(graft_mul(dx.get(), rstd.get()), "layer_norm");
  if (!a.none(2) && a.t(2).defined()) y = chk(graft_mul(y.get(), tv(a.t(2)).get()), "layer_norm");
  if (!a.none(3) && a.t(3).defined()) y = chk(graft_add(y.get(), tv(a.t(3)).get()), "layer_norm");
  push(s, wrap(std::move(y)));
  push(s, wrap(std::move(m)));
  push(s, wrap(std::move(rstd)));
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, mask[3])
void native_layer_norm_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  auto ns = a.il(2);
  int64_t nd = x.dim(), k = (int64_t)ns.size();
  std::vector<int> dims, outer;
  int64_t n = 1;
  for (int64_t i = 0; i < nd; ++i) {
    if (i >= nd - k) { dims.push_back((int)i); n *= x.size(i); }
    else outer.push_back((int)i);
  }
  auto mask = a.v[7].toBoolList();
  at::ScalarType st = x.scalar_type();
  G g = tv(a.t(0)), gx = tv(x), m = tv(a.t(3)), rstd = tv(a.t(4));
  G xhat = chk(graft_sub(gx.get(), m.get()), "layer_norm_backward");
  xhat = chk(graft_mul(xhat.get(), rstd.get()), "layer_norm_backward");
  bool hasw = !a.none(5) && a.t(5).defined();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    G gh = hasw ? chk(graft_mul(g.get(), tv(a.t(5)).get()), "layer_norm_backward") : g;
    // dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))
    G m1 = reduce<graft_mean>(gh, dims, true, "layer_norm_backward");
    G gx2 = chk(graft_mul(gh.get(), xhat.get()), "layer_norm_backward");
    G m2 = reduce<graft_mean>(gx2, dims, true, "layer_norm_backward");
    G t2 = chk(graft_mul(xhat.get(), m2.get()), "layer_norm_backward");
    G r = chk(graft_sub(gh.get(), m1.get()), "layer_norm_backward");
    r = chk(graft_sub(r.get(), t2.get()), "layer_norm_backward");
    r = chk(graft_mul(r.get(), rstd.get()), "layer_norm_backward");
    gi = wrap(std::move(r));
  }
  if (mask[1] && hasw) {
    G p = chk(graft_mul(g.get(), xhat.get()), "layer_norm_backward");
    gw = wrap(outer.empty() ? p : reduce<graft_sum>(p, outer, false, "layer_norm_backward"));
  }
  if (mask[2] && !a.none(6) && a.t(6).defined()) {
    gb = wrap(outer.empty() ? g : reduce<graft_sum>(g, outer, false, "layer_norm_backward"));
  }
  (void)st;
  (void)n;
  push(s, gi);
  push(s, gw);
  push(s, gb);
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
//   -> (out, save_mean, save_invstd); updates running stats in place when training.
void native_batch_norm(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0);
  int64_t nd = x.dim();
  TORCH_CHECK(nd >= 2, "batch_norm: expected at least 2-D input");
  int64_t C = x.size(1);
  std::vector<int> dims;
  int64_t cnt = 1;
  for (int i = 0; i < nd; ++i)
    if (i != 1) { dims.push_back(i); cnt *= x.size(i); }
  std::vector<int64_t> bshape(nd, 1);
  bshape[1] = C;
  at::ScalarType st = x.scalar_type();
  bool training = a.b(5);
  double mom = a.d(6), eps = a.d(7);
  bool has_rm = !a.none(3) && a.t(3).defined(), has_rv = !a.none(4) && a.t(4).defined();
  G gx = tv(x);
  G mean, invstd, y;
  if (training) {
    G m = reduce<graft_mean>(gx, dims, true, "batch_norm");
    G dx = chk(graft_sub(gx.get(), m.get()), "batch_norm");
    G sq = chk(graft_mul(dx.get(), dx.get()), "batch_norm");
    G var = reduce<graft_mean>(sq, dims, true, "batch_norm");
    G is = chk(graft_add(var.get(), scal(eps, st).get()), "batch_norm");
    is = chk(graft_rsqrt(is.get()), "batch_norm");
    y = chk(graft_mul(dx.get(), is.get()), "batch_norm");
    mean = reshape_to(m, {C});
    invstd = reshape_to(is, {C});
    if (has_rm) {
      G rm = tv(a.t(3));
      G upd = chk(graft_mul(rm.get(), scal(1 - mom, st).get()), "batch_norm");
      G mm_ = chk(graft_mul(mean.get(), scal(mom, st).get()), "batch_norm");
      write(a.t(3), chk(graft_add(upd.get(), mm_.get()), "batch_norm"));
    }
    if (has_rv) {
      G rv = tv(a.t(4));
      G v1 = reshape_to(var, {C});
      double unb = cnt > 1 ? (double)cnt / (double)(cnt - 1) : 1.0;
      v1 = chk(graft_mul(v1.get(), scal(mom * unb, st).get()), "batch_norm");
      G upd = chk(graft_mul(rv.get(), scal(1 - mom, st).get()), "batch_norm");
      write(a.t(4), chk(graft_add(upd.get(), v1.get()), "batch_norm"));
    }
  } else {
    TORCH_CHECK(has_rm && has_rv, "batch_norm: running_mean and running_var must be defined in eval mode");
    G rm = reshape_to(tv(a.t(3)), bshape), rv = reshape_to(tv(a.t(4)), bshape);
    G is = chk(graft_add(rv.get(), scal(eps, st).get()), "batch_norm");
    is = chk(graft_rsqrt(is.get()), "batch_norm");
    G dx = chk(graft_sub(gx.get(), rm.get()), "batch_norm");
    y = chk(graft_mul(dx.get(), is.get()), "batch_norm");
    int64_t zero = 0;  // PyTorch returns empty save_mean / save_invstd in eval mode
    mean = chk(graft_zeros(to_gdt(st), 1, &zero), "batch_norm");
    invstd = chk(graft_zeros(to_gdt(st), 1, &zero), "batch_norm");
  }
  if (!a.none(1) && a.t(1).defined()) y = chk(graft_mul(y.get(), reshape_to(tv(a.t(1)), bshape).get()), "batch_norm");
  if (!a.none(2) && a.t(2).defined()) y = chk(graft_add(y.get(), reshape_to(tv(a.t(2)), bshape).get()), "batch_norm");
  push(s, wrap(std::move(y)));
  push(s, wrap(std::move(mean)));
  push(s, wrap(std::move(invstd)));
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
//   save_invstd?, train, eps, output_mask[3])
void native_batch_norm_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(1);
  int64_t nd = x.dim(), C = x.size(1);
  std::vector<int> dims;
  for (int i = 0; i < nd; ++i)
    if (i != 1) dims.push_back(i);
  std::vector<int64_t> bshape(nd, 1);
  bshape[1] = C;
  at::ScalarType st = x.scalar_type();
  bool train = a.b(7);
  double eps = a.d(8);
  auto mask = a.v[9].toBoolList();
  G g = tv(a.t(0)), gx = tv(x);
  G mean, is;
  if (train) {
    mean = reshape_to(tv(a.t(5)), bshape);
    is = reshape_to(tv(a.t(6)), bshape);
  } else {
    mean = reshape_to(tv(a.t(3)), bshape);
    G rv = reshape_to(tv(a.t(4)), bshape);
    is = chk(graft_add(rv.get(), scal(eps, st).get()), "batch_norm_backward");
    is = chk(graft_rsqrt(is.get()), "batch_norm_backward");
  }
  G xhat = chk(graft_sub(gx.get(), mean.get()), "batch_norm_backward");
  xhat = chk(graft_mul(xhat.get(), is.get()), "batch_norm_backward");
  bool hasw = !a.none(2) && a.t(2).defined();
  G w = hasw ? reshape_to(tv(a.t(2)), bshape) : G();
  at::Tensor gi, gw, gb;
  if (mask[0]) {
    G gh = hasw ? chk(graft_mul(g.get(), w.get()), "batch_norm_backward") : g;
    G r;
    if (train) {
      G m1 = reduce<graft_mean>(gh, dims, true, "batch_norm_backward");
      G gx2 = chk(graft_mul(gh.get(), xhat.get()), "batch_norm_backward");
      G m2 = reduce<graft_mean>(gx2, dims, true, "batch_norm_backward");
      G t2 = chk(graft_mul(xhat.get(), m2.get()), "batch_norm_backward");
      r = chk(graft_sub(gh.get(), m1.get()), "batch_norm_backward");
      r = chk(graft_sub(r.get(), t2.get()), "batch_norm_backward");
      r = chk(graft_mul(r.get(), is.get()), "batch_norm_backward");
    } else {
      r = chk(graft_mul(gh.get(), is.get()), "batch_norm_backward");
    }
    gi = wrap(std::move(r));
  }
  if (mask[1]) {
    G p = chk(graft_mul(g.get(), xhat.get()), "batch_norm_backward");
    gw = wrap(reduce<graft_sum>(p, dims, false, "batch_norm_backward"));
  }
  if (mask[2]) gb = wrap(reduce<graft_sum>(g, dims, false, "batch_norm_backward"));
  push(s, gi);
  push(s, gw);
  push(s, gb);
}

std::vector<int> pair(const std::vector<int64_t> &v, int64_t dflt) {
  if (v.empty()) return {(int)dflt, (int)dflt};
  if (v.size() == 1) return {(int)v[0], (int)v[0]};
  return {(int)v[0], (int)v[1]};
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
  std::vector<int64_t> lo(nd, 0), hi(nd, 0), in(nd, 0);
  in[nd - 2] = st[0] - 1;
  in[nd - 1] = st[1] - 1;
  G acc;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      lo[nd - 2] = i;
      hi[nd - 2] = HP - (i + (OH - 1) * st[0] + 1);
      lo[nd - 1] = j;
      hi[nd - 1] = WP - (j + (OW - 1) * st[1] + 1);
      if (hi[nd - 2] < 0 || hi[nd - 1] < 0) continue;  // offset past the padded input
      G t = chk(graft_pad_ex(g.get(), lo.data(), hi.data(), in.data(), 0.0), "pool backward");
      acc = acc ? chk(graft_add(acc.get(), t.get()), "pool backward") : t;
    }
  std::vector<int64_t> a0(nd, 0), a1 = gshape(acc);
  a0[nd - 2] = p[0];
  a0[nd - 1] = p[1];
  a1[nd - 2] = p[0] + H;
  a1[nd - 1] = p[1] + W;
  return chk(graft_slice(acc.get(), a0.data(), a1.data(), nullptr), "pool backward");
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

bool use_im2col(int groups) {
  static const char *m = getenv("GRAFT_TORCH_CONV");
  return groups == 1 && !(m && std::string(m) == "native");
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
  std::vector<int64_t> a0(nd, 0), a1 = xs, step(nd, 1);
  step[nd - 2] = st[0];
  step[nd - 1] = st[1];
  G acc;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      a0[nd - 2] = i;
      a1[nd - 2] = i + (OH - 1) * st[0] + 1;
      a0[nd - 1] = j;
      a1[nd - 1] = j + (OW - 1) * st[1] + 1;
      G v = chk(graft_slice(x.get(), a0.data(), a1.data(), step.data()), "avg_pool2d");
      acc = acc ? chk(graft_add(acc.get(), v.get()), "avg_pool2d") : v;
    }
  return chk(graft_mul(acc.get(), fullc(1.0 / ((double)k[0] * k[1]), graft_get_dtype(acc.get())).get()), "avg_pool2d");
}

// Rows/cols past the high padding that ceil_mode's last window reaches (0 without ceil_mode).
std::vector<int> ceil_extra(const at::Tensor &x, const std::vector<int> &k, const std::vector<int> &st,
                            const std::vector<int> &p, bool ceil, const std::vector<int> &dl = {1, 1}) {
  std::vector<int> e = {0, 0};
  for (int d = 0; d < 2 && ceil; ++d) {
    int64_t n = x.size(x.dim() - 2 + d), o = pool_out(n, k[d], st[d], p[d], dl[d], true);
    e[d] = (int)std::max<int64_t>(0, (o - 1) * st[d] + (int64_t)dl[d] * (k[d] - 1) + 1 - (n + 2 * p[d]));
  }
  return e;
}

// Dilated max pooling (graft's pooling has no dilation): the window offsets' strided slices of
// the padded input; out = their max; first-max hits give indices and the gradient.
struct DilatedPool {
  G xpad, out;
  std::vector<G> hits;  // per offset, in window order: this offset holds the first maximum
  std::vector<int64_t> lin;  // per offset: (i*dl0 - p0)*W + (j*dl1 - p1)
};

DilatedPool dilated_max_pool(const G &gx, int64_t W, const std::vector<int> &k, const std::vector<int> &st,
                             const std::vector<int> &p, const std::vector<int> &dl, const std::vector<int> &e,
                             double ninf, bool want_hits) {
  DilatedPool r;
  r.xpad = pad_hw(gx, p, e, ninf);
  auto xs = gshape(r.xpad);
  int nd = (int)xs.size();
  int64_t OH = (xs[nd - 2] - (int64_t)dl[0] * (k[0] - 1) - 1) / st[0] + 1;
  int64_t OW = (xs[nd - 1] - (int64_t)dl[1] * (k[1] - 1) - 1) / st[1] + 1;
  std::vector<int64_t> a0(nd, 0), a1 = xs, step(nd, 1);
  step[nd - 2] = st[0];
  step[nd - 1] = st[1];
  std::vector<G> views;
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      a0[nd - 2] = (int64_t)i * dl[0];
      a1[nd - 2] = a0[nd - 2] + (OH - 1) * st[0] + 1;
      a0[nd - 1] = (int64_t)j * dl[1];
      a1[nd - 1] = a0[nd - 1] + (OW - 1) * st[1] + 1;
      views.push_back(chk(graft_slice(r.xpad.get(), a0.data(), a1.data(), step.data()), "max_pool2d"));
      r.lin.push_back(((int64_t)i * dl[0] - p[0]) * W + ((int64_t)j * dl[1] - p[1]));
      r.out = r.out ? chk(graft_maximum(r.out.get(), views.back().get()), "max_pool2d") : views.back();
    }
  if (!want_hits) return r;
  auto os = gshape(r.out);
  G taken = fullc(0, GRAFT_BOOL, os);
  for (auto &v : views) {
    G eq = chk(graft_eq(v.get(), r.out.get()), "max_pool2d");
    G nt = chk(graft_logical_not(taken.get()), "max_pool2d");
    G hit = chk(graft_logical_and(eq.get(), nt.get()), "max_pool2d");
    taken = chk(graft_logical_or(taken.get(), hit.get()), "max_pool2d");
    r.hits.push_back(hit);
  }
  return r;
}

bool pool_ok(const at::Tensor &x, const std::vector<int> &k, const std::vector<int> &st,
             const std::vector<int> &p, const std::vector<int> &dl) {
  if ((x.dim() != 3 && x.dim() != 4) || x.numel() == 0) return false;
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

// avg_pool2d(self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override?)
void avg_pool2d(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  auto k = pair(a.il(1), 1);
  auto st = a.il(2).empty() ? k : pair(a.il(2), 1);
  auto p = pair(a.il(3), 0);
  const at::Tensor &x = a.t(0);
  if (!pool_ok(x, k, st, p, {1, 1}) || !at::isFloatingType(x.scalar_type()) || (!a.none(6) && a.i(6) == 0))
    return fall_back(op, s, a);
  auto e = ceil_extra(x, k, st, p, a.b(4));
  bool include_pad = a.b(5);
  G gx = tv(x);
  graft_dtype dt = to_gdt(x.scalar_type());
  if (e[0] == 0 && e[1] == 0 && a.none(6) && (include_pad || (p[0] == 0 && p[1] == 0))) {
    push(s, wrap(window_avg((p[0] || p[1]) ? pad_hw(gx, p, {0, 0}, 0.0) : gx, k, st)));
    return;
  }
  std::vector<int> z = {0, 0};
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
  auto k = pair(a.il(2), 1);
  auto st = a.il(3).empty() ? k : pair(a.il(3), 1);
  auto p = pair(a.il(4), 0);
  const at::Tensor &x = a.t(1);
  if (!pool_ok(x, k, st, p, {1, 1}) || !at::isFloatingType(x.scalar_type()) || (!a.none(7) && a.i(7) == 0))
    return fall_back(op, s, a);
  auto e = ceil_extra(x, k, st, p, a.b(5));
  graft_dtype dt = to_gdt(x.scalar_type());
  G g = conv(tv(a.t(0)), x.scalar_type());
  if (!a.none(7)) g = chk(graft_mul(g.get(), fullc(1.0 / (double)a.i(7), dt).get()), "avg_pool2d_backward");
  else if (e[0] == 0 && e[1] == 0 && (a.b(6) || (p[0] == 0 && p[1] == 0)))
    g = chk(graft_mul(g.get(), fullc(1.0 / ((double)k[0] * k[1]), dt).get()), "avg_pool2d_backward");
  else
    g = chk(graft_div(g.get(), pool_counts(x, k, st, p, e, a.b(6)).get()), "avg_pool2d_backward");
  push(s, wrap(window_scatter(g, x.size(-2), x.size(-1), k, st, p, e)));
}

// max_pool2d_with_indices(self, kernel, stride, padding, dilation, ceil_mode) -> (out, indices)
// The indices (flat positions in each H*W plane of the first maximum, as PyTorch's CPU kernel
// picks) are computed in graft from the window offsets; lazily, so nothing runs unless used.
void max_pool2d_with_indices(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  auto k = pair(a.il(1), 1);
  auto st = a.il(2).empty() ? k : pair(a.il(2), 1);
  auto p = pair(a.il(3), 0);
  auto dl = pair(a.il(4), 1);
  const at::Tensor &x = a.t(0);
  if (!pool_ok(x, k, st, p, dl) || x.scalar_type() == at::kBool) return fall_back(op, s, a);
  auto e = ceil_extra(x, k, st, p, a.b(5), dl);
  G gx = tv(x);
  double ninf = at::isFloatingType(x.scalar_type()) ? -INFINITY : -9.2e18;  // pads never win
  if (dl[0] != 1 || dl[1] != 1 || use_slices(k)) {
    DilatedPool dp = dilated_max_pool(gx, x.size(-1), k, st, p, dl, e, ninf, true);
    auto os = gshape(dp.out);
    int nd = (int)os.size();
    std::vector<int64_t> sp = {os[nd - 2], os[nd - 1]};
    G rows = chk(graft_iota(GRAFT_I64, 2, sp.data(), 0), "max_pool2d");
    G cols = chk(graft_iota(GRAFT_I64, 2, sp.data(), 1), "max_pool2d");
    rows = chk(graft_mul(rows.get(), fullc((double)st[0] * x.size(-1), GRAFT_I64).get()), "max_pool2d");
    cols = chk(graft_mul(cols.get(), fullc(st[1], GRAFT_I64).get()), "max_pool2d");
    G base = chk(graft_add(rows.get(), cols.get()), "max_pool2d");
    G idx = fullc(0, GRAFT_I64, os);
    for (size_t q = 0; q < dp.hits.size(); ++q) {
      G lin = chk(graft_add(base.get(), fullc((double)dp.lin[q], GRAFT_I64).get()), "max_pool2d");
      idx = chk(graft_where(dp.hits[q].get(), lin.get(), idx.get()), "max_pool2d");
    }
    push(s, wrap(std::move(dp.out)));
    push(s, wrap(std::move(idx)));
    return;
  }
  bool padded = p[0] || p[1] || e[0] || e[1];
  G xpad = padded ? pad_hw(gx, p, e, ninf) : gx;
  std::vector<int> z = {0, 0};
  G out = chk(graft_max_pool2d(xpad.get(), k.data(), st.data(), z.data()), "max_pool2d");
  auto os = gshape(out);
  int nd = (int)os.size();
  int64_t W = x.size(-1), OH = os[nd - 2], OW = os[nd - 1];
  std::vector<int64_t> sp = {OH, OW};
  G rows = chk(graft_iota(GRAFT_I64, 2, sp.data(), 0), "max_pool2d");
  G cols = chk(graft_iota(GRAFT_I64, 2, sp.data(), 1), "max_pool2d");
  rows = chk(graft_mul(rows.get(), fullc(st[0], GRAFT_I64).get()), "max_pool2d");
  cols = chk(graft_mul(cols.get(), fullc(st[1], GRAFT_I64).get()), "max_pool2d");
  G base = chk(graft_mul(rows.get(), fullc((double)W, GRAFT_I64).get()), "max_pool2d");
  base = chk(graft_add(base.get(), cols.get()), "max_pool2d");  // (oh*s0)*W + ow*s1
  G idx = fullc(0, GRAFT_I64, os), taken = fullc(0, GRAFT_BOOL, os);
  std::vector<int64_t> a0(nd, 0), a1 = gshape(xpad), step(nd, 1);
  step[nd - 2] = st[0];
  step[nd - 1] = st[1];
  for (int i = 0; i < k[0]; ++i)
    for (int j = 0; j < k[1]; ++j) {
      a0[nd - 2] = i;
      a1[nd - 2] = i + (OH - 1) * st[0] + 1;
      a0[nd - 1] = j;
      a1[nd - 1] = j + (OW - 1) * st[1] + 1;
      G xv = chk(graft_slice(xpad.get(), a0.data(), a1.data(), step.data()), "max_pool2d");
      G eq = chk(graft_eq(xv.get(), out.get()), "max_pool2d");
      G nt = chk(graft_logical_not(taken.get()), "max_pool2d");
      G hit = chk(graft_logical_and(eq.get(), nt.get()), "max_pool2d");
      taken = chk(graft_logical_or(taken.get(), hit.get()), "max_pool2d");
      G lin = chk(graft_add(base.get(), fullc((double)((i - p[0]) * W + (j - p[1])), GRAFT_I64).get()), "max_pool2d");
      idx = chk(graft_where(hit.get(), lin.get(), idx.get()), "max_pool2d");
    }
  push(s, wrap(std::move(out)));
  push(s, wrap(std::move(idx)));
}

// max_pool2d_with_indices_backward(grad_output, self, kernel, stride, padding, dilation, ceil_mode,
// indices): graft's own gradient (first maximum of each window) from self; indices unused.
void max_pool2d_with_indices_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  auto k = pair(a.il(2), 1);
  auto st = a.il(3).empty() ? k : pair(a.il(3), 1);
  auto p = pair(a.il(4), 0);
  auto dl = pair(a.il(5), 1);
  const at::Tensor &x = a.t(1);
  if (!pool_ok(x, k, st, p, dl) || !at::isFloatingType(x.scalar_type())) return fall_back(op, s, a);
  auto e = ceil_extra(x, k, st, p, a.b(6), dl);
  G gx = tv(x), g = conv(tv(a.t(0)), x.scalar_type());
  if (dl[0] != 1 || dl[1] != 1 || use_slices(k)) {
    DilatedPool dp = dilated_max_pool(gx, x.size(-1), k, st, p, dl, e, -INFINITY, true);
    auto xs = gshape(dp.xpad), gs = gshape(g);
    int nd = (int)xs.size();
    int64_t OH = gs[nd - 2], OW = gs[nd - 1];
    std::vector<int64_t> lo(nd, 0), hi(nd, 0), in(nd, 0);
    in[nd - 2] = st[0] - 1;
    in[nd - 1] = st[1] - 1;
    G z = fullc(0, to_gdt(x.scalar_type()));
    G acc;
    size_t q = 0;
    for (int i = 0; i < k[0]; ++i)
      for (int j = 0; j < k[1]; ++j, ++q) {
        lo[nd - 2] = (int64_t)i * dl[0];
        hi[nd - 2] = xs[nd - 2] - (lo[nd - 2] + (OH - 1) * st[0] + 1);
        lo[nd - 1] = (int64_t)j * dl[1];
        hi[nd - 1] = xs[nd - 1] - (lo[nd - 1] + (OW - 1) * st[1] + 1);
        G gq = chk(graft_where(dp.hits[q].get(), g.get(), z.get()), "max_pool2d_backward");
        G t = chk(graft_pad_ex(gq.get(), lo.data(), hi.data(), in.data(), 0.0), "max_pool2d_backward");
        acc = acc ? chk(graft_add(acc.get(), t.get()), "max_pool2d_backward") : t;
      }
    std::vector<int64_t> a0(nd, 0), a1 = xs;
    a0[nd - 2] = p[0];
    a0[nd - 1] = p[1];
    a1[nd - 2] = p[0] + x.size(-2);
    a1[nd - 1] = p[1] + x.size(-1);
    push(s, wrap(chk(graft_slice(acc.get(), a0.data(), a1.data(), nullptr), "max_pool2d_backward")));
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
  auto rs = gshape(r);
  int nd = (int)rs.size();
  std::vector<int64_t> a0(nd, 0), a1 = rs;
  a0[nd - 2] = p[0];
  a0[nd - 1] = p[1];
  a1[nd - 2] = p[0] + x.size(-2);
  a1[nd - 1] = p[1] + x.size(-1);
  push(s, wrap(chk(graft_slice(r.get(), a0.data(), a1.data(), nullptr), "max_pool2d_backward")));
}

// Adaptive average pooling. Output cell i of a dim of size n -> m covers [floor(i*n/m),
// ceil((i+1)*n/m)). Divisible sizes are avg_pool with kernel = stride = n/m; otherwise a
// pooling matrix P [m, n] (built from iota in the graph, so constant-folded) and P x P^T.
G adaptive_matrix(int64_t n, int64_t m, graft_dtype dt) {
  std::vector<int64_t> sh = {m, n};
  G io = chk(graft_iota(GRAFT_I64, 2, sh.data(), 0), "adaptive_avg_pool2d");
  G ih = chk(graft_iota(GRAFT_I64, 2, sh.data(), 1), "adaptive_avg_pool2d");
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

std::vector<int> two_ints(std::vector<int64_t> v, int64_t dflt) {
  if (v.empty()) v.push_back(dflt);
  if (v.size() == 1) v.push_back(v[0]);
  return {(int)v[0], (int)v[1]};
}

// 1-D convolutions run as 2-D ones over [N, C, 1, L].
G as_4d(const G &v) {
  auto sh = gshape(v);
  if (sh.size() == 4) return v;
  sh.insert(sh.end() - 1, 1);
  return reshape_to(v, sh);
}

// im2col lowering of a (groups=1, non-transposed) convolution: the k*k window offsets of the
// padded input as strided slices, stacked into a [C*KH*KW, N*OH*OW] matrix, so the convolution,
// its weight gradient and its input gradient are single matrix products plus data movement
// (which graft's compiling backend generates natively). GRAFT_TORCH_CONV=native uses graft's
// conv2d primitives instead.
struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, OH, OW, HP, WP;
};

ConvGeom conv_geom(const std::vector<int64_t> &xs, const std::vector<int64_t> &ws, const std::vector<int> &st,
                   const std::vector<int> &p, const std::vector<int> &dl) {
  ConvGeom g;
  g.N = xs[0], g.C = xs[1], g.H = xs[2], g.W = xs[3], g.O = ws[0], g.KH = ws[2], g.KW = ws[3];
  g.HP = g.H + 2 * p[0], g.WP = g.W + 2 * p[1];
  g.OH = (g.HP - (int64_t)dl[0] * (g.KH - 1) - 1) / st[0] + 1;
  g.OW = (g.WP - (int64_t)dl[1] * (g.KW - 1) - 1) / st[1] + 1;
  return g;
}

// cols [C*KH*KW, N*OH*OW] of x [N,C,H,W].
G im2col(const G &x, const ConvGeom &g, const std::vector<int> &st, const std::vector<int> &p,
         const std::vector<int> &dl) {
  int perm[4] = {1, 0, 2, 3};
  G xt = chk(graft_transpose(x.get(), perm), "conv2d");  // [C,N,H,W]
  if (p[0] || p[1]) xt = pad_hw(xt, p, {0, 0}, 0.0);
  std::vector<G> parts;
  std::vector<graft_tensor *> ptrs;
  int64_t NL = g.N * g.OH * g.OW;
  for (int i = 0; i < g.KH; ++i)
    for (int j = 0; j < g.KW; ++j) {
      int64_t a0[4] = {0, 0, (int64_t)i * dl[0], (int64_t)j * dl[1]};
      int64_t a1[4] = {g.C, g.N, a0[2] + (g.OH - 1) * st[0] + 1, a0[3] + (g.OW - 1) * st[1] + 1};
      int64_t step[4] = {1, 1, st[0], st[1]};
      G v = chk(graft_slice(xt.get(), a0, a1, step), "conv2d");
      parts.push_back(reshape_to(v, {g.C, 1, NL}));
      ptrs.push_back(parts.back().get());
    }
  G c = ptrs.size() == 1 ? parts[0] : chk(graft_concat(ptrs.data(), (int)ptrs.size(), 1), "conv2d");
  return reshape_to(c, {g.C * g.KH * g.KW, NL});
}

// dy [N,O,OH,OW] as [O, N*OH*OW].
G dy_rows(const G &dy, const ConvGeom &g) {
  int perm[4] = {1, 0, 2, 3};
  G t = chk(graft_transpose(dy.get(), perm), "conv2d");
  return reshape_to(t, {g.O, g.N * g.OH * g.OW});
}

G im2col_conv(const G &x, const G &w, const std::vector<int> &st, const std::vector<int> &p,
              const std::vector<int> &dl) {
  ConvGeom g = conv_geom(gshape(x), gshape(w), st, p, dl);
  TORCH_CHECK(g.OH > 0 && g.OW > 0, "graft: convolution output would be empty");
  G cols = im2col(x, g, st, p, dl);
  G w2 = reshape_to(w, {g.O, g.C * g.KH * g.KW});
  G y = chk(graft_matmul(w2.get(), cols.get()), "conv2d");  // [O, N*L]
  y = reshape_to(y, {g.O, g.N, g.OH, g.OW});
  int perm[4] = {1, 0, 2, 3};
  return chk(graft_transpose(y.get(), perm), "conv2d");
}

G im2col_conv_bwd_weight(const G &x, const G &dy, const std::vector<int64_t> &ws, const std::vector<int> &st,
                         const std::vector<int> &p, const std::vector<int> &dl) {
  ConvGeom g = conv_geom(gshape(x), ws, st, p, dl);
  G cols = im2col(x, g, st, p, dl);
  G ct = chk(graft_t(cols.get()), "conv2d_backward_weight");
  G dw = chk(graft_matmul(dy_rows(dy, g).get(), ct.get()), "conv2d_backward_weight");  // [O, CKK]
  return reshape_to(dw, ws);
}

G im2col_conv_bwd_input(const G &dy, const G &w, const std::vector<int64_t> &xs, const std::vector<int> &st,
                        const std::vector<int> &p, const std::vector<int> &dl) {
  ConvGeom g = conv_geom(xs, gshape(w), st, p, dl);
  G w2 = reshape_to(w, {g.O, g.C * g.KH * g.KW});
  G wt = chk(graft_t(w2.get()), "conv2d_backward_input");
  G dc = chk(graft_matmul(wt.get(), dy_rows(dy, g).get()), "conv2d_backward_input");  // [CKK, N*L]
  dc = reshape_to(dc, {g.C, g.KH * g.KW, g.N, g.OH, g.OW});
  G acc;
  for (int i = 0; i < g.KH; ++i)
    for (int j = 0; j < g.KW; ++j) {
      int64_t q = i * g.KW + j;
      int64_t a0[5] = {0, q, 0, 0, 0}, a1[5] = {g.C, q + 1, g.N, g.OH, g.OW};
      G part = reshape_to(chk(graft_slice(dc.get(), a0, a1, nullptr), "conv2d_backward_input"),
                          {g.C, g.N, g.OH, g.OW});
      int64_t lo[4] = {0, 0, (int64_t)i * dl[0], (int64_t)j * dl[1]};
      int64_t hi[4] = {0, 0, g.HP - (lo[2] + (g.OH - 1) * st[0] + 1), g.WP - (lo[3] + (g.OW - 1) * st[1] + 1)};
      int64_t in[4] = {0, 0, st[0] - 1, st[1] - 1};
      G t = chk(graft_pad_ex(part.get(), lo, hi, in, 0.0), "conv2d_backward_input");
      acc = acc ? chk(graft_add(acc.get(), t.get()), "conv2d_backward_input") : t;
    }
  if (p[0] || p[1]) {
    int64_t a0[4] = {0, 0, p[0], p[1]}, a1[4] = {g.C, g.N, p[0] + g.H, p[1] + g.W};
    acc = chk(graft_slice(acc.get(), a0, a1, nullptr), "conv2d_backward_input");
  }
  int perm[4] = {1, 0, 2, 3};
  return chk(graft_transpose(acc.get(), perm), "conv2d_backward_input");
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
void convolution(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0), &w = a.t(1);
  bool one_d = x.dim() == 3 && w.dim() == 3;
  if (!((x.dim() == 4 && w.dim() == 4) || one_d) || !at::isFloatingType(x.scalar_type()))
    return fall_back(op, s, a);
  same_dtype(x, w, "convolution");
  auto fix = [&](std::vector<int64_t> v, int64_t dflt) {
    if (v.empty()) v.push_back(dflt);
    auto r = two_ints(v, dflt);
    if (one_d) r[0] = (int)dflt;
    return r;
  };
  auto s2 = fix(a.il(3), 1), p2 = fix(a.il(4), 0), d2 = fix(a.il(5), 1), op2 = fix(a.il(7), 0);
  int groups = (int)a.i(8);
  bool transposed = a.b(6);
  G gx = as_4d(tv(x)), gw = as_4d(tv(w));
  G r;
  if (!transposed && use_im2col(groups)) {
    r = im2col_conv(gx, gw, s2, p2, d2);
  } else if (!transposed) {
    r = chk(graft_conv2d(gx.get(), gw.get(), s2.data(), p2.data(), d2.data(), groups), "conv2d");
  } else {
    // conv_transpose(x, w) is the input-gradient of conv(., w) with x as dy.
    auto ws = gshape(gw), xs = gshape(gx);
    std::vector<int64_t> osz = {xs[0], ws[1] * groups, 0, 0};
    for (int d = 0; d < 2; ++d)
      osz[2 + d] = (xs[2 + d] - 1) * s2[d] - 2 * p2[d] + (int64_t)d2[d] * (ws[2 + d] - 1) + op2[d] + 1;
    std::vector<int> zp = {0, 0};
    std::vector<int64_t> big = osz;
    big[2] += 2 * p2[0];
    big[3] += 2 * p2[1];
    r = use_im2col(groups)
            ? im2col_conv_bwd_input(gx, gw, big, s2, zp, d2)
            : chk(graft_conv2d_backward_input(gx.get(), gw.get(), big.data(), s2.data(), zp.data(), d2.data(), groups),
                  "conv_transpose2d");
    if (p2[0] || p2[1]) {
      std::vector<int64_t> a0 = {0, 0, p2[0], p2[1]}, a1 = {osz[0], osz[1], p2[0] + osz[2], p2[1] + osz[3]};
      r = chk(graft_slice(r.get(), a0.data(), a1.data(), nullptr), "conv_transpose2d");
    }
  }
  if (!a.none(2) && a.t(2).defined()) {
    G b = reshape_to(conv(tv(a.t(2)), x.scalar_type()), {1, a.t(2).numel(), 1, 1});
    r = chk(graft_add(r.get(), b.get()), "conv2d");
  }
  if (one_d) {
    auto rs = gshape(r);
    r = reshape_to(r, {rs[0], rs[1], rs[3]});
  }
  push(s, wrap(std::move(r)));
}

// Input gradient of a (non-transposed) conv, also when padding exceeds dilation*(kernel-1):
// computed for the explicitly padded input with no padding, then cropped.
G conv_bwd_input(const G &dy, const G &w, std::vector<int64_t> xs, const std::vector<int> &st,
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
  std::vector<int64_t> a0 = {0, 0, p[0], p[1]}, a1 = {xs[0], xs[1], p[0] + xs[2], p[1] + xs[3]};
  return chk(graft_slice(r.get(), a0.data(), a1.data(), nullptr), "conv2d_backward_input");
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
//   transposed, output_padding, groups, output_mask[3]) -> (grad_input, grad_weight, grad_bias)
void convolution_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &go = a.t(0), &x = a.t(1), &w = a.t(2);
  bool one_d = x.dim() == 3 && w.dim() == 3 && go.dim() == 3;
  if (!((x.dim() == 4 && w.dim() == 4 && go.dim() == 4) || one_d) || !at::isFloatingType(x.scalar_type()))
    return fall_back(op, s, a);
  auto fix = [&](std::vector<int64_t> v, int64_t dflt) {
    if (v.empty()) v.push_back(dflt);
    auto r = two_ints(v, dflt);
    if (one_d) r[0] = (int)dflt;
    return r;
  };
  auto s2 = fix(a.il(4), 1), p2 = fix(a.il(5), 0), d2 = fix(a.il(6), 1), op2 = fix(a.il(8), 0);
  bool transposed = a.b(7);
  int groups = (int)a.i(9);
  auto mask = a.v[10].toBoolList();
  at::ScalarType stp = x.scalar_type();
  G g = as_4d(conv(tv(go), stp)), gx = as_4d(tv(x)), gw = as_4d(conv(tv(w), stp));
  auto xs = gshape(gx), ws = gshape(gw), ys = gshape(g);
  auto back3 = [&](G v) {
    if (!one_d) return v;
    auto sh = gshape(v);
    return reshape_to(v, {sh[0], sh[1], sh[3]});
  };
  at::Tensor gi, gwt, gb;
  if (mask[0]) {
    G r = transposed ? (use_im2col(groups) ? im2col_conv(g, gw, s2, p2, d2)
                                           : chk(graft_conv2d(g.get(), gw.get(), s2.data(), p2.data(), d2.data(), groups),
                                                 "conv_transpose backward"))
          : use_im2col(groups) ? im2col_conv_bwd_input(g, gw, xs, s2, p2, d2)
                               : conv_bwd_input(g, gw, xs, s2, p2, d2, groups);
    if (transposed) {  // output_padding >= stride (possible with dilation) leaves extra rows: crop
      auto rs = gshape(r);
      if (rs[2] != xs[2] || rs[3] != xs[3]) {
        std::vector<int64_t> a0 = {0, 0, 0, 0}, a1 = {rs[0], rs[1], xs[2], xs[3]};
        r = chk(graft_slice(r.get(), a0.data(), a1.data(), nullptr), "conv_transpose backward");
      }
    }
    gi = wrap(back3(std::move(r)));
  }
  if (mask[1]) {
    G r;
    if (!transposed && use_im2col(groups)) {
      r = im2col_conv_bwd_weight(gx, g, ws, s2, p2, d2);
    } else if (transposed && use_im2col(groups)) {
      r = im2col_conv_bwd_weight(g, gx, ws, s2, p2, d2);
    } else if (!transposed) {
      r = chk(graft_conv2d_backward_weight(gx.get(), g.get(), ws.data(), s2.data(), p2.data(), d2.data(), groups),
              "conv2d_backward_weight");
    } else {
      // y = conv_transpose(x, w) = adjoint of conv(., w): dw = backward_weight(input = dy, dy = x)
      r = chk(graft_conv2d_backward_weight(g.get(), gx.get(), ws.data(), s2.data(), p2.data(), d2.data(), groups),
              "conv_transpose backward_weight");
    }
    gwt = wrap(back3(std::move(r)));
  }
  if (mask[2]) {
    std::vector<int> dims = {0, 2, 3};
    gb = wrap(chk(graft_sum(g.get(), dims.data(), 3, false), "convolution_backward (bias)"));
  }
  (void)ys;
  (void)op2;
  push(s, gi);
  push(s, gwt);
  push(s, gb);
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
    G i = conv(is_graft(idx[d]) ? value(idx[d]) : from_cpu(idx[d]), at::kLong);
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
    push(s, wrap(chk(graft_zeros(to_gdt(x.scalar_type()), (int)out.size(), out.data()), "repeat")));
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

// nll_loss2d_forward / _backward: the class dim moved last and the rest flattened into rows,
// then the 1-D lowerings (same argument layout) on those rows.
void nll2d_rows(const at::Tensor &x, const at::Tensor &t, at::Tensor &x2, at::Tensor &t2) {
  int64_t nd = x.dim(), C = x.size(1);
  std::vector<int> perm = {0};
  for (int i = 2; i < nd; ++i) perm.push_back(i);
  perm.push_back(1);
  G gx = chk(graft_transpose(tv(x).get(), perm.data()), "nll_loss2d");
  int64_t M = x.numel() / std::max<int64_t>(C, 1);
  x2 = wrap(reshape_to(gx, {M, C}));
  t2 = wrap(reshape_to(tv(t), {M}));
}

void nll_loss2d_forward(const c10::OperatorHandle &op, Stack *s) {  // (self, target, weight?, reduction, ignore_index)
  Args a(op, s);
  at::Tensor x = a.t(0), t = a.t(1);  // copies: a.v is rewritten below
  if (x.dim() != 4 || t.dim() != 3 || x.numel() == 0 || x.size(0) != t.size(0) ||
      x.size(2) != t.size(1) || x.size(3) != t.size(2))
    return fall_back(op, s, a);
  at::Tensor x2, t2;
  nll2d_rows(x, t, x2, t2);
  int64_t red = a.i(3);
  a.v[0] = x2;
  a.v[1] = t2;
  for (auto &iv : a.v) s->push_back(iv);
  nll_loss_forward(op, s);
  if (red == 0) {
    at::Tensor tw = s->back().toTensor();
    s->pop_back();
    at::Tensor out = s->back().toTensor();
    s->pop_back();
    push(s, wrap(reshape_to(value(out), t.sizes().vec())));
    push(s, tw);
  }
}

// (grad_output, self, target, weight?, reduction, ignore_index, total_weight)
void nll_loss2d_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::Tensor x = a.t(1), t = a.t(2);  // copies: a.v is rewritten below
  if (x.dim() != 4 || t.dim() != 3 || x.numel() == 0) return fall_back(op, s, a);
  at::Tensor x2, t2;
  nll2d_rows(x, t, x2, t2);
  if (a.i(4) == 0) a.v[0] = wrap(reshape_to(tv(a.t(0)), {t.numel()}));
  a.v[1] = x2;
  a.v[2] = t2;
  for (auto &iv : a.v) s->push_back(iv);
  nll_loss_backward(op, s);
  at::Tensor g2 = s->back().toTensor();
  s->pop_back();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  G g = reshape_to(value(g2), {N, H, W, C});
  int perm[4] = {0, 3, 1, 2};
  push(s, wrap(chk(graft_transpose(g.get(), perm), "nll_loss2d_backward")));
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

// The table ---------------------------------------------------------------------------
const std::unordered_map<std::string, Lowering> &table() {
  static const std::unordered_map<std::string, Lowering> t = {
      {"aten::add.Tensor", &addsub<graft_add>},
      {"aten::add.Scalar", &addsub<graft_add>},
      {"aten::sub.Tensor", &addsub<graft_sub>},
      {"aten::sub.Scalar", &addsub<graft_sub>},
      {"aten::rsub.Tensor", &rsub},
      {"aten::rsub.Scalar", &rsub},
      {"aten::mul.Tensor", &binop<graft_mul>},
      {"aten::mul.Scalar", &binop<graft_mul>},
      {"aten::div.Tensor", &binop<graft_div, true>},
      {"aten::div.Scalar", &binop<graft_div, true>},
      {"aten::div.Tensor_mode", &div_mode},
      {"aten::div.Scalar_mode", &div_mode},
      {"aten::maximum", &binop<graft_maximum>},
      {"aten::minimum", &binop<graft_minimum>},
      {"aten::fmod.Tensor", &binop<graft_rem>},
      {"aten::fmod.Scalar", &binop<graft_rem>},
      {"aten::eq.Tensor", &binop<graft_eq>},
      {"aten::eq.Scalar", &binop<graft_eq>},
      {"aten::ne.Tensor", &binop<graft_ne>},
      {"aten::ne.Scalar", &binop<graft_ne>},
      {"aten::lt.Tensor", &binop<graft_lt>},
      {"aten::lt.Scalar", &binop<graft_lt>},
      {"aten::le.Tensor", &binop<graft_le>},
      {"aten::le.Scalar", &binop<graft_le>},
      {"aten::gt.Tensor", &binop<graft_gt>},
      {"aten::gt.Scalar", &binop<graft_gt>},
      {"aten::ge.Tensor", &binop<graft_ge>},
      {"aten::ge.Scalar", &binop<graft_ge>},
      {"aten::logical_and", &logical_bin<graft_logical_and>},
      {"aten::logical_or", &logical_bin<graft_logical_or>},
      {"aten::logical_xor", &logical_bin<graft_logical_xor>},
      {"aten::logical_not", &logical_not},
      {"aten::pow.Tensor_Tensor", &pow_tt},
      {"aten::pow.Tensor_Scalar", &pow_ts},
      {"aten::pow.Scalar", &pow_scalar_base},
      {"aten::where.self", &where_self},
      {"aten::masked_fill.Scalar", &masked_fill},
      {"aten::masked_fill.Tensor", &masked_fill},
      {"aten::clamp", &clamp},
      {"aten::clamp.Tensor", &clamp},
      {"aten::clamp_min.Tensor", &clamp_min},
      {"aten::clamp_max.Tensor", &clamp_max},
      {"aten::nll_loss2d_forward", &nll_loss2d_forward},
      {"aten::nll_loss2d_backward", &nll_loss2d_backward},
      {"aten::embedding_renorm_", &embedding_renorm_},
      {"aten::clamp_min", &clamp_min},
      {"aten::clamp_max", &clamp_max},
      {"aten::neg", &unop<graft_neg, false>},
      {"aten::abs", &unop<graft_abs, false>},
      {"aten::sign", &unop<graft_sign, false>},
      {"aten::exp", &unop<graft_exp>},
      {"aten::log", &unop<graft_log>},
      {"aten::sqrt", &unop<graft_sqrt>},
      {"aten::rsqrt", &unop<graft_rsqrt>},
      {"aten::tanh", &unop<graft_tanh>},
      {"aten::erf", &unop<graft_erf>},
      {"aten::sigmoid", &unop<graft_sigmoid>},
      {"aten::sin", &unop<graft_sin>},
      {"aten::cos", &unop<graft_cos>},
      {"aten::floor", &unop<graft_floor, false>},
      {"aten::ceil", &unop<graft_ceil, false>},
      {"aten::round", &unop<graft_round, false>},
      {"aten::reciprocal", &unop<graft_reciprocal>},
      {"aten::log1p", &unop<graft_log1p>},
      {"aten::expm1", &unop<graft_expm1>},
      {"aten::relu", &unop<g_relu, false>},
      {"aten::gelu", &gelu},
      {"aten::gelu_backward", &gelu_backward},
      {"aten::sigmoid_backward", &sigmoid_backward},
      {"aten::tanh_backward", &tanh_backward},
      {"aten::threshold", &threshold},
      {"aten::threshold_backward", &threshold_backward},
      {"aten::addcmul", &addc<false>},
      {"aten::addcdiv", &addc<true>},
      {"aten::lerp.Scalar", &lerp},
      {"aten::lerp.Tensor", &lerp},
      {"aten::empty.memory_format", &empty_mf},
      {"aten::empty_strided", &empty_strided},
      {"aten::zero_", &zero_},
      {"aten::fill_.Scalar", &fill_},
      {"aten::fill_.Tensor", &fill_},
      {"aten::normal_", &normal_},
      {"aten::uniform_", &uniform_},
      {"aten::bernoulli_.float", &bernoulli_f},
      {"aten::native_dropout", &native_dropout},
      {"aten::native_dropout_backward", &native_dropout_backward},
      {"aten::_copy_from", &copy_from},
      {"aten::_copy_from_and_resize", &copy_from_and_resize},
      {"aten::clone", &clone},
      {"aten::detach_", &detach_},
      {"aten::_local_scalar_dense", &local_scalar_dense},
      {"aten::view", &v_view},
      {"aten::_reshape_alias", &v_reshape_alias},
      {"aten::_unsafe_view", &unsafe_view},
      {"aten::as_strided", &v_as_strided},
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
      {"aten::sum", &sum_all},
      {"aten::sum.dim_IntList", &sum_dim},
      {"aten::mean", &mean_all},
      {"aten::mean.dim", &mean_dim},
      {"aten::prod", &prod_all},
      {"aten::max", &minmax_all<graft_max>},
      {"aten::min", &minmax_all<graft_min>},
      {"aten::amax", &amaxmin<graft_max>},
      {"aten::amin", &amaxmin<graft_min>},
      {"aten::max.dim", &minmax_dim<true>},
      {"aten::min.dim", &minmax_dim<false>},
      {"aten::argmax", &argmaxmin<true>},
      {"aten::argmin", &argmaxmin<false>},
      {"aten::var.correction", &var_corr<false>},
      {"aten::std.correction", &var_corr<true>},
      {"aten::mm", &mm},
      {"aten::bmm", &mm},
      {"aten::dot", &mm},
      {"aten::mv", &mm},
      {"aten::addmm", &addmm},
      {"aten::addmv", &addmv},
      {"aten::select_backward", &select_backward},
      {"aten::slice_backward", &slice_backward},
      {"aten::index_add", &index_add},
      {"aten::new_empty_strided", &new_empty_strided},
      {"aten::sgn", &unop<graft_sign, false>},
      {"aten::baddbmm", &addmm},
      {"aten::_log_softmax", &log_softmax},
      {"aten::_softmax", &softmax},
      {"aten::_log_softmax_backward_data", &log_softmax_backward},
      {"aten::_softmax_backward_data", &softmax_backward},
      {"aten::nll_loss_forward", &nll_loss_forward},
      {"aten::nll_loss_backward", &nll_loss_backward},
      {"aten::mse_loss", &mse_loss},
      {"aten::mse_loss_backward", &mse_loss_backward},
      {"aten::cat", &cat},
      {"aten::gather", &gather},
      {"aten::scatter_add", &scatter_add},
      {"aten::index_select", &index_select},
      {"aten::embedding", &embedding},
      {"aten::embedding_dense_backward", &embedding_dense_backward},
      {"aten::convolution", &convolution},
      {"aten::native_layer_norm", &native_layer_norm},
      {"aten::native_layer_norm_backward", &native_layer_norm_backward},
      {"aten::native_batch_norm", &native_batch_norm},
      {"aten::native_batch_norm_backward", &native_batch_norm_backward},
      {"aten::avg_pool2d", &avg_pool2d},
      {"aten::avg_pool2d_backward", &avg_pool2d_backward},
      {"aten::max_pool2d_with_indices", &max_pool2d_with_indices},
      {"aten::max_pool2d_with_indices_backward", &max_pool2d_with_indices_backward},
      {"aten::_adaptive_avg_pool2d", &adaptive_avg_pool2d},
      {"aten::_adaptive_avg_pool2d_backward", &adaptive_avg_pool2d_backward},
      {"aten::convolution_backward", &convolution_backward},
      {"aten::index.Tensor", &index_tensor},
      {"aten::repeat", &repeat},
      {"aten::index_put", &index_put},
      {"aten::index_put_", &index_put_},
      {"aten::_index_put_impl_", &index_put_},
  };
  return t;
}

// An in-place op (name ending in '_') with a functional lowering: compute, then write into self.
void inplace_via(Lowering fn, const c10::OperatorHandle &op, Stack *s) {
  size_t n = op.schema().arguments().size();
  at::Tensor self = (*s)[s->size() - n].toTensor();
  fn(op, s);
  at::Tensor r = s->back().toTensor();
  s->pop_back();
  write(self, value(r));
  push(s, self);
}

}  // namespace

std::vector<std::string> lowered_ops() {
  std::vector<std::string> out;
  for (auto &kv : table()) out.push_back(kv.first);
  return out;
}

// An in-place view op (squeeze_, t_, ...): the functional view's geometry and value become self's.
void inplace_view_via(Lowering fn, const c10::OperatorHandle &op, Stack *s) {
  size_t n = op.schema().arguments().size();
  at::Tensor self = (*s)[s->size() - n].toTensor();
  fn(op, s);
  at::Tensor r = s->back().toTensor();
  s->pop_back();
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
  return {nullptr, false};
}

void run_lowering(const Resolved &r, const c10::OperatorHandle &op, Stack *s) {
  if (r.view_inplace) inplace_view_via(r.fn, op, s);
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
