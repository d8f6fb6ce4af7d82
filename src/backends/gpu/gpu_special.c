/* Kernels for the ops the CPU runs as host kernels: conv2d (direct: a work-item per output
 * element looping over its window; every attribute: stride, padding, dilation, input dilation,
 * groups), reduce_window (max/sum pooling), max_pool_grad and gather (an index out of range is recorded in the
 * program's status buffer and reported as the reference kernel does). Operands are whole
 * buffers (the plan materializes them). */
#include "gpu_cg.h"
#include "dtype.h"
#include <inttypes.h>

/* max_pool_grad with windows over the last two dims only (pooling as the front-ends make it). */
static bool gpu_pool_grad_supported(const exec_instr *ins) {
  for (int d = 0; d + 2 < ins->ndim; d++)
    if (IR_ATTR_AT(ins->attr, WINDOW, window, d) != 1 || IR_ATTR_AT(ins->attr, WINDOW, stride, d) != 1 ||
        IR_ATTR_AT(ins->attr, WINDOW, pad_lo, d) != 0)
      return false;
  return ins->ndim >= 2;
}

bool gpu_special_supported(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  switch (ins->op) {
  case IR_CONV2D: return dtype_is_float(ins->dtype) && ins->ndim == 4;
  case IR_REDUCE_WINDOW: return true;
  case IR_MAX_POOL_GRAD: return gpu_pool_grad_supported(ins);
  case IR_GATHER: return true;
  default: return false;
  }
}

/* "c0..c<nd-1>" := the coordinates of gid over shape (the outermost needs no modulo). */
static void gpu_unravel(rd_sb *b, const char *v, const char *prefix, int nd, const int64_t *shape) {
  int64_t st = 1;
  for (int d = nd - 1; d >= 0; d--) {
    if (d == 0) rd_sb_printf(b, "  const gi_t %s%d = %s / %" PRId64 ";\n", prefix, d, v, st);
    else rd_sb_printf(b, "  const gi_t %s%d = %s / %" PRId64 " %% %" PRId64 ";\n", prefix, d, v, st,
                       shape[d]);
    st *= shape[d];
  }
}

static const char *gpu_load_expr(gpu_cg *g, int s, const char *idx) {
  g->r.reads[s] = 1;
  return rd_fmt(&g->r.ar, "p%d[%s]", s, idx);
}

/* One spatial tap: "p" := o * stride + k * dil - lo within the input dilated by ld; skip it when
 * it falls on padding or on an inserted zero. */
static void gpu_conv_tap(rd_sb *b, const char *v, const char *o, const char *k, int64_t st,
                         int64_t dil, int64_t lo, int64_t ld, int64_t size) {
  if (ld < 1) ld = 1;
  int64_t dilated = size > 0 ? (size - 1) * ld + 1 : 0;
  rd_sb_printf(b, "  const gi_t p%s = %s * %" PRId64 " + %s * %" PRId64 " - %" PRId64 ";\n", v, o, st,
                k, dil, lo);
  rd_sb_printf(b, "  if (p%s < 0 || p%s >= %" PRId64, v, v, dilated);
  if (ld > 1) rd_sb_printf(b, " || p%s %% %" PRId64, v, ld);
  rd_sb_printf(b, ") continue;\n  const gi_t %s = p%s / %" PRId64 ";\n", v, v, ld);
}

static void gpu_special_conv(gpu_cg *g, int s, rd_sb *b) {
  const exec_instr *ins = &g->r.p->instr[s];
  int xs = ins->in[0], ws = ins->in[1];
  const exec_instr *x = &g->r.p->instr[xs], *w = &g->r.p->instr[ws];
  const ir_attrs *a = &ins->attr;
  int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3];
  int64_t O = w->shape[0], CG = w->shape[1], KH = w->shape[2], KW = w->shape[3];
  int64_t groups = IR_ATTR(*a, CONV2D, groups) > 0 ? IR_ATTR(*a, CONV2D, groups) : 1;
  int64_t OG = O / groups > 0 ? O / groups : 1;
  const char *T = rd_ctype(ins->dtype);
  gpu_unravel(b, "gid", "c", 4, ins->shape);
  rd_sb_printf(b, "  %s acc = 0;\n  const gi_t grp = c1 / %" PRId64 ";\n", T, OG);
  rd_sb_printf(b, "  for (gi_t cg = 0; cg < %" PRId64 "; cg++)\n  for (gi_t kh = 0; kh < %" PRId64
                "; kh++) {\n", CG, KH);
  gpu_conv_tap(b, "ih", "c2", "kh", IR_ATTR_AT(*a, CONV2D, stride, 0), IR_ATTR_AT(*a, CONV2D, dilation, 0),
               IR_ATTR_AT(*a, CONV2D, pad_lo, 0), IR_ATTR_AT(*a, CONV2D, lhs_dilation, 0), H);
  rd_sb_printf(b, "  for (gi_t kw = 0; kw < %" PRId64 "; kw++) {\n", KW);
  gpu_conv_tap(b, "iw", "c3", "kw", IR_ATTR_AT(*a, CONV2D, stride, 1), IR_ATTR_AT(*a, CONV2D, dilation, 1),
               IR_ATTR_AT(*a, CONV2D, pad_lo, 1), IR_ATTR_AT(*a, CONV2D, lhs_dilation, 1), W);
  const char *xi = rd_fmt(&g->r.ar, "((c0 * %" PRId64 " + grp * %" PRId64 " + cg) * %" PRId64
                           " + ih) * %" PRId64 " + iw", C, CG, H, W);
  const char *wi = rd_fmt(&g->r.ar, "((c1 * %" PRId64 " + cg) * %" PRId64 " + kh) * %" PRId64 " + kw",
                           CG, KH, KW);
  rd_sb_printf(b, "  acc += (%s)%s * (%s)%s;\n  }\n  }\n", T, gpu_load_expr(g, xs, xi), T,
                gpu_load_expr(g, ws, wi));
  rd_sb_printf(b, "  p%d[gid] = acc;\n", s);
}

