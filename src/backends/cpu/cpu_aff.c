/* Merging loop dims. A generated loop nest follows its root's dims: a batch-norm statistic
 * summed over N, H, W of a [N,C,H,W] view of the conv GEMM's [C][N*H*W] output ran an inner
 * loop of W = 8 elements. Where every load's flat index is an exact affine function of the
 * loop variables and the strides compose along a run of loop dims (stride[d] == stride[e] *
 * size[e] for consecutive dims d, e of the run), the run is one loop over the product of the
 * sizes: the loads index by the affine form, in which the folded dims' terms are the inner
 * variable's. A trial generation (the same recursion as the real one, render/rd_value.c) tracks the
 * affine forms through broadcast, reshape, transpose and slice; anything else that reads
 * coordinates (pad, concat, iota) or an unravel that is not exact keeps the loops as they are. */
#include "cpu_codegen.h"
#include "../render/render.h"
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static cpu_apos *aff_new(cpu_cg *g) {
  cpu_apos *q = rd_arena_alloc(&g->r.ar, sizeof *q);
  if (!q) {
    rd_fail(&g->r, "out of memory merging loops");
  }
  return q;
}

static const cpu_apos *aff_fail(cpu_cg *g) {
  g->aff_fail = 1;
  return NULL;
}

const cpu_apos *cpu_aff_root(cpu_cg *g, int nd) {
  cpu_apos *q = aff_new(g);
  if (!q) return NULL;
  for (int d = 0; d < nd; d++) q->c[d].a[d] = g->aff_n[d] > 1;
  return q;
}

/* The flat index of ap over shape (nd). */
static cpu_aff aff_flat(const cpu_cg *g, const cpu_apos *ap, int nd, const int64_t *shape) {
  if (ap->lin) return ap->c[0];
  int64_t st[GRAFT_MAX_DIMS];
  rd_strides(nd, shape, st);
  cpu_aff L = {{0}, 0};
  for (int d = 0; d < nd; d++) {
    L.b += ap->c[d].b * st[d];
    for (int r = 0; r < g->aff_nv; r++) L.a[r] += ap->c[d].a[r] * st[d];
  }
  return L;
}

/* ap as coordinates over shape (nd): a flat form unravels exactly when each variable's term
 * lies in one digit and no digit can carry over any point of the loops; else NULL. */
static const cpu_apos *aff_coords(cpu_cg *g, const cpu_apos *ap, int nd, const int64_t *shape) {
  if (!ap->lin) return ap;
  int64_t st[GRAFT_MAX_DIMS], numel = 1;
  rd_strides(nd, shape, st);
  for (int d = 0; d < nd; d++) numel *= shape[d];
  const cpu_aff *L = &ap->c[0];
  if (numel == 0 || L->b < 0 || L->b >= numel) return aff_fail(g);
  cpu_apos *q = aff_new(g);
  if (!q) return NULL;
  for (int d = 0; d < nd; d++) q->c[d].b = d ? L->b / st[d] % shape[d] : L->b / st[d];
  for (int r = 0; r < g->aff_nv; r++) {
    int64_t a = L->a[r];
    if (g->aff_n[r] <= 1 || a == 0) continue;
    int j = -1;
    for (int d = nd - 1; d >= 0; d--) /* the outermost non-unit dim whose stride is <= a */
      if (shape[d] > 1 && st[d] <= a) j = d;
    if (a < 0 || j < 0 || a % st[j]) return aff_fail(g);
    q->c[j].a[r] = a / st[j];
  }
  for (int d = 0; d < nd; d++) { /* the largest value of each digit stays in it */
    int64_t hi = q->c[d].b;
    for (int r = 0; r < g->aff_nv; r++) hi += q->c[d].a[r] * (g->aff_n[r] - 1);
    if (hi >= shape[d]) return aff_fail(g);
  }
  return q;
}

const cpu_apos *cpu_aff_move(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                             const cpu_apos *ap) {
  if (!ap) return aff_fail(g);
  if (ins->op == IR_RESHAPE || (ins->op == IR_BROADCAST && ap->lin && x->numel == ins->numel)) {
    if (ap->lin) return ap;
    cpu_apos *q = aff_new(g);
    if (!q) return NULL;
    q->lin = 1;
    q->c[0] = aff_flat(g, ap, ins->ndim, ins->shape);
    return q;
  }
  const cpu_apos *c = aff_coords(g, ap, ins->ndim, ins->shape);
  if (!c) return NULL;
  cpu_apos *q = aff_new(g);
  if (!q) return NULL;
  switch (ins->op) {
  case IR_BROADCAST: {
    int off = ins->ndim - x->ndim;
    for (int d = 0; d < x->ndim; d++)
      if (x->shape[d] != 1) q->c[d] = c->c[d + off];
    return q;
  }
  case IR_TRANSPOSE:
    for (int d = 0; d < ins->ndim; d++) q->c[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)] = c->c[d];
    return q;
  case IR_SLICE:
    for (int d = 0; d < ins->ndim; d++) {
      if (x->shape[d] == 1) continue;
      int64_t s0 = IR_ATTR_AT(ins->attr, SLICE, start, d), sd = IR_ATTR_AT(ins->attr, SLICE, stride, d);
      q->c[d].b = s0 + c->c[d].b * sd;
      for (int r = 0; r < g->aff_nv; r++) q->c[d].a[r] = c->c[d].a[r] * sd;
    }
    return q;
  default: return aff_fail(g);
  }
}

