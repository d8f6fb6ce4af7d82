/* What CPU C renders its own way around the shared values at positions (render/rd_value.c):
 * loads that check a row group's locality and index by affine forms while loop dims merge, a
 * reshape's coordinates by digit groups, a concat's part picked once per row, the row scratch
 * of a value several members of a group compute. */
#include "cpu_codegen.h"
#include <ctype.h>
#include "../render/render.h"
#include "dtype.h"
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cpu_ctype(graft_dtype dt) { return rd_ctype(dt); }

/* A group whose dims refine to common factors (output [64,64] and source [8,512] share
 * [8,8,64]): each source coordinate is a sum of output digits, (c / inner) % f, so the inner
 * loop's index stays affine in its variable (vectorizable; no division of a flat index). False
 * when some pair of sizes does not divide (the caller then unravels the group's flat index). */
static bool cpu_reshape_refine(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                               const rd_pos *pos, rd_pos *q, int i0, int i1, int k0, int k1) {
  rd_sb terms[GRAFT_MAX_DIMS];
  memset(terms, 0, sizeof terms);
  int oi = i1 - 1, si = k1 - 1;
  int64_t ro = 0, rs = 0, oin = 1, sin = 1;
  bool ok = true;
  for (;;) {
    if (ro == 0) { /* next output dim (size-1 dims carry no digit) */
      while (oi >= i0 && ins->shape[oi] == 1) oi--;
      if (oi >= i0) ro = ins->shape[oi], oin = 1;
    }
    if (rs == 0) {
      while (si >= k0 && x->shape[si] == 1) si--;
      if (si >= k0) rs = x->shape[si], sin = 1;
    }
    if (oi < i0 || si < k0) break;
    int64_t f = ro < rs ? ro : rs;
    if ((ro > rs ? ro % rs : rs % ro) != 0) { ok = false; break; }
    const char *c = pos->c[oi];
    bool inner = g->split_var && !strcmp(c, g->split_var);
    if (inner && !g->split_f && oin == 1 && f < ro) /* trial: the low digit of the inner loop */
      g->split_want = g->split_want == 0 || g->split_want == f ? f : -1;
    if (inner && g->split_f && oin == 1 && f == g->split_f) {
      c = rd_fmt(&g->r.ar, "%sl", g->split_var);
    } else if (inner && g->split_f && oin == g->split_f) {
      c = rd_fmt(&g->r.ar, "%sh", g->split_var);
      if (f < ro) c = rd_fmt(&g->r.ar, "(%s %% %" PRId64 ")", c, f);
    } else {
      if (oin > 1) c = rd_fmt(&g->r.ar, "(%s / %" PRId64 ")", c, oin);
      if (f < ro) c = rd_fmt(&g->r.ar, "(%s %% %" PRId64 ")", c, f);
    }
    if (sin > 1) rd_sb_printf(&terms[si], "%s%s * %" PRId64, terms[si].n ? " + " : "", c, sin);
    else rd_sb_printf(&terms[si], "%s%s", terms[si].n ? " + " : "", c);
    ro /= f; rs /= f; oin *= f; sin *= f;
    if (ro == 1) { oi--; ro = 0; }
    if (rs == 1) { si--; rs = 0; }
  }
  ok = ok && oi < i0 && si < k0;
  for (int d = k0; d < k1; d++) {
    if (ok) q->c[d] = x->shape[d] == 1 || !terms[d].n ? "0" : rd_fmt(&g->r.ar, "(%s)", terms[d].s);
    rd_sb_free(&terms[d]);
  }
  return ok;
}

/* Source coordinates of a reshape from output coordinates, group by group: dims are grouped
 * where the products of both shapes agree, so a split or merge costs arithmetic on the group's
 * own coordinates instead of unravelling the flat index over the whole shape. False when it
 * does not apply (zero-size dims). */
