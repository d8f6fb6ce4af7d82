/* Reference CPU kernels: plain loop nests, one per op, the oracle every other backend is
 * checked against. Private to the backends. */
#ifndef GRAFT_REF_H
#define GRAFT_REF_H
#include "backend.h"

typedef struct {
  const void *data;
  graft_dtype dtype;
  int ndim;
  const int64_t *shape;
  int64_t numel;
} ref_arg;

/* Computes instruction ins (its op, attr, output dtype, ndim, shape, numel) from operands
 * in[0..ins->nin) into out (ins->numel elements of ins->dtype, already allocated, NOT zeroed).
 * Returns 0, or -1 after err_set(...) for a runtime failure. */
typedef int (*ref_fn)(const exec_instr *ins, const ref_arg *in, void *out);

/* One per op-table row except IR_DATA (NULL: data leaves are bound, not computed). */
extern const ref_fn ref_kernels[IR_OP_COUNT];

/* A faster kernel for an instruction, or NULL for the reference one. */
typedef ref_fn (*ref_pick_fn)(const exec_instr *ins, const ref_arg *in);
/* Interprets program p one instruction at a time (operands freed at their last use), each with
 * pick's kernel or the reference one; outs receive new references. Returns 0 or -1 (error set). */
int ref_run(const exec_program *p, exec_buffer *const *params, exec_buffer **outs, ref_pick_fn pick);
/* The reference backend: ref_run with the reference kernels only. */
extern const backend ref_backend;
#endif
