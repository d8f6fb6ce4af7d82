// graft's PyTorch bridge: elementwise lowerings: arithmetic, comparisons, where / clamp,
// activations and their gradients, optimizer arithmetic (addcmul, lerp), random fills, dropout.
#include "lower.h"

#include <cmath>

namespace graftpt {
namespace {

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

// floor / ceil / round / trunc: PyTorch returns an integer input unchanged (a copy, its dtype),
// where graft's ops take floats only. Bool goes to the op, which refuses it as PyTorch does.
template <Un F>
void rounding(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  if (!at::isIntegralType(gst(x), /*includeBool=*/false))
    x = chk(F(x.get()), op.schema().name().c_str());
  push(s, wrap(std::move(x)));
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

// isnan / isinf / isposinf / isneginf / isfinite as comparisons; integers are never inf or NaN.
enum FpClass { CLS_NAN, CLS_INF, CLS_POSINF, CLS_NEGINF, CLS_FINITE };
template <FpClass K>
void fp_class(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  const char *what = "isinf";
  if (!at::isFloatingType(st)) {
    push(s, wrap(fullc(K == CLS_FINITE ? 1 : 0, GRAFT_BOOL, gshape(x))));
    return;
  }
  G inf = scal(INFINITY, st);
  G r;
  switch (K) {
    case CLS_NAN: r = chk(graft_ne(x.get(), x.get()), what); break;
    case CLS_INF: r = chk(graft_eq(chk(graft_abs(x.get()), what).get(), inf.get()), what); break;
    case CLS_POSINF: r = chk(graft_eq(x.get(), inf.get()), what); break;
    case CLS_NEGINF: r = chk(graft_eq(x.get(), scal(-INFINITY, st).get()), what); break;
    case CLS_FINITE: r = chk(graft_lt(chk(graft_abs(x.get()), what).get(), inf.get()), what); break;
  }
  push(s, wrap(std::move(r)));
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
  G z = chk(dev_zeros(to_gdt(st), 0, nullptr), "threshold_backward");
  push(s, wrap(chk(graft_where(le.get(), z.get(), g.get()), "threshold_backward")));
}

// hardtanh(self, min_val, max_val): a clamp (relu6 is hardtanh(0, 6)).
void hardtanh(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  at::ScalarType st = gst(x);
  x = chk(graft_maximum(x.get(), scal(a.d(1), st).get()), "hardtanh");
  push(s, wrap(chk(graft_minimum(x.get(), scal(a.d(2), st).get()), "hardtanh")));
}

// g where lo < x < hi (strictly, as PyTorch's kernel), else 0.
G pass_between(const G &g, const G &x, double lo, double hi, const char *fn) {
  at::ScalarType xs = gst(x);
  G below = chk(graft_le(x.get(), scal(lo, xs).get()), fn);
  G above = chk(graft_ge(x.get(), scal(hi, xs).get()), fn);
  G out = chk(graft_logical_or(below.get(), above.get()), fn);
  G z = chk(dev_zeros(graft_get_dtype(g.get()), 0, nullptr), fn);
  return chk(graft_where(out.get(), z.get(), g.get()), fn);
}

void hardtanh_backward(const c10::OperatorHandle &op, Stack *s) {  // (grad, self, min, max)
  Args a(op, s);
  push(s, wrap(pass_between(tv(a.t(0)), tv(a.t(1)), a.d(2), a.d(3), "hardtanh_backward")));
}

void silu(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  G x = tv(a.t(0));
  G sg = chk(graft_sigmoid(x.get()), "silu");
  push(s, wrap(chk(graft_mul(x.get(), sg.get()), "silu")));
}

void silu_backward(const c10::OperatorHandle &op, Stack *s) {  // g * s * (1 + x * (1 - s))
  Args a(op, s);
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(x);
  G sg = chk(graft_sigmoid(x.get()), "silu_backward");
  G one_m = chk(graft_sub(scal(1.0, st).get(), sg.get()), "silu_backward");
  G inner = chk(graft_add_scalar(chk(graft_mul(x.get(), one_m.get()), "silu_backward").get(), 1.0),
                "silu_backward");
  G d = chk(graft_mul(sg.get(), inner.get()), "silu_backward");
  push(s, wrap(chk(graft_mul(g.get(), d.get()), "silu_backward")));
}

// min(max(x + 3, 0), 6) / 6
G hard_sigmoid_of(const G &x, const char *fn) {
  at::ScalarType st = gst(x);
  G t = chk(graft_add(x.get(), scal(3.0, st).get()), fn);
  t = chk(graft_maximum(t.get(), scal(0.0, st).get()), fn);
  t = chk(graft_minimum(t.get(), scal(6.0, st).get()), fn);
  return chk(graft_div(t.get(), scal(6.0, st).get()), fn);
}

void hardsigmoid(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  push(s, wrap(hard_sigmoid_of(tv(a.t(0)), "hardsigmoid")));
}

void hardsigmoid_backward(const c10::OperatorHandle &op, Stack *s) {  // g/6 where -3 < x < 3
  Args a(op, s);
  G g = tv(a.t(0));
  G g6 = chk(graft_div(g.get(), scal(6.0, gst(g)).get()), "hardsigmoid_backward");
  push(s, wrap(pass_between(g6, tv(a.t(1)), -3.0, 3.0, "hardsigmoid_backward")));
}

void hardswish(const c10::OperatorHandle &op, Stack *s) {  // x * hardsigmoid(x)
  Args a(op, s);
  G x = tv(a.t(0));
  push(s, wrap(chk(graft_mul(x.get(), hard_sigmoid_of(x, "hardswish").get()), "hardswish")));
}

// 0 for x < -3, g * (x / 3 + 0.5) for x <= 3, g above (PyTorch's kernel).
void hardswish_backward(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *fn = "hardswish_backward";
  G g = tv(a.t(0)), x = tv(a.t(1));
  at::ScalarType st = gst(x);
  G mid = chk(graft_add_scalar(chk(graft_div(x.get(), scal(3.0, st).get()), fn).get(), 0.5), fn);
  G gm = chk(graft_mul(g.get(), mid.get()), fn);
  G le3 = chk(graft_le(x.get(), scal(3.0, st).get()), fn);
  G r = chk(graft_where(le3.get(), gm.get(), g.get()), fn);
  G lt = chk(graft_lt(x.get(), scal(-3.0, st).get()), fn);
  G z = chk(dev_zeros(graft_get_dtype(r.get()), 0, nullptr), fn);
  push(s, wrap(chk(graft_where(lt.get(), z.get(), r.get()), fn)));
}

// triu / tril(self, diagonal): keep x where col - row >= diagonal (triu) / <= diagonal (tril).
template <bool Upper>
void tri(const c10::OperatorHandle &op, Stack *s) {
  Args a(op, s);
  const char *fn = Upper ? "triu" : "tril";
  TORCH_CHECK(a.t(0).dim() >= 2, fn, ": input must have at least 2 dims, got ", a.t(0).dim());
  G x = tv(a.t(0));
  int64_t rc[2] = {a.t(0).size(-2), a.t(0).size(-1)};
  G row = chk(dev_iota(GRAFT_I64, 2, rc, 0), fn), col = chk(dev_iota(GRAFT_I64, 2, rc, 1), fn);
  G off = chk(graft_sub(col.get(), row.get()), fn);
  G d = scal((double)a.i(1), at::kLong);
  G keep = chk(Upper ? graft_ge(off.get(), d.get()) : graft_le(off.get(), d.get()), fn);
  G z = chk(dev_zeros(graft_get_dtype(x.get()), 0, nullptr), fn);
  push(s, wrap(chk(graft_where(keep.get(), x.get(), z.get()), fn)));
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

// Random fills, dropout -----------------------------------------------------------
using RandFn = graft_tensor *(*)(graft_dtype, int, const int64_t *);

// self = r * scale + shift in place, r drawn by F in self's shape and dtype.
template <RandFn F>
void rand_fill(Stack *s, const at::Tensor &t, double scale, double shift, const char *what) {
  auto sz = t.sizes().vec();
  at::ScalarType st = t.scalar_type();
  G r = chk(F(to_gdt(st), (int)sz.size(), sz.data()), what);
  r = chk(graft_mul(r.get(), scal(scale, st).get()), what);
  r = chk(graft_add(r.get(), scal(shift, st).get()), what);
  write(t, std::move(r));
  push(s, t);
}

void normal_(const c10::OperatorHandle &op, Stack *s) {  // normal_(self, mean, std, generator)
  Args a(op, s);
  rand_fill<dev_rand_normal>(s, a.t(0), a.d(2), a.d(1), "normal_");
}

void uniform_(const c10::OperatorHandle &op, Stack *s) {  // uniform_(self, from, to, generator)
  Args a(op, s);
  rand_fill<dev_rand_uniform>(s, a.t(0), a.d(2) - a.d(1), a.d(1), "uniform_");
}

void bernoulli_f(const c10::OperatorHandle &op, Stack *s) {  // bernoulli_.float(self, p, generator)
  Args a(op, s);
  const at::Tensor &t = a.t(0);
  auto sz = t.sizes().vec();
  G r = chk(dev_rand_uniform(GRAFT_F32, (int)sz.size(), sz.data()), "bernoulli_");
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
    push(s, wrap(chk(dev_ones(GRAFT_BOOL, (int)sz.size(), sz.data()), "dropout")));
    return;
  }
  G u = chk(dev_rand_uniform(GRAFT_F32, (int)sz.size(), sz.data()), "dropout");
  G keep = chk(graft_ge(u.get(), scal(p, at::kFloat).get()), "dropout");
  double scale = p >= 1 ? 0.0 : 1.0 / (1.0 - p);
  G xs = chk(graft_mul(x.get(), scal(scale, t.scalar_type()).get()), "dropout");
  G z = chk(dev_zeros(to_gdt(t.scalar_type()), 0, nullptr), "dropout");
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

}  // namespace

void add_elementwise_lowerings(LoweringTable &t) {
  t.insert({
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
      {"aten::where.ScalarSelf", &where_self},
      {"aten::where.ScalarOther", &where_self},
      {"aten::where.Scalar", &where_self},
      {"aten::isnan", &fp_class<CLS_NAN>},
      {"aten::isinf", &fp_class<CLS_INF>},
      {"aten::isposinf", &fp_class<CLS_POSINF>},
      {"aten::isneginf", &fp_class<CLS_NEGINF>},
      {"aten::isfinite", &fp_class<CLS_FINITE>},
      {"aten::masked_fill.Scalar", &masked_fill},
      {"aten::masked_fill.Tensor", &masked_fill},
      {"aten::clamp", &clamp},
      {"aten::clamp.Tensor", &clamp},
      {"aten::clamp_min.Tensor", &clamp_min},
      {"aten::clamp_max.Tensor", &clamp_max},
      {"aten::clamp_min", &clamp_min},
      {"aten::clamp_max", &clamp_max},
      {"aten::relu", &unop<g_relu, false>},
      {"aten::gelu", &gelu},
      {"aten::gelu_backward", &gelu_backward},
      {"aten::sigmoid_backward", &sigmoid_backward},
      {"aten::tanh_backward", &tanh_backward},
      {"aten::threshold", &threshold},
      {"aten::threshold_backward", &threshold_backward},
      {"aten::hardtanh", &hardtanh},
      {"aten::hardtanh_backward", &hardtanh_backward},
      {"aten::silu", &silu},
      {"aten::silu_backward", &silu_backward},
      {"aten::hardsigmoid", &hardsigmoid},
      {"aten::hardsigmoid_backward", &hardsigmoid_backward},
      {"aten::hardswish", &hardswish},
      {"aten::hardswish_backward", &hardswish_backward},
      {"aten::triu", &tri<true>},
      {"aten::tril", &tri<false>},
      {"aten::addcmul", &addc<false>},
      {"aten::addcdiv", &addc<true>},
      {"aten::lerp.Scalar", &lerp},
      {"aten::lerp.Tensor", &lerp},
      {"aten::normal_", &normal_},
      {"aten::uniform_", &uniform_},
      {"aten::bernoulli_.float", &bernoulli_f},
      {"aten::native_dropout", &native_dropout},
      {"aten::native_dropout_backward", &native_dropout_backward},
      {"aten::sgn", &unop<graft_sign, false>},
      {"aten::floor", &rounding<graft_floor>},
      {"aten::ceil", &rounding<graft_ceil>},
      {"aten::round", &rounding<graft_round>},
      {"aten::trunc", &rounding<graft_trunc>},
  });
  // aten::<fn> for every UNARY / UNARY_FLOAT row of ops.def, one-to-one (UNARY_FLOAT promotes
  // integer inputs to float first, as PyTorch does). A lowering above wins (logical_not's):
  // insert does not overwrite.
  t.insert({
#define OPS_LOWER_UNARY(fn) {"aten::" #fn, &unop<graft_##fn, false>},
#define OPS_LOWER_UNARY_FLOAT(fn) {"aten::" #fn, &unop<graft_##fn, true>},
#define OPS_LOWER_BINARY(fn)
#define OPS_LOWER_OWN(fn)
#define OPS_LOWER_NONE(fn)
#define X(e, nm, ar, k, dts, api, fn, ...) OPS_LOWER_##api(fn)
#include "../../src/core/ops.def"
  });
}

}  // namespace graftpt
