/* The fusion plan (src/passes/fusion.h) as this backend sees it: which ops it generates. */
#include "cpu_internal.h"
#include "dtype.h"

static bool cpu_dtype_gen(graft_dtype dt) { return dt != GRAFT_F16 && dt != GRAFT_BF16; }

bool cpu_op_generated(const exec_program *p, int i, bool have_blas) {
  const exec_instr *ins = &p->instr[i];
  if (!cpu_dtype_gen(ins->dtype)) return false;
  for (int k = 0; k < ins->nin; k++)
    if (!cpu_dtype_gen(p->instr[ins->in[k]].dtype)) return false;
  switch (ir_ops[ins->op].cpu) { /* ops.def's cpu column */
  case OPS_CPU_EXPR: case OPS_CPU_WIDE: case OPS_CPU_MOVE: case OPS_CPU_REDUCE: return true;
  case OPS_CPU_GEMM: /* BLAS for f32/f64 with int-sized dims */
    if (!have_blas || !dtype_is_float(ins->dtype)) return false;
    for (int d = 0; d < ins->ndim; d++)
      if (ins->shape[d] > 0x7fffffff) return false;
    return p->instr[ins->in[0]].shape[p->instr[ins->in[0]].ndim - 1] <= 0x7fffffff;
  default: return false; /* host kernels and declared fallbacks run through rt->fallback */
  }
}

static int cpu_classify(const exec_program *p, int i, void *ctx) {
  if (!cpu_op_generated(p, i, *(bool *)ctx)) return FUSE_FALLBACK;
  switch (ir_ops[p->instr[i].op].cpu) {
  case OPS_CPU_GEMM: return FUSE_LIBRARY;
  case OPS_CPU_REDUCE: return FUSE_REDUCE;
  default: return FUSE_INLINE;
  }
}

int cpu_plan_build(const exec_program *p, bool have_blas, fuse_plan *pl) {
  return fuse_plan_build(p, cpu_classify, &have_blas, pl);
}
