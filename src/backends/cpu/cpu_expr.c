/* Expression emission: the value of an instruction at a position of some loop nest, as C
 * statements appended to the current loop body. Inlined instructions become expressions;
 * movement ops transform the position (index arithmetic); materialized ones are loads.
 * Values are memoized per (instruction, position) within one loop body. */
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

static char *cpu_tmp(cpu_cg *g) { return rd_fmt(&g->ar, "t%d", g->ntmp++); }

/* Emits "const T name = expr;" and returns name. */
static const char *cpu_def(cpu_cg *g, graft_dtype dt, const char *expr) {
  char *t = cpu_tmp(g);
  rd_sb_printf(g->body, "      const %s %s = %s;\n", cpu_ctype(dt), t, expr);
  return t;
}

/* Row-major strides. */

void cpu_pos_coords(cpu_cg *g, cpu_pos *pos) {
  if (pos->has_c) return;
  int64_t st[GRAFT_MAX_DIMS];
  rd_strides(pos->nd, pos->shape, st);
  for (int d = 0; d < pos->nd; d++) {
    if (pos->shape[d] == 1) {
      pos->c[d] = "0";
    } else if (pos->nd == 1) {
      pos->c[d] = pos->lin;
    } else {
      g->need_unravel = 1;
      char *t = cpu_tmp(g);
      if (d == 0)
        rd_sb_printf(g->body, "      const int64_t %s = (%s) / %" PRId64 ";\n", t, pos->lin, st[d]);
      else
        rd_sb_printf(g->body, "      const int64_t %s = (%s) / %" PRId64 " %% %" PRId64 ";\n", t,
                      pos->lin, st[d], pos->shape[d]);
      pos->c[d] = t;
    }
  }
  pos->has_c = 1;
}

const char *cpu_pos_lin(cpu_cg *g, cpu_pos *pos) {
  if (!pos->lin) pos->lin = rd_lin(&g->ar, pos->nd, pos->shape, pos->c);
  return pos->lin;
}

static const char *cpu_pos_key(cpu_cg *g, const cpu_pos *pos) {
  /* merged loop dims read "0" in the coordinates: the affine form tells positions apart */
  const char *ak = g->aff_on && pos->ap ? cpu_aff_key(g, pos->ap, pos->nd) : "";
  if (!pos->has_c) return rd_fmt(&g->ar, "L%s%s", pos->lin, ak);
  rd_sb e = {0};
  for (int d = 0; d < pos->nd; d++) rd_sb_printf(&e, "%s,", pos->c[d]);
  char *r = rd_fmt(&g->ar, "C%s%s", e.n ? e.s : "", ak);
  rd_sb_free(&e);
  return r;
}

/* Load of materialized slot s at pos; records the read; checks row-locality inside a group. */
static const char *cpu_load(cpu_cg *g, int s, cpu_pos *pos) {
  const exec_instr *src = &g->p->instr[s];
  if (g->member && g->member[s] && !g->oshape) { /* a flat group's: this element only */
    if (!pos->lin || strcmp(pos->lin, "L")) g->violation = 1;
  } else if (g->member && g->member[s]) { /* produced earlier in this row group: same row only */
    cpu_pos_coords(g, pos);
    for (int d = 0; d < g->gouter; d++) {
      char want[24];
      snprintf(want, sizeof want, "i%d", d);
      if (d >= src->ndim || src->shape[d] != g->oshape[d] || strcmp(pos->c[d], want))
        g->violation = 1;
    }
  }
  g->reads[s] = 1;
  const char *idx = g->aff_on ? cpu_aff_load(g, pos->ap, pos->nd, pos->shape) : NULL;
  if (!idx) idx = cpu_pos_lin(g, pos);
  const char *e = src->dtype == GRAFT_BOOL ? rd_fmt(&g->ar, "(uint8_t)(p%d[%s] != 0)", s, idx)
                                           : rd_fmt(&g->ar, "p%d[%s]", s, idx);
  return cpu_def(g, src->dtype, e);
}

