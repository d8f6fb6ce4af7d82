// graft's PyTorch bridge: shared declarations for the translation units of torch/csrc.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/TensorImpl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "graft.h"

namespace graftpt {

// graft is PyTorch's PrivateUse1 backend, renamed "graft" (core.cpp registers the name): a
// graft tensor's device is torch.device("graft", N).
constexpr c10::DispatchKey kKey = c10::DispatchKey::PrivateUse1;
constexpr c10::DeviceType kDevType = c10::DeviceType::PrivateUse1;

// Owning handle for a graft_tensor* (one reference).
struct G {
  graft_tensor *p = nullptr;
  G() = default;
  explicit G(graft_tensor *t) : p(t) {}
  G(const G &o) : p(o.p ? graft_retain(o.p) : nullptr) {}
  G(G &&o) noexcept : p(o.p) { o.p = nullptr; }
  G &operator=(G o) noexcept { std::swap(p, o.p); return *this; }
  ~G() { if (p) graft_release(p); }
  graft_tensor *get() const { return p; }
  graft_tensor *release() { graft_tensor *t = p; p = nullptr; return t; }
  explicit operator bool() const { return p != nullptr; }
};

// Throws a c10::Error (Python RuntimeError) carrying graft's last error when t is NULL.
G chk(graft_tensor *t, const char *what = "graft");
void chk_status(graft_status s, const char *what);

// The "storage" of a graft tensor: one contiguous root value that views alias.
struct GStore {
  graft_tensor *val = nullptr;  // owned; shape == shape
  std::vector<int64_t> shape;
  uint64_t gen = 0;             // bumped on each write
  // A storage with no data (its pointer is null): what PyTorch's tracers (dynamo's fake
  // tensors, AOTAutograd) read of a tensor's storage, its identity (views share it) and size.
  c10::Storage storage;
  ~GStore() { if (val) graft_release(val); }
};

struct GraftImpl : public c10::TensorImpl {
  std::shared_ptr<GStore> store;
  graft_tensor *cache = nullptr;  // value of a non-identity view; valid when cache_gen == store->gen
  uint64_t cache_gen = ~0ull;

  GraftImpl(std::shared_ptr<GStore> s, caffe2::TypeMeta dt, c10::IntArrayRef sizes,
            c10::IntArrayRef strides, int64_t offset, int device);
  ~GraftImpl() override;

  bool is_identity() const;
  void attach_storage();  // storage_ := store's (made once per store)
  bool is_full_reshape() const;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion &version_counter, bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion &&version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl> &impl) override;
  const char *tensorimpl_type_name() const override { return "GraftTensorImpl"; }
};

std::recursive_mutex &bridge_mutex();

// Devices: torch.device('graft', N) is graft device N (0..3 the CPU devices, then accelerators).
// The current device is thread-local (the device guard's; 0 by default); the boxed kernel sets it
// to the op's device for the op's duration, so the creators below make their values there.
int cur_device();
int gdevice(const at::Tensor &t);  // a graft tensor's device
// "graft:4 (opencl:0)": a tensor's device, for error messages
std::string device_desc(const at::Tensor &t);
inline graft_tensor *dev_scalar(double v, graft_dtype dt) { return graft_scalar_on(v, dt, cur_device()); }
// A new step: scalar operands' uses count from the first again (lower.cpp's scalar reuse).
void new_step_scalars();
inline graft_tensor *dev_full(double v, graft_dtype dt, int nd, const int64_t *sh) {
  return graft_full_on(v, dt, nd, sh, cur_device());
}
inline graft_tensor *dev_zeros(graft_dtype dt, int nd, const int64_t *sh) { return graft_zeros_on(dt, nd, sh, cur_device()); }
inline graft_tensor *dev_ones(graft_dtype dt, int nd, const int64_t *sh) { return graft_ones_on(dt, nd, sh, cur_device()); }
inline graft_tensor *dev_iota(graft_dtype dt, int nd, const int64_t *sh, int axis) {
  return graft_iota_on(dt, nd, sh, axis, cur_device());
}
inline graft_tensor *dev_rand_uniform(graft_dtype dt, int nd, const int64_t *sh) {
  return graft_rand_uniform_on(dt, nd, sh, cur_device());
}
inline graft_tensor *dev_rand_normal(graft_dtype dt, int nd, const int64_t *sh) {
  return graft_rand_normal_on(dt, nd, sh, cur_device());
}

