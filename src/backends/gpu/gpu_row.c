/* The vector row form of CPU-type devices (caps->row_vec lanes; pocl). There a work-group per
 * output with a tree in local memory costs a barrier per step on every core (a 4096x4096
 * softmax took 190 ms against 15 on graft's CPU backend), and pocl vectorizes across work-items
 * only elementwise kernels. So a reduction whose reduced elements are contiguous rows becomes a
 * work-item per row that loads the row row_vec floats at a time (the dialect's vector type,
 * loads and stores) and a scalar tail for the rest; the kernels after it that read the same rows
 * join it (a "row group": softmax's max, sum and quotient, layer_norm's two sums, their per-row
 * scalars and the normalized output), so a row is read while it is still in the cache and every
 * value the group computes per row is read back by the work-item that wrote it.
 *
 * A member's value is built lane-wise from its inlined expression: loads of contiguous lanes,
 * values uniform over the lanes (a per-row scalar broadcast along the row: the scalar renderer's
 * expression at the first lane), and f32 elementwise math. What has no such form (another
 * movement, an op without a vector spelling, a read of a member outside this work-item's row)
 * ends the group before that member; a reduction with none keeps the existing forms. */
#include "gpu_cg.h"
#include "../cpu/cpu_internal.h" /* cpu_costs: the same cost rule as the CPU's row scratch */
#include "../render/render.h"
#include "dtype.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const char *v;
  bool vec; /* differs between lanes (a gc_vf); else a scalar equal in every lane */
} gpu_vval;

/* The row length of reduction i when it is one the row form computes (f32 sum, max or min)
 * and its reduced elements are contiguous (every non-unit reduced dim after every non-unit kept
 * one: operand element e of output r is at r * len + e); 0 otherwise. */
static int64_t gpu_row_len(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  if ((ins->op != IR_REDUCE_SUM && ins->op != IR_REDUCE_MAX && ins->op != IR_REDUCE_MIN) ||
      ins->dtype != GRAFT_F32 || p->instr[ins->in[0]].dtype != GRAFT_F32)
    return 0;
  const exec_instr *x = &p->instr[ins->in[0]];
  int64_t mask = IR_ATTR(ins->attr, REDUCE, mask), len = 1;
  bool reduced = false;
  for (int d = 0; d < x->ndim; d++) {
    if (x->shape[d] == 1) continue;
    if (mask >> d & 1) reduced = true, len *= x->shape[d];
    else if (reduced) return 0;
  }
  return x->numel && len > 1 ? len : 0; /* a run of one is no row */
}

static gpu_vval gpu_vfail(gpu_cg *g) {
  g->vfail = true;
  return (gpu_vval){"0", false};
}

static const char *gpu_vdef(gpu_cg *g, const char *expr) {
  const char *t = rd_tmp(&g->r);
  rd_sb_printf(g->r.body, "  const gc_vf %s = %s;\n", t, expr);
  return t;
}

static const char *gpu_as_vec(gpu_cg *g, gpu_vval v) {
  return v.vec ? v.v : rd_fmt(&g->r.ar, "(gc_vf)(%s)", v.v);
}

static bool gpu_is_elementwise(ir_op op) {
  int k = ir_ops[op].kind;
  return k == IR_K_UNARY || k == IR_K_BINARY || k == IR_K_COMPARE || op == IR_CONVERT ||
         op == IR_SELECT;
}

/* Whether the scalar value of i, read at a position whose linear index is this work-item's row
 * (row: numel == rows) or anywhere (!row), reads no member of the group but its own row's. */
static bool gpu_row_safe(gpu_cg *g, int i, bool row) {
  unsigned char *memo = &g->safe[2 * i + row];
  if (*memo) return *memo == 1;
  const exec_instr *ins = &g->r.p->instr[i];
  bool ok = true;
  if (g->r.pl->role[i] != FUSE_INLINE && i != g->r.self) {
    ok = !g->member[i] || (row && ins->numel == g->rows);
  } else if (ins->op != IR_CONSTANT && ins->op != IR_IOTA) {
    /* elementwise ops and reshapes keep the linear index, a broadcast adding unit dims too */
    bool keep = row && (gpu_is_elementwise(ins->op) || ins->op == IR_RESHAPE ||
                        (ins->op == IR_BROADCAST && g->r.p->instr[ins->in[0]].numel == ins->numel));
    for (int k = 0; k < ins->nin && ok; k++) ok = gpu_row_safe(g, ins->in[k], keep);
  }
  *memo = ok ? 1 : 2;
  return ok;
}

