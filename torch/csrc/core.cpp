// graft's PyTorch bridge: the tensor impl, device guard, boxed kernel, CPU fallback and the
// torch.ops.graft helpers.
#include "bridge.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/AutogradState.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <ATen/Parallel.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <sstream>
#include <tuple>

namespace graftpt {

std::recursive_mutex &bridge_mutex() {
  static std::recursive_mutex m;
  return m;
}

G chk(graft_tensor *t, const char *what) {
  if (!t) {
    std::string msg = graft_last_error();
    graft_clear_error();
    TORCH_CHECK(false, "graft: ", what, ": ", msg.empty() ? "operation failed" : msg);
  }
  return G(t);
}

void chk_status(graft_status s, const char *what) {
  if (s != GRAFT_OK) {
    std::string msg = graft_last_error();
    graft_clear_error();
    TORCH_CHECK(false, "graft: ", what, ": ", msg);
  }
}

graft_dtype to_gdt(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return GRAFT_F32;
    case at::kDouble: return GRAFT_F64;
    case at::kHalf: return GRAFT_F16;
    case at::kBFloat16: return GRAFT_BF16;
    case at::kInt: return GRAFT_I32;
    case at::kLong: return GRAFT_I64;
    case at::kByte: return GRAFT_U8;
    case at::kBool: return GRAFT_BOOL;
    default:
      TORCH_CHECK(false, "graft: unsupported dtype ", c10::toString(st),
                  " (graft supports float32, float64, float16, bfloat16, int32, int64, uint8, bool)");
  }
}

at::ScalarType to_st(graft_dtype dt) {
  switch (dt) {
    case GRAFT_F32: return at::kFloat;
    case GRAFT_F64: return at::kDouble;
    case GRAFT_F16: return at::kHalf;
    case GRAFT_BF16: return at::kBFloat16;
    case GRAFT_I32: return at::kInt;
    case GRAFT_I64: return at::kLong;
    case GRAFT_U8: return at::kByte;
    case GRAFT_BOOL: return at::kBool;
    default: TORCH_CHECK(false, "graft: invalid dtype");
  }
}

static std::vector<int64_t> contig_strides(c10::IntArrayRef sizes) {
  std::vector<int64_t> st(sizes.size());
  int64_t s = 1;
  for (int i = (int)sizes.size() - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}

// ---------------------------------------------------------------- tensor impl

// The autograd engine runs the backward pass of a non-CPU device on a thread of its own, so
// every backward() hands off to that thread and back: two wake-ups of a sleeping thread, ~0.14
// ms a step here (a small model's backward 0.58 -> 0.44 ms). A graft backward pass only traces,
// so the thread that makes graft tensors asks the engine to run its backward passes in place,
// as it does for CPU tensors (torch.autograd.set_multithreading_enabled(False), for this thread
// only). GRAFT_AUTOGRAD_THREAD=1 keeps the engine's device thread.
static void autograd_in_place() {
  static const bool keep = [] {
    const char *e = std::getenv("GRAFT_AUTOGRAD_THREAD");
    return e && !std::strcmp(e, "1");
  }();
  if (!keep) c10::AutogradState::get_tls_state().set_multithreading_enabled(false);
}

// PyTorch's CPU ops run on an OpenMP team, and after each parallel region its workers spin for
// milliseconds waiting for the next one (libgomp's default wait policy), each on a core that
// graft's executor and thread pool need for the step just queued. A training loop on graft
// still makes small CPU tensors (a causal mask, a collated batch): each one cost graft a core
// for ~10 ms (a held-out decoder LM: 8.4-9.7 ms a step against 4.5 without the spin). So the
// thread that makes graft tensors runs its own PyTorch CPU ops on one thread, and so do host
// calls and fallbacks below kParallelHostElems; OpenMP's thread count is per thread (an ICV of
// the thread's data environment), and so is MKL's local count, so other threads, and the
// default torch.set_num_threads sets, are untouched. GRAFT_TORCH_THREADS=N: N threads instead
// of one; 0 leaves PyTorch's setting alone. The runtimes are the ones libtorch_cpu was linked
// with: its symbols are looked up through its own handle (its dependencies: libgomp in the
// wheels, libiomp5 / libomp in other builds; MKL inside it where built with it). No OpenMP:
// nothing to do.
namespace {
using omp_set_fn = void (*)(int);
using mkl_local_fn = int (*)(int);  // MKL_Set_Num_Threads_Local (the C API; the lower-case
                                    // names are the Fortran one, by pointer): the previous count

struct Runtimes {
  omp_set_fn omp_set = nullptr;
  mkl_local_fn mkl_local = nullptr;
};

const Runtimes &runtimes() {
  static const Runtimes r = [] {
    Runtimes x;
    Dl_info info;
    void *h = nullptr;
    if (dladdr(reinterpret_cast<void *>(&at::get_num_threads), &info) && info.dli_fname)
      h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) return x;
    x.omp_set = reinterpret_cast<omp_set_fn>(dlsym(h, "omp_set_num_threads"));
    x.mkl_local = reinterpret_cast<mkl_local_fn>(dlsym(h, "MKL_Set_Num_Threads_Local"));
    return x;
  }();
  return r;
}

int wanted_threads() {
  static const int n = [] {
    const char *e = std::getenv("GRAFT_TORCH_THREADS");
    if (!e || !*e) return 1;
    char *end = nullptr;
    long v = std::strtol(e, &end, 10);
    TORCH_CHECK(*end == 0 && v >= 0 && v <= 4096, "graft: GRAFT_TORCH_THREADS=", e,
                " is not a thread count (0: PyTorch's own setting)");
    return (int)v;
  }();
  return runtimes().omp_set ? n : 0;
}

// This thread's OpenMP count (and MKL's local one) to n; MKL's previous local count returned.
int set_threads(int n) {
  runtimes().omp_set(n);
  return runtimes().mkl_local ? runtimes().mkl_local(n) : 0;
}

// PyTorch's own count for this thread, read before graft first changes it (its lazy per-thread
// set-up runs then too, or it would undo ours later).
thread_local int pytorch_threads = 0;
int pytorch_threads_here() {
  if (!pytorch_threads) pytorch_threads = std::max(1, at::get_num_threads());
  return pytorch_threads;
}

// A host call this large runs faster on PyTorch's team than the spin after it costs (i0 over
// 131K elements in and out: even; 524K: 15 ms against 19 on one thread).
constexpr int64_t kParallelHostElems = int64_t(1) << 18;
}  // namespace

static void torch_threads() {
  if (!wanted_threads()) return;
  pytorch_threads_here();
  set_threads(wanted_threads());
}

// The settings of a thread that makes graft tensors, made at its first one (one check a tensor).
static void thread_setup_once() {
  static thread_local bool done = false;
  if (done) return;
  done = true;
  autograd_in_place();
  torch_threads();
}

