/* The fusion plan, shared by the compiling backends (the CPU's C generator, the GPU renderer):
 * which instructions get a buffer (a kernel root, a reduction, a BLAS call, a
 * reference-kernel fallback, a parameter) and which are inlined into their consumers' loops as
 * expressions (elementwise, compare, select, convert, constant, iota and every movement op:
 * index arithmetic, never a copy). An inlined node read by several kernels is recomputed in
 * each (bandwidth is the scarce resource here), except a computed node read through an
 * expanding broadcast, which gets its own (small) buffer so it is not recomputed per element. */
#include "fusion.h"
#include "error.h"
#include <stdlib.h>

/* A node worth a buffer when broadcast: it computes something (not a leaf or movement). */
static bool fuse_computes(ir_op op) {
  ir_kind k = ir_ops[op].kind;
  return k == IR_K_UNARY || k == IR_K_BINARY || k == IR_K_COMPARE || k == IR_K_SELECT;
}

#define FUSE_MAX_INLINE_DEPTH 64
#define FUSE_SHARED_EXPR_SIZE 12

static bool fuse_last2_transpose(const exec_instr *ins) {
  if (ins->op != IR_TRANSPOSE || ins->ndim < 2) return false;
  for (int d = 0; d < ins->ndim - 2; d++)
    if (IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d) != d) return false;
  return IR_ATTR_AT(ins->attr, TRANSPOSE, perm, ins->ndim - 2) == ins->ndim - 1 &&
         IR_ATTR_AT(ins->attr, TRANSPOSE, perm, ins->ndim - 1) == ins->ndim - 2;
}

int fuse_library_operand(const exec_program *p, const fuse_plan *pl, int s, int *trans) {
  *trans = (pl->tview[s] & FUSE_VIEW_TRANSPOSE) && pl->role[s] == FUSE_INLINE;
  if (*trans) s = p->instr[s].in[0];
  while ((pl->tview[s] & FUSE_VIEW_RESHAPE) && pl->role[s] == FUSE_INLINE) s = p->instr[s].in[0];
  return s;
}

/* Below a GEMM operand s (past a transposed view): a chain of inlined reshapes is the same bytes
 * as the buffer under it (every buffer is dense, row-major), so the GEMM reads that buffer and
 * the reshapes are never copied (resnet18's weights [O,I,3,3] read as [O,I*9]: 17% of a step
 * was such copies). The value under the chain gets the buffer instead. */
static int fuse_view_reshapes(const exec_program *p, fuse_plan *pl, int s) {
  while (pl->role[s] == FUSE_INLINE && p->instr[s].op == IR_RESHAPE) {
    pl->tview[s] |= FUSE_VIEW_RESHAPE;
    s = p->instr[s].in[0];
  }
  return s;
}

/* Each live instruction's role (live: an output depends on it), as classify says. */
static void fuse_plan_roles(const exec_program *p, fuse_classify_fn classify, void *ctx,
                            const unsigned char *live, fuse_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op == IR_DATA) { pl->role[i] = FUSE_PARAM; continue; }
    if (!live[i]) { pl->role[i] = FUSE_DEAD; continue; }
    for (int k = 0; k < ins->nin; k++) pl->nuse[ins->in[k]]++;
    int r = classify(p, i, ctx);
    pl->role[i] = (unsigned char)(r == FUSE_INLINE && ins->is_output ? FUSE_KERNEL : r);
  }
}

/* Library calls and fallbacks read whole buffers; a GEMM operand that is a transpose of the
 * last two dims reads its source's buffer with BLAS's transpose flag instead. */
static void fuse_plan_library_operands(const exec_program *p, fuse_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != FUSE_FALLBACK && pl->role[i] != FUSE_LIBRARY) continue;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[i] == FUSE_LIBRARY && p->instr[i].op == IR_DOT && pl->role[s] == FUSE_INLINE &&
          fuse_last2_transpose(&p->instr[s])) {
        pl->tview[s] |= FUSE_VIEW_TRANSPOSE;
        s = p->instr[s].in[0];
      }
      if (pl->role[i] == FUSE_LIBRARY && p->instr[i].op == IR_DOT) s = fuse_view_reshapes(p, pl, s);
      if (pl->role[s] == FUSE_INLINE) pl->role[s] = FUSE_KERNEL;
    }
  }
}

/* A computed value read through an expanding broadcast gets a buffer (also behind reshapes
 * transposes and slices: a pooling gradient's dy viewed as [..., OH, 1, OW, 1] and broadcast). */
