/* Values at positions, for every C-like language (rd_gen.h): an inlined instruction becomes an
 * expression over its operands' values, a movement op maps the position (index arithmetic, no
 * copy), a materialized instruction is a load. Values are memoized per (instruction, position)
 * within a scope. The semantics follow the reference kernels (integer wrap, float->int
 * saturation, NaN-propagating max/min); spellings come from the expression dialect, and what a
 * generator renders its own way from its hooks. */
#include "rd_gen.h"
#include "dtype.h"
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *rd_tmp(rd_gen *g) { return rd_fmt(&g->ar, "t%d", g->ntmp++); }

const char *rd_def(rd_gen *g, graft_dtype dt, const char *expr) {
  const char *t = rd_tmp(g);
  rd_sb_printf(g->body, "%sconst %s %s = %s;\n", g->ind, rd_ctype(dt), t, expr);
  return t;
}

void rd_fail(rd_gen *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->fail_what, sizeof g->fail_what, fmt, ap);
  va_end(ap);
}

static void rd_coords_read(rd_gen *g) {
  if (g->h && g->h->coords_read) g->h->coords_read(g);
}

void rd_pos_coords(rd_gen *g, rd_pos *pos) {
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
      const char *t = rd_tmp(g);
      if (d == 0)
        rd_sb_printf(g->body, "%sconst %s %s = (%s) / %" PRId64 ";\n", g->ind, g->itype, t, pos->lin, st[d]);
      else
        rd_sb_printf(g->body, "%sconst %s %s = (%s) / %" PRId64 " %% %" PRId64 ";\n", g->ind, g->itype,
                     t, pos->lin, st[d], pos->shape[d]);
      pos->c[d] = t;
    }
  }
  pos->has_c = 1;
}

const char *rd_pos_lin(rd_gen *g, rd_pos *pos) {
  if (!pos->lin) pos->lin = rd_lin(&g->ar, pos->nd, pos->shape, pos->c);
  return pos->lin;
}

static const char *rd_pos_key(rd_gen *g, const rd_pos *pos) {
  const char *ext = g->h && g->h->key ? g->h->key(g, pos) : "";
  if (!pos->has_c) return rd_fmt(&g->ar, "L%s%s", pos->lin, ext);
  rd_sb e = {0};
  for (int d = 0; d < pos->nd; d++) rd_sb_printf(&e, "%s,", pos->c[d]);
  const char *r = rd_fmt(&g->ar, "C%s%s", e.n ? e.s : "", ext);
  rd_sb_free(&e);
  return r;
}

const char *rd_load_at(rd_gen *g, int s, const char *idx) {
  const exec_instr *src = &g->p->instr[s];
  g->reads[s] = 1;
  const char *e = src->dtype == GRAFT_BOOL ? rd_fmt(&g->ar, "(uint8_t)(p%d[%s] != 0)", s, idx)
                                           : rd_fmt(&g->ar, "p%d[%s]", s, idx);
  return rd_def(g, src->dtype, e);
}

