/* Values at positions: an inlined instruction becomes an expression over its operands' values,
 * a movement op maps the position (index arithmetic, no copy), a materialized instruction is a
 * load. Values are memoized per (instruction, position) within a scope. The semantics follow
 * the reference kernels (integer wrap, float->int saturation, NaN-propagating max/min) as the
 * CPU generator does; the spelling that differs between languages lives in the dialect. */
#include "gpu_cg.h"
#include "../render/render.h"
#include "dtype.h"
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

const char *gpu_ctype(graft_dtype dt) { return rd_ctype(dt); }

void gpu_fail(gpu_cg *g, const char *fmt, ...) {
  if (g->failed) return;
  g->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->fail_what, sizeof g->fail_what, fmt, ap);
  va_end(ap);
}

const char *gpu_tmp(gpu_cg *g) { return rd_fmt(&g->ar, "t%d", g->ntmp++); }

const char *gpu_def(gpu_cg *g, graft_dtype dt, const char *expr) {
  const char *t = gpu_tmp(g);
  rd_sb_printf(g->body, "  const %s %s = %s;\n", gpu_ctype(dt), t, expr);
  return t;
}


void gpu_pos_coords(gpu_cg *g, gpu_pos *pos) {
  if (pos->has_c) return;
  int64_t st[GRAFT_MAX_DIMS];
  rd_strides(pos->nd, pos->shape, st);
  for (int d = 0; d < pos->nd; d++) {
    if (pos->shape[d] == 1) {
      pos->c[d] = "0";
    } else if (pos->nd == 1) {
      pos->c[d] = pos->lin;
    } else {
      const char *t = gpu_tmp(g);
      if (d == 0)
        rd_sb_printf(g->body, "  const gi_t %s = (%s) / %" PRId64 ";\n", t, pos->lin, st[d]);
      else
        rd_sb_printf(g->body, "  const gi_t %s = (%s) / %" PRId64 " %% %" PRId64 ";\n", t,
                      pos->lin, st[d], pos->shape[d]);
      pos->c[d] = t;
    }
  }
  pos->has_c = 1;
}

const char *gpu_pos_lin(gpu_cg *g, gpu_pos *pos) {
  if (!pos->lin) pos->lin = rd_lin(&g->ar, pos->nd, pos->shape, pos->c);
  return pos->lin;
}

static const char *gpu_pos_key(gpu_cg *g, const gpu_pos *pos) {
  if (!pos->has_c) return rd_fmt(&g->ar, "L%s", pos->lin);
  rd_sb e = {0};
  for (int d = 0; d < pos->nd; d++) rd_sb_printf(&e, "%s,", pos->c[d]);
  char *r = rd_fmt(&g->ar, "C%s", e.n ? e.s : "");
  rd_sb_free(&e);
  return r;
}

static const char *gpu_load(gpu_cg *g, int s, gpu_pos *pos) {
  const exec_instr *src = &g->p->instr[s];
  g->reads[s] = 1;
  const char *idx = gpu_pos_lin(g, pos);
  const char *e = src->dtype == GRAFT_BOOL ? rd_fmt(&g->ar, "(uint8_t)(p%d[%s] != 0)", s, idx)
                                           : rd_fmt(&g->ar, "p%d[%s]", s, idx);
  return gpu_def(g, src->dtype, e);
}