/* Clamp of coordinate expression q to [0, n). Emits a temp. */
static const char *cpu_clamp(cpu_cg *g, const char *q, int64_t n) {
  char *t = cpu_tmp(g);
  rd_sb_printf(g->body, "      const int64_t %s = gc_clamp(%s, %" PRId64 ");\n", t, q, n);
  return t;
}


/* A group whose dims refine to common factors (output [64,64] and source [8,512] share
 * [8,8,64]): each source coordinate is a sum of output digits, (c / inner) % f, so the inner
 * loop's index stays affine in its variable (vectorizable; no division of a flat index). False
 * when some pair of sizes does not divide (the caller then unravels the group's flat index). */
static bool cpu_reshape_refine(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                               const cpu_pos *pos, cpu_pos *q, int i0, int i1, int k0, int k1) {
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
      c = rd_fmt(&g->ar, "%sl", g->split_var);
    } else if (inner && g->split_f && oin == g->split_f) {
      c = rd_fmt(&g->ar, "%sh", g->split_var);
      if (f < ro) c = rd_fmt(&g->ar, "(%s %% %" PRId64 ")", c, f);
    } else {
      if (oin > 1) c = rd_fmt(&g->ar, "(%s / %" PRId64 ")", c, oin);
      if (f < ro) c = rd_fmt(&g->ar, "(%s %% %" PRId64 ")", c, f);
    }
    if (sin > 1) rd_sb_printf(&terms[si], "%s%s * %" PRId64, terms[si].n ? " + " : "", c, sin);
    else rd_sb_printf(&terms[si], "%s%s", terms[si].n ? " + " : "", c);
    ro /= f; rs /= f; oin *= f; sin *= f;
    if (ro == 1) { oi--; ro = 0; }
    if (rs == 1) { si--; rs = 0; }
  }
  ok = ok && oi < i0 && si < k0;
  for (int d = k0; d < k1; d++) {
    if (ok) q->c[d] = x->shape[d] == 1 || !terms[d].n ? "0" : rd_fmt(&g->ar, "(%s)", terms[d].s);
    rd_sb_free(&terms[d]);
  }
  return ok;
}

/* Source coordinates of a reshape from output coordinates, group by group: dims are grouped
 * where the products of both shapes agree, so a split or merge costs arithmetic on the group's
 * own coordinates instead of unravelling the flat index over the whole shape. False when it
 * does not apply (zero-size dims). */