rd_pos rd_move_pos(rd_gen *g, const exec_instr *ins, const exec_instr *x, rd_pos *pos) {
  rd_pos q = {.nd = x->ndim, .shape = x->shape};
  if (g->h && g->h->move) q.ap = g->h->move(g, ins, x, pos);
  switch (ins->op) {
  case IR_BROADCAST: {
    int off = ins->ndim - x->ndim;
    if (!pos->has_c && x->numel == ins->numel) {
      q.lin = pos->lin;
    } else if (x->numel == 1) { /* a scalar: no coordinates needed */
      for (int d = 0; d < x->ndim; d++) q.c[d] = "0";
      q.has_c = 1;
    } else {
      rd_pos_coords(g, pos);
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
    } else if (!(pos->has_c && g->h && g->h->reshape && g->h->reshape(g, ins, x, pos, &q))) {
      q.lin = rd_pos_lin(g, pos);
    }
    break;
  case IR_TRANSPOSE:
    rd_pos_coords(g, pos);
    for (int d = 0; d < ins->ndim; d++) q.c[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)] = pos->c[d];
    q.has_c = 1;
    break;
  default: /* IR_SLICE */
    rd_pos_coords(g, pos);
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

/* The branch form of pad: t = fill; if (cond) t = operand at q (its values scoped to the
 * branch). */
static const char *rd_value_pad_branch(rd_gen *g, const exec_instr *ins, rd_pos q,
                                       const char *fill, const char *cond) {
  const char *t = rd_tmp(g);
  rd_sb_printf(g->body, "%s%s %s = %s;\n%sif (%s) {\n", g->ind, rd_ctype(ins->dtype), t, fill, g->ind,
               cond);
  g->branch++;
  int nmemo = g->nmemo;
  const char *a = rd_value(g, ins->in[0], q);
  rd_sb_printf(g->body, "%s%s = %s;\n%s}\n", g->ind, t, a, g->ind);
  g->nmemo = nmemo;
  g->branch--;
  return t;
}

/* pad: the operand's element where pos maps onto one, else the fill. Rows at least
 * pad_branch_min long read the operand in a branch (nothing out of range is read; on the CPU gcc
 * turns it into masked vector loads and the unclamped index stays affine: a convolution's input
 * gradient, nine padded taps summed, ran 1.5-2.3x faster so on 8- and 16-wide rows); shorter
 * ones clamp the index and select (on 4-wide rows the scalar branches lost to that). */
static const char *rd_value_pad(rd_gen *g, const exec_instr *ins, const exec_instr *x, rd_pos *pos) {
  const char *fill = rd_literal(&g->ar, g->d, ins->dtype, ins->attr.f);
  bool branch = ins->ndim && ins->shape[ins->ndim - 1] >= g->pad_branch_min;
  rd_coords_read(g);
  if (x->numel == 0) return fill;
  rd_pos_coords(g, pos);
  rd_pos q = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  rd_sb cond = {0};
  for (int d = 0; d < ins->ndim; d++) {
    int64_t lo = IR_ATTR_AT(ins->attr, PAD, lo, d), hi = IR_ATTR_AT(ins->attr, PAD, hi, d);
    int64_t step = IR_ATTR_AT(ins->attr, PAD, interior, d) + 1;
    if (lo == 0 && hi == 0 && step == 1) { q.c[d] = pos->c[d]; continue; }
    const char *r = rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[d], lo);
    if (step > 1) { /* interior padding: only every step-th position holds an element */
      rd_sb_printf(&cond, "%s%s >= 0 && %s %% %" PRId64 " == 0", cond.n ? " && " : "", r, r, step);
      r = rd_fmt(&g->ar, "(%s / %" PRId64 ")", r, step);
    }
    rd_sb_printf(&cond, "%s(uint64_t)%s < %" PRId64 "%s", cond.n ? " && " : "", r, x->shape[d],
                 g->d->u64_suffix);
    if (!branch) { /* clamped into range: the load is safe, the select picks the fill */
      const char *t = rd_tmp(g);
      rd_sb_printf(g->body, "%sconst %s %s = gc_clamp(%s, %" PRId64 ");\n", g->ind, g->itype, t, r,
                   x->shape[d]);
      r = t;
    }
    q.c[d] = r;
  }
  if (branch && cond.n) {
    const char *t = rd_value_pad_branch(g, ins, q, fill, cond.s);
    rd_sb_free(&cond);
    return t;
  }
  const char *a = rd_value(g, ins->in[0], q);
  const char *v = cond.n ? rd_def(g, ins->dtype, rd_fmt(&g->ar, "(%s) ? %s : %s", cond.s, a, fill)) : a;
  rd_sb_free(&cond);
  return v;
}

void rd_concat_part(rd_gen *g, const rd_pos *pos, int nd, int ax, int part, int64_t off, const char *t) {
  const exec_instr *x = &g->p->instr[part];
  rd_pos q = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  for (int d = 0; d < nd; d++) q.c[d] = pos->c[d];
  q.c[ax] = off ? rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[ax], off) : pos->c[ax];
  int nmemo = g->nmemo;
  const char *a = rd_value(g, part, q);
  rd_sb_printf(g->body, "%s%s = %s;\n", g->ind, t, a);
  g->nmemo = nmemo;
}

/* concat: only the part an element lies in is computed: an if/else chain on the concat axis
 * (im2col's 9 slices computed for every element cost 9x), each part's values scoped to its
 * branch. */
