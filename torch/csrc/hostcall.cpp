// graft's PyTorch bridge: an op with no lowering and no decomposition runs on PyTorch's CPU
// kernel as a host call inside the graph (graft_host_call) instead of cutting the graph there:
// its output shapes come from the op's meta kernel, and when the step runs, graft's executor
// calls the CPU kernel on the operands' buffers. Taken for functional, deterministic ops whose
// tensors are all on a CPU graft device and whose outputs are plain tensors of a shape known
// before the values (meta); anything else takes the cutting fallback. GRAFT_HOST_CALLS=0 is
// the A/B switch. An op with several outputs is one host call per output (each runs the op).
// Only aten ops: their CPU kernels are C++ (a Python kernel on graft's executor thread would
// take the GIL there). An op traced with more than kMaxVariants distinct non-tensor arguments
// (a scalar that changes every step) takes the cutting fallback from then on: each variant is a
// new graph. Lock order: the GIL (a Python meta kernel) may be taken under the bridge's lock,
// never the reverse (GraftGenerator has its own lock).
#include "bridge.h"

#include <ATen/ATen.h>
#include <c10/core/DispatchKeySet.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace graftpt {
namespace {

// One (op, non-tensor arguments, output index) the graphs may call: kept for the process (a
// cached graph calls it again), found by its text.
struct HostOp {
  c10::OperatorHandle op;
  std::vector<c10::IValue> args;  // operands' places hold None
  std::vector<size_t> tensor_at;  // argument index of each operand
  std::vector<std::pair<size_t, at::ScalarType>> out_at;  // an out= form's outs: index, dtype
  size_t ret;
};

std::mutex &host_ops_mutex() {
  static std::mutex m;
  return m;
}

// text -> op, and key -> text (a 64-bit key two texts share is refused, not confused)
std::unordered_map<std::string, HostOp *> &host_ops() {
  static auto *m = new std::unordered_map<std::string, HostOp *>();
  return *m;
}
constexpr int kMaxVariants = 32;
std::unordered_map<std::string, int> &host_variants() {  // per operator
  static auto *m = new std::unordered_map<std::string, int>();
  return *m;
}
std::unordered_map<uint64_t, std::string> &host_keys() {
  static auto *m = new std::unordered_map<uint64_t, std::string>();
  return *m;
}

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool enabled() {
  static const bool on = [] {
    const char *e = std::getenv("GRAFT_HOST_CALLS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// graft's executor calls this with the operands' buffers; it runs the op's CPU kernel.
int run_host_op(void *ctx, int nin, const graft_host_tensor *in, graft_host_tensor *out, char *err,
                size_t errlen) {
  const HostOp *h = static_cast<const HostOp *>(ctx);
  int64_t elems = 1;
  for (int d = 0; d < out->ndim; ++d) elems *= out->shape[d];
  for (int k = 0; k < nin; ++k) {
    int64_t e = 1;
    for (int d = 0; d < in[k].ndim; ++d) e *= in[k].shape[d];
    elems += e;
  }
  HostThreads threads(elems);
  try {
    torch::jit::Stack s(h->args.begin(), h->args.end());
    for (const auto &o : h->out_at) s[o.first] = at::empty({0}, at::TensorOptions().dtype(o.second));
    for (int k = 0; k < nin; ++k) {
      std::vector<int64_t> shape(in[k].shape, in[k].shape + in[k].ndim);
      s[h->tensor_at[(size_t)k]] = at::from_blob(in[k].data, shape, at::TensorOptions().dtype(to_st(in[k].dtype)));
    }
    h->op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &s);
    at::Tensor r = s.at(h->ret).toTensor();
    std::vector<int64_t> shape(out->shape, out->shape + out->ndim);
    if (r.sizes() != c10::IntArrayRef(shape)) {
      std::snprintf(err, errlen, "%s: output %zu has shape %s, its meta kernel said %s",
                    h->op.schema().operator_name().name.c_str(), h->ret, c10::str(r.sizes()).c_str(),
                    c10::str(c10::IntArrayRef(shape)).c_str());
      return 1;
    }
    // the declared dtype is the meta kernel's when traced (a default dtype changed since
    // converts); the copy resolves zero tensors, negative and conjugate bits
    if (r.numel()) at::from_blob(out->data, shape, at::TensorOptions().dtype(to_st(out->dtype))).copy_(r);
    return 0;
  } catch (const std::exception &e) {
    std::snprintf(err, errlen, "%s (run on PyTorch's CPU kernel): %s",
                  h->op.schema().operator_name().name.c_str(), e.what());
    return 1;
  }
}

// The text of a non-tensor argument: doubles by their bits (0.1 and 0.1000000001 differ).
void put_arg(std::ostringstream &os, const c10::IValue &iv) {
  auto bits = [&](double d) {
    uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    os << "d" << std::hex << b << std::dec;
  };
  if (iv.isDouble()) {
    bits(iv.toDouble());
  } else if (iv.isDoubleList()) {
    os << "[";
    for (double d : iv.toDoubleList()) bits(d), os << ",";
    os << "]";
  } else {
    os << iv;
  }
}

// A non-tensor argument the key can name exactly, copied so the caller's list cannot change it.
bool plain_value(const c10::IValue &iv, c10::IValue *copy) {
  if (iv.isNone() || iv.isBool() || iv.isInt() || iv.isDouble() || iv.isString()) *copy = iv;
  else if (iv.isIntList()) *copy = c10::IValue(iv.toIntVector());
  else if (iv.isDoubleList()) *copy = c10::IValue(iv.toDoubleVector());
  else if (iv.isBoolList()) {
    c10::List<bool> l;
    for (bool b : iv.toBoolList()) l.push_back(b);
    *copy = c10::IValue(std::move(l));
  }
  else return false;
  return true;
}

bool list_of_plain(const c10::TypePtr &t) {
  auto k = t->containedType(0)->kind();
  return k == c10::TypeKind::IntType || k == c10::TypeKind::FloatType || k == c10::TypeKind::BoolType;
}

// Whether op can be a host call at all, by its schema and tags: functional, or an out= form
// (PyTorch's functional kernel of a structured op calls it) whose only writes are its outs.
bool eligible_op(const c10::OperatorHandle &op) {
  const auto &sc = op.schema();
  if (sc.returns().empty() || sc.name().rfind("aten::", 0) != 0) return false;
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::CPU)) return false;
  size_t outs = 0;
  for (const auto &a : sc.arguments()) {
    if (a.is_out() && a.type()->kind() == c10::TypeKind::TensorType) {
      outs++;
      continue;
    }
    if (a.alias_info()) return false;
    if (a.type()->kind() == c10::TypeKind::ListType && !list_of_plain(a.type())) return false;
  }
  if (outs && outs != sc.returns().size()) return false;
  for (const auto &r : sc.returns())
    if (r.type()->kind() != c10::TypeKind::TensorType || (!outs && r.alias_info())) return false;
  return !op.hasTag(at::Tag::nondeterministic_seeded) && !op.hasTag(at::Tag::dynamic_output_shape) &&
         !op.hasTag(at::Tag::data_dependent_output);
}

}  // namespace