HostThreads::HostThreads(int64_t elems) {
  if (!wanted_threads()) return;
  pytorch_threads_here();
  prev_ = at::get_num_threads();
  prev_mkl_ = set_threads(elems >= kParallelHostElems ? pytorch_threads : wanted_threads());
}

HostThreads::~HostThreads() {
  if (!prev_) return;
  runtimes().omp_set(prev_);
  if (runtimes().mkl_local) runtimes().mkl_local(prev_mkl_);
}

GraftImpl::GraftImpl(std::shared_ptr<GStore> s, caffe2::TypeMeta dt, c10::IntArrayRef sizes,
                     c10::IntArrayRef strides, int64_t offset, int device)
    : c10::TensorImpl(c10::DispatchKeySet(kKey), dt, c10::Device(kDevType, (c10::DeviceIndex)device)),
      store(std::move(s)) {
  thread_setup_once();
  attach_storage();
  set_sizes_and_strides(sizes, strides);
  set_storage_offset(offset);
}

void GraftImpl::attach_storage() {
  if (!store->storage) {
    int64_t n = 1;
    for (int64_t d : store->shape) n *= d;
    store->storage = c10::Storage(c10::Storage::use_byte_size_t(), (size_t)n * data_type_.itemsize(),
                                  c10::DataPtr(nullptr, device_opt_.value()), nullptr, false);
  }
  storage_ = store->storage;
}

GraftImpl::~GraftImpl() {
  if (cache) graft_release(cache);
}

bool GraftImpl::is_identity() const {
  if (storage_offset() != 0) return false;
  auto sz = sizes();
  if (sz.size() != store->shape.size()) return false;
  for (size_t i = 0; i < sz.size(); ++i)
    if (sz[i] != store->shape[i]) return false;
  auto st = strides();
  auto cs = contig_strides(sz);
  for (size_t i = 0; i < sz.size(); ++i)
    if (sz[i] != 1 && st[i] != cs[i]) return false;
  return true;
}

// A view that covers its whole root contiguously in row-major order (e.g. [1,10] seen as [10]):
// its value is a reshape of the root and a write through it replaces the root.
bool GraftImpl::is_full_reshape() const {
  if (storage_offset() != 0) return false;
  int64_t n = 1, total = 1;
  for (auto v : sizes()) n *= v;
  for (auto v : store->shape) total *= v;
  if (n != total) return false;
  auto sz = sizes();
  auto st = strides();
  auto cs = contig_strides(sz);
  for (size_t i = 0; i < sz.size(); ++i)
    if (sz[i] != 1 && st[i] != cs[i]) return false;
  return true;
}

c10::intrusive_ptr<c10::TensorImpl> GraftImpl::shallow_copy_and_detach(
    const c10::VariableVersion &vc, bool allow) const {
  auto impl = c10::make_intrusive<GraftImpl>(store, dtype(), sizes(), strides(), storage_offset(),
                                             device().index());
  copy_tensor_metadata(this, impl.get(), vc, allow);
  if (cache && cache_gen == store->gen) {
    impl->cache = graft_retain(cache);
    impl->cache_gen = cache_gen;
  }
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> GraftImpl::shallow_copy_and_detach(c10::VariableVersion &&vc,
                                                                       bool allow) const {
  auto impl = c10::make_intrusive<GraftImpl>(store, dtype(), sizes(), strides(), storage_offset(),
                                             device().index());
  copy_tensor_metadata(this, impl.get(), std::move(vc), allow);
  if (cache && cache_gen == store->gen) {
    impl->cache = graft_retain(cache);
    impl->cache_gen = cache_gen;
  }
  return impl;
}

void GraftImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl> &impl) {
  auto *g = dynamic_cast<GraftImpl *>(impl.get());
  TORCH_CHECK(g, "graft: cannot shallow-copy a non-graft tensor into a graft tensor");
  copy_tensor_metadata(g, this, version_counter(), allow_tensor_metadata_change());
  store = g->store;
  if (cache) graft_release(cache);
  cache = g->cache ? graft_retain(g->cache) : nullptr;
  cache_gen = g->cache_gen;
}

bool is_graft(const at::Tensor &t) { return t.defined() && t.device().type() == kDevType; }

int gdevice(const at::Tensor &t) { return t.device().index(); }

std::string device_desc(const at::Tensor &t) {
  std::ostringstream os;
  os << t.device();
  if (is_graft(t)) {
    const char *kind = graft_device_kind(gdevice(t));
    int ord = 0;  // the ordinal among the devices of its kind
    for (int i = 0; kind && i < gdevice(t); ++i) ord += !strcmp(graft_device_kind(i), kind);
    os << " (" << (kind ? kind : "?") << ":" << ord << ")";
  }
  return os.str();
}

GraftImpl *gimpl(const at::Tensor &t) {
  auto *g = dynamic_cast<GraftImpl *>(t.unsafeGetTensorImpl());
  TORCH_CHECK(g, "graft: expected a graft tensor, got one on ", t.device());
  return g;
}

// Flat indices into the root of every element of a view, row-major over its sizes.
static std::vector<int64_t> view_indices(const GraftImpl *g) {
  auto sz = g->sizes();
  auto st = g->strides();
  int64_t n = 1;
  for (auto s : sz) n *= s;
  std::vector<int64_t> idx((size_t)n);
  int nd = (int)sz.size();
  std::vector<int64_t> ctr(nd, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = g->storage_offset();
    for (int d = 0; d < nd; ++d) off += ctr[d] * st[d];
    idx[(size_t)k] = off;
    for (int d = nd - 1; d >= 0; --d) {
      if (++ctr[d] < sz[d]) break;
      ctr[d] = 0;
    }
  }
  return idx;
}

static int64_t prod(const std::vector<int64_t> &s) {
  int64_t n = 1;
  for (auto v : s) n *= v;
  return n;
}