static bool cpu_reshape_groups(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                               const cpu_pos *pos, cpu_pos *q) {
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
    const char *lin = rd_fmt(&g->ar, "(%s)", e.n ? e.s : "0");
    rd_sb_free(&e);
    int64_t sst = 1;
    for (int d = k - 1; d >= k0; d--) {
      if (x->shape[d] == 1) q->c[d] = "0";
      else if (d == k0) q->c[d] = rd_fmt(&g->ar, "(%s / %" PRId64 ")", lin, sst);
      else q->c[d] = rd_fmt(&g->ar, "(%s / %" PRId64 " %% %" PRId64 ")", lin, sst, x->shape[d]);
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
  char *r = rd_fmt(&g->ar, "(%s)", e.n ? e.s : "0");
  rd_sb_free(&e);
  return r;
}

/* Is pos the group's own loop position (coordinates i0..i<ond-1>)? */
static bool cpu_pos_is_row(cpu_cg *g, const cpu_pos *pos) {
  if (!pos->has_c || pos->nd != g->ond || !g->oshape) return false;
  for (int d = 0; d < pos->nd; d++) {
    if (pos->shape[d] != g->oshape[d]) return false;
    char want[24];
    snprintf(want, sizeof want, "i%d", d);
    if (strcmp(pos->c[d], pos->shape[d] == 1 ? "0" : want)) return false;
  }
  return true;
}

/* ---- the memo: a value per (instruction, position) of the current loop body ----
 * Rolling back (nmemo set lower: a new loop body, a concat branch) leaves stale slots in the
 * index; a slot counts only when it points below nmemo at an entry with the same key, and
 * lookups probe past stale ones (slots are emptied only by a rebuild). */
static uint64_t cpu_memo_hash(const char *s) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static const char *cpu_memo_find(const cpu_cg *g, const char *key, uint64_t h) {
  if (!g->memo_nslots) return NULL;
  size_t mask = g->memo_nslots - 1;
  for (size_t s = h & mask; g->memo_slot[s]; s = (s + 1) & mask) {
    int k = g->memo_slot[s] - 1;
    if (k < g->nmemo && g->memo[k].hash == h && !strcmp(g->memo[k].key, key)) return g->memo[k].val;
  }
  return NULL;
}

static void cpu_memo_index(cpu_cg *g, int k) {
  size_t mask = g->memo_nslots - 1, s = g->memo[k].hash & mask;
  while (g->memo_slot[s]) s = (s + 1) & mask;
  g->memo_slot[s] = k + 1;
  g->memo_used++;
}

/* The index at most half full: rebuilt over the live entries (stale slots dropped), larger
 * when they need it. */
static int cpu_memo_reindex(cpu_cg *g) {
  size_t n = 256;
  while (n < 4 * ((size_t)g->nmemo + 1)) n *= 2;
  int32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return -1;
  free(g->memo_slot);
  g->memo_slot = slot;
  g->memo_nslots = n;
  g->memo_used = 0;
  for (int k = 0; k < g->nmemo; k++) cpu_memo_index(g, k);
  return 0;
}

static void cpu_memo_put(cpu_cg *g, const char *key, uint64_t h, const char *val) {
  if (g->nmemo == g->memo_cap) {
    int cap = g->memo_cap ? 2 * g->memo_cap : 256;
    cpu_memo *m = realloc(g->memo, sizeof *m * (size_t)cap);
    if (!m) goto oom;
    g->memo = m;
    g->memo_cap = cap;
  }
  if (2 * (g->memo_used + 1) > g->memo_nslots && cpu_memo_reindex(g)) goto oom;
  g->memo[g->nmemo] = (cpu_memo){key, val, h};
  cpu_memo_index(g, g->nmemo++);
  return;
oom: /* the compile fails and names why; the graph stays on the first tier */
  if (!g->failed) snprintf(g->fail_what, sizeof g->fail_what, ": out of memory memoizing values");
  g->failed = 1;
}

void cpu_memo_free(cpu_cg *g) {
  free(g->memo);
  free(g->memo_slot);
  g->memo = NULL;
  g->memo_slot = NULL;
}

/* The operand position that an index-mapping movement op (broadcast, reshape, transpose,
 * slice) reads for its output position pos. */
static cpu_pos cpu_move_pos(cpu_cg *g, const exec_instr *ins, const exec_instr *x, cpu_pos *pos) {
  cpu_pos q = {.nd = x->ndim, .shape = x->shape};
  if (g->aff_on) q.ap = cpu_aff_move(g, ins, x, pos->ap);
  switch (ins->op) {
  case IR_BROADCAST: {
    int off = ins->ndim - x->ndim;
    if (!pos->has_c && x->numel == ins->numel) {
      q.lin = pos->lin;
    } else if (x->numel == 1) { /* a scalar: no coordinates needed */
      for (int d = 0; d < x->ndim; d++) q.c[d] = "0";
      q.has_c = 1;
    } else {
      cpu_pos_coords(g, pos);
      for (int d = 0; d < x->ndim; d++) q.c[d] = x->shape[d] == 1 ? "0" : pos->c[d + off];
      q.has_c = 1;
    }
    break;
  }
  case IR_RESHAPE:
    if (pos->has_c && rd_only_unit_dims_differ(ins, x)) {
      int j = 0;
      for (int d = 0; d < x->ndim; d++) {
        if (x->shape[d] == 1) { q.c[d] = "0"; continue; }
        while (ins->shape[j] == 1) j++;
        q.c[d] = pos->c[j++];
      }
      q.has_c = 1;
    } else if (!(pos->has_c && cpu_reshape_groups(g, ins, x, pos, &q))) {
      q.lin = cpu_pos_lin(g, pos);
    }
    break;
  case IR_TRANSPOSE:
    cpu_pos_coords(g, pos);
    for (int d = 0; d < ins->ndim; d++) q.c[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)] = pos->c[d];
    q.has_c = 1;
    break;
  default: /* IR_SLICE */
    cpu_pos_coords(g, pos);
    for (int d = 0; d < ins->ndim; d++) {
      int64_t s0 = IR_ATTR_AT(ins->attr, SLICE, start, d), st = IR_ATTR_AT(ins->attr, SLICE, stride, d);
      if (x->shape[d] == 1) q.c[d] = "0";
      else if (s0 == 0 && st == 1) q.c[d] = pos->c[d];
      else q.c[d] = rd_fmt(&g->ar, "(%" PRId64 " + %s * %" PRId64 ")", s0, pos->c[d], st);
    }
    q.has_c = 1;
    break;
  }
  return q;
}