gpu_pos gpu_move_pos(gpu_cg *g, const exec_instr *ins, const exec_instr *x, gpu_pos *pos) {
  gpu_pos q = {.nd = x->ndim, .shape = x->shape};
  switch (ins->op) {
  case IR_BROADCAST: {
    int off = ins->ndim - x->ndim;
    if (!pos->has_c && x->numel == ins->numel) {
      q.lin = pos->lin;
    } else {
      if (x->numel != 1) gpu_pos_coords(g, pos);
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
    } else {
      q.lin = gpu_pos_lin(g, pos);
    }
    break;
  case IR_TRANSPOSE:
    gpu_pos_coords(g, pos);
    for (int d = 0; d < ins->ndim; d++) q.c[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)] = pos->c[d];
    q.has_c = 1;
    break;
  default: /* IR_SLICE */
    gpu_pos_coords(g, pos);
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

/* pad: the operand's element where pos maps onto one, else the fill (an if, so nothing out of
 * range is read). */
static const char *gpu_value_pad(gpu_cg *g, const exec_instr *ins, const exec_instr *x, gpu_pos *pos) {
  const char *fill = rd_literal(&g->ar, g->d->expr, ins->dtype, ins->attr.f);
  if (x->numel == 0) return fill;
  gpu_pos_coords(g, pos);
  gpu_pos q = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  rd_sb cond = {0};
  for (int d = 0; d < ins->ndim; d++) {
    int64_t lo = IR_ATTR_AT(ins->attr, PAD, lo, d), hi = IR_ATTR_AT(ins->attr, PAD, hi, d);
    int64_t step = IR_ATTR_AT(ins->attr, PAD, interior, d) + 1;
    if (lo == 0 && hi == 0 && step == 1) { q.c[d] = pos->c[d]; continue; }
    const char *r = rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[d], lo);
    if (step > 1) {
      rd_sb_printf(&cond, "%s%s >= 0 && %s %% %" PRId64 " == 0", cond.n ? " && " : "", r, r, step);
      r = rd_fmt(&g->ar, "(%s / %" PRId64 ")", r, step);
    }
    rd_sb_printf(&cond, "%s(uint64_t)%s < %" PRId64 "UL", cond.n ? " && " : "", r, x->shape[d]);
    q.c[d] = r;
  }
  if (!cond.n) {
    rd_sb_free(&cond);
    return gpu_value(g, ins->in[0], q);
  }
  const char *t = gpu_tmp(g);
  rd_sb_printf(g->body, "  %s %s = %s;\n  if (%s) {\n", gpu_ctype(ins->dtype), t, fill, cond.s);
  rd_sb_free(&cond);
  int nmemo = g->nmemo;
  const char *a = gpu_value(g, ins->in[0], q);
  rd_sb_printf(g->body, "  %s = %s;\n  }\n", t, a);
  g->nmemo = nmemo; /* values computed inside the branch are scoped to it */
  return t;
}

/* concat: only the part an element lies in is computed (an if/else chain on the axis). */
static const char *gpu_value_concat(gpu_cg *g, const exec_instr *ins, gpu_pos *pos) {
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis);
  gpu_pos_coords(g, pos);
  const char *t = gpu_tmp(g);
  rd_sb_printf(g->body, "  %s %s = 0;\n", gpu_ctype(ins->dtype), t);
  int64_t off = 0;
  const char *kw = "if";
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *xk = &g->p->instr[ins->in[k]];
    int64_t ext = xk->shape[ax];
    if (ext == 0) continue;
    rd_sb_printf(g->body, "  %s (%s < %" PRId64 ") {\n", kw, pos->c[ax], off + ext);
    kw = "else if";
    gpu_pos qk = {.nd = xk->ndim, .shape = xk->shape, .has_c = 1};
    for (int d = 0; d < ins->ndim; d++) qk.c[d] = pos->c[d];
    qk.c[ax] = off ? rd_fmt(&g->ar, "(%s - %" PRId64 ")", pos->c[ax], off) : pos->c[ax];
    int nmemo = g->nmemo;
    const char *a = gpu_value(g, ins->in[k], qk);
    rd_sb_printf(g->body, "  %s = %s;\n  }\n", t, a);
    g->nmemo = nmemo;
    off += ext;
  }
  return t;
}

