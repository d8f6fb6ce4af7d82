/* The fusion plan: which instructions get a buffer (a kernel root, a reduction, a BLAS call, a
 * reference-kernel fallback, a parameter) and which are inlined into their consumers' loops as
 * expressions (elementwise, compare, select, convert, constant, iota and every movement op:
 * index arithmetic, never a copy). An inlined node read by several kernels is recomputed in
 * each (bandwidth is the scarce resource here), except a computed node read through an
 * expanding broadcast, which gets its own (small) buffer so it is not recomputed per element. */
#include "cpu_internal.h"
#include "dtype.h"
#include <stdlib.h>

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

/* A node worth a buffer when broadcast: it computes something (not a leaf or movement). */
static bool cpu_computes(ir_op op) {
  ir_kind k = ir_ops[op].kind;
  return k == IR_K_UNARY || k == IR_K_BINARY || k == IR_K_COMPARE || k == IR_K_SELECT;
}

#define CPU_MAX_INLINE_DEPTH 64
#define CPU_SHARED_EXPR_SIZE 12

static bool cpu_last2_transpose(const exec_instr *ins) {
  if (ins->op != IR_TRANSPOSE || ins->ndim < 2) return false;
  for (int d = 0; d < ins->ndim - 2; d++)
    if (IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d) != d) return false;
  return IR_ATTR_AT(ins->attr, TRANSPOSE, perm, ins->ndim - 2) == ins->ndim - 1 &&
         IR_ATTR_AT(ins->attr, TRANSPOSE, perm, ins->ndim - 1) == ins->ndim - 2;
}

int cpu_gemm_operand(const exec_program *p, const cpu_plan *pl, int s, int *trans) {
  *trans = pl->tview[s] && pl->role[s] == CPU_INLINE;
  return *trans ? p->instr[s].in[0] : s;
}

/* Each live instruction's role (live: an output depends on it). */
static void cpu_plan_roles(const exec_program *p, bool have_blas, const unsigned char *live,
                           cpu_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op == IR_DATA) { pl->role[i] = CPU_PARAM; continue; }
    if (!live[i]) { pl->role[i] = CPU_DEAD; continue; }
    for (int k = 0; k < ins->nin; k++) pl->nuse[ins->in[k]]++;
    if (!cpu_op_generated(p, i, have_blas)) pl->role[i] = CPU_FALLBACK;
    else if (ir_ops[ins->op].cpu == OPS_CPU_GEMM) pl->role[i] = CPU_GEMM;
    else if (ir_ops[ins->op].cpu == OPS_CPU_REDUCE) pl->role[i] = CPU_REDUCE;
    else if (ins->is_output) pl->role[i] = CPU_KERNEL;
    else pl->role[i] = CPU_INLINE;
  }
}

/* Library calls and fallbacks read whole buffers; a GEMM operand that is a transpose of the
 * last two dims reads its source's buffer with BLAS's transpose flag instead. */
static void cpu_plan_library_operands(const exec_program *p, cpu_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != CPU_FALLBACK && pl->role[i] != CPU_GEMM) continue;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[i] == CPU_GEMM && pl->role[s] == CPU_INLINE && cpu_last2_transpose(&p->instr[s])) {
        pl->tview[s] = 1;
        s = p->instr[s].in[0];
      }
      if (pl->role[s] == CPU_INLINE) pl->role[s] = CPU_KERNEL;
    }
  }
}

/* A computed value read through an expanding broadcast gets a buffer (also behind reshapes
 * transposes and slices: a pooling gradient's dy viewed as [..., OH, 1, OW, 1] and broadcast). */
static void cpu_plan_broadcast_sources(const exec_program *p, cpu_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op != IR_BROADCAST || pl->role[i] == CPU_DEAD) continue;
    int s = ins->in[0];
    while (pl->role[s] == CPU_INLINE &&
           (p->instr[s].op == IR_RESHAPE || p->instr[s].op == IR_TRANSPOSE ||
            p->instr[s].op == IR_SLICE))
      s = p->instr[s].in[0];
    if (pl->role[s] == CPU_INLINE && cpu_computes(p->instr[s].op) && p->instr[s].numel < ins->numel)
      pl->role[s] = CPU_KERNEL;
  }
}

/* Long chains of inlined values would become deeply nested expressions (and deep recursion
 * in the generator): materialize one value every CPU_MAX_INLINE_DEPTH levels. depth[] is
 * scratch of p->ninstr entries. */
static void cpu_plan_depth_limit(const exec_program *p, cpu_plan *pl, int *depth) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != CPU_INLINE) continue;
    int d = 0;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[s] == CPU_INLINE && depth[s] > d) d = depth[s];
    }
    depth[i] = d + 1;
    if (depth[i] >= CPU_MAX_INLINE_DEPTH) {
      pl->role[i] = CPU_KERNEL;
      depth[i] = 0;
    }
  }
}

/* An expensive inlined value read by several consumers would be recomputed in each (seen:
 * a col2im sum of 9 padded slices recomputed by 5 batch-norm reductions; at 12 nodes, the
 * max-pool gradient those reductions read: the demo CNN's step 1.9 -> 1.55 ms): give it a buffer.
 * size = inlined expression nodes under a value, as a tree (capped); depth[] holds the depths
 * cpu_plan_depth_limit left and is reused for sizes. */
static void cpu_plan_shared_values(const exec_program *p, cpu_plan *pl, int *depth) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != CPU_INLINE) continue;
    int64_t sz = 1;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[s] == CPU_INLINE) sz += depth[s];
    }
    depth[i] = sz > 1 << 20 ? 1 << 20 : (int)sz;
    if (pl->nuse[i] >= 2 && depth[i] >= CPU_SHARED_EXPR_SIZE) {
      pl->role[i] = CPU_KERNEL;
      depth[i] = 0;
    }
  }
}

int cpu_plan_build(const exec_program *p, bool have_blas, cpu_plan *pl) {
  int n = p->ninstr;
  pl->n = n;
  pl->have_blas = have_blas;
  pl->role = calloc((size_t)n + 1, 1);
  pl->nuse = calloc((size_t)n + 1, sizeof(int));
  pl->tview = calloc((size_t)n + 1, 1);
  unsigned char *live = calloc((size_t)n + 1, 1);
  int *depth = calloc((size_t)n + 1, sizeof(int));
  if (!pl->role || !pl->nuse || !pl->tview || !live || !depth) {
    free(live);
    free(depth);
    cpu_plan_free(pl);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory planning a graph");
    return -1;
  }
  for (int k = 0; k < p->noutputs; k++) live[p->output_slot[k]] = 1;
  for (int i = n - 1; i >= 0; i--)
    if (live[i])
      for (int k = 0; k < p->instr[i].nin; k++) live[p->instr[i].in[k]] = 1;
  cpu_plan_roles(p, have_blas, live, pl);
  cpu_plan_library_operands(p, pl);
  cpu_plan_broadcast_sources(p, pl);
  cpu_plan_depth_limit(p, pl, depth);
  cpu_plan_shared_values(p, pl, depth);
  free(depth);
  free(live);
  return 0;
}

void cpu_plan_free(cpu_plan *pl) {
  free(pl->role);
  free(pl->nuse);
  free(pl->tview);
  pl->role = NULL;
  pl->nuse = NULL;
  pl->tview = NULL;
}