/* Rows of a pad at least this long read the operand only where the element lies inside it
 * (a branch, as concat's parts do): gcc turns the branch into masked vector loads, and the
 * unclamped index stays affine. A convolution's input gradient (nine padded taps summed) ran
 * 1.5-2.3x faster so on 8- and 16-wide rows; on 4-wide rows the scalar branches lost to the
 * clamped loads and a select. */
#define CPU_PAD_BRANCH_MIN 8

/* The branch form of pad: t = fill; if (cond) t = operand at q (its values scoped to the
 * branch: memo rolled back, no row scratch). */
static const char *cpu_value_pad_branch(cpu_cg *g, const exec_instr *ins, cpu_pos q,
                                        const char *fill, const char *cond) {
  char *t = cpu_tmp(g);
  rd_sb_printf(g->body, "      %s %s = %s;\n      if (%s) {\n", cpu_ctype(ins->dtype), t, fill,
                cond);
  unsigned char *rc_state = g->rc_state;
  g->rc_state = NULL;
  int nmemo = g->nmemo;
  const char *a = cpu_value(g, ins->in[0], q);
  rd_sb_printf(g->body, "      %s = %s;\n      }\n", t, a);
  g->nmemo = nmemo;
  g->rc_state = rc_state;
  return t;
}

/* pad: the operand's element where pos maps onto one (clamped, or read in a branch), else the
 * fill. */
static const char *cpu_value_pad(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                                 cpu_pos *pos) {
  const char *fill = rd_literal(&g->ar, &rd_dialect_c, ins->dtype, ins->attr.f);
  bool branch = ins->ndim && ins->shape[ins->ndim - 1] >= CPU_PAD_BRANCH_MIN;
  g->aff_fail |= g->aff_on; /* reads coordinates */
  if (x->numel == 0) return fill;
  cpu_pos_coords(g, pos);
  cpu_pos q = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  rd_sb cond = {0};
  for (int d = 0; d < ins->ndim; d++) {
    int64_t lo = IR_ATTR_AT(ins->attr, PAD, lo, d), hi = IR_ATTR_AT(ins->attr, PAD, hi, d);
    int64_t step = IR_ATTR_AT(ins->attr, PAD, interior, d) + 1;
    if (lo == 0 && hi == 0 && step == 1) { q.c[d] = pos->c[d]; continue; }
    const char *r = rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[d], lo);
    if (step > 1) { /* interior padding: only every step-th position holds an element */
      rd_sb_printf(&cond, "%s%s >= 0 && %s %% %" PRId64 " == 0", cond.n ? " && " : "", r, r,
                    step);
      r = rd_fmt(&g->ar, "(%s / %" PRId64 ")", r, step);
    }
    rd_sb_printf(&cond, "%s(uint64_t)%s < %" PRId64 "ull", cond.n ? " && " : "", r, x->shape[d]);
    q.c[d] = branch ? r : cpu_clamp(g, r, x->shape[d]);
  }
  if (branch && cond.n) {
    const char *t = cpu_value_pad_branch(g, ins, q, fill, cond.s);
    rd_sb_free(&cond);
    return t;
  }
  const char *a = cpu_value(g, ins->in[0], q);
  const char *v = cond.n ? cpu_def(g, ins->dtype, rd_fmt(&g->ar, "(%s) ? %s : %s", cond.s, a, fill))
                         : a;
  rd_sb_free(&cond);
  return v;
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