static gpu_vval gpu_vvalue(gpu_cg *g, int i, rd_pos pos, bool row);

/* The lanes of slot s at linear index lin. */
static const char *gpu_vload(gpu_cg *g, int s, const char *lin) {
  return gpu_vdef(g, rd_fmt(&g->r.ar, g->d->vload, rd_fmt(&g->r.ar, "p%d + (%s)", s, lin)));
}

/* Inlined value i's lanes v were computed at this row's elements: counted (a counting render),
 * and stored when they are the row scratch's and this is their first computation. */
static void gpu_row_use(gpu_cg *g, int i, const char *v) {
  if (g->use_first) {
    if (g->use_first[i] < 0) g->use_first[i] = g->cur;
    g->use_last[i] = g->cur;
  }
  if (i != g->vc || g->vc_state != 1) return;
  rd_sb_printf(g->r.body, "  %s;\n", rd_fmt(&g->r.ar, g->d->vstore, v,
                                             rd_fmt(&g->r.ar, "p%d + (%s)", g->vc_buf, g->rowlin)));
  g->vc_state = 2;
}

/* A broadcast along the row (the operand has unit dims there) is uniform over the lanes; one
 * along other dims only keeps the lanes contiguous in the operand. row: the operand's lanes are
 * in this work-item's row when the dims before the row are not broadcast. */
static gpu_vval gpu_vbroadcast(gpu_cg *g, int i, rd_pos pos, bool row) {
  const exec_instr *ins = &g->r.p->instr[i], *x = &g->r.p->instr[ins->in[0]];
  int nd = ins->ndim, off = nd - x->ndim, t = nd;
  for (int64_t len = 1; t > 0 && len < g->rlen;) len *= ins->shape[--t];
  int64_t inner = 1;
  for (int d = t; d < nd; d++) inner *= ins->shape[d];
  if (inner != g->rlen) return gpu_vfail(g); /* the row is not a run of trailing dims */
  bool same = true, unit = true, outer = true;
  for (int d = 0; d < nd; d++) {
    int64_t xs = d - off >= 0 ? x->shape[d - off] : 1;
    if (xs != ins->shape[d]) {
      if (d < t) outer = false;
      else same = false;
    }
    if (d >= t && xs != 1) unit = false;
  }
  if (unit) {
    if (!gpu_row_safe(g, ins->in[0], row && outer)) return gpu_vfail(g);
    return (gpu_vval){rd_value(&g->r, i, pos), false};
  }
  if (!same) return gpu_vfail(g);
  rd_pos q = rd_move_pos(&g->r, ins, x, &pos);
  return gpu_vvalue(g, ins->in[0], q, row && outer);
}

/* f32 math lane-wise; uniform operands give the scalar renderer's value. */
static gpu_vval gpu_vmath(gpu_cg *g, int i, rd_pos pos, bool row) {
  const exec_instr *ins = &g->r.p->instr[i];
  ir_op op = ins->op;
  bool unary = op == IR_NEG || op == IR_ABS || op == IR_EXP;
  bool binary = op == IR_ADD || op == IR_SUB || op == IR_MUL || op == IR_DIV || op == IR_MAX ||
                op == IR_MIN;
  if (!unary && !binary) return gpu_vfail(g);
  gpu_vval a = gpu_vvalue(g, ins->in[0], pos, row), b = {0};
  if (binary) b = gpu_vvalue(g, ins->in[1], pos, row);
  if (g->vfail) return a;
  if (!a.vec && !b.vec) /* the operands' reads were checked where they became uniform */
    return (gpu_vval){rd_value(&g->r, i, pos), false};
  const char *va = gpu_as_vec(g, a), *e;
  if (op == IR_NEG) e = rd_fmt(&g->r.ar, "-%s", va);
  else if (op == IR_ABS) e = rd_fmt(&g->r.ar, "fabs(%s)", va);
  else if (op == IR_EXP) e = rd_fmt(&g->r.ar, "gm_expf_v(%s)", va);
  else e = rd_float_binary(&g->r.ar, op, va, gpu_as_vec(g, b)); /* valid on vectors */
  return (gpu_vval){gpu_vdef(g, e), true};
}