static void gpu_special_window(gpu_cg *g, int s, rd_sb *b) {
  const exec_instr *ins = &g->r.p->instr[s];
  int xs = ins->in[0];
  const exec_instr *x = &g->r.p->instr[xs];
  exec_instr red = *ins; /* the accumulator of the equivalent reduction */
  red.op = IR_ATTR(ins->attr, WINDOW, kind) == 0 ? IR_REDUCE_MAX : IR_REDUCE_SUM;
  rd_red r = rd_reduce(g->d->expr, g->caps->fp64, &red);
  gpu_unravel(b, "gid", "c", x->ndim, ins->shape);
  rd_sb_printf(b, "  %s acc = %s; int nf = 0; (void)nf;\n", r.acc_t, r.init);
  rd_sb e = {0};
  int64_t st = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    int64_t win = IR_ATTR_AT(ins->attr, WINDOW, window, d);
    rd_sb_printf(b, "  for (gi_t w%d = 0; w%d < %" PRId64 "; w%d++) {\n", d, d, win, d);
    rd_sb_printf(b, "  const gi_t q%d = c%d * %" PRId64 " + w%d - %" PRId64 ";\n", d, d,
                  IR_ATTR_AT(ins->attr, WINDOW, stride, d), d, IR_ATTR_AT(ins->attr, WINDOW, pad_lo, d));
    rd_sb_printf(b, "  if (q%d < 0 || q%d >= %" PRId64 ") continue;\n", d, d, x->shape[d]);
    rd_sb_printf(&e, "%sq%d * %" PRId64, e.n ? " + " : "", d, st);
    st *= x->shape[d];
  }
  const char *v = rd_def(&g->r, x->dtype, gpu_load_expr(g, xs, e.s ? e.s : "0"));
  rd_sb_free(&e);
  rd_red_step(b, "  ", &r, "acc", "nf", v);
  for (int d = 0; d < x->ndim; d++) rd_sb_puts(b, "  }\n");
  rd_sb_printf(b, "  p%d[gid] = %s;\n", s, rd_red_final(&g->r.ar, g->d->expr, &red, &r, "acc", "nf"));
}

/* The windows along one dim that hold coordinate c: o * S - P <= c < o * S - P + K, o in
 * [0, O): "<o>_lo" and "<o>_hi" (inclusive). */
static void gpu_pool_grad_range(rd_sb *b, const char *o, const char *c, int64_t S, int64_t P,
                                int64_t K, int64_t O) {
  rd_sb_printf(b, "  const gi_t %s_n = %s + %" PRId64 " - %" PRId64 " + 1;\n", o, c, P, K);
  rd_sb_printf(b, "  const gi_t %s_lo = %s_n <= 0 ? 0 : (%s_n + %" PRId64 " - 1) / %" PRId64 ";\n",
                o, o, o, S, S);
  rd_sb_printf(b, "  const gi_t %s_q = (%s + %" PRId64 ") / %" PRId64 ";\n", o, c, P, S);
  rd_sb_printf(b, "  const gi_t %s_hi = %s_q < %" PRId64 " ? %s_q : %" PRId64 " - 1;\n", o, o, O, o, O);
}

/* max_pool_grad: a work-item per input element sums dy over the windows that contain it and
 * whose first maximum it is (taps in row-major order, pads -inf and never chosen, a NaN in the
 * window chooses nothing): the host kernel's and the reference's rule, and their order of
 * summation (windows by row, then column), without atomics. */