/* Part `part` of a concat along ax, whose elements start at off on the axis, at the concat's
 * position pos, assigned to t inside the branch the caller opened; the part's values are scoped
 * to the branch (the memo rolled back after it). */
static void cpu_concat_part(cpu_cg *g, const cpu_pos *pos, int nd, int ax, int part, int64_t off,
                            const char *t) {
  const exec_instr *x = &g->p->instr[part];
  cpu_pos q = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  for (int d = 0; d < nd; d++) q.c[d] = pos->c[d];
  q.c[ax] = off ? rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[ax], off) : pos->c[ax];
  int nmemo = g->nmemo;
  const char *a = cpu_value(g, part, q);
  rd_sb_printf(g->body, "      %s = %s;\n", t, a);
  g->nmemo = nmemo;
}

/* The parts of concat i along ax, nested inlined concats on the same axis flattened: each
 * part's instruction and offset on the axis, and whether it is a plain load of a buffer outside
 * the current group (else it is computed in the element loop); false past the cap. */
static bool cpu_concat_leaves(const cpu_cg *g, int i, int ax, int64_t off, int *leaf, int64_t *at,
                              bool *loaded, int *n) {
  const exec_instr *ins = &g->p->instr[i];
  for (int k = 0; k < ins->nin; k++) {
    int s = ins->in[k];
    const exec_instr *x = &g->p->instr[s];
    if (x->shape[ax] == 0) continue;
    if (g->pl->role[s] == FUSE_INLINE && s != g->self && x->op == IR_CONCAT &&
        IR_ATTR(x->attr, AXIS, axis) == ax) {
      if (!cpu_concat_leaves(g, s, ax, off, leaf, at, loaded, n)) return false;
    } else {
      if (*n == CPU_CONCAT_ROWSEL_MAX) return false;
      loaded[*n] = g->pl->role[s] != FUSE_INLINE && s != g->self && !(g->member && g->member[s]) &&
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
static const char *cpu_value_concat_rowsel(cpu_cg *g, const exec_instr *ins, cpu_pos *pos) {
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis), leaf[CPU_CONCAT_ROWSEL_MAX], n = 0, nload = 0;
  int64_t at[CPU_CONCAT_ROWSEL_MAX];
  bool loaded[CPU_CONCAT_ROWSEL_MAX];
  if (!g->row_vars || !g->row_pre || g->aff_on) return NULL;
  for (int d = 0; d <= ax; d++)
    if (!cpu_row_only(g, pos->c[d])) return NULL;
  if (!cpu_concat_leaves(g, (int)(ins - g->p->instr), ax, 0, leaf, at, loaded, &n) || n < 2) return NULL;
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
    const exec_instr *x = &g->p->instr[leaf[k]];
    rd_sb row = {0}; /* the part's offset of this row: its coordinates before and on ax */
    int64_t st = inner_stride;
    for (int d = ax; d >= 0 && loaded[k]; d--) {
      const char *c = d == ax && at[k] ? rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[d], at[k]) : pos->c[d];
      rd_sb_printf(&row, "%s(%s) * %" PRId64, row.n ? " + " : "", c, st);
      st *= x->shape[d];
    }
    const char *ptr = loaded[k] ? rd_fmt(&g->ar, "p%d + (%s)", leaf[k], row.s)
                                : rd_fmt(&g->ar, "(const %s *)0", ct);
    if (k < n - 1) rd_sb_printf(&sel, "%s < %" PRId64 " ? %s : ", pos->c[ax], at[k] + x->shape[ax], ptr);
    else rd_sb_puts(&sel, ptr);
    rd_sb_free(&row);
    if (loaded[k]) g->reads[leaf[k]] = 1;
  }
  char *b = cpu_tmp(g);
  rd_sb_printf(g->row_pre, "    const %s *%s = %s;\n", ct, b, sel.s);
  const char *load = rd_fmt(&g->ar, "%s[%s]", b, inner.n ? inner.s : "0");
  rd_sb_free(&inner);
  rd_sb_free(&sel);
  if (nload == n) return cpu_def(g, ins->dtype, load);
  char *t = cpu_tmp(g); /* some parts computed: the chain over those, where b is NULL */
  rd_sb_printf(g->body, "      %s %s;\n      if (%s) {\n      %s = %s;\n", ct, t, b, t, load);
  unsigned char *rc_state = g->rc_state;
  g->rc_state = NULL;
  int seen = 0;
  for (int k = 0; k < n; k++) {
    if (loaded[k]) continue;
    const exec_instr *x = &g->p->instr[leaf[k]];
    bool last = ++seen == n - nload;
    if (last) rd_sb_puts(g->body, "      } else {\n");
    else rd_sb_printf(g->body, "      } else if (%s < %" PRId64 ") {\n", pos->c[ax], at[k] + x->shape[ax]);
    cpu_concat_part(g, pos, ins->ndim, ax, leaf[k], at[k], t);
  }
  rd_sb_puts(g->body, "      }\n");
  g->rc_state = rc_state;
  return t;
}