/* Instruction i (f32) over the lanes at pos and the next width - 1 elements of its shape, all
 * in one row; row: that row is this work-item's (a member written here may be read there). */
static gpu_vval gpu_vvalue(gpu_cg *g, int i, rd_pos pos, bool row) {
  const exec_instr *ins = &g->r.p->instr[i];
  if (g->vfail || ins->dtype != GRAFT_F32) return gpu_vfail(g);
  const char *lin0 = rd_pos_lin(&g->r, &pos);
  const char *key = rd_fmt(&g->r.ar, "V%d@%s", i, lin0);
  uint64_t key_hash = rd_memo_hash(key);
  const char *v = rd_memo_find(&g->r, key, key_hash);
  if (v) return (gpu_vval){v, true};
  /* an inlined value at this row's elements: the row scratch may keep it */
  bool inrow = row && g->r.pl->role[i] == FUSE_INLINE && i != g->r.self &&
               ins->numel == g->rows * g->rlen && !strcmp(lin0, g->rowlin);
  gpu_vval r;
  if (inrow && i == g->vc && g->vc_state == 3) {
    r = (gpu_vval){gpu_vload(g, g->vc_buf, lin0), true};
  } else if (g->r.pl->role[i] != FUSE_INLINE && i != g->r.self) {
    if (g->member[i] && !(row && ins->numel == g->rows * g->rlen)) return gpu_vfail(g);
    g->r.reads[i] = 1;
    r = (gpu_vval){gpu_vload(g, i, lin0), true};
  } else if (ins->op == IR_CONSTANT) {
    r = (gpu_vval){rd_value(&g->r, i, pos), false};
  } else if (ins->op == IR_RESHAPE) { /* the linear index is kept */
    r = gpu_vvalue(g, ins->in[0], rd_move_pos(&g->r, ins, &g->r.p->instr[ins->in[0]], &pos), row);
  } else if (ins->op == IR_BROADCAST) {
    r = gpu_vbroadcast(g, i, pos, row);
  } else {
    r = gpu_vmath(g, i, pos, row);
  }
  if (r.vec && !g->vfail) {
    rd_memo_put(&g->r, key, key_hash, r.v);
    if (inrow) gpu_row_use(g, i, r.v);
  }
  return r;
}

/* Element e of this work-item's row of instruction i: the linear index, and coordinates when
 * the row is its last dim (then a per-row value is read at p[gid], not p[(gid * len + e) /
 * len], and the compiler hoists it out of the loop). */
static rd_pos gpu_row_pos(gpu_cg *g, int i) {
  const exec_instr *x = &g->r.p->instr[i];
  rd_pos pos = {.nd = x->ndim, .shape = x->shape, .lin = g->rowlin};
  if (!x->ndim || x->shape[x->ndim - 1] != g->rlen) return pos;
  int64_t st = 1, rows = g->rows;
  for (int d = x->ndim - 2; d >= 0; st *= x->shape[d--]) {
    bool outer = st * x->shape[d] == rows; /* gid < rows: no remainder */
    if (x->shape[d] == 1) pos.c[d] = "0";
    else if (st == 1) pos.c[d] = outer ? "gid" : rd_fmt(&g->r.ar, "(gid %% %" PRId64 ")", x->shape[d]);
    else if (outer) pos.c[d] = rd_fmt(&g->r.ar, "(gid / %" PRId64 ")", st);
    else pos.c[d] = rd_fmt(&g->r.ar, "(gid / %" PRId64 " %% %" PRId64 ")", st, x->shape[d]);
  }
  pos.c[x->ndim - 1] = "e";
  pos.has_c = 1;
  return pos;
}

/* Whether kernel s is an elementwise member over the rows (vector stores to its rows). */
static bool gpu_row_is_map(const gpu_cg *g, int s) {
  const exec_instr *ins = &g->r.p->instr[s];
  return g->r.pl->role[s] == FUSE_KERNEL && ins->dtype == GRAFT_F32 && ins->numel == g->rows * g->rlen;
}