static void gpu_special_pool_grad(gpu_cg *g, int s, rd_sb *b) {
  const exec_instr *ins = &g->r.p->instr[s];
  int xs = ins->in[0], gs = ins->in[1], nd = ins->ndim;
  const exec_instr *dy = &g->r.p->instr[gs];
  int64_t H = ins->shape[nd - 2], W = ins->shape[nd - 1], OH = dy->shape[nd - 2], OW = dy->shape[nd - 1];
  int64_t KH = IR_ATTR_AT(ins->attr, WINDOW, window, nd - 2), KW = IR_ATTR_AT(ins->attr, WINDOW, window, nd - 1);
  int64_t SH = IR_ATTR_AT(ins->attr, WINDOW, stride, nd - 2), SW = IR_ATTR_AT(ins->attr, WINDOW, stride, nd - 1);
  int64_t PH = IR_ATTR_AT(ins->attr, WINDOW, pad_lo, nd - 2), PW = IR_ATTR_AT(ins->attr, WINDOW, pad_lo, nd - 1);
  const char *T = rd_ctype(ins->dtype);
  rd_sb_printf(b, "  const gi_t plane = gid / %" PRId64 ", h = gid / %" PRId64 " %% %" PRId64
                ", w = gid %% %" PRId64 ";\n", H * W, W, H, W);
  rd_sb_printf(b, "  const gi_t xb = plane * %" PRId64 ", gb = plane * %" PRId64 ";\n  %s acc = 0;\n",
                H * W, OH * OW, T);
  gpu_pool_grad_range(b, "oh", "h", SH, PH, KH, OH);
  gpu_pool_grad_range(b, "ow", "w", SW, PW, KW, OW);
  rd_sb_puts(b, "  for (gi_t oh = oh_lo; oh <= oh_hi; oh++)\n  for (gi_t ow = ow_lo; ow <= ow_hi; ow++) {\n");
  rd_sb_printf(b, "    %s m = 0; gi_t best = -1; int first = 1, nf = 0;\n", T);
  rd_sb_printf(b, "    for (gi_t kh = 0; kh < %" PRId64 "; kh++)\n    for (gi_t kw = 0; kw < %" PRId64
                "; kw++) {\n", KH, KW);
  rd_sb_printf(b, "      const gi_t ih = oh * %" PRId64 " + kh - %" PRId64 ", iw = ow * %" PRId64
                " + kw - %" PRId64 ";\n", SH, PH, SW, PW);
  rd_sb_printf(b, "      const int in = ih >= 0 && ih < %" PRId64 " && iw >= 0 && iw < %" PRId64 ";\n",
                H, W);
  const char *xv = gpu_load_expr(g, xs, rd_fmt(&g->r.ar, "xb + (in ? ih * %" PRId64 " + iw : 0)", W));
  rd_sb_printf(b, "      const %s v = in ? (%s)%s : (%s)(-INFINITY);\n", T, T, xv, T);
  rd_sb_puts(b, "      nf |= v != v;\n");
  rd_sb_printf(b, "      if (first || v > m) { m = v; best = in ? ih * %" PRId64 " + iw : -1; first = 0; }\n", W);
  rd_sb_puts(b, "    }\n");
  const char *gv = gpu_load_expr(g, gs, rd_fmt(&g->r.ar, "gb + oh * %" PRId64 " + ow", OW));
  rd_sb_printf(b, "    if (!nf && best == h * %" PRId64 " + w) acc += %s;\n  }\n", W, gv);
  rd_sb_printf(b, "  p%d[gid] = acc;\n", s);
}

static void gpu_special_gather(gpu_cg *g, int s, rd_sb *b) {
  const exec_instr *ins = &g->r.p->instr[s];
  int xs = ins->in[0], is = ins->in[1];
  const exec_instr *x = &g->r.p->instr[xs];
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis);
  gpu_unravel(b, "gid", "c", ins->ndim, ins->shape);
  rd_sb_printf(b, "  int64_t v = (int64_t)%s;\n", gpu_load_expr(g, is, "gid"));
  rd_sb_printf(b, "  if (v < 0 || v >= %" PRId64 ") { status[1] = v; status[2] = %d; status[3] = "
                "%" PRId64 "; status[0] = 1; v = 0; }\n", x->shape[ax], s, x->shape[ax]);
  rd_sb e = {0};
  int64_t st = 1;
  for (int d = x->ndim - 1; d >= 0; d--) {
    if (d < ins->ndim) rd_sb_printf(&e, "%s%s * %" PRId64, e.n ? " + " : "",
                                     d == ax ? "(gi_t)v" : rd_fmt(&g->r.ar, "c%d", d), st);
    st *= x->shape[d];
  }
  const char *load = gpu_load_expr(g, xs, e.s ? e.s : "0");
  rd_sb_free(&e);
  rd_sb_printf(b, "  p%d[gid] = %s;\n", s, load);
}

void gpu_kernel_special(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st) {
  const exec_instr *ins = &g->r.p->instr[s];
  rd_sb body = {0};
  gpu_scope_begin(g, &body);
  g->r.self = -1;
  if (ins->op == IR_CONV2D) gpu_special_conv(g, s, &body);
  else if (ins->op == IR_REDUCE_WINDOW) gpu_special_window(g, s, &body);
  else if (ins->op == IR_MAX_POOL_GRAD) gpu_special_pool_grad(g, s, &body);
  else gpu_special_gather(g, s, &body);
  st->status = ins->op == IR_GATHER;
  gpu_signature(g, out, s, kernel, st);
  if (st->status) { /* the status buffer goes last: reopen the signature */
    out->n -= 4; /* ") {\n" */
    out->s[out->n] = 0;
    rd_sb_printf(out, ", %s int64_t *%s status) {\n", g->d->global, g->d->restrict_);
  }
  gpu_kernel_close(g, out, &body, ins->numel, st);
}