/* concat: only the part an element lies in is computed: an if/else chain on the concat axis
 * (im2col's 9 slices computed for every element cost 9x). Values computed inside a branch are
 * scoped to it: the memo is rolled back after each branch, and row-scratch caching is off
 * inside branches (a store there would be conditional). */
static const char *cpu_value_concat(cpu_cg *g, const exec_instr *ins, cpu_pos *pos) {
  const int *in = ins->in;
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis);
  g->aff_fail |= g->aff_on; /* reads coordinates */
  cpu_pos_coords(g, pos);
  int nparts = 0;
  for (int k = 0; k < ins->nin; k++) nparts += g->p->instr[in[k]].shape[ax] != 0;
  if (!nparts) return rd_literal(&g->ar, &rd_dialect_c, ins->dtype, 0);
  const char *picked = cpu_value_concat_rowsel(g, ins, pos);
  if (picked) return picked;
  char *t = cpu_tmp(g);
  rd_sb_printf(g->body, "      %s %s;\n", cpu_ctype(ins->dtype), t);
  unsigned char *rc_state = g->rc_state;
  g->rc_state = NULL;
  int64_t off = 0;
  int seen = 0;
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *xk = &g->p->instr[in[k]];
    int64_t ext = xk->shape[ax];
    if (ext == 0) continue;
    seen++;
    if (seen == 1 && nparts > 1) rd_sb_printf(g->body, "      if (%s < %" PRId64 ") {\n", pos->c[ax], off + ext);
    else if (seen < nparts) rd_sb_printf(g->body, "      } else if (%s < %" PRId64 ") {\n", pos->c[ax], off + ext);
    else if (nparts > 1) rd_sb_puts(g->body, "      } else {\n");
    cpu_concat_part(g, pos, ins->ndim, ax, in[k], off, t);
    off += ext;
  }
  if (nparts > 1) rd_sb_puts(g->body, "      }\n");
  g->rc_state = rc_state;
  return t;
}

/* Elementwise ops (convert, select, unary, binary, compare) at pos; an op with no code here
 * fails the compile, naming it. */
