/* The first tier's views. A new graph runs one instruction at a time, and the movement ops
 * the front-ends emit around contractions and normalisations (a convolution's im2col: a
 * transposed weight for the input gradient, the taps as slices of the padded input, its column
 * matrix transposed for the weight gradient; a batch norm's per-channel scale broadcast over
 * the batch) each wrote a full copy that one reader then read once: on resnet18's first-tier
 * step, 21 ms of 100 were transposes, 9 broadcasts, 4 slices. A transpose, broadcast or slice
 * whose every reader can read it in place (a BLAS operand, a loop that gathers its operands a
 * chunk at a time, a concatenation's strided copy) runs as no kernel at all: its slot shares
 * its operand's buffer, and its readers get the view (ref_arg.view). */
#include "cpu_internal.h"
#include <stdlib.h>
#include <string.h>

bool cpu_view_of(const exec_instr *ins, int xnd, const int64_t *xshape, ref_view *v) {
  int64_t st[GRAFT_MAX_DIMS];
  cpu_row_major(xnd, xshape, st);
  v->offset = 0;
  v->ndim = ins->ndim;
  memcpy(v->shape, ins->shape, sizeof(int64_t) * (size_t)ins->ndim);
  switch (ins->op) {
  case IR_TRANSPOSE:
    for (int d = 0; d < ins->ndim; d++) v->strides[d] = st[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)];
    return true;
  case IR_BROADCAST: { /* operand dims are right-aligned; new and size-1 dims repeat */
    int off = ins->ndim - xnd;
    for (int d = 0; d < ins->ndim; d++) v->strides[d] = d < off || xshape[d - off] == 1 ? 0 : st[d - off];
    return true;
  }
  case IR_SLICE:
    for (int d = 0; d < ins->ndim; d++) {
      v->strides[d] = st[d] * IR_ATTR_AT(ins->attr, SLICE, stride, d);
      v->offset += IR_ATTR_AT(ins->attr, SLICE, start, d) * st[d];
    }
    return true;
  default:
    return false;
  }
}

bool cpu_view_reshape(int ond, const int64_t *oshape, const int64_t *ost, int nnd,
                          const int64_t *nshape, int64_t *nst) {
  if (ond == 0) return false;
  int vd = nnd - 1;
  int64_t base = ost[ond - 1], tn = 1, vn = 1;
  for (int td = ond - 1; td >= 0; td--) {
    tn *= oshape[td];
    if (td > 0 && oshape[td - 1] != 1 && ost[td - 1] == tn * base) continue; /* same block */
    while (vd >= 0 && (vn < tn || nshape[vd] == 1)) {
      nst[vd] = vn * base;
      vn *= nshape[vd--];
    }
    if (vn != tn) return false;
    if (td > 0) base = ost[td - 1], tn = vn = 1;
  }
  return vd == -1;
}

bool cpu_view_plain(const ref_view *v, int nd, const int64_t *shape) {
  return v->ndim == nd && !memcmp(v->shape, shape, sizeof(int64_t) * (size_t)nd);
}

/* Whether reader j takes operand k as a view: a reshape when it is a view itself. */
static bool views_taken(const exec_program *p, const ref_view *v, int j, int k, cpu_view_taker takes) {
  return p->instr[j].op == IR_RESHAPE ? v[j].on : takes(p, j, k, &v[p->instr[j].in[k]]);
}

ref_view *cpu_views_plan(const exec_program *p, cpu_view_taker takes) {
  const char *env = getenv("GRAFT_FIRST_TIER_VIEWS"); /* 0: every instruction runs (A/B) */
  if (env && !strcmp(env, "0")) return NULL;
  ref_view *v = calloc((size_t)p->ninstr + 1, sizeof *v);
  if (!v) return NULL; /* every instruction runs: slower, never wrong */
  int found = 0;
  for (int i = 0; i < p->ninstr; i++) { /* a movement op of a view runs; a reshape of one views */
    const exec_instr *ins = &p->instr[i];
    if (ins->nin != 1 || ins->is_output || ins->numel == 0) continue;
    const exec_instr *x = &p->instr[ins->in[0]];
    const ref_view *xv = &v[ins->in[0]];
    if (xv->on && ins->op == IR_RESHAPE) { /* a reshape of a view: a view of the same buffer */
      v[i] = *xv;
      if (cpu_view_reshape(xv->ndim, xv->shape, xv->strides, ins->ndim, ins->shape, v[i].strides)) {
        v[i].ndim = ins->ndim; /* the new shape has strides: walked as itself */
        memcpy(v[i].shape, ins->shape, sizeof(int64_t) * (size_t)ins->ndim);
      } else {
        memcpy(v[i].strides, xv->strides, sizeof v[i].strides); /* walked as the operand */
      }
      found++;
    } else if (!xv->on && cpu_view_of(ins, x->ndim, x->shape, &v[i])) {
      v[i].on = true, found++;
    }
  }
  /* Each reader must take it. A reshape that stops being a view no longer takes its operand
   * as one, and a reshape of a view that runs is no view either (it passes on the operand's
   * own buffer): until nothing changes. */
  for (bool changed = true; changed && found;) {
    changed = false;
    for (int j = p->ninstr - 1; j >= 0; j--) {
      const exec_instr *ins = &p->instr[j];
      if (v[j].on && ins->op == IR_RESHAPE && !v[ins->in[0]].on)
        v[j].on = false, found--, changed = true;
      for (int k = 0; k < ins->nin; k++) {
        ref_view *s = &v[ins->in[k]];
        if (s->on && !views_taken(p, v, j, k, takes)) s->on = false, found--, changed = true;
      }
    }
  }
  if (!found) {
    free(v);
    return NULL;
  }
  __atomic_fetch_add(&cpu_stats.views, (uint64_t)found, __ATOMIC_RELAXED);
  return v;
}