// The index constants that read a view out of its root ("r": the root positions of its elements)
// or write it in ("w": per root position, the view element it takes and whether it takes one),
// on the root's device. They depend only on the view's geometry, so each geometry's are uploaded
// once and kept: a steady training step (in-place ops on chunks of an LSTM's gates) uploads none.
// Past kViewConstBytes the cache is emptied (a steady loop refills it once).
static std::vector<G> view_consts(const GraftImpl *g, bool wr) {
  static constexpr size_t kViewConstBytes = 64u << 20;
  struct Cache {
    std::unordered_map<std::string, std::vector<G>> m;
    size_t bytes = 0;
  };
  static Cache *cache = new Cache;  // never destroyed: graft may be shut down at exit
  int dev = graft_device(g->store->val);
  int64_t total = prod(g->store->shape);
  std::ostringstream key;
  key << (wr ? 'w' : 'r') << dev << ':' << total << ':' << g->storage_offset();
  for (auto v : g->sizes()) key << ',' << v;
  key << ';';
  for (auto v : g->strides()) key << ',' << v;
  auto it = cache->m.find(key.str());
  if (it != cache->m.end()) return it->second;

  auto idx = view_indices(g);
  int64_t n = (int64_t)idx.size();
  std::vector<G> consts;
  size_t bytes;
  if (!wr) {
    consts.push_back(chk(graft_from_host(idx.data(), GRAFT_I64, 1, &n, dev), "view"));
    bytes = (size_t)n * 8;
  } else {
    // Overlapping views: each root position takes the LAST view element mapping to it (as on CPU).
    std::vector<uint8_t> mask((size_t)total, 0);
    std::vector<int64_t> src((size_t)total, 0);
    for (int64_t k = 0; k < n; ++k) {
      mask[(size_t)idx[(size_t)k]] = 1;
      src[(size_t)idx[(size_t)k]] = k;
    }
    consts.push_back(chk(graft_from_host(src.data(), GRAFT_I64, 1, &total, dev), "view write"));
    consts.push_back(chk(graft_from_host(mask.data(), GRAFT_BOOL, 1, &total, dev), "view write"));
    bytes = (size_t)total * 9;
  }
  if (cache->bytes + bytes > kViewConstBytes) {
    cache->m.clear();
    cache->bytes = 0;
  }
  cache->bytes += bytes;
  return cache->m[key.str()] = std::move(consts);
}

G value(const at::Tensor &t) {
  GraftImpl *g = gimpl(t);
  if (g->is_identity()) {
    TORCH_CHECK(g->store->val, "graft: tensor has no value");
    return G(graft_retain(g->store->val));
  }
  if (g->cache && g->cache_gen == g->store->gen) return G(graft_retain(g->cache));
  if (g->is_full_reshape()) {
    auto sz = g->sizes().vec();
    G out = chk(graft_reshape(g->store->val, (int)sz.size(), sz.data()), "view");
    if (g->cache) graft_release(g->cache);
    g->cache = graft_retain(out.get());
    g->cache_gen = g->store->gen;
    return out;
  }
  // Stale or never computed: gather from the root.
  int64_t total = prod(g->store->shape);
  G flat = chk(graft_reshape(g->store->val, 1, &total), "view");
  G out = chk(graft_gather(flat.get(), 0, view_consts(g, false)[0].get()), "view");  // the view's positions
  auto sz = g->sizes().vec();
  out = chk(graft_reshape(out.get(), (int)sz.size(), sz.data()), "view");
  if (g->cache) graft_release(g->cache);
  g->cache = graft_retain(out.get());
  g->cache_gen = g->store->gen;
  return out;
}

at::Tensor wrap(G v) {
  TORCH_CHECK(v, "graft: wrap of a null tensor");
  int64_t shape[GRAFT_MAX_DIMS];
  int nd = graft_shape(v.get(), shape);
  auto st = std::make_shared<GStore>();
  st->shape.assign(shape, shape + nd);
  auto dt = to_st(graft_get_dtype(v.get()));
  int dev = graft_device(v.get());
  st->val = v.release();
  auto strides = contig_strides(st->shape);
  return at::Tensor(c10::make_intrusive<GraftImpl>(st, caffe2::TypeMeta::fromScalarType(dt),
                                                   st->shape, strides, 0, dev));
}

static G fit(const at::Tensor &dst, G v) {
  graft_dtype want = to_gdt(dst.scalar_type());
  if (graft_get_dtype(v.get()) != want) v = chk(graft_convert(v.get(), want), "convert");
  auto sz = dst.sizes().vec();
  int64_t shape[GRAFT_MAX_DIMS];
  int nd = graft_shape(v.get(), shape);
  bool same = nd == (int)sz.size();
  for (int i = 0; same && i < nd; ++i) same = shape[i] == sz[i];
  if (!same) v = chk(graft_broadcast_to(v.get(), (int)sz.size(), sz.data()), "copy (broadcast)");
  return v;
}

// A write through view g: root becomes the store's new value (a new generation) and v, the
// view's own new value, its cache.
static void set_root(GraftImpl *g, G root, G v) {
  if (g->store->val) graft_release(g->store->val);
  g->store->val = root.release();
  g->store->gen++;
  if (g->cache) graft_release(g->cache);
  g->cache = v.release();
  g->cache_gen = g->store->gen;
}

void write(const at::Tensor &dst, G v) {
  GraftImpl *g = gimpl(dst);
  v = fit(dst, std::move(v));
  if (g->is_identity()) {
    if (g->store->val) graft_release(g->store->val);
    g->store->val = v.release();
    g->store->gen++;
    return;
  }
  if (g->is_full_reshape()) {
    G nb = chk(graft_reshape(v.get(), (int)g->store->shape.size(), g->store->shape.data()), "view write");
    set_root(g, std::move(nb), std::move(v));
    return;
  }
  // Write the view's new values into the root: each root position a view element maps to takes
  // the value of the LAST such element (overlapping views: last write wins, as on CPU).
  int64_t n = dst.numel();
  int64_t total = prod(g->store->shape);
  std::vector<G> c = view_consts(g, true);  // the source element of each root position, the mask
  G flat = chk(graft_reshape(g->store->val, 1, &total), "view write");
  G vflat = chk(graft_reshape(v.get(), 1, &n), "view write");
  G picked = n ? chk(graft_gather(vflat.get(), 0, c[0].get()), "view write") : flat;
  G nb = chk(graft_where(c[1].get(), picked.get(), flat.get()), "view write");
  nb = chk(graft_reshape(nb.get(), (int)g->store->shape.size(), g->store->shape.data()), "view write");
  set_root(g, std::move(nb), std::move(v));
}

void write_resize(const at::Tensor &dst, G v) {
  GraftImpl *g = gimpl(dst);
  int64_t shape[GRAFT_MAX_DIMS];
  int nd = graft_shape(v.get(), shape);
  auto sz = dst.sizes();
  bool same = nd == (int)sz.size();
  for (int i = 0; same && i < nd; ++i) same = shape[i] == sz[i];
  if (same) return write(dst, std::move(v));
  graft_dtype want = to_gdt(dst.scalar_type());
  if (graft_get_dtype(v.get()) != want) v = chk(graft_convert(v.get(), want), "convert");
  auto st = std::make_shared<GStore>();
  st->shape.assign(shape, shape + nd);
  st->val = v.release();
  g->store = st;
  g->attach_storage();
  if (g->cache) graft_release(g->cache);
  g->cache = nullptr;
  g->set_sizes_and_strides(st->shape, contig_strides(st->shape));
  g->set_storage_offset(0);
}

at::Tensor make_view(const at::Tensor &base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                     int64_t offset, G v) {
  GraftImpl *b = gimpl(base);
  auto impl = c10::make_intrusive<GraftImpl>(b->store, base.dtype(), sizes, strides, offset, gdevice(base));
  if (v && !impl->is_identity()) {
    impl->cache = v.release();
    impl->cache_gen = b->store->gen;
  }
  return at::Tensor(std::move(impl));
}