static bool cpu_reshape_groups(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                               const rd_pos *pos, rd_pos *q) {
  int no = ins->ndim, ns = x->ndim, i = 0, k = 0;
  for (int d = 0; d < no; d++)
    if (ins->shape[d] == 0) return false;
  for (int d = 0; d < ns; d++) q->c[d] = "0";
  while (i < no && k < ns) {
    int i0 = i, k0 = k;
    int64_t po = ins->shape[i++], ps = x->shape[k++];
    while (po != ps) {
      if (po < ps) {
        if (i == no) return false;
        po *= ins->shape[i++];
      } else {
        if (k == ns) return false;
        ps *= x->shape[k++];
      }
    }
    if (cpu_reshape_refine(g, ins, x, pos, q, i0, i, k0, k)) continue;
    /* lin: this group's row-major index over its output dims */
    rd_sb e = {0};
    int64_t st = 1;
    for (int d = i - 1; d >= i0; d--) {
      if (ins->shape[d] != 1)
        rd_sb_printf(&e, "%s%s * %" PRId64, e.n ? " + " : "", pos->c[d], st);
      st *= ins->shape[d];
    }
    const char *lin = rd_fmt(&g->r.ar, "(%s)", e.n ? e.s : "0");
    rd_sb_free(&e);
    int64_t sst = 1;
    for (int d = k - 1; d >= k0; d--) {
      if (x->shape[d] == 1) q->c[d] = "0";
      else if (d == k0) q->c[d] = rd_fmt(&g->r.ar, "(%s / %" PRId64 ")", lin, sst);
      else q->c[d] = rd_fmt(&g->r.ar, "(%s / %" PRId64 " %% %" PRId64 ")", lin, sst, x->shape[d]);
      sst *= x->shape[d];
    }
  }
  q->has_c = 1; /* dims left on either side have size 1 */
  return true;
}

int64_t cpu_row_len(const cpu_cg *g) {
  int64_t n = 1;
  for (int d = g->gouter; d < g->ond; d++) n *= g->oshape[d];
  return n;
}

const char *cpu_row_inner(cpu_cg *g) {
  rd_sb e = {0};
  int64_t st = 1;
  for (int d = g->ond - 1; d >= g->gouter; d--) {
    if (g->oshape[d] != 1) {
      if (e.n) rd_sb_puts(&e, " + ");
      rd_sb_printf(&e, "i%d * %" PRId64, d, st);
    }
    st *= g->oshape[d];
  }
  char *r = rd_fmt(&g->r.ar, "(%s)", e.n ? e.s : "0");
  rd_sb_free(&e);
  return r;
}

/* Is pos the group's own loop position (coordinates i0..i<ond-1>)? */
static bool cpu_pos_is_row(cpu_cg *g, const rd_pos *pos) {
  if (!pos->has_c || pos->nd != g->ond || !g->oshape) return false;
  for (int d = 0; d < pos->nd; d++) {
    if (pos->shape[d] != g->oshape[d]) return false;
    char want[24];
    snprintf(want, sizeof want, "i%d", d);
    if (strcmp(pos->c[d], pos->shape[d] == 1 ? "0" : want)) return false;
  }
  return true;
}

/* Whether expression e reads only the row variables i0..i<row_vars-1> (and constants): its
 * value is fixed for a whole row of the kernel. */
static bool cpu_row_only(const cpu_cg *g, const char *e) {
  if (!e) return false;
  for (const char *c = e; *c;) {
    if (isalpha((unsigned char)*c) || *c == '_') {
      if (*c != 'i' || !isdigit((unsigned char)c[1])) return false;
      char *end;
      long v = strtol(c + 1, &end, 10);
      if (isalnum((unsigned char)*end) || *end == '_' || v >= g->row_vars) return false;
      c = end;
    } else {
      c++;
    }
  }
  return true;
}

enum { CPU_CONCAT_ROWSEL_MAX = 64 }; /* parts of a row-selected concat */

/* The parts of concat i along ax, nested inlined concats on the same axis flattened: each
 * part's instruction and offset on the axis, and whether it is a plain load of a buffer outside
 * the current group (else it is computed in the element loop); false past the cap. */
static bool cpu_concat_leaves(const cpu_cg *g, int i, int ax, int64_t off, int *leaf, int64_t *at,
                              bool *loaded, int *n) {
  const exec_instr *ins = &g->r.p->instr[i];
  for (int k = 0; k < ins->nin; k++) {
    int s = ins->in[k];
    const exec_instr *x = &g->r.p->instr[s];
    if (x->shape[ax] == 0) continue;
    if (g->r.pl->role[s] == FUSE_INLINE && s != g->r.self && x->op == IR_CONCAT &&
        IR_ATTR(x->attr, AXIS, axis) == ax) {
      if (!cpu_concat_leaves(g, s, ax, off, leaf, at, loaded, n)) return false;
    } else {
      if (*n == CPU_CONCAT_ROWSEL_MAX) return false;
      loaded[*n] = g->r.pl->role[s] != FUSE_INLINE && s != g->r.self && !(g->member && g->member[s]) &&
                   x->dtype == ins->dtype && x->dtype != GRAFT_BOOL;
      leaf[*n] = s, at[(*n)++] = off;
    }
    off += x->shape[ax];
  }
  return true;
}

