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

int cpu_plan_buffer_of(const exec_program *p, const fuse_plan *pl, int s) {
  while (pl->role[s] == FUSE_INLINE && p->instr[s].op == IR_RESHAPE) s = p->instr[s].in[0];
  return s;
}

/* Can every reader of value i read it through an inlined reshape? Generated kernels and GEMMs
 * can (fuse_library_operand follows the chain); a fallback or another library call reads the
 * value's own buffer (an output that is a reshape of an input and the operand of a linear
 * layer's GEMM: through torch.compile, the GEMM read a buffer nothing had filled). */
static bool cpu_plan_reads_through(const exec_program *p, const fuse_plan *pl, int i) {
  for (int j = i + 1; j < p->ninstr; j++) {
    const exec_instr *r = &p->instr[j];
    for (int k = 0; k < r->nin; k++)
      if (r->in[k] == i && (pl->role[j] == FUSE_FALLBACK || (pl->role[j] == FUSE_LIBRARY && r->op != IR_DOT)))
        return false;
  }
  return true;
}

/* An output that is a reshape of a value with a buffer (a conv weight's gradient: the GEMM's
 * [O, I*kh*kw] returned as [O,I,kh,kw]; copying it was ~10% of a resnet18 step) shares that
 * buffer: it stays inlined (its consumers read through the reshape) and the run hands out the
 * buffer under it (buffers are refcounted; a shared one is never donated). */
static void cpu_plan_output_views(const exec_program *p, fuse_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (!ins->is_output || ins->op != IR_RESHAPE || pl->role[i] != FUSE_KERNEL) continue;
    if (pl->role[cpu_plan_buffer_of(p, pl, ins->in[0])] == FUSE_INLINE || !cpu_plan_reads_through(p, pl, i))
      continue;
    pl->role[i] = FUSE_INLINE;
    pl->tview[i] |= FUSE_VIEW_RESHAPE; /* a GEMM reading it reads the buffer under it */
  }
}

int cpu_plan_build(const exec_program *p, bool have_blas, fuse_plan *pl) {
  if (fuse_plan_build(p, cpu_classify, &have_blas, pl)) return -1;
  cpu_plan_output_views(p, pl);
  return 0;
}