/* A member being rendered: its slot and, for a reduction, its accumulators. */
typedef struct {
  int s;
  const char *acc, *nf; /* a reduction's accumulators */
  rd_red r;
  bool dlanes;          /* sum lanes in double */
} gpu_rowm;

/* The vector loop over the row's whole lane groups (emitted even when there is none: building
 * it checks that src has a row form, which the scalar tail relies on): a reduction's lanes
 * accumulate src, an elementwise member stores itself (src == m->s). */
static void gpu_row_lanes(gpu_cg *g, const gpu_rowm *m, int64_t wlen, int src) {
  const int64_t len = g->rlen;
  rd_sb_printf(g->r.body, "  for (; e < %" PRId64 "; e += GC_VW) {\n", wlen);
  g->r.nmemo = 0;
  gpu_vval v = gpu_vvalue(g, src, gpu_row_pos(g, src), true);
  const char *vv = gpu_as_vec(g, v);
  const exec_instr *ins = &g->r.p->instr[m->s];
  if (ins->op == IR_REDUCE_SUM)
    rd_sb_printf(g->r.body, "  va += %s;\n", m->dlanes ? rd_fmt(&g->r.ar, "gc_vf2d(%s)", vv) : vv);
  else if (ir_ops[ins->op].kind == IR_K_REDUCE) /* a NaN sticks in its lane */
    rd_sb_printf(g->r.body, "  va = (%s %s va || %s != %s) ? %s : va;\n", vv,
                  ins->op == IR_REDUCE_MAX ? ">" : "<", vv, vv, vv);
  else
    rd_sb_printf(g->r.body, "  %s;\n", rd_fmt(&g->r.ar, g->d->vstore, vv,
                                              rd_fmt(&g->r.ar, "p%d + gid * %" PRId64 " + e", m->s, len)));
  rd_sb_puts(g->r.body, "  }\n");
  g->r.nmemo = 0;
}

/* The scalar loop over the rest of the row, from where the lanes stopped. */
static void gpu_row_tail(gpu_cg *g, const gpu_rowm *m, int src) {
  const int64_t len = g->rlen;
  const exec_instr *ins = &g->r.p->instr[m->s];
  rd_sb_printf(g->r.body, "  for (; e < %" PRId64 "; e++) {\n", len);
  const char *v = rd_value(&g->r, src, gpu_row_pos(g, src));
  if (ir_ops[ins->op].kind == IR_K_REDUCE) rd_red_step(g->r.body, "  ", &m->r, m->acc, m->nf, v);
  else rd_sb_printf(g->r.body, "  p%d[gid * %" PRId64 " + e] = %s;\n", m->s, len, v);
  rd_sb_puts(g->r.body, "  }\n");
  g->r.nmemo = 0;
}

/* A reduction over the row: lanes, then the lanes folded in order with the tail (a sum in
 * double where the device has it; f32 lanes up to 8192 elements as the CPU backend's). */
static void gpu_row_reduce(gpu_cg *g, int s, int64_t wlen) {
  const exec_instr *ins = &g->r.p->instr[s];
  gpu_rowm m = {.s = s, .acc = "acc", .nf = "nf", .r = rd_reduce(g->d->expr, g->caps->fp64, ins)};
  bool sum = ins->op == IR_REDUCE_SUM;
  m.dlanes = sum && g->caps->fp64 && g->rlen > 8192;
  const char *lt = m.dlanes ? "gc_vd" : "gc_vf", *st = m.dlanes ? "double" : "float";
  g->r.self = -1;
  rd_sb_printf(g->r.body, "  { /* %%%d: %s over the row */\n  %s va = (%s)(%s); gi_t e = 0;\n", s,
                ir_ops[ins->op].name, lt, lt, sum ? "0" : m.r.init);
  gpu_row_lanes(g, &m, wlen, ins->in[0]);
  rd_sb_printf(g->r.body, "  %s acc = %s; int nf = 0; (void)nf;\n", m.r.acc_t, m.r.init);
  if (wlen) { /* a row shorter than the lanes has only the tail */
    rd_sb_printf(g->r.body, "  %s gl[GC_VW]; %s;\n  for (int l = 0; l < GC_VW; l++) {\n", st,
                  rd_fmt(&g->r.ar, g->d->vstore, "va", "gl"));
    rd_red_step(g->r.body, "  ", &m.r, "acc", "nf", "gl[l]");
    rd_sb_puts(g->r.body, "  }\n");
  }
  gpu_row_tail(g, &m, ins->in[0]);
  rd_sb_printf(g->r.body, "  p%d[gid] = %s;\n  }\n", s, rd_red_final(&g->r.ar, g->d->expr, ins, &m.r, "acc", "nf"));
}