static const char *rd_value_concat(rd_gen *g, const exec_instr *ins, rd_pos *pos) {
  const int *in = ins->in;
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis);
  rd_coords_read(g);
  rd_pos_coords(g, pos);
  int nparts = 0;
  for (int k = 0; k < ins->nin; k++) nparts += g->p->instr[in[k]].shape[ax] != 0;
  if (!nparts) return rd_literal(&g->ar, g->d, ins->dtype, 0);
  const char *picked = g->h && g->h->concat ? g->h->concat(g, ins, pos) : NULL;
  if (picked) return picked;
  const char *t = rd_tmp(g), *ind = g->ind;
  rd_sb_printf(g->body, "%s%s %s;\n", ind, rd_ctype(ins->dtype), t);
  g->branch++;
  int64_t off = 0;
  int seen = 0;
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *xk = &g->p->instr[in[k]];
    int64_t ext = xk->shape[ax];
    if (ext == 0) continue;
    seen++;
    if (seen == 1 && nparts > 1) rd_sb_printf(g->body, "%sif (%s < %" PRId64 ") {\n", ind, pos->c[ax], off + ext);
    else if (seen < nparts) rd_sb_printf(g->body, "%s} else if (%s < %" PRId64 ") {\n", ind, pos->c[ax], off + ext);
    else if (nparts > 1) rd_sb_printf(g->body, "%s} else {\n", ind);
    rd_concat_part(g, pos, ins->ndim, ax, in[k], off, t);
    off += ext;
  }
  if (nparts > 1) rd_sb_printf(g->body, "%s}\n", ind);
  g->branch--;
  return t;
}

/* Elementwise ops (convert, select, unary, binary, compare) at pos; an op with no code here
 * fails the kernel, naming it. */
static const char *rd_value_elementwise(rd_gen *g, int i, rd_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const int *in = ins->in;
  const char *v = NULL;
  if (ins->op == IR_CONVERT) {
    v = rd_convert(&g->ar, g->d, g->p->instr[in[0]].dtype, ins->dtype, rd_value(g, in[0], pos));
  } else if (ins->op == IR_SELECT) {
    const char *c = rd_value(g, in[0], pos), *a = rd_value(g, in[1], pos), *b = rd_value(g, in[2], pos);
    v = rd_fmt(&g->ar, "%s ? %s : %s", c, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_UNARY) {
    v = rd_unary(&g->ar, g->d, g->fp64, ins, rd_value(g, in[0], pos));
  } else if (ir_ops[ins->op].kind == IR_K_BINARY) {
    const char *a = rd_value(g, in[0], pos), *b = rd_value(g, in[1], pos);
    v = rd_binary(&g->ar, g->d, ins, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_COMPARE) {
    const char *a = rd_value(g, in[0], pos), *b = rd_value(g, in[1], pos);
    v = rd_compare(&g->ar, ins->op, a, b);
  }
  if (v) return rd_def(g, ins->dtype, v);
  rd_fail(g, "no code for %s on %s (instruction %d)", ir_ops[ins->op].name,
          graft_dtype_name(ins->dtype), i);
  return "0";
}

/* An inlined instruction's value at pos: a leaf, index arithmetic into its operand, or
 * elementwise math over its operands' values. */
static const char *rd_value_inlined(rd_gen *g, int i, rd_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const exec_instr *x = ins->nin ? &g->p->instr[ins->in[0]] : NULL;
  switch (ins->op) {
  case IR_CONSTANT: return rd_literal(&g->ar, g->d, ins->dtype, ins->attr.f);
  case IR_IOTA: {
    rd_coords_read(g);
    rd_pos_coords(g, &pos);
    const char *c = pos.c[IR_ATTR(ins->attr, AXIS, axis)];
    const char *v = dtype_is_float(ins->dtype) ? rd_fmt(&g->ar, "(%s)%s", rd_ctype(ins->dtype), c)
                                               : rd_narrow(&g->ar, ins->dtype, c);
    return rd_def(g, ins->dtype, v);
  }
  case IR_BROADCAST: case IR_RESHAPE: case IR_TRANSPOSE: case IR_SLICE:
    return rd_value(g, ins->in[0], rd_move_pos(g, ins, x, &pos));
  case IR_PAD: return rd_value_pad(g, ins, x, &pos);
  case IR_CONCAT: return rd_value_concat(g, ins, &pos);
  default: return rd_value_elementwise(g, i, pos);
  }
}

const char *rd_value_fresh(rd_gen *g, int i, rd_pos *pos) {
  if (g->pl->role[i] == FUSE_INLINE || i == g->self) return rd_value_inlined(g, i, *pos);
  if (g->h && g->h->load) return g->h->load(g, i, pos);
  return rd_load_at(g, i, rd_pos_lin(g, pos));
}

const char *rd_value(rd_gen *g, int i, rd_pos pos) {
  const char *key = rd_fmt(&g->ar, "%d@%s", i, rd_pos_key(g, &pos));
  uint64_t h = rd_memo_hash(key);
  const char *v = rd_memo_find(g, key, h);
  if (v) return v;
  v = g->h && g->h->fresh ? g->h->fresh(g, i, &pos) : rd_value_fresh(g, i, &pos);
  rd_memo_put(g, key, h, v);
  return v;
}