/* A concat whose axis coordinate (and every coordinate before it) is fixed for a row: the part
 * a row lies in is picked once per row, before the element loop (g->row_pre), as a pointer into
 * the part's buffer when the part is a load, NULL when it is computed. The element loop reads
 * through the pointer (a plain load that vectorizes) where the if/else chain ran for every
 * element (an LSTM's saved state, 32 steps' outputs stacked: 0.19 -> 0.09 ms a run); with some
 * parts computed, the loop tests the pointer (fixed for the row: the compiler unswitches it)
 * and runs the chain over the computed parts only where it is NULL. NULL when the concat is
 * not of that form or has no loaded part. */
static const char *cpu_concat_rowsel(cpu_cg *g, const exec_instr *ins, rd_pos *pos) {
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis), leaf[CPU_CONCAT_ROWSEL_MAX], n = 0, nload = 0;
  int64_t at[CPU_CONCAT_ROWSEL_MAX];
  bool loaded[CPU_CONCAT_ROWSEL_MAX];
  if (!g->row_vars || !g->row_pre || g->aff_on) return NULL;
  for (int d = 0; d <= ax; d++)
    if (!cpu_row_only(g, pos->c[d])) return NULL;
  if (!cpu_concat_leaves(g, (int)(ins - g->r.p->instr), ax, 0, leaf, at, loaded, &n) || n < 2) return NULL;
  for (int k = 0; k < n; k++) nload += loaded[k];
  if (!nload) return NULL;
  int64_t inner_stride = 1; /* dims after ax: the same in every part */
  rd_sb inner = {0}, sel = {0};
  for (int d = ins->ndim - 1; d > ax; d--) {
    rd_sb_printf(&inner, "%s(%s) * %" PRId64, inner.n ? " + " : "", pos->c[d], inner_stride);
    inner_stride *= ins->shape[d];
  }
  const char *ct = cpu_ctype(ins->dtype);
  for (int k = 0; k < n; k++) {
    const exec_instr *x = &g->r.p->instr[leaf[k]];
    rd_sb row = {0}; /* the part's offset of this row: its coordinates before and on ax */
    int64_t st = inner_stride;
    for (int d = ax; d >= 0 && loaded[k]; d--) {
      const char *c = d == ax && at[k] ? rd_fmt(&g->r.ar, "(%s - %" PRId64 ")", pos->c[d], at[k]) : pos->c[d];
      rd_sb_printf(&row, "%s(%s) * %" PRId64, row.n ? " + " : "", c, st);
      st *= x->shape[d];
    }
    const char *ptr = loaded[k] ? rd_fmt(&g->r.ar, "p%d + (%s)", leaf[k], row.s)
                                : rd_fmt(&g->r.ar, "(const %s *)0", ct);
    if (k < n - 1) rd_sb_printf(&sel, "%s < %" PRId64 " ? %s : ", pos->c[ax], at[k] + x->shape[ax], ptr);
    else rd_sb_puts(&sel, ptr);
    rd_sb_free(&row);
    if (loaded[k]) g->r.reads[leaf[k]] = 1;
  }
  const char *b = rd_tmp(&g->r);
  rd_sb_printf(g->row_pre, "    const %s *%s = %s;\n", ct, b, sel.s);
  const char *load = rd_fmt(&g->r.ar, "%s[%s]", b, inner.n ? inner.s : "0");
  rd_sb_free(&inner);
  rd_sb_free(&sel);
  if (nload == n) return rd_def(&g->r, ins->dtype, load);
  const char *t = rd_tmp(&g->r); /* some parts computed: the chain over those, where b is NULL */
  rd_sb_printf(g->r.body, "      %s %s;\n      if (%s) {\n      %s = %s;\n", ct, t, b, t, load);
  g->r.branch++;
  int seen = 0;
  for (int k = 0; k < n; k++) {
    if (loaded[k]) continue;
    const exec_instr *x = &g->r.p->instr[leaf[k]];
    bool last = ++seen == n - nload;
    if (last) rd_sb_puts(g->r.body, "      } else {\n");
    else rd_sb_printf(g->r.body, "      } else if (%s < %" PRId64 ") {\n", pos->c[ax], at[k] + x->shape[ax]);
    rd_concat_part(&g->r, pos, ins->ndim, ax, leaf[k], at[k], t);
  }
  rd_sb_puts(g->r.body, "      }\n");
  g->r.branch--;
  return t;
}