at::Tensor to_cpu(const at::Tensor &t) {
  G v = value(t);
  at::Tensor out = at::empty(t.sizes(), at::TensorOptions().dtype(t.scalar_type()));
  size_t bytes = (size_t)out.numel() * out.element_size();
  if (bytes) chk_status(graft_to_host(v.get(), out.data_ptr(), bytes), "copy to host");
  return out;
}

// A CPU tensor over t's graft buffer, without a copy (torch.compile's results: a fresh CPU
// tensor of a few MB costs page faults at ~1.4 GB/s, 5 ms a step for an MLP's gradients; graft's
// buffers come from its pool). The buffer is held until the CPU tensor dies; graft never writes
// a buffer with another holder.
static at::Tensor py_host_view(const at::Tensor &t) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  TORCH_CHECK(is_graft(t), "graft: host_view takes a graft tensor (got ", t.device(), ")");
  G v = value(t);
  graft_host_ref *ref = nullptr;
  int shared = 0;
  const void *p = graft_host_view(v.get(), &ref, &shared);
  if (!p) chk_status(graft_last_status(), "host view");
  auto opts = at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU);
  if (shared) {  // the caller may write it: bytes another graft value reads are copied
    at::Tensor c;
    try {
      c = at::from_blob(const_cast<void *>(p), t.sizes(), opts).clone();
    } catch (...) {
      graft_host_ref_release(ref);
      throw;
    }
    graft_host_ref_release(ref);
    return c;
  }
  try {
    return at::from_blob(const_cast<void *>(p), t.sizes(), [ref](void *) { graft_host_ref_release(ref); }, opts);
  } catch (...) {
    graft_host_ref_release(ref);
    throw;
  }
}

// torch.compile's CPU tensors handed to graft without a copy (graft_from_host_borrowed): each
// holds its PyTorch tensor until graft lets go. graft may let go on its executor's thread; the
// tensor is destroyed later, on the thread of a bridge call (a storage's deleter may take the
// GIL, which a thread of graft's must not wait for).
static std::mutex &released_mu() {
  static auto *m = new std::mutex;  // never destroyed: graft's threads may release at exit
  return *m;
}
static std::vector<at::Tensor *> &released() {
  static auto *v = new std::vector<at::Tensor *>;
  return *v;
}
static void borrowed_release(void *ctx) {
  std::lock_guard<std::mutex> lk(released_mu());
  released().push_back(static_cast<at::Tensor *>(ctx));
}
static void drain_released() {
  std::vector<at::Tensor *> v;
  {
    std::lock_guard<std::mutex> lk(released_mu());
    v.swap(released());
  }
  for (auto *t : v) delete t;
}

// A graft tensor on host device `device` over t's memory, without a copy, where graft can read
// it in place (contiguous, 64-byte aligned, a plain dense CPU tensor); else a copy. The caller
// must not write t while graft may read it (torch.compile's CPU calls wait for their results).
static at::Tensor py_host_borrow(const at::Tensor &t, int64_t device) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  drain_released();
  TORCH_CHECK(t.device().is_cpu(), "graft: host_borrow takes a CPU tensor (got ", t.device(), ")");
  const char *kind = graft_device_kind((int)device);
  TORCH_CHECK(kind, "graft: host_borrow: no graft device ", device);
  bool in_place = !strcmp(kind, "cpu") && t.layout() == at::kStrided && t.is_contiguous() &&
                  t.numel() > 0 && !t._is_zerotensor() && !t.is_conj() && !t.is_neg() &&
                  reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0;
  if (!in_place) return wrap(from_cpu(t, (int)device));
  graft_dtype dt = to_gdt(t.scalar_type());
  auto sz = t.sizes().vec();
  auto *keep = new at::Tensor(t.detach());  // the storage, not the autograd graph behind t
  graft_tensor *g = graft_from_host_borrowed(t.data_ptr(), dt, (int)sz.size(), sz.data(), (int)device,
                                             borrowed_release, keep);
  if (!g) {
    delete keep;
    chk_status(graft_last_status(), "host_borrow");
  }
  return wrap(G(g));
}

G from_cpu(const at::Tensor &cpu, int device) {
  graft_dtype dt = to_gdt(cpu.scalar_type());
  auto sz = cpu.sizes().vec();
  TORCH_CHECK(sz.size() <= GRAFT_MAX_DIMS, "graft: at most ", GRAFT_MAX_DIMS, " dims are supported");
  // No data to copy: empty tensors and PyTorch's storage-less zero tensors (_efficientzerotensor).
  if (cpu.numel() == 0 || cpu._is_zerotensor())
    return chk(graft_zeros_on(dt, (int)sz.size(), sz.data(), device), "copy to device");
  at::Tensor c = cpu.contiguous();
  return chk(graft_from_host(c.data_ptr(), dt, (int)sz.size(), sz.data(), device), "copy to device");
}

// ---------------------------------------------------------------- fallback counters
static std::map<std::string, uint64_t> &fallbacks() {
  static std::map<std::string, uint64_t> m;
  return m;
}
static std::map<std::string, uint64_t> &lowerings() {
  static std::map<std::string, uint64_t> m;
  return m;
}
void count_fallback(const std::string &name) { fallbacks()[name]++; }
void count_lowering(const std::string &name) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  lowerings()[name]++;
}
void reset_fallbacks() {
  fallbacks().clear();
  lowerings().clear();
}
static std::string counters_json(const std::map<std::string, uint64_t> &m) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (auto &kv : m) {
    os << (first ? "" : ",") << "\"" << kv.first << "\":" << kv.second;
    first = false;
  }
  os << "}";
  return os.str();
}
std::string fallback_json() { return counters_json(fallbacks()); }
std::string lowering_json() { return counters_json(lowerings()); }

// ---------------------------------------------------------------- CPU fallback
static bool arg_mutated(const c10::Argument &a) {
  return a.alias_info() && a.alias_info()->isWrite();
}

// The CPU copies of a fallback's arguments, and what they came from.
struct FallbackArgs {
  std::vector<at::Tensor> orig;    // graft tensor arguments (single tensors)
  std::vector<at::Tensor> cpu_of;  // their CPU copies, as passed to the CPU kernel
  // Tensor[] arguments: each element's graft tensor (undefined if none) and CPU copy, so that
  // a mutated list (a fused optimizer's, AMP's unscale) is written back element by element.
  std::vector<std::vector<at::Tensor>> orig_list, cpu_list;
  bool any_graft = false, any_cpu = false;
};

// A tensor argument on the CPU: graft tensors copied, CPU tensors noted (mixing is an error).
static at::Tensor fallback_tensor_to_cpu(const at::Tensor &t, FallbackArgs &fa, bool cpu_allowed) {
  if (is_graft(t)) {
    fa.any_graft = true;
    return to_cpu(t);
  }
  if (!cpu_allowed && t.defined() && t.dim() > 0) fa.any_cpu = true;
  return t;
}