bool host_call_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  if (!enabled() || !eligible_op(op)) return false;
  const auto &sc = op.schema();
  size_t n = sc.arguments().size(), base = stack->size() - n;
  std::ostringstream text;
  text << sc.operator_name();
  HostOp proto{op, {}, {}, {}, 0};
  std::vector<G> operands;
  std::vector<at::Tensor> out_args;
  torch::jit::Stack meta;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue &iv = (*stack)[base + i];
    if (sc.arguments()[i].is_out()) {  // written with the result, as the functional form's
      if (!iv.isTensor() || !is_graft(iv.toTensor()) || gdevice(iv.toTensor()) >= GRAFT_CPU_DEVICES) return false;
      const at::Tensor &o = iv.toTensor();
      check_write_overlap(op, *stack, n, o);  // raises as PyTorch's CPU does
      out_args.push_back(o);
      proto.args.emplace_back();
      proto.out_at.emplace_back(i, o.scalar_type());
      meta.emplace_back(at::empty({0}, o.options().device(c10::kMeta)));
      text << "|out" << c10::toString(o.scalar_type());
      continue;
    }
    if (iv.isTensor()) {
      const at::Tensor &t = iv.toTensor();
      if (!t.defined()) {
        proto.args.emplace_back(iv);
        meta.emplace_back(iv);
        text << "|undef";
        continue;
      }
      if (!is_graft(t) || gdevice(t) >= GRAFT_CPU_DEVICES) return false;
      proto.args.emplace_back();
      proto.tensor_at.push_back(i);
      meta.emplace_back(at::empty(t.sizes(), t.options().device(c10::kMeta)));
      text << "|T" << c10::toString(t.scalar_type()) << t.dim();
      operands.push_back(value(t));
    } else {
      c10::IValue copy;
      if (!plain_value(iv, &copy)) return false;
      proto.args.emplace_back(copy);
      meta.emplace_back(copy);
      text << "|";
      put_arg(text, copy);
    }
  }
  if (operands.empty()) return false;
  const std::string op_name = sc.operator_name().name + "." + sc.overload_name();
  {  // an op past its variant limit cuts the step without paying for its meta kernel
    std::lock_guard<std::mutex> lk(host_ops_mutex());
    if (!host_ops().count(text.str() + "#0") && host_variants()[op_name] >= kMaxVariants) return false;
  }
  try {  // the outputs' shapes and dtypes, from the meta kernel
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception &e) {
    return false;
  }
  size_t nret = sc.returns().size();
  if (meta.size() != nret) return false;
  for (const auto &m : meta) {  // outputs graft can hold (dense; not complex, not quantized)
    if (!m.isTensor() || m.toTensor().layout() != at::kStrided || m.toTensor().is_nested()) return false;
    try {
      to_gdt(m.toTensor().scalar_type());
    } catch (const std::exception &) {
      return false;
    }
  }
  std::vector<graft_tensor *> in;
  for (auto &g : operands) in.push_back(g.get());
  std::vector<at::Tensor> outs;
  for (size_t r = 0; r < nret; ++r) {
    const at::Tensor &m = meta[r].toTensor();
    std::string key_text = text.str() + "#" + std::to_string(r);
    HostOp *h;
    uint64_t key = fnv1a(key_text);
    {
      std::lock_guard<std::mutex> lk(host_ops_mutex());
      auto it = host_ops().find(key_text);
      if (it == host_ops().end()) {
        auto k = host_keys().find(key);
        if (k != host_keys().end()) return false;  // a 64-bit key two texts share
        if (r == 0 && ++host_variants()[op_name] > kMaxVariants)
          return false;
        h = new HostOp(proto);
        h->ret = r;
        host_ops().emplace(key_text, h);
        host_keys().emplace(key, key_text);
      } else {
        h = it->second;
      }
    }
    std::vector<int64_t> shape(m.sizes().begin(), m.sizes().end());
    outs.push_back(wrap(chk(graft_host_call(run_host_op, h, key, (int)in.size(), in.data(),
                                            to_gdt(m.scalar_type()), (int)shape.size(), shape.data()),
                            "host call")));
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < out_args.size(); ++r) {  // an out= form: the outs take the results
    write_resize(out_args[r], value(outs[r]));
    outs[r] = out_args[r];
  }
  count_lowering("hostcall::" + sc.operator_name().name + (sc.overload_name().empty() ? "" : "." + sc.overload_name()));
  for (auto &o : outs) stack->push_back(o);
  return true;
}

}  // namespace graftpt
