/* Collective kernels. The operands are packed into the result, one flat buffer per dtype, so
 * the process group moves all of them in one MPI call, in place; then the collective runs
 * through core's hook (coll.h), at this instruction's place in the program. */
#include "ref_util.h"
#include "coll.h"
#include <inttypes.h>
#include <string.h>

/* What every rank must agree on before data moves: op, argument, dtype and each operand's
 * shape. Two ranks whose graphs differ here would otherwise reduce misaligned buffers. */
static uint64_t ref_coll_sig(const exec_instr *ins, const ref_arg *in) {
  uint64_t h = ir_mix(ir_mix((uint64_t)ins->op, (uint64_t)IR_ATTR(ins->attr, COLLECTIVE, arg)),
                      (uint64_t)ins->dtype);
  h = ir_mix(h, (uint64_t)ins->nin);
  for (int k = 0; k < ins->nin; k++) {
    h = ir_mix(h, (uint64_t)in[k].ndim);
    for (int d = 0; d < in[k].ndim; d++) h = ir_mix(h, (uint64_t)in[k].shape[d]);
  }
  return h;
}

int ref_collective(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = graft_dtype_size(ins->dtype);
  int64_t total = ins->shape[ins->ndim - 1];
  char *dst = out;
  if (ins->op == IR_ALL_GATHER) {
    if (ins->shape[0] != coll_world())
      return err_set(GRAFT_ERR_ARG, "all_gather: traced for a world of %" PRId64
                     " processes, running in a world of %d", ins->shape[0], coll_world()), -1;
    dst += (size_t)coll_rank() * (size_t)total * es; /* this rank's row */
  }
  for (int k = 0; k < ins->nin; k++) {
    size_t n = (size_t)in[k].numel * es;
    if (n) memcpy(dst, in[k].data, n);
    dst += n;
  }
  return coll_run(ins->op, IR_ATTR(ins->attr, COLLECTIVE, arg), ins->dtype, out, total,
                  ref_coll_sig(ins, in));
}