graft_dtype to_gdt(at::ScalarType st);
at::ScalarType to_st(graft_dtype dt);
bool is_graft(const at::Tensor &t);
GraftImpl *gimpl(const at::Tensor &t);

// Current value of a graft tensor (refreshing a stale view); a new reference.
G value(const at::Tensor &t);
// A new root graft tensor around v (takes the reference).
at::Tensor wrap(G v);
// Writes v into dst (converting dtype, broadcasting); through views it updates the base.
void write(const at::Tensor &dst, G v);
// Replaces dst wholesale with v (may change its shape: resize for out= ops).
void write_resize(const at::Tensor &dst, G v);
// A view impl of base with the given geometry (relative to the root store); value computed by v
// (may be empty: then gathered from the store).
at::Tensor make_view(const at::Tensor &base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t offset, G v);

// CPU <-> graft copies (from_cpu: onto graft device `device`).
at::Tensor to_cpu(const at::Tensor &t);
G from_cpu(const at::Tensor &cpu, int device);

// Fallback counters.
void count_fallback(const std::string &name);
std::string fallback_json();
void reset_fallbacks();  // and the lowering counters
// Counters of the bridge's composite lowerings ("lstm_fused", "lstm_decomposed"): entries of
// graft.metrics(). Takes the bridge lock itself (the autograd kernels run outside it).
void count_lowering(const std::string &name);
std::string lowering_json();

// Lowering table.
using Lowering = void (*)(const c10::OperatorHandle &op, torch::jit::Stack *stack);
// Runs the lowering for "aten::name.overload" (or its functional form for an in-place op);
// false when there is none.
bool try_lower(const std::string &key, const c10::OperatorHandle &op, torch::jit::Stack *stack);
// Names ("aten::add.Tensor") of every op with a lowering.
std::vector<std::string> lowered_ops();
// A resolved lowering (fn == nullptr: none); inplace: run fn and write the result into self.
struct Resolved {
  Lowering fn = nullptr;
  bool inplace = false;
  bool view_inplace = false;  // squeeze_, t_, ...: changes self's geometry, not its data
  // An out= variant (where.self_out, ...): fn is its functional form's, run on functional's
  // arguments; the result is written into the out argument.
  std::optional<c10::OperatorHandle> functional;
};
Resolved resolve_lowering(const std::string &key, const c10::OperatorHandle &op);
void run_lowering(const Resolved &r, const c10::OperatorHandle &op, torch::jit::Stack *stack);
void cpu_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
// An op with no lowering as a host call inside the graph (hostcall.cpp); false: not taken,
// the stack untouched.
bool host_call_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack);
// For one host call or fallback (core.cpp says why): GRAFT_TORCH_THREADS threads, PyTorch's own count for an op
// of many elements; the thread's count is restored after.
class HostThreads {
 public:
  explicit HostThreads(int64_t elems);
  ~HostThreads();
  HostThreads(const HostThreads &) = delete;
  HostThreads &operator=(const HostThreads &) = delete;

 private:
  int prev_ = 0, prev_mkl_ = 0;
};
// PyTorch's two errors for writing out from the top n arguments of s: out partly overlapping
// one of them, or an expanded out (lower.cpp).
void check_write_overlap(const c10::OperatorHandle &op, const torch::jit::Stack &s, size_t n,
                         const at::Tensor &out);

}  // namespace graftpt