/* An elementwise kernel over the rows: lanes stored, then the tail. */
static void gpu_row_map(gpu_cg *g, int s, int64_t wlen) {
  gpu_rowm m = {.s = s};
  g->r.self = s;
  rd_sb_printf(g->r.body, "  { /* %%%d over the row */\n  gi_t e = 0;\n", s);
  gpu_row_lanes(g, &m, wlen, s);
  gpu_row_tail(g, &m, s);
  rd_sb_puts(g->r.body, "  }\n");
}

/* A kernel of one value per row. */
static void gpu_row_scalar(gpu_cg *g, int s) {
  const exec_instr *ins = &g->r.p->instr[s];
  g->r.self = s;
  g->r.nmemo = 0;
  if (!gpu_row_safe(g, s, true)) {
    g->vfail = true;
    return;
  }
  rd_pos pos = {.nd = ins->ndim, .shape = ins->shape, .lin = "gid"};
  const char *v = rd_value(&g->r, s, pos);
  rd_sb_printf(g->r.body, "  p%d[gid] = %s;\n", s, v);
  g->r.nmemo = 0;
}

/* Appends member s to the group's body when it has a row form here; false: nothing appended
 * (and nothing counted). */
static bool gpu_row_member(gpu_cg *g, int s, rd_sb *body) {
  const exec_program *p = g->r.p;
  const exec_instr *ins = &p->instr[s];
  int role = g->r.pl->role[s];
  int64_t wlen = g->rlen / g->caps->row_vec * g->caps->row_vec;
  size_t nr = (size_t)p->ninstr + 1, ub = g->use_first ? sizeof(int) * nr : 0;
  unsigned char *saved = malloc(nr + 2 * ub); /* what a member that fails leaves as it was */
  if (!saved) return false;
  memcpy(saved, g->r.reads, nr);
  if (ub) {
    memcpy(saved + nr, g->use_first, ub);
    memcpy(saved + nr + ub, g->use_last, ub);
  }
  memset(g->safe, 0, 2 * nr);
  rd_sb mb = {0};
  g->r.body = &mb;
  g->vfail = false;
  g->cur = s;
  if (role == FUSE_REDUCE && ins->numel == g->rows && gpu_row_len(p, s) == g->rlen)
    gpu_row_reduce(g, s, wlen);
  else if (gpu_row_is_map(g, s))
    gpu_row_map(g, s, wlen);
  else if (role == FUSE_KERNEL && ins->numel == g->rows)
    gpu_row_scalar(g, s);
  else
    g->vfail = true;
  bool ok = !g->vfail && !mb.oom;
  if (ok) {
    rd_sb_puts(body, mb.s ? mb.s : "");
    g->member[s] = 1;
    if (g->vc_state == 2) g->vc_state = 3; /* the members after it load the scratch */
    if (s == g->vc_buf) g->vc_state = 0;   /* until this one, which overwrote it */
  } else {
    memcpy(g->r.reads, saved, nr);
    if (ub) {
      memcpy(g->use_first, saved + nr, ub);
      memcpy(g->use_last, saved + nr + ub, ub);
    }
  }
  rd_sb_free(&mb);
  free(saved);
  g->r.body = body;
  g->vfail = false;
  return ok;
}

/* Renders the group into body: reduction s, then the kernel and reduction steps after it while
 * each has a row form over the same rows (a library call or a fallback between them ends it);
 * false when s has none. */