// Replaces every graft tensor in args (single, list, optional list, device) by a CPU one.
static FallbackArgs fallback_args_to_cpu(std::vector<c10::IValue> &args) {
  FallbackArgs fa;
  fa.orig.resize(args.size());
  fa.cpu_of.resize(args.size());
  fa.orig_list.resize(args.size());
  fa.cpu_list.resize(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto &iv = args[i];
    if (iv.isTensor()) {
      const at::Tensor &t = iv.toTensor();
      if (is_graft(t)) fa.orig[i] = t;
      iv = fa.cpu_of[i] = fallback_tensor_to_cpu(t, fa, false);
    } else if (iv.isTensorList()) {
      auto lst = iv.toTensorList();
      c10::List<at::Tensor> nl;
      for (size_t k = 0; k < lst.size(); ++k) {
        at::Tensor t = lst.get(k);
        fa.orig_list[i].push_back(is_graft(t) ? t : at::Tensor());
        fa.cpu_list[i].push_back(fallback_tensor_to_cpu(t, fa, false));
        nl.push_back(fa.cpu_list[i].back());
      }
      iv = nl;
    } else if (iv.isList() && iv.toListRef().size() > 0 &&
               (iv.toListRef()[0].isTensor() || iv.toListRef()[0].isNone())) {
      // Tensor?[]: CPU index tensors are allowed with device tensors (as PyTorch allows on CUDA).
      c10::List<c10::optional<at::Tensor>> nl;
      for (const auto &e : iv.toListRef()) {
        if (e.isTensor()) nl.push_back(fallback_tensor_to_cpu(e.toTensor(), fa, true));
        else nl.push_back(c10::nullopt);
      }
      iv = nl;
    } else if (iv.isDevice() && iv.toDevice().type() == kDevType) {
      fa.any_graft = true;
      iv = c10::Device(c10::DeviceType::CPU);
    }
  }
  return fa;
}

// A returned alias of a mutated argument: the graft argument itself (undefined if none).
static at::Tensor fallback_mutated_alias(const c10::FunctionSchema &schema, const c10::Argument &ret,
                                         const FallbackArgs &fa) {
  if (!ret.alias_info() || !ret.alias_info()->isWrite()) return at::Tensor();
  for (size_t i = 0; i < fa.orig.size(); ++i) {
    const auto &ai = schema.arguments()[i].alias_info();
    if (fa.orig[i].defined() && ai && ai->beforeSets() == ret.alias_info()->beforeSets()) return fa.orig[i];
  }
  return at::Tensor();
}

// A returned view of an argument (unfold, diagonal, ...): a graft view keeping the aliasing when
// the argument is a whole root, so writes through the view reach it as on CPU (else undefined).
static at::Tensor fallback_view(const c10::FunctionSchema &schema, const c10::Argument &ret,
                                const at::Tensor &t, const FallbackArgs &fa) {
  if (!ret.alias_info() || ret.alias_info()->isWrite() || !t.defined()) return at::Tensor();
  for (size_t i = 0; i < fa.orig.size(); ++i) {
    const auto &ai = schema.arguments()[i].alias_info();
    if (!fa.orig[i].defined() || !ai || ai->beforeSets() != ret.alias_info()->beforeSets()) continue;
    GraftImpl *gi = gimpl(fa.orig[i]);
    if ((gi->is_identity() || gi->is_full_reshape()) && t.is_alias_of(fa.cpu_of[i]) &&
        t.scalar_type() == fa.orig[i].scalar_type())
      return make_view(fa.orig[i], t.sizes(), t.strides(), t.storage_offset(),
                       from_cpu(t, gdevice(fa.orig[i])));
    break;
  }
  return at::Tensor();
}

// One CPU result as the op's graft result.
static c10::IValue fallback_output(const c10::FunctionSchema &schema, const c10::Argument &ret,
                                   c10::IValue iv, const FallbackArgs &fa) {
  if (iv.isTensor()) {
    at::Tensor t = iv.toTensor();
    at::Tensor g = fallback_mutated_alias(schema, ret, fa);
    if (!g.defined()) g = fallback_view(schema, ret, t, fa);
    if (g.defined()) return g;
    if (t.defined() && fa.any_graft && t.device().type() == c10::DeviceType::CPU) return wrap(from_cpu(t, cur_device()));
  } else if (iv.isTensorList() && fa.any_graft) {
    auto lst = iv.toTensorList();
    c10::List<at::Tensor> nl;
    for (size_t k = 0; k < lst.size(); ++k) {
      at::Tensor t = lst.get(k);
      nl.push_back(t.defined() ? wrap(from_cpu(t, cur_device())) : t);
    }
    return nl;
  }
  return iv;
}

static bool copy_like(const std::string &name) {
  return name == "aten::_copy_from" || name == "aten::_copy_from_and_resize" || name == "aten::copy_" ||
         name == "aten::_to_copy" || name == "aten::to" || name == "aten::set_";
}

