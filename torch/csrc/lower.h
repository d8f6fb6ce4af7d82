// graft's PyTorch bridge: what the lowering files (lower*.cpp) share. Each lower_<concept>.cpp
// keeps its lowerings file-local and adds them to the table through its add_*_lowerings;
// lower.cpp assembles the table and holds these helpers' definitions.
#pragma once
#include "bridge.h"

#include <exception>

#include <initializer_list>
#include <string>
#include <unordered_map>
#include <vector>

namespace graftpt {

using Stack = torch::jit::Stack;
using LoweringTable = std::unordered_map<std::string, Lowering>;

// Notes the arguments of a lowering an exception leaves (their sizes, dtypes and devices, as
// text: no tensor is kept alive), for the boxed kernel's out-of-memory message (core.cpp).
void note_unwound_args(const std::vector<c10::IValue> &v);

// The op's arguments, popped off the stack.
struct Args {
  std::vector<c10::IValue> v;
  int unwinding = std::uncaught_exceptions();  // described only when an exception leaves
  Args(const c10::OperatorHandle &op, Stack *s) {
    size_t n = op.schema().arguments().size();
    v = torch::jit::last(*s, n).vec();
    torch::jit::drop(*s, n);
  }
  Args(const Args &) = delete;
  ~Args() {
    if (std::uncaught_exceptions() > unwinding) note_unwound_args(v);
  }
  const at::Tensor &t(int i) const { return v[i].toTensor(); }
  // Absent: past the end, None, or an undefined tensor (autograd passes those for Tensor?).
  bool none(int i) const {
    return (size_t)i >= v.size() || v[i].isNone() || (v[i].isTensor() && !v[i].toTensor().defined());
  }
  double d(int i) const { return v[i].toScalar().toDouble(); }
  int64_t i(int k) const { return v[k].toInt(); }
  bool b(int k) const { return v[k].toBool(); }
  std::vector<int64_t> il(int k) const { return v[k].toIntVector(); }
  c10::Scalar sc(int k) const { return v[k].toScalar(); }
};

inline void push(Stack *s, at::Tensor t) { s->emplace_back(std::move(t)); }

// Lowerings that may hand an unsupported configuration to the CPU fallback: Args::v holds the
// popped arguments; this puts them back and runs PyTorch's kernel (counted as a fallback).
void fall_back(const c10::OperatorHandle &op, Stack *s, Args &a);

// A constant of the given dtype and shape.
G fullc(double v, graft_dtype dt, std::vector<int64_t> shape = {});

at::ScalarType default_float();

// Operand helpers.
void check_device(const at::Tensor &t);
// PyTorch's result type of the tensors and Scalars among ivs.
at::ScalarType promote(std::initializer_list<const c10::IValue *> ivs);
// A graft value for an operand (graft tensor, CPU 0-dim tensor or Scalar) in dtype st.
G operand(const c10::IValue &iv, at::ScalarType st);
// A graft value for a tensor (a CPU 0-dim tensor becomes a scalar), in its own dtype.
G tv(const at::Tensor &t);
// v converted to dtype st (unchanged when it has it).
G conv(G v, at::ScalarType st);
G scal(double x, at::ScalarType st);
at::ScalarType gst(const G &v);
std::vector<int64_t> gshape(const G &v);
// The wrapped dims of an int / int[] / None argument (None: empty).
std::vector<int> dims_of(const c10::IValue &iv, int64_t ndim);
G reshape_to(const G &v, const std::vector<int64_t> &sz);
// One graft op on values, its failure raised naming what (lowerings composed of many ops).
using GBin = graft_tensor *(*)(graft_tensor *, graft_tensor *);
using GUn = graft_tensor *(*)(graft_tensor *);
inline G gbin(GBin f, const G &a, const G &b, const char *what) { return chk(f(a.get(), b.get()), what); }
inline G gun(GUn f, const G &a, const char *what) { return chk(f(a.get()), what); }
void same_dtype(const at::Tensor &a, const at::Tensor &b, const char *what);

// Each concept's lowerings.
void add_elementwise_lowerings(LoweringTable &t);  // lower_elementwise.cpp
void add_view_lowerings(LoweringTable &t);         // lower_views.cpp
void add_reduce_lowerings(LoweringTable &t);       // lower_reduce.cpp
void add_nn_lowerings(LoweringTable &t);           // lower_nn.cpp
void add_conv_lowerings(LoweringTable &t);         // lower_conv.cpp
void add_optim_lowerings(LoweringTable &t);        // lower_optim.cpp
void add_rnn_lowerings(LoweringTable &t);          // lower_rnn.cpp (fused cells)
void add_attention_lowerings(LoweringTable &t);    // lower_attention.cpp
void add_activation_lowerings(LoweringTable &t);   // lower_activations.cpp
void add_resample_lowerings(LoweringTable &t);     // lower_resample.cpp
void add_norm_lowerings(LoweringTable &t);         // lower_norms.cpp
void add_scan_lowerings(LoweringTable &t);         // lower_scan.cpp

}  // namespace graftpt