static bool gpu_rows_render(gpu_cg *g, int s, rd_sb *body) {
  const exec_program *p = g->r.p;
  memset(g->member, 0, (size_t)p->ninstr + 1);
  gpu_scope_begin(g, body);
  if (!gpu_row_member(g, s, body)) return false;
  for (int j = s + 1; j < p->ninstr; j++) {
    int role = g->r.pl->role[j];
    if (role == FUSE_INLINE || role == FUSE_DEAD || role == FUSE_PARAM) continue;
    if ((role != FUSE_KERNEL && role != FUSE_REDUCE) || !gpu_row_member(g, j, body)) break;
  }
  return true;
}

/* The row scratch of the group just rendered with counting, as the CPU backend's row scratch:
 * the last inlined value (the widest expression) whose lanes two members or more compute and
 * whose cost (cpu_costs >= 8: an exp, two divisions) is worth a store and loads instead, kept in
 * the output rows of the last elementwise member up to its last use and after its first (on
 * pocl softmax's exp is then computed once a row, not twice: 10.3 -> 7.0 ms at 4096x4096). */
static bool gpu_row_pick(gpu_cg *g) {
  const exec_program *p = g->r.p;
  int *cost = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  if (!cost) return false;
  cpu_costs(p, g->r.pl, cost);
  g->vc = g->vc_buf = -1;
  for (int i = p->ninstr - 1; i >= 0 && g->vc < 0; i--) {
    if (g->use_first[i] < 0 || g->use_first[i] == g->use_last[i] || cost[i] < 8) continue;
    for (int m = g->use_last[i]; m > g->use_first[i] && g->vc < 0; m--)
      if (g->member[m] && gpu_row_is_map(g, m)) g->vc = i, g->vc_buf = m;
  }
  free(cost);
  return g->vc >= 0;
}

/* Renders the group again with the row scratch g->vc; keeps the first rendering (body) when
 * this one has other members (it should not: a scratch load stands for a value that had a row
 * form). */
static void gpu_rows_scratch(gpu_cg *g, int s, rd_sb *body) {
  size_t nr = (size_t)g->r.p->ninstr + 1;
  unsigned char *keep = malloc(2 * nr);
  int *uf = g->use_first;
  if (keep) {
    memcpy(keep, g->member, nr);
    memcpy(keep + nr, g->r.reads, nr);
    g->use_first = NULL;
    g->vc_state = 1;
    rd_sb b2 = {0};
    bool ok = gpu_rows_render(g, s, &b2) && !b2.oom && !memcmp(keep, g->member, nr) &&
              g->vc_state == 0;
    rd_sb_free(ok ? body : &b2);
    if (ok) *body = b2;
    else memcpy(g->member, keep, nr), memcpy(g->r.reads, keep + nr, nr);
  }
  free(keep);
  g->use_first = uf;
  g->vc = g->vc_buf = -1;
  g->vc_state = 0;
}

bool gpu_kernel_rows(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st, unsigned char *done) {
  const exec_program *p = g->r.p;
  size_t nr = (size_t)p->ninstr + 1;
  if (!g->caps->row_vec || !g->d->vprelude || !(g->rlen = gpu_row_len(p, s))) return false;
  g->rows = p->instr[s].numel;
  g->rowlin = rd_fmt(&g->r.ar, "gid * %" PRId64 " + e", g->rlen);
  g->member = calloc(nr, 1);
  g->safe = calloc(2 * nr, 1);
  g->use_first = malloc(sizeof(int) * nr);
  g->use_last = malloc(sizeof(int) * nr);
  g->vc = g->vc_buf = -1;
  g->vc_state = 0;
  rd_sb body = {0};
  bool ok = g->member && g->safe && g->use_first && g->use_last;
  if (ok) {
    memset(g->use_first, 0xff, sizeof(int) * nr); /* -1: no use */
    ok = gpu_rows_render(g, s, &body);
  }
  if (ok && g->rlen >= g->caps->row_vec && gpu_row_pick(g)) gpu_rows_scratch(g, s, &body);
  if (ok) {
    for (int j = 0; j < p->ninstr; j++) done[j] |= g->member[j];
    gpu_signature(g, out, s, kernel, st);
    gpu_kernel_close(g, out, &body, g->rows, st);
  } else {
    rd_sb_free(&body);
  }
  free(g->member);
  free(g->safe);
  free(g->use_first);
  free(g->use_last);
  g->member = NULL;
  g->safe = NULL;
  g->use_first = g->use_last = NULL;
  return ok;
}
