/* IR_HOST_CALL: the registered host function (hostfn.h) called with its operands as they are
 * bound (contiguous host memory); its failure fails the run with its message. */
#include "ref_util.h"
#include "hostfn.h"
#include <stdlib.h>

int ref_host_call(const exec_instr *ins, const ref_arg *in, void *out) {
  uint64_t key = (uint64_t)IR_ATTR(ins->attr, HOST_CALL, key);
  graft_host_fn fn;
  void *ctx;
  if (!hostfn_find(key, &fn, &ctx))
    return err_set(GRAFT_ERR_INTERNAL, "host_call: no function registered under key %016llx",
                   (unsigned long long)key), -1;
  graft_host_tensor small[16], *args = ins->nin <= 16 ? small : malloc(sizeof *args * (size_t)ins->nin);
  if (!args) return err_set(GRAFT_ERR_OOM, "host_call: out of memory"), -1;
  for (int k = 0; k < ins->nin; k++)
    args[k] = (graft_host_tensor){(void *)in[k].data, in[k].dtype, in[k].ndim, in[k].shape, in[k].numel};
  graft_host_tensor res = {out, ins->dtype, ins->ndim, ins->shape, ins->numel};
  char msg[512] = "";
  int rc = fn(ctx, ins->nin, args, &res, msg, sizeof msg);
  if (args != small) free(args);
  if (rc) return err_set(GRAFT_ERR_ARG, "host_call: %s", msg[0] ? msg : "the host function failed"), -1;
  return 0;
}