static const char *gpu_value_elementwise(gpu_cg *g, int i, gpu_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const int *in = ins->in;
  const char *v = NULL;
  if (ins->op == IR_CONVERT) {
    v = rd_convert(&g->ar, g->d->expr, g->p->instr[in[0]].dtype, ins->dtype, gpu_value(g, in[0], pos));
  } else if (ins->op == IR_SELECT) {
    const char *c = gpu_value(g, in[0], pos), *a = gpu_value(g, in[1], pos),
               *b = gpu_value(g, in[2], pos);
    v = rd_fmt(&g->ar, "%s ? %s : %s", c, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_UNARY) {
    v = rd_unary(&g->ar, g->d->expr, g->caps->fp64, ins, gpu_value(g, in[0], pos));
  } else if (ir_ops[ins->op].kind == IR_K_BINARY) {
    const char *a = gpu_value(g, in[0], pos), *b = gpu_value(g, in[1], pos);
    v = rd_binary(&g->ar, g->d->expr, ins, a, b);
  } else if (ir_ops[ins->op].kind == IR_K_COMPARE) {
    const char *a = gpu_value(g, in[0], pos), *b = gpu_value(g, in[1], pos);
    v = rd_compare(&g->ar, ins->op, a, b);
  }
  if (v) return gpu_def(g, ins->dtype, v);
  gpu_fail(g, "no code for %s on %s (instruction %d)", ir_ops[ins->op].name,
           graft_dtype_name(ins->dtype), i);
  return "0";
}

static const char *gpu_value_inlined(gpu_cg *g, int i, gpu_pos pos) {
  const exec_instr *ins = &g->p->instr[i];
  const exec_instr *x = ins->nin ? &g->p->instr[ins->in[0]] : NULL;
  switch (ins->op) {
  case IR_CONSTANT: return rd_literal(&g->ar, g->d->expr, ins->dtype, ins->attr.f);
  case IR_IOTA: {
    gpu_pos_coords(g, &pos);
    const char *c = pos.c[IR_ATTR(ins->attr, AXIS, axis)];
    const char *v = dtype_is_float(ins->dtype) ? rd_fmt(&g->ar, "(%s)%s", gpu_ctype(ins->dtype), c)
                                               : rd_narrow(&g->ar, ins->dtype, c);
    return gpu_def(g, ins->dtype, v);
  }
  case IR_BROADCAST: case IR_RESHAPE: case IR_TRANSPOSE: case IR_SLICE:
    return gpu_value(g, ins->in[0], gpu_move_pos(g, ins, x, &pos));
  case IR_PAD: return gpu_value_pad(g, ins, x, &pos);
  case IR_CONCAT: return gpu_value_concat(g, ins, &pos);
  default: return gpu_value_elementwise(g, i, pos);
  }
}

const char *gpu_memo_find(const gpu_cg *g, const char *key) {
  for (int k = g->nmemo - 1; k >= 0; k--)
    if (!strcmp(g->memo[k].key, key)) return g->memo[k].val;
  return NULL;
}

void gpu_memo_put(gpu_cg *g, const char *key, const char *val) {
  if (g->nmemo == g->memo_cap) {
    int cap = g->memo_cap ? 2 * g->memo_cap : 256;
    gpu_memo *m = realloc(g->memo, sizeof *m * (size_t)cap);
    if (!m) {
      gpu_fail(g, "out of memory memoizing values");
      return;
    }
    g->memo = m;
    g->memo_cap = cap;
  }
  g->memo[g->nmemo++] = (gpu_memo){key, val};
}

const char *gpu_value(gpu_cg *g, int i, gpu_pos pos) {
  const char *key = rd_fmt(&g->ar, "%d@%s", i, gpu_pos_key(g, &pos));
  const char *v = gpu_memo_find(g, key);
  if (v) return v;
  if (g->pl->role[i] != FUSE_INLINE && i != g->self) v = gpu_load(g, i, &pos);
  else v = gpu_value_inlined(g, i, pos);
  gpu_memo_put(g, key, v);
  return v;
}