// An op with no lowering runs on PyTorch's CPU kernel: graft arguments are synced and copied to
// the CPU, mutated ones written back, results copied to graft (views and aliases kept).
void cpu_fallback(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  if (host_call_fallback(op, stack)) return;  // inside the graph, no cut (hostcall.cpp)
  const auto &schema = op.schema();
  const std::string name = schema.name();
  size_t nargs = schema.arguments().size();
  auto args = torch::jit::last(*stack, nargs).vec();
  torch::jit::drop(*stack, nargs);
  FallbackArgs fa = fallback_args_to_cpu(args);
  TORCH_CHECK(!(fa.any_graft && fa.any_cpu) || copy_like(name),
              "Expected all tensors to be on the same device, but found at least two devices, graft:",
              cur_device(), " and cpu! (in ", schema.operator_name(), ")");

  int64_t elems = 0;  // the fallback's size picks its OpenMP threads, as a host call's
  for (const auto &iv : args) {
    if (iv.isTensor()) elems += iv.toTensor().numel();
    else if (iv.isTensorList())
      for (const at::Tensor &t : iv.toTensorList().vec()) elems += t.defined() ? t.numel() : 0;
  }
  for (auto &iv : args) stack->push_back(std::move(iv));
  count_fallback(name);
  {
    HostThreads threads(elems);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  for (size_t i = 0; i < nargs; ++i) {  // mutated arguments back into their graft tensors
    if (!arg_mutated(schema.arguments()[i])) continue;
    if (fa.orig[i].defined()) write_resize(fa.orig[i], from_cpu(fa.cpu_of[i], gdevice(fa.orig[i])));
    for (size_t k = 0; k < fa.orig_list[i].size(); ++k)
      if (fa.orig_list[i][k].defined())
        write_resize(fa.orig_list[i][k], from_cpu(fa.cpu_list[i][k], gdevice(fa.orig_list[i][k])));
  }
  const auto &rets = schema.returns();
  auto outs = torch::jit::last(*stack, rets.size()).vec();
  torch::jit::drop(*stack, rets.size());
  for (size_t r = 0; r < rets.size(); ++r) stack->push_back(fallback_output(schema, rets[r], std::move(outs[r]), fa));
}

// ---------------------------------------------------------------- the boxed kernel
// The lowering of each operator is resolved once and cached by the address of its
// OperatorName, which lives in the dispatcher's operator entry for the process lifetime: the
// per-op cost is one hash lookup, no name strings.
static Resolved lookup(const c10::OperatorHandle &op) {
  static std::unordered_map<const void *, Resolved> cache;
  const c10::OperatorName *key = &op.operator_name();
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::string name = key->name;
  if (!key->overload_name.empty()) name += "." + key->overload_name;
  Resolved r = resolve_lowering(name, op);
  cache.emplace(key, r);
  return r;
}

// The current device (see bridge.h).
static thread_local int tl_device = 0;
int cur_device() { return tl_device; }

struct DeviceScope {
  int prev;
  explicit DeviceScope(int d) : prev(tl_device) { tl_device = d; }
  ~DeviceScope() { tl_device = prev; }
};

// The device an op runs on: its graft tensor arguments' (they must share one; a copy between two
// devices runs on the destination's), else its device argument's, else the current one.
static int op_device(const c10::OperatorHandle &op, const torch::jit::Stack &stack) {
  const auto &schema = op.schema();
  size_t n = schema.arguments().size(), base = stack.size() - n;
  at::Tensor first, other;
  auto see = [&](const at::Tensor &t) {
    if (!is_graft(t)) return;
    if (!first.defined()) first = t;
    else if (!other.defined() && gdevice(t) != gdevice(first)) other = t;
  };
  int devarg = -1;
  for (size_t i = base; i < stack.size(); ++i) {
    const c10::IValue &iv = stack[i];
    if (iv.isTensor()) {
      see(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto lst = iv.toTensorList();
      for (size_t k = 0; k < lst.size(); ++k) see(lst.get(k));
    } else if (iv.isList()) {
      for (const auto &e : iv.toListRef())
        if (e.isTensor()) see(e.toTensor());
    } else if (iv.isDevice() && iv.toDevice().type() == kDevType && iv.toDevice().has_index()) {
      devarg = iv.toDevice().index();
    }
  }
  if (other.defined()) {
    const std::string &name = schema.name();
    if (name == "aten::_copy_from" || name == "aten::_copy_from_and_resize") return gdevice(stack[base + 1].toTensor());
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                device_desc(first), " and ", device_desc(other), "! (in ", schema.operator_name(),
                "; .to(device) moves a tensor)");
  }
  if (devarg >= 0) return devarg;
  return first.defined() ? gdevice(first) : tl_device;
}

// The last lowering arguments an exception left on this thread (note_unwound_args); cleared
// as each op starts, so a message never names an earlier op's.
static thread_local std::string tl_unwound;

void note_unwound_args(const std::vector<c10::IValue> &v) {
  std::ostringstream os;
  int64_t most = 0;
  for (const auto &iv : v) {
    if (!iv.isTensor() || !iv.toTensor().defined()) continue;
    const at::Tensor &t = iv.toTensor();
    os << (os.tellp() > 0 ? ", " : " on ") << t.sizes() << " " << t.scalar_type() << " on "
       << (is_graft(t) ? device_desc(t) : t.device().str());
    most = std::max<int64_t>(most, t.numel() * (int64_t)t.element_size());
  }
  if (most) os << " (the largest tensor is " << most << " bytes)";
  tl_unwound = os.str();
}

// pyloc.c: the Python line of the op being traced, for recompile reasons
extern "C" void graftpt_pyloc_capture(void);
extern "C" void graftpt_pyloc_configure(const char *const *prefixes, int n, int on);

// Ops a lowering calls (at::) come back through graft_kernel: only the outermost one, the
// op the user's code called, looks up its Python line and names the nodes' aten op; leaving
// it clears both, so nodes made elsewhere (syncs, collectives) take their neighbours' line
// (src/graph/cache.c). The op's name lives as long as its registration.
static thread_local int tl_kernel_depth;
struct KernelDepth {
  KernelDepth() { ++tl_kernel_depth; }
  ~KernelDepth() {
    if (!--tl_kernel_depth) {
      graft_set_location(nullptr, 0);
      graft_set_op_name(nullptr);
    }
  }
};

static void graft_kernel(const c10::OperatorHandle &op, torch::jit::Stack *stack) {
  if (!tl_kernel_depth) {
    graftpt_pyloc_capture();  // before the lock: it may take the GIL
    graft_set_op_name(op.schema().name().c_str());
  }
  KernelDepth depth;
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  DeviceScope scope(op_device(op, *stack));
  Resolved r = lookup(op);
  if (!tl_unwound.empty()) tl_unwound.clear();
  try {
    if (r.fn) return run_lowering(r, op, stack);
    cpu_fallback(op, stack);
  } catch (const std::bad_alloc &) {
    // Host memory ran out inside the op (a lowering's host-side tables, a fallback's copies):
    // say which op, on which tensors and device
    TORCH_CHECK(false, "graft: out of host memory running ", op.schema().operator_name(), tl_unwound);
  }
}

// ---------------------------------------------------------------- device guard
struct GraftGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kDevType, (c10::DeviceIndex)tl_device); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kDevType, "graft: bad device type");
    if (d.has_index()) tl_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) tl_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  // An upper bound, not graft_device_count(): counting loads the accelerator runtimes, and the
  // autograd engine asks at its first backward (it starts one thread per device id).
  c10::DeviceIndex deviceCount() const noexcept override { return GRAFT_MAX_DEVICES; }
  void record(void **, const c10::Stream &, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void *, const c10::Stream &) const override {}
  bool queryEvent(void *) const override { return true; }
  void destroyEvent(void *, const c10::DeviceIndex) const noexcept override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GraftGuardImpl);