/* ---- the hooks: what CPU C renders its own way (rd_gen.h) ---- */

/* Load of materialized slot s at pos; checks row-locality inside a group; indexes by the
 * affine form while loop dims merge. */
static const char *cpu_load(rd_gen *r, int s, rd_pos *pos) {
  cpu_cg *g = (cpu_cg *)r;
  const exec_instr *src = &r->p->instr[s];
  if (g->member && g->member[s] && !g->oshape) { /* a flat group's: this element only */
    if (!pos->lin || strcmp(pos->lin, "L")) g->violation = 1;
  } else if (g->member && g->member[s]) { /* produced earlier in this row group: same row only */
    rd_pos_coords(r, pos);
    for (int d = 0; d < g->gouter; d++) {
      char want[24];
      snprintf(want, sizeof want, "i%d", d);
      if (d >= src->ndim || src->shape[d] != g->oshape[d] || strcmp(pos->c[d], want))
        g->violation = 1;
    }
  }
  const char *idx = g->aff_on ? cpu_aff_load(g, pos->ap, pos->nd, pos->shape) : NULL;
  return rd_load_at(r, s, idx ? idx : rd_pos_lin(r, pos));
}

/* Merged loop dims read "0" in the coordinates: the affine form tells positions apart. */
static const char *cpu_key(rd_gen *r, const rd_pos *pos) {
  cpu_cg *g = (cpu_cg *)r;
  return g->aff_on && pos->ap ? cpu_aff_key(g, pos->ap, pos->nd) : "";
}

static const void *cpu_move(rd_gen *r, const exec_instr *ins, const exec_instr *x, const rd_pos *pos) {
  cpu_cg *g = (cpu_cg *)r;
  return g->aff_on ? cpu_aff_move(g, ins, x, pos->ap) : NULL;
}

static bool cpu_reshape(rd_gen *r, const exec_instr *ins, const exec_instr *x, const rd_pos *pos,
                        rd_pos *q) {
  return cpu_reshape_groups((cpu_cg *)r, ins, x, pos, q);
}

static const char *cpu_concat(rd_gen *r, const exec_instr *ins, rd_pos *pos) {
  return cpu_concat_rowsel((cpu_cg *)r, ins, pos);
}

static void cpu_coords_read(rd_gen *r) {
  cpu_cg *g = (cpu_cg *)r;
  g->aff_fail |= g->aff_on;
}

/* A value the memo lacks: a row-scratch load, or the shared form (a load or the inlined
 * expression), stored to the row scratch when the group caches it (not inside a branch: the
 * store would be conditional). */
static const char *cpu_fresh(rd_gen *r, int i, rd_pos *pos) {
  cpu_cg *g = (cpu_cg *)r;
  const exec_instr *ins = &r->p->instr[i];
  bool row = g->rc_state && !r->branch && r->pl->role[i] == FUSE_INLINE && i != r->self &&
             cpu_pos_is_row(g, pos);
  if (row && g->rc_state[i] == 2)
    return rd_def(r, ins->dtype, rd_fmt(&r->ar, "rc%d[%s]", i, cpu_row_inner(g)));
  const char *v = rd_value_fresh(r, i, pos);
  if (row) {
    g->rc_count[i]++;
    if (g->rc_state[i] == 1) {
      rd_sb_printf(r->body, "      rc%d[%s] = %s;\n", i, cpu_row_inner(g), v);
      g->rc_state[i] = 3;
    }
  }
  return v;
}

static const rd_hooks cpu_hooks = {.load = cpu_load, .fresh = cpu_fresh, .key = cpu_key, .move = cpu_move,
                                   .reshape = cpu_reshape, .concat = cpu_concat,
                                   .coords_read = cpu_coords_read};

/* Rows of a pad at least this long read the operand in a branch (rd_value.c says why). */
#define CPU_PAD_BRANCH_MIN 8

void cpu_expr_init(cpu_cg *g) {
  g->r.d = &rd_dialect_c;
  g->r.h = &cpu_hooks;
  g->r.fp64 = true;
  g->r.ind = "      ";
  g->r.itype = "int64_t";
  g->r.pad_branch_min = CPU_PAD_BRANCH_MIN;
}