static void fuse_plan_broadcast_sources(const exec_program *p, fuse_plan *pl) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op != IR_BROADCAST || pl->role[i] == FUSE_DEAD) continue;
    int s = ins->in[0];
    while (pl->role[s] == FUSE_INLINE &&
           (p->instr[s].op == IR_RESHAPE || p->instr[s].op == IR_TRANSPOSE ||
            p->instr[s].op == IR_SLICE))
      s = p->instr[s].in[0];
    if (pl->role[s] == FUSE_INLINE && fuse_computes(p->instr[s].op) && p->instr[s].numel < ins->numel)
      pl->role[s] = FUSE_KERNEL;
  }
}

/* Long chains of inlined values would become deeply nested expressions (and deep recursion
 * in the generator): materialize one value every FUSE_MAX_INLINE_DEPTH levels. depth[] is
 * scratch of p->ninstr entries. */
static void fuse_plan_depth_limit(const exec_program *p, fuse_plan *pl, int *depth) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != FUSE_INLINE) continue;
    int d = 0;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[s] == FUSE_INLINE && depth[s] > d) d = depth[s];
    }
    depth[i] = d + 1;
    if (depth[i] >= FUSE_MAX_INLINE_DEPTH) {
      pl->role[i] = FUSE_KERNEL;
      depth[i] = 0;
    }
  }
}

/* An expensive inlined value read by several consumers would be recomputed in each (seen:
 * a col2im sum of 9 padded slices recomputed by 5 batch-norm reductions; at 12 nodes, the
 * max-pool gradient those reductions read: the demo CNN's step 1.9 -> 1.55 ms; a SiLU padded
 * for a convolution's im2col, its sigmoid recomputed by each of the 9 taps: a U-Net's largest
 * kernel): give it a buffer. By size (inlined expression nodes under a value, as a tree,
 * capped) or by the work the extra reads repeat (ops.def's per-element costs under it: a
 * transcendental 16, a division 4, other arithmetic 1, movement 0, times the reads past the
 * first). depth[] holds the depths fuse_plan_depth_limit left and is reused for sizes. */
#define FUSE_SHARED_REPEAT_COST 48
static void fuse_plan_shared_values(const exec_program *p, fuse_plan *pl, int *depth, int *cost) {
  for (int i = 0; i < p->ninstr; i++) {
    if (pl->role[i] != FUSE_INLINE) continue;
    int64_t sz = 1, c = ir_ops[p->instr[i].op].cost;
    for (int k = 0; k < p->instr[i].nin; k++) {
      int s = p->instr[i].in[k];
      if (pl->role[s] == FUSE_INLINE) sz += depth[s], c += cost[s];
    }
    depth[i] = sz > 1 << 20 ? 1 << 20 : (int)sz;
    cost[i] = c > 1 << 20 ? 1 << 20 : (int)c;
    int extra = pl->nuse[i] - 1;
    if (extra >= 1 && (depth[i] >= FUSE_SHARED_EXPR_SIZE || (int64_t)extra * cost[i] >= FUSE_SHARED_REPEAT_COST)) {
      pl->role[i] = FUSE_KERNEL;
      depth[i] = 0, cost[i] = 0;
    }
  }
}

int fuse_plan_build(const exec_program *p, fuse_classify_fn classify, void *ctx, fuse_plan *pl) {
  int n = p->ninstr;
  pl->n = n;
  pl->role = calloc((size_t)n + 1, 1);
  pl->nuse = calloc((size_t)n + 1, sizeof(int));
  pl->tview = calloc((size_t)n + 1, 1);
  unsigned char *live = calloc((size_t)n + 1, 1);
  int *depth = calloc((size_t)n + 1, sizeof(int)), *cost = calloc((size_t)n + 1, sizeof(int));
  if (!pl->role || !pl->nuse || !pl->tview || !live || !depth || !cost) {
    free(live);
    free(depth);
    free(cost);
    fuse_plan_free(pl);
    err_set(GRAFT_ERR_OOM, "out of memory planning a graph's kernels");
    return -1;
  }
  for (int k = 0; k < p->noutputs; k++) live[p->output_slot[k]] = 1;
  for (int i = n - 1; i >= 0; i--)
    if (live[i])
      for (int k = 0; k < p->instr[i].nin; k++) live[p->instr[i].in[k]] = 1;
  fuse_plan_roles(p, classify, ctx, live, pl);
  fuse_plan_library_operands(p, pl);
  fuse_plan_broadcast_sources(p, pl);
  fuse_plan_depth_limit(p, pl, depth);
  fuse_plan_shared_values(p, pl, depth, cost);
  free(depth);
  free(cost);
  free(live);
  return 0;
}

void fuse_plan_free(fuse_plan *pl) {
  free(pl->role);
  free(pl->nuse);
  free(pl->tview);
  pl->role = NULL;
  pl->nuse = NULL;
  pl->tview = NULL;
}