// ---------------------------------------------------------------- PrivateUse1 hooks
// torch 2 asks a PrivateUse1 backend for these (the autograd engine at its first backward,
// torch.Generator(device="graft"), pinned-memory queries). graft has one counter-based
// generator for all its devices, seeded by graft_manual_seed; its position is not exposed, so
// its state cannot be saved or restored: that is an error, not a silent no-op.
struct GraftGenerator final : public c10::GeneratorImpl {
  uint64_t seed_ = 67280421310721ull;
  explicit GraftGenerator(c10::DeviceIndex d)
      : c10::GeneratorImpl(c10::Device(kDevType, d), c10::DispatchKeySet(kKey)) {}
  // Its own lock, not the bridge's: Python calls this holding the GIL, and the bridge's lock
  // is held while a host call's meta kernel (often Python) takes the GIL (hostcall.cpp).
  std::mutex seed_mu_;
  void set_current_seed(uint64_t s) override {
    std::lock_guard<std::mutex> lk(seed_mu_);
    seed_ = s;
    graft_manual_seed(s);
  }
  void set_offset(uint64_t) override {
    TORCH_CHECK(false, "graft: the device generator has no settable offset (seed it instead)");
  }
  uint64_t get_offset() const override {
    TORCH_CHECK(false, "graft: the device generator's offset is not exposed");
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl &) override {
    TORCH_CHECK(false, "graft: the device generator's state cannot be restored (torch.manual_seed "
                       "seeds it)");
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    TORCH_CHECK(false, "graft: the device generator's state cannot be saved (torch.manual_seed "
                       "seeds it)");
  }
  GraftGenerator *clone_impl() const override {
    auto *g = new GraftGenerator(device().index());
    g->seed_ = seed_;
    return g;
  }
};

struct GraftHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  const at::Generator &getDefaultGenerator(c10::DeviceIndex d) const override {
    static at::Generator gens[GRAFT_MAX_DEVICES];
    static std::once_flag once;
    std::call_once(once, [] {
      for (int i = 0; i < GRAFT_MAX_DEVICES; ++i)
        gens[i] = at::make_generator<GraftGenerator>((c10::DeviceIndex)i);
    });
    int i = d < 0 ? tl_device : d;
    TORCH_CHECK(i < GRAFT_MAX_DEVICES, "graft: no device ", i);
    return gens[i];
  }
  at::Device getDeviceFromPtr(void *) const override {
    TORCH_CHECK(false, "graft: graft tensors have no data pointer (their values live in graft)");
  }
  bool isPinnedPtr(const void *) const override { return false; }
  // .to("cpu", non_blocking=True) asks for a pinned host buffer: graft's copies out are plain
  // reads of a materialized value, so ordinary CPU memory serves.
  c10::Allocator *getPinnedMemoryAllocator() const override { return c10::GetAllocator(c10::DeviceType::CPU); }
};

static bool register_hooks() {
  static GraftHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}
static const bool hooks_registered = register_hooks();

}  // namespace graftpt

using namespace graftpt;

// Every op on the key goes to the boxed kernel.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&graft_kernel>());
}

// Composite views: registered explicitly so they stay views (not as_strided) and use fast paths.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const char *views[] = {"t", "transpose.int", "permute", "select.int", "slice.Tensor", "expand",
                         "unsqueeze", "squeeze", "squeeze.dim", "alias", "_unsafe_view", "clone", "convolution_backward"};
  for (const char *v : views) m.impl(v, torch::CppFunction::makeFromBoxedFunction<&graft_kernel>());
  // Every lowered op (and its in-place form) is registered by name too, so that ops PyTorch
  // implements as CompositeExplicitAutograd (abs -> abs.out, logical_and, sum, mv, ...) reach
  // the lowering instead of decomposing into out= variants.
  auto &disp = c10::Dispatcher::singleton();
  for (const std::string &key : lowered_ops()) {
    std::string k = key.substr(6);  // drop "aten::"
    auto dot = k.find('.');
    std::string name = k.substr(0, dot), ov = dot == std::string::npos ? "" : k.substr(dot + 1);
    for (const std::string &n : {name, name + "_"}) {
      if (std::find(std::begin(views), std::end(views), n + (ov.empty() ? "" : "." + ov)) != std::end(views)) continue;
      // functorch registers index_put_ on this key already (it forwards to _index_put_impl_).
      if (n == "index_put_") continue;
      auto h = disp.findSchema(c10::OperatorName("aten::" + n, ov));
      if (!h) continue;
      // A CompositeImplicitAutograd op (where.ScalarSelf, ...) keeps its decomposition: a
      // backend kernel would take the place of its autograd (no gradient flows through it).
      if (h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
      static std::vector<std::unique_ptr<std::string>> names;  // kept alive for the registry
      names.push_back(std::make_unique<std::string>(n + (ov.empty() ? "" : "." + ov)));
      m.impl(names.back()->c_str(), torch::CppFunction::makeFromBoxedFunction<&graft_kernel>());
    }
  }
}

// ---------------------------------------------------------------- torch.ops.graft helpers
static void py_step() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  new_step_scalars();
  chk_status(graft_step(), "step");
}

static void py_sync(const std::vector<at::Tensor> &ts) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  drain_released();
  std::vector<G> vals;
  std::vector<graft_tensor *> ptrs;
  for (auto &t : ts) {
    if (!is_graft(t)) continue;
    vals.push_back(value(t));
    ptrs.push_back(vals.back().get());
  }
  if (!ptrs.empty()) chk_status(graft_sync(ptrs.data(), (int)ptrs.size()), "sync");
}

static std::string py_metrics_json() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  graft_metrics m;
  graft_metrics_get(&m);
  std::ostringstream os;
  os << "{";
  // every field of GRAFT_METRICS_FIELDS (include/graft.h), then the bridge's fallbacks per aten op
#define JSON_FIELD(type, name, label, meaning) os << "\"" #name "\":" << m.name << ",";
  GRAFT_METRICS_FIELDS(JSON_FIELD)
#undef JSON_FIELD
  os << "\"fallbacks\":" << fallback_json() << ",\"lowerings\":" << lowering_json() << "}";
  return os.str();
}

static void py_reset_metrics() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  graft_metrics_reset();
  reset_fallbacks();
}

static std::string py_report() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  char *r = graft_metrics_report();
  std::string s = r ? r : "";
  free(r);
  return s;
}

static void py_wait_compiles() {
  // Not under the bridge lock: background compiles do not need it, and tracing may go on.
  graft_wait_compiles();
}

static void py_wait() {
  // Not under the bridge lock: the executor thread never needs it.
  chk_status(graft_wait(), "wait");
  drain_released();  // what the finished steps let go of
}

static int64_t py_device_count() { return graft_device_count(); }

static int64_t py_current_device() { return tl_device; }

static void py_set_device(int64_t id) {
  TORCH_CHECK(id >= 0 && id < GRAFT_MAX_DEVICES, "graft: no device ", id);
  tl_device = (int)id;
}

static int64_t py_device_find(const std::string &kind, int64_t ordinal) {
  int id = graft_device_find(kind.c_str(), (int)ordinal);
  if (id < 0) chk_status(GRAFT_ERR_DEVICE, "device");
  return id;
}

// (kind, name, memory bytes) of device id; kind "" when there is no such device.
static std::tuple<std::string, std::string, int64_t> py_device_info(int64_t id) {
  const char *kind = graft_device_kind((int)id), *name = graft_device_name((int)id);
  return {kind ? kind : "", name ? name : "", (int64_t)graft_device_memory((int)id)};
}

// Why no device of kind is listed; "" when one is.
static std::string py_device_absent(const std::string &kind) {
  const char *why = graft_device_absent(kind.c_str());
  return why ? why : "";
}

