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
    if (td > 0 && (oshape[td - 1] == 1 || ost[td - 1] == tn * base)) continue; /* same block */
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

/* Whether reader j takes operand k as a view: a reshape or pad when it is a view itself (a pad
 * that runs may still read a view: takes says). */
static bool views_taken(const exec_program *p, const ref_view *v, int j, int k, cpu_view_taker takes) {
  ir_op op = p->instr[j].op;
  if ((op == IR_RESHAPE || op == IR_PAD) && v[j].on) return true;
  return op != IR_RESHAPE && takes(p, j, k, &v[p->instr[j].in[k]]);
}

/* v: pad ins (float) as a view of its operand x (row-major, or a view walked as itself: xv). */
static bool views_pad(const exec_instr *ins, const exec_instr *x, const ref_view *xv, ref_view *v) {
  if ((ins->dtype != GRAFT_F32 && ins->dtype != GRAFT_F64) || (xv->on && !cpu_view_plain(xv, x->ndim, x->shape)))
    return false;
  ref_padding *pd = malloc(sizeof *pd);
  if (!pd) return false;
  pd->fill = ins->attr.f;
  pd->on_view = xv->on;
  for (int d = 0; d < ins->ndim; d++) {
    pd->lo[d] = IR_ATTR_AT(ins->attr, PAD, lo, d);
    pd->step[d] = 1 + IR_ATTR_AT(ins->attr, PAD, interior, d);
    pd->src[d] = x->shape[d];
  }
  v->ndim = ins->ndim;
  memcpy(v->shape, ins->shape, sizeof(int64_t) * (size_t)ins->ndim);
  if (xv->on) {
    v->offset = xv->offset;
    memcpy(v->strides, xv->strides, sizeof v->strides);
  } else {
    v->offset = 0;
    cpu_row_major(x->ndim, x->shape, v->strides);
  }
  v->pad = pd;
  return true;
}

void cpu_views_free(ref_view *v, int ninstr) {
  for (int i = 0; v && i < ninstr; i++) free((void *)v[i].pad);
  free(v);
}

ref_view *cpu_views_plan(const exec_program *p, cpu_view_taker takes) {
  const char *env = getenv("GRAFT_FIRST_TIER_VIEWS"); /* 0: every instruction runs (A/B) */
  if (env && !strcmp(env, "0")) return NULL;
  ref_view *v = calloc((size_t)p->ninstr + 1, sizeof *v);
  if (!v) return NULL; /* every instruction runs: slower, never wrong */
  /* A pad is a view only where its readers all gather (else it would keep its readers, a
   * convolution's taps, from being views of the buffer it fills). */
  static const ref_padding probe;
  ref_view padded = {.pad = &probe};
  bool *gathered = malloc((size_t)p->ninstr + 1);
  if (!gathered) {
    free(v);
    return NULL;
  }
  memset(gathered, 1, (size_t)p->ninstr + 1);
  for (int j = 0; j < p->ninstr; j++)
    for (int k = 0; k < p->instr[j].nin; k++)
      if (gathered[p->instr[j].in[k]] && !takes(p, j, k, &padded)) gathered[p->instr[j].in[k]] = false;
  int found = 0;
  for (int i = 0; i < p->ninstr; i++) { /* a movement op of a view runs; a reshape of one views */
    const exec_instr *ins = &p->instr[i];
    if (ins->nin != 1 || ins->is_output || ins->numel == 0) continue;
    const exec_instr *x = &p->instr[ins->in[0]];
    const ref_view *xv = &v[ins->in[0]];
    if (ins->op == IR_PAD) { /* a pad's view reads its operand's elements at their strides */
      if (gathered[i] && views_pad(ins, x, xv, &v[i])) v[i].on = true, found++;
    } else if (xv->on && ins->op == IR_RESHAPE && !xv->pad) { /* a reshape of a view: a view of the same buffer */
      v[i] = *xv;
      if (cpu_view_reshape(xv->ndim, xv->shape, xv->strides, ins->ndim, ins->shape, v[i].strides)) {
        v[i].ndim = ins->ndim; /* the new shape has strides: walked as itself */
        memcpy(v[i].shape, ins->shape, sizeof(int64_t) * (size_t)ins->ndim);
      } else {
        memcpy(v[i].strides, xv->strides, sizeof v[i].strides); /* walked as the operand */
      }
      found++;
    } else if (!xv->on && ins->op != IR_RESHAPE && cpu_view_of(ins, x->ndim, x->shape, &v[i])) {
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
      if (v[j].on && ((ins->op == IR_RESHAPE && !v[ins->in[0]].on) || /* its buffer would be */
                      (ins->op == IR_PAD && v[j].pad->on_view && !v[ins->in[0]].on))) /* another's */
        v[j].on = false, found--, changed = true;
      for (int k = 0; k < ins->nin; k++) {
        ref_view *s = &v[ins->in[k]];
        if (s->on && !views_taken(p, v, j, k, takes)) s->on = false, found--, changed = true;
      }
    }
  }
  free(gathered);
  if (!found) {
    cpu_views_free(v, p->ninstr);
    return NULL;
  }
  __atomic_fetch_add(&cpu_stats.views, (uint64_t)found, __ATOMIC_RELAXED);
  return v;
}
