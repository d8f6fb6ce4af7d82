// graft's PyTorch bridge: the lowering table (aten op -> graft C API calls).
#include "bridge.h"

#include <ATen/InferSize.h>
#include <ATen/TensorUtils.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/WrapDimMinimal.h>

#include <cmath>
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
  push(s, wrap(chk(F(x.get(), y.get()), op.schema().name().c_str())));
}

// add/sub with alpha: out = x (+|-) alpha*y
template <Bin F>
void addsub(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  at::ScalarType st = promote({&a.v[0], &a.v[1]});
  G x = operand(a.v[0], st), y = operand(a.v[1], st);
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

void argmax(const c10::OperatorHandle &op, Stack *s) {  // argmax(self, dim?, keepdim)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  G x = tv(t);
  bool keep = a.b(2);
  if (a.none(1)) {
    int64_t n = t.numel();
    x = reshape_to(x, {n});
    G r = chk(graft_argmax(x.get(), 0, false), "argmax");
    if (keep) r = reshape_to(r, std::vector<int64_t>(t.dim(), 1));
    push(s, wrap(std::move(r)));
    return;
  }
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  if (t.dim() == 0) {
    push(s, wrap(chk(graft_zeros(GRAFT_I64, 0, nullptr), "argmax")));
    return;
  }
  push(s, wrap(chk(graft_argmax(x.get(), d, keep), "argmax")));
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
  TORCH_CHECK(!use.empty(), "graft: cat of only empty tensors");
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
  int d = (int)c10::maybe_wrap_dim(a.i(1), t.dim());
  G x = tv(t), idx = tv(a.t(2));
  push(s, wrap(chk(graft_gather(x.get(), d, idx.get()), "gather")));
}

void scatter_add(const c10::OperatorHandle &op, Stack *s) {  // scatter_add(self, dim, index, src)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
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
// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
void convolution(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const at::Tensor &x = a.t(0), &w = a.t(1);
  TORCH_CHECK(x.dim() == 4 && w.dim() == 4 && !a.b(6),
              "graft: only non-transposed 2-D convolution is lowered");
  auto st = a.il(3), pd = a.il(4), dl = a.il(5);
  auto two = [](std::vector<int64_t> v) {
    if (v.size() == 1) v.push_back(v[0]);
    return std::vector<int>{(int)v[0], (int)v[1]};
  };
  auto s2 = two(st), p2 = two(pd), d2 = two(dl);
  same_dtype(x, w, "convolution");
  G gx = tv(x), gw = tv(w);
  G r = chk(graft_conv2d(gx.get(), gw.get(), s2.data(), p2.data(), d2.data(), (int)a.i(8)), "conv2d");
  if (!a.none(2) && a.t(2).defined()) {
    G b = reshape_to(tv(a.t(2)), {1, a.t(2).numel(), 1, 1});
    r = chk(graft_add(r.get(), b.get()), "conv2d");
  }
  push(s, wrap(std::move(r)));
}

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
    mean = chk(graft_zeros(to_gdt(st), 1, &C), "batch_norm");
    invstd = chk(graft_zeros(to_gdt(st), 1, &C), "batch_norm");
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

// avg_pool2d(self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override?)
void avg_pool2d(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  TORCH_CHECK(!a.b(4) && a.b(5) && a.none(6),
              "graft: avg_pool2d lowered only for ceil_mode=False, count_include_pad=True");
  auto k = pair(a.il(1), 1);
  auto st = a.il(2).empty() ? k : pair(a.il(2), 1);
  auto p = pair(a.il(3), 0);
  TORCH_CHECK(a.t(0).dim() == 4, "graft: avg_pool2d lowered for 4-D input only");
  G x = tv(a.t(0));
  push(s, wrap(chk(graft_avg_pool2d(x.get(), k.data(), st.data(), p.data()), "avg_pool2d")));
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
      {"aten::argmax", &argmax},
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

bool try_lower(const std::string &key, const c10::OperatorHandle &op, Stack *s) {
  const auto &t = table();
  auto it = t.find(key);
  if (it != t.end()) {
    it->second(op, s);
    return true;
  }
  // in-place variant: aten::add_.Tensor -> aten::add.Tensor
  auto dot = key.find('.');
  std::string base = key.substr(0, dot);
  if (base.size() > 1 && base.back() == '_' && base[base.size() - 2] != '_') {
    std::string fk = base.substr(0, base.size() - 1) + (dot == std::string::npos ? "" : key.substr(dot));
    auto jt = t.find(fk);
    if (jt != t.end() && op.schema().returns().size() == 1) {
      inplace_via(jt->second, op, s);
      return true;
    }
  }
  return false;
}

}  // namespace graftpt