static std::string py_last_compile_reason() { return graft_last_compile_reason(); }

static void py_locations(const std::vector<std::string> &internal, bool on) {
  std::vector<const char *> p;
  for (const auto &s : internal) p.push_back(s.c_str());
  graftpt_pyloc_configure(p.data(), (int)p.size(), on);
}

static std::vector<std::string> py_lowered_ops() { return lowered_ops(); }

static void py_count_lowering(const std::string &name) { count_lowering(name); }

static void py_manual_seed(int64_t s) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  graft_manual_seed((uint64_t)s);
}

static bool py_is_pending(const at::Tensor &t) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  G v = value(t);
  return graft_is_pending(v.get());
}

// Functions (graft_function_*): torch.compile's backend records a traced FX graph once and calls
// it again (torch/graft/_dynamo.py). Handles are ids into this table (a TORCH_LIBRARY op takes
// no C pointers); freed by function_free.
static std::map<int64_t, graft_function *> &functions() {
  static auto *m = new std::map<int64_t, graft_function *>();
  return *m;
}

static std::vector<G> values(const std::vector<at::Tensor> &ts, std::vector<graft_tensor *> &ptrs) {
  std::vector<G> vals;
  for (auto &t : ts) {
    TORCH_CHECK(is_graft(t), "graft: a function's tensors must be on a graft device (got ", t.device(), ")");
    vals.push_back(value(t));
    ptrs.push_back(vals.back().get());
  }
  return vals;
}

static int64_t py_function_capture(const std::vector<at::Tensor> &inputs,
                                   const std::vector<at::Tensor> &outputs) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  std::vector<graft_tensor *> in, out;
  auto iv = values(inputs, in), ov = values(outputs, out);
  graft_function *f = graft_function_capture((int)in.size(), in.data(), (int)out.size(), out.data());
  if (!f) chk_status(graft_last_status(), "function_capture");
  static int64_t next_id = 0;
  functions()[++next_id] = f;
  return next_id;
}

static std::vector<at::Tensor> py_function_call(int64_t id, const std::vector<at::Tensor> &inputs) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  drain_released();
  auto it = functions().find(id);
  TORCH_CHECK(it != functions().end(), "graft: no function ", id, " (freed?)");
  std::vector<graft_tensor *> in;
  auto iv = values(inputs, in);
  int nout = graft_function_outputs(it->second);
  std::vector<graft_tensor *> out((size_t)nout, nullptr);
  chk_status(graft_function_call(it->second, (int)in.size(), in.data(), nout, out.data()),
             "function_call");
  std::vector<at::Tensor> r;
  for (auto *o : out) r.push_back(wrap(G(o)));
  return r;
}

static void py_function_free(int64_t id) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  auto it = functions().find(id);
  if (it == functions().end()) return;
  graft_function_free(it->second);
  functions().erase(it);
}

// graft.export / graft.load: a function as a file (graft_save / graft_load).
static void py_function_save(int64_t id, const std::string &path) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  auto it = functions().find(id);
  TORCH_CHECK(it != functions().end(), "graft: no function ", id, " (freed?)");
  chk_status(graft_save(it->second, path.c_str()), "save");
}

static int64_t py_function_load(const std::string &path, int64_t device) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  graft_function *f = graft_load(path.c_str(), (int)device);
  if (!f) chk_status(graft_last_status(), "load");
  static int64_t next_id = 1LL << 40; /* apart from captured ones: ids are never reused */
  functions()[++next_id] = f;
  return next_id;
}

// Named outputs: graft.save_tensors / load_tensors (a function of no inputs, each output named).
static void py_function_set_output_name(int64_t id, int64_t k, const std::string &name) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  auto it = functions().find(id);
  TORCH_CHECK(it != functions().end(), "graft: no function ", id, " (freed?)");
  chk_status(graft_function_set_output_name(it->second, (int)k, name.c_str()), "function_set_output_name");
}

static std::vector<std::string> py_function_output_names(int64_t id) {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  auto it = functions().find(id);
  TORCH_CHECK(it != functions().end(), "graft: no function ", id, " (freed?)");
  std::vector<std::string> r;
  for (int k = 0; k < graft_function_outputs(it->second); k++) {
    const char *nm = graft_function_output_name(it->second, k);
    r.push_back(nm ? nm : "");
  }
  return r;
}

// graft.trace(path): the timeline trace (graft_trace_begin / end).
static void py_trace_begin(const std::string &path) {
  chk_status(graft_trace_begin(path.c_str()), "trace_begin");
}

static void py_trace_end() {
  graft_wait(); /* the steps queued so far are in the trace */
  chk_status(graft_trace_end(), "trace_end");
}

TORCH_LIBRARY(graft, m) {
  m.def("host_view(Tensor t) -> Tensor", &py_host_view);
  m.def("host_borrow(Tensor t, int device) -> Tensor", &py_host_borrow);
  m.def("function_save(int id, str path) -> ()", &py_function_save);
  m.def("function_load(str path, int device) -> int", &py_function_load);
  m.def("function_capture(Tensor[] inputs, Tensor[] outputs) -> int", &py_function_capture);
  m.def("function_call(int id, Tensor[] inputs) -> Tensor[]", &py_function_call);
  m.def("function_free(int id) -> ()", &py_function_free);
  m.def("function_set_output_name(int id, int k, str name) -> ()", &py_function_set_output_name);
  m.def("function_output_names(int id) -> str[]", &py_function_output_names);
  m.def("trace_begin(str path) -> ()", &py_trace_begin);
  m.def("trace_end() -> ()", &py_trace_end);
  m.def("step() -> ()", &py_step);
  m.def("lowered_ops() -> str[]", &py_lowered_ops);
  m.def("count_lowering(str name) -> ()", &py_count_lowering);
  m.def("sync(Tensor[] tensors) -> ()", &py_sync);
  m.def("metrics_json() -> str", &py_metrics_json);
  m.def("reset_metrics() -> ()", &py_reset_metrics);
  m.def("metrics_report() -> str", &py_report);
  m.def("last_compile_reason() -> str", &py_last_compile_reason);
  m.def("locations(str[] internal, bool on) -> ()", &py_locations);
  m.def("manual_seed(int seed) -> ()", &py_manual_seed);
  m.def("is_pending(Tensor t) -> bool", &py_is_pending);
  m.def("wait_compiles() -> ()", &py_wait_compiles);
  m.def("wait() -> ()", &py_wait);
  m.def("device_count() -> int", &py_device_count);
  m.def("current_device() -> int", &py_current_device);
  m.def("set_device(int id) -> ()", &py_set_device);
  m.def("device_find(str kind, int ordinal) -> int", &py_device_find);
  m.def("device_info(int id) -> (str, str, int)", &py_device_info);
  m.def("device_absent(str kind) -> str", &py_device_absent);
}
