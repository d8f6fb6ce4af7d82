// graft.distributed's C++ side: translates torch.ops.graft.dist_* calls to graft's C API
// (include/graft.h, graft_dist_*). Collectives are in place on the given graft tensors, as in
// torch.distributed: each tensor's value becomes the collective's (lazy) result.
#include "bridge.h"

#include <torch/library.h>

namespace graftpt {
namespace {

// The graft values of ts (every one must be a graft tensor).
std::vector<G> dist_values(const std::vector<at::Tensor> &ts, const char *fn) {
  std::vector<G> vals;
  for (size_t i = 0; i < ts.size(); i++) {
    TORCH_CHECK(is_graft(ts[i]), "graft.distributed.", fn, ": tensor ", i, " is on ",
                ts[i].device(), ", not on graft's device");
    vals.push_back(value(ts[i]));
  }
  return vals;
}

std::vector<graft_tensor *> dist_ptrs(const std::vector<G> &vals) {
  std::vector<graft_tensor *> p;
  for (auto &v : vals) p.push_back(v.get());
  return p;
}

// Runs an in-place collective: call(in, n, out), then each tensor takes its result.
template <typename F>
void dist_inplace(const std::vector<at::Tensor> &ts, const char *fn, F call) {
  if (ts.empty()) return;
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  std::vector<G> vals = dist_values(ts, fn);
  std::vector<graft_tensor *> in = dist_ptrs(vals), out(ts.size(), nullptr);
  chk_status(call(in.data(), (int)in.size(), out.data()), fn);
  for (size_t i = 0; i < ts.size(); i++) write(ts[i], G(out[i]));
}

int64_t py_dist_init() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  chk_status(graft_dist_init(), "graft.distributed.init");
  return graft_dist_world_size();
}

bool py_dist_available() { return graft_dist_available(); }
int64_t py_dist_rank() { return graft_dist_rank(); }
int64_t py_dist_world_size() { return graft_dist_world_size(); }

void py_dist_finalize() {
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  chk_status(graft_dist_finalize(), "graft.distributed.finalize");
}

void py_dist_abort(int64_t code) { graft_dist_abort((int)code); }

void py_all_reduce(const std::vector<at::Tensor> &ts, int64_t op) {
  dist_inplace(ts, "all_reduce", [op](graft_tensor *const *in, int n, graft_tensor **out) {
    return graft_dist_all_reduce(in, n, (graft_reduce_op)op, out);
  });
}

void py_broadcast(const std::vector<at::Tensor> &ts, int64_t root) {
  dist_inplace(ts, "broadcast", [root](graft_tensor *const *in, int n, graft_tensor **out) {
    return graft_dist_broadcast(in, n, (int)root, out);
  });
}

std::vector<at::Tensor> py_all_gather(const std::vector<at::Tensor> &ts) {
  std::vector<at::Tensor> res;
  if (ts.empty()) return res;
  std::lock_guard<std::recursive_mutex> lk(bridge_mutex());
  std::vector<G> vals = dist_values(ts, "all_gather");
  std::vector<graft_tensor *> in = dist_ptrs(vals), out(ts.size(), nullptr);
  chk_status(graft_dist_all_gather(in.data(), (int)in.size(), out.data()), "all_gather");
  for (auto *o : out) res.push_back(wrap(G(o)));
  return res;
}

}  // namespace
}  // namespace graftpt

TORCH_LIBRARY_FRAGMENT(graft, m) {
  using namespace graftpt;
  m.def("dist_available() -> bool", &py_dist_available);
  m.def("dist_init() -> int", &py_dist_init);
  m.def("dist_rank() -> int", &py_dist_rank);
  m.def("dist_world_size() -> int", &py_dist_world_size);
  m.def("dist_finalize() -> ()", &py_dist_finalize);
  m.def("dist_abort(int code) -> ()", &py_dist_abort);
  m.def("dist_all_reduce(Tensor[] tensors, int op) -> ()", &py_all_reduce);
  m.def("dist_broadcast(Tensor[] tensors, int root) -> ()", &py_broadcast);
  m.def("dist_all_gather(Tensor[] tensors) -> Tensor[]", &py_all_gather);
}