static const char *cpu_value_elementwise(cpu_cg *g, int i, cpu_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const int *in = ins->in;
  const char *v = NULL;
  if (ins->op == IR_CONVERT) {
    v = rd_convert(&g->ar, &rd_dialect_c, g->p->instr[in[0]].dtype, ins->dtype, cpu_value(g, in[0], pos));
  } else if (ins->op == IR_SELECT) {
    const char *c = cpu_value(g, in[0], pos), *a = cpu_value(g, in[1], pos),
               *b = cpu_value(g, in[2], pos);
    v = rd_fmt(&g->ar, "%s ? %s : %s", c, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_UNARY) {
    v = rd_unary(&g->ar, &rd_dialect_c, true, ins, cpu_value(g, in[0], pos));
  } else if (ir_ops[ins->op].kind == IR_K_BINARY) {
    const char *a = cpu_value(g, in[0], pos), *b = cpu_value(g, in[1], pos);
    v = rd_binary(&g->ar, &rd_dialect_c, ins, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_COMPARE) {
    const char *a = cpu_value(g, in[0], pos), *b = cpu_value(g, in[1], pos);
    v = rd_compare(&g->ar, ins->op, a, b);
  }
  if (v) return cpu_def(g, ins->dtype, v);
  if (!g->failed)
    snprintf(g->fail_what, sizeof g->fail_what, ": no code for %s on %s (instruction %d)",
             ir_ops[ins->op].name, graft_dtype_name(ins->dtype), i);
  g->failed = 1;
  return "0";
}

/* An inlined instruction's value at pos: a leaf, index arithmetic into its operand, or
 * elementwise math over its operands' values. */
static const char *cpu_value_inlined(cpu_cg *g, int i, cpu_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const exec_instr *x = ins->nin ? &g->p->instr[ins->in[0]] : NULL;
  switch (ins->op) {
  case IR_CONSTANT: return rd_literal(&g->ar, &rd_dialect_c, ins->dtype, ins->attr.f);
  case IR_IOTA: {
    g->aff_fail |= g->aff_on; /* reads coordinates */
    cpu_pos_coords(g, &pos);
    const char *c = pos.c[IR_ATTR(ins->attr, AXIS, axis)];
    const char *v = dtype_is_float(ins->dtype) ? rd_fmt(&g->ar, "(%s)%s", cpu_ctype(ins->dtype), c)
                                               : rd_narrow(&g->ar, ins->dtype, c);
    return cpu_def(g, ins->dtype, v);
  }
  case IR_BROADCAST: case IR_RESHAPE: case IR_TRANSPOSE: case IR_SLICE:
    return cpu_value(g, ins->in[0], cpu_move_pos(g, ins, x, &pos));
  case IR_PAD: return cpu_value_pad(g, ins, x, &pos);
  case IR_CONCAT: return cpu_value_concat(g, ins, &pos);
  default: return cpu_value_elementwise(g, i, pos);
  }
}

/* Instruction i's value at pos, memoized per (instruction, position) within the loop body: a
 * row-scratch load, a load of a materialized buffer, or the inlined expression (stored to the
 * row scratch when the group caches it). */
const char *cpu_value(cpu_cg *g, int i, cpu_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const char *key = rd_fmt(&g->ar, "%d@%s", i, cpu_pos_key(g, &pos));
  uint64_t key_hash = cpu_memo_hash(key);
  const char *v = cpu_memo_find(g, key, key_hash);
  if (v) return v;
  bool row = g->rc_state && g->pl->role[i] == FUSE_INLINE && i != g->self && cpu_pos_is_row(g, &pos);
  if (row && g->rc_state[i] == 2)
    v = cpu_def(g, ins->dtype, rd_fmt(&g->ar, "rc%d[%s]", i, cpu_row_inner(g)));
  else if (g->pl->role[i] != FUSE_INLINE && i != g->self)
    v = cpu_load(g, i, &pos);
  else
    v = cpu_value_inlined(g, i, pos);
  if (row && g->rc_state[i] != 2) {
    g->rc_count[i]++;
    if (g->rc_state[i] == 1) {
      rd_sb_printf(g->body, "      rc%d[%s] = %s;\n", i, cpu_row_inner(g), v);
      g->rc_state[i] = 3;
    }
  }
  cpu_memo_put(g, key, key_hash, v);
  return v;
}