/* Do the candidates from j0 on compose in L? (bit j of the result: pair j, j+1 does not) */
static unsigned aff_pairs_bad(const cpu_cg *g, const cpu_aff *L, int j0) {
  unsigned bad = 0;
  for (int j = j0; j + 1 < g->aff_ncand; j++) {
    int d = g->aff_cand[j], e = g->aff_cand[j + 1];
    if (L->a[d] != L->a[e] * g->aff_n[e]) bad |= 1u << j;
  }
  return bad;
}

const char *cpu_aff_load(cpu_cg *g, const cpu_apos *ap, int nd, const int64_t *shape) {
  if (!ap) {
    g->aff_fail = 1;
    return NULL;
  }
  cpu_aff L = aff_flat(g, ap, nd, shape);
  if (!g->aff_emit) {
    g->aff_bad |= aff_pairs_bad(g, &L, 0);
    return NULL;
  }
  int j0 = g->aff_ncand;
  for (int j = 0; j < g->aff_ncand; j++)
    if (g->aff_gone >> g->aff_cand[j] & 1) { j0 = j; break; }
  if (aff_pairs_bad(g, &L, j0)) { /* the trial said they compose: a generator bug */
    rd_fail(&g->r, "merged loop dims disagree");
  }
  rd_sb e = {0};
  rd_sb_printf(&e, "(%" PRId64, L.b);
  for (int r = 0; r < g->aff_nv; r++)
    if (L.a[r] && g->aff_n[r] > 1 && !(g->aff_gone >> r & 1))
      rd_sb_printf(&e, " + i%d * %" PRId64, r, L.a[r]);
  rd_sb_puts(&e, ")");
  const char *s = rd_fmt(&g->r.ar, "%s", e.s ? e.s : "0");
  if (e.oom) g->r.failed = 1;
  rd_sb_free(&e);
  return s;
}

const char *cpu_aff_key(cpu_cg *g, const cpu_apos *ap, int nd) {
  rd_sb e = {0};
  rd_sb_printf(&e, "|%c", ap->lin ? 'L' : 'C');
  for (int d = 0; d < (ap->lin ? 1 : nd); d++) {
    rd_sb_printf(&e, "%" PRId64, ap->c[d].b);
    for (int r = 0; r < g->aff_nv; r++) rd_sb_printf(&e, ",%" PRId64, ap->c[d].a[r]);
    rd_sb_puts(&e, ";");
  }
  const char *s = rd_fmt(&g->r.ar, "%s", e.s ? e.s : "");
  if (e.oom) g->r.failed = 1;
  rd_sb_free(&e);
  return s;
}

int cpu_aff_plan(cpu_cg *g, int v, int nd, const int64_t *shape, const int *cand, int nc) {
  if (nc < 2) return 0;
  g->aff_on = 1;
  g->aff_emit = 0;
  g->aff_fail = 0;
  g->aff_bad = 0;
  g->aff_gone = 0;
  g->aff_nv = nd;
  g->aff_ncand = nc;
  for (int d = 0; d < nd; d++) g->aff_n[d] = shape[d];
  for (int j = 0; j < nc; j++) g->aff_cand[j] = cand[j];
  rd_pos pos = {.nd = nd, .shape = shape, .has_c = 1, .ap = cpu_aff_root(g, nd)};
  for (int d = 0; d < nd; d++) pos.c[d] = shape[d] == 1 ? "0" : rd_fmt(&g->r.ar, "i%d", d);
  rd_sb trial = {0}, *body = g->r.body;
  unsigned char *rc_state = g->rc_state;
  int ntmp = g->r.ntmp;
  g->r.body = &trial;
  g->rc_state = NULL;
  g->r.nmemo = 0;
  rd_value(&g->r, v, pos);
  g->r.body = body;
  g->rc_state = rc_state;
  g->r.ntmp = ntmp;
  g->r.nmemo = 0;
  rd_sb_free(&trial);
  int k = 1;
  while (k < nc && !(g->aff_bad >> (nc - 1 - k) & 1)) k++;
  if (g->aff_fail || k < 2) {
    cpu_aff_end(g);
    return 0;
  }
  g->aff_emit = 1;
  for (int j = nc - k; j < nc - 1; j++) g->aff_gone |= 1u << cand[j];
  g->aff_inner = cand[nc - 1];
  return k;
}

void cpu_aff_end(cpu_cg *g) {
  if (g->aff_emit && g->aff_fail) { /* the trial found none of this: a generator bug */
    rd_fail(&g->r, "merged loop dims disagree");
  }
  g->aff_on = g->aff_emit = g->aff_fail = 0;
  g->aff_gone = 0;
}
