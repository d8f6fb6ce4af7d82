/* Kernels and the program: one kernel per materialized instruction of the fusion plan, in
 * program order, with the steps (kernel launches, library calls, fallbacks) the runtime runs. */
#include "gpu_cg.h"
#include "error.h"
#include "../picture.h"
#include "../cpu/cpu_math.h"
#include "opmath.h"
#include "dtype.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

enum {
  GPU_WG = 128,           /* work-group size of element-wise kernels */
  GPU_RED_WG = 128,       /* work-group of a cooperative reduction */
  GPU_RED_COOP_MIN = 2048 /* reduced elements per output from which a work-group shares one */
};


static const char gpu_helpers_fp64[] =
    "static inline int64_t gc_d2i(double v) { return v != v ? 0 : v >= 9223372036854775808.0 ? "
    "INT64_MAX : v <= -9223372036854775808.0 ? INT64_MIN : (int64_t)v; }\n";
static const char gpu_helpers_fp32[] =
    "static inline int64_t gc_d2i(float v) { return v != v ? 0 : v >= 9223372036854775808.0f ? "
    "INT64_MAX : v <= -9223372036854775808.0f ? INT64_MIN : (int64_t)v; }\n";
static const char gpu_helpers[] =
    "static inline int32_t gc_sat32(int64_t x) { return (int32_t)(x > INT32_MAX ? INT32_MAX : x < "
    "INT32_MIN ? INT32_MIN : x); }\n"
    "static inline int64_t gc_idiv(int64_t a, int64_t b) { return b == 0 ? 0 : b == -1 ? "
    "(int64_t)(0UL - (uint64_t)a) : a / b; }\n"
    "static inline int64_t gc_irem(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }\n";

static bool gpu_dtype_ok(graft_dtype dt, const gpu_caps *caps) {
  return dt != GRAFT_F16 && dt != GRAFT_BF16 && (dt != GRAFT_F64 || caps->fp64);
}

int gpu_classify(const exec_program *p, int i, const gpu_caps *caps) {
  const exec_instr *ins = &p->instr[i];
  if (!gpu_dtype_ok(ins->dtype, caps)) return FUSE_FALLBACK;
  for (int k = 0; k < ins->nin; k++)
    if (!gpu_dtype_ok(p->instr[ins->in[k]].dtype, caps)) return FUSE_FALLBACK;
  switch (ir_ops[ins->op].cpu) { /* how compiling backends run it (ops.def) */
  case OPS_CPU_EXPR: case OPS_CPU_MOVE: return FUSE_INLINE;
  case OPS_CPU_WIDE: return caps->fp64 ? FUSE_INLINE : FUSE_FALLBACK; /* math in double */
  case OPS_CPU_REDUCE: return FUSE_REDUCE;
  case OPS_CPU_HOST: /* a kernel of its own over whole operand buffers (gpu_special.c) */
    return gpu_special_supported(p, i) ? FUSE_LIBRARY : FUSE_FALLBACK;
  case OPS_CPU_GEMM:
    if (!caps->have_gemm || !dtype_is_float(ins->dtype)) return FUSE_FALLBACK;
    for (int d = 0; d < ins->ndim; d++)
      if (ins->shape[d] > 0x7fffffff) return FUSE_FALLBACK;
    return FUSE_LIBRARY;
  default: return FUSE_FALLBACK;
  }
}

static int gpu_classify_cb(const exec_program *p, int i, void *ctx) { return gpu_classify(p, i, ctx); }

/* Work-items for n outputs: a work-group size that divides n when one of 8..GPU_WG does (then
 * no bounds check: an early return keeps pocl from vectorizing a work-group, 4x slower on the
 * gelu chain), else GPU_WG with the launch rounded up and a check. */
void gpu_launch_shape(int64_t n, gpu_step *st, bool *guard) {
  int64_t wg = GPU_WG;
  while (wg >= 8 && n % wg) wg /= 2;
  *guard = wg < 8;
  st->local = *guard ? GPU_WG : wg;
  st->global = (n + st->local - 1) / st->local * st->local;
}

/* The kernel's signature: its output, a row group's other outputs, then every buffer it loads,
 * in slot order. */
void gpu_signature(gpu_cg *g, rd_sb *out, int s, int kernel, gpu_step *st) {
  const gpu_dialect *d = g->d;
  rd_sb_printf(out, "%s k%d(%s %s *%s p%d", d->kernel, kernel, d->global,
                rd_ctype(g->r.p->instr[s].dtype), d->restrict_, s);
  st->nargs = st->nout = 0;
  st->args = malloc(sizeof(int) * ((size_t)g->r.p->ninstr + 1));
  if (!st->args) rd_fail(&g->r, "out of memory");
  for (int r = 0; r < g->r.p->ninstr && st->args && g->member; r++) { /* a row group's others */
    if (!g->member[r] || r == s) continue;
    rd_sb_printf(out, ", %s %s *%s p%d", d->global, rd_ctype(g->r.p->instr[r].dtype), d->restrict_, r);
    st->args[st->nargs++] = r;
    st->nout++;
  }
  for (int r = 0; r < g->r.p->ninstr && st->args; r++) {
    if (!g->r.reads[r] || r == s || (g->member && g->member[r])) continue;
    rd_sb_printf(out, ", %s const %s *%s p%d", d->global, rd_ctype(g->r.p->instr[r].dtype),
                  d->restrict_, r);
    st->args[st->nargs++] = r;
  }
  rd_sb_puts(out, ") {\n");
}

void gpu_kernel_close(gpu_cg *g, rd_sb *out, rd_sb *body, int64_t n, gpu_step *st) {
  if (n) {
    bool guard;
    gpu_launch_shape(n, st, &guard);
    gpu_kernel_index(g, out, n, guard);
  }
  rd_sb_puts(out, body->s ? body->s : "");
  rd_sb_puts(out, "}\n");
  if (body->oom) rd_fail(&g->r, "out of memory");
  rd_sb_free(body);
}

/* gid: this work-item's output; past n (a rounded-up launch) it does nothing. */
void gpu_kernel_index(gpu_cg *g, rd_sb *out, int64_t n, bool guard) {
  rd_sb_printf(out, "  const gi_t gid = (gi_t)%s;\n", g->d->global_id);
  if (guard) rd_sb_printf(out, "  if (gid >= %" PRId64 ") return;\n", n);
}

void gpu_scope_begin(gpu_cg *g, rd_sb *body) {
  memset(g->r.reads, 0, (size_t)g->r.p->ninstr + 1);
  g->r.body = body;
  g->r.nmemo = 0;
}

/* Element-wise kernel: a work-item per element of slot s. */
static void gpu_kernel_map(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st) {
  const exec_instr *ins = &g->r.p->instr[s];
  rd_sb body = {0};
  gpu_scope_begin(g, &body);
  g->r.self = s;
  rd_pos pos = {.nd = ins->ndim, .shape = ins->shape, .lin = "gid"};
  const char *v = rd_value(&g->r, s, pos);
  rd_sb_printf(&body, "  p%d[gid] = %s;\n", s, v);
  gpu_signature(g, out, s, kernel, st);
  gpu_kernel_close(g, out, &body, ins->numel, st);
}

static int64_t gpu_reduced_count(const exec_instr *x, int64_t mask) {
  int64_t n = 1;
  for (int d = 0; d < x->ndim; d++)
    if (mask >> d & 1) n *= x->shape[d];
  return n;
}

/* The operand position of output element `out` (kept dims unravelled from it) with the reduced
 * dims at coordinates red (unravelled from the expression e over the reduced dims). */
static rd_pos gpu_red_pos(gpu_cg *g, const exec_instr *x, int64_t mask, const char *out,
                           const char *e) {
  rd_pos pos = {.nd = x->ndim, .shape = x->shape, .has_c = 1};
  int64_t ost = 1, rst = 1, rtotal = gpu_reduced_count(x, mask), ototal = x->numel / (rtotal ? rtotal : 1);
  for (int d = x->ndim - 1; d >= 0; d--) {
    bool red = mask >> d & 1;
    const char *base = red ? e : out;
    int64_t st = red ? rst : ost, total = red ? rtotal : ototal;
    if (x->shape[d] == 1) pos.c[d] = "0";
    else if (st == 1 && x->shape[d] == total) pos.c[d] = base; /* the only non-unit dim */
    else if (st == 1) pos.c[d] = rd_fmt(&g->r.ar, "(%s %% %" PRId64 ")", base, x->shape[d]);
    else if (st * x->shape[d] == total) pos.c[d] = rd_fmt(&g->r.ar, "(%s / %" PRId64 ")", base, st);
    else pos.c[d] = rd_fmt(&g->r.ar, "(%s / %" PRId64 " %% %" PRId64 ")", base, st, x->shape[d]);
    if (red) rst *= x->shape[d];
    else ost *= x->shape[d];
  }
  return pos;
}

/* argmax/argmin: one work-item per output, the first extreme wins; for floats the first NaN. */
static void gpu_arg_body(gpu_cg *g, const exec_instr *ins, const exec_instr *x, rd_sb *b) {
  int ax = (int)IR_ATTR(ins->attr, ARG, axis);
  bool mx = ins->op == IR_ARGMAX, fl = dtype_is_float(x->dtype);
  rd_sb_printf(b, "  int64_t best = 0; %s bv = 0; int seen = 0;\n", rd_ctype(x->dtype));
  rd_sb_printf(b, "  for (gi_t e = 0; e < %" PRId64 "; e++) {\n", x->shape[ax]);
  rd_pos pos = gpu_red_pos(g, x, (int64_t)1 << ax, "gid", "e");
  const char *v = rd_value(&g->r, ins->in[0], pos);
  if (fl)
    rd_sb_printf(b, "  if (!seen || (%s != %s && bv == bv) || (bv == bv && %s %s bv)) { best = e; "
                  "bv = %s; seen = 1; }\n", v, v, v, mx ? ">" : "<", v);
  else
    rd_sb_printf(b, "  if (!seen || %s %s bv) { best = e; bv = %s; seen = 1; }\n", v, mx ? ">" : "<", v);
  rd_sb_puts(b, "  }\n");
}

/* Reduction kernel of slot s: a work-item per output, or a work-group per output (coop). */
static void gpu_kernel_reduce(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st) {
  const exec_instr *ins = &g->r.p->instr[s];
  const exec_instr *x = &g->r.p->instr[ins->in[0]];
  bool arg = ins->op == IR_ARGMAX || ins->op == IR_ARGMIN;
  int64_t mask = arg ? 0 : IR_ATTR(ins->attr, REDUCE, mask);
  int64_t R = arg ? 0 : gpu_reduced_count(x, mask);
  /* A work-group shares an output when its reduced elements are contiguous (the innermost dim is
   * reduced): the lanes then load neighbours. Reducing outer dims (a column sum), neighbouring
   * outputs are neighbours in memory: a work-item per output loads contiguously across lanes. */
  bool inner = !arg && x->ndim && (mask >> (x->ndim - 1) & 1);
  bool coop = inner && (R >= GPU_RED_COOP_MIN || (R >= 256 && x->shape[x->ndim - 1] >= 64));
  rd_red r = rd_reduce(g->d->expr, g->caps->fp64, ins);
  rd_sb body = {0};
  gpu_scope_begin(g, &body);
  g->r.self = -1;
  if (arg) {
    gpu_arg_body(g, ins, x, &body);
    rd_sb_printf(&body, "  p%d[gid] = best;\n", s);
  } else if (!coop) {
    rd_sb_printf(&body, "  %s acc = %s; int nf = 0; (void)nf;\n", r.acc_t, r.init);
    rd_sb_printf(&body, "  for (gi_t e = 0; e < %" PRId64 "; e++) {\n", R);
    rd_pos pos = gpu_red_pos(g, x, mask, "gid", "e");
    rd_red_step(&body, "  ", &r, "acc", "nf", rd_value(&g->r, ins->in[0], pos));
    rd_sb_puts(&body, "  }\n");
    rd_sb_printf(&body, "  p%d[gid] = %s;\n", s, rd_red_final(&g->r.ar, g->d->expr, ins, &r, "acc", "nf"));
  } else { /* each work-item strides over the reduced elements, then a tree in local memory */
    rd_sb_printf(&body, "  %s acc = %s; int nf = 0; (void)nf;\n", r.acc_t, r.init);
    rd_sb_printf(&body, "  for (gi_t e = lid; e < %" PRId64 "; e += %d) {\n", R, GPU_RED_WG);
    g->r.nmemo = 0;
    rd_pos pos = gpu_red_pos(g, x, mask, "gid", "e");
    rd_red_step(&body, "  ", &r, "acc", "nf", rd_value(&g->r, ins->in[0], pos));
    rd_sb_puts(&body, "  }\n");
    rd_sb_printf(&body, g->d->local_decl, r.acc_t, "sacc", GPU_RED_WG);
    rd_sb_printf(&body, g->d->local_decl, "int", "snf", GPU_RED_WG);
    rd_sb_printf(&body, "  sacc[lid] = acc; snf[lid] = nf;\n  %s;\n", g->d->barrier);
    rd_sb_printf(&body, "  for (int h = %d; h > 0; h >>= 1) {\n    if (lid < h) {\n", GPU_RED_WG / 2);
    rd_red_step(&body, "  ", &r, "sacc[lid]", "snf[lid]", "sacc[lid + h]");
    rd_sb_printf(&body, "  snf[lid] |= snf[lid + h];\n    }\n    %s;\n  }\n", g->d->barrier);
    rd_sb_printf(&body, "  if (lid == 0) p%d[gid] = %s;\n", s,
                  rd_red_final(&g->r.ar, g->d->expr, ins, &r, "sacc[0]", "snf[0]"));
  }
  gpu_signature(g, out, s, kernel, st);
  if (coop) {
    rd_sb_printf(out, "  const gi_t gid = (gi_t)%s;\n  const int lid = %s;\n", g->d->group_id,
                  g->d->local_id);
    st->local = GPU_RED_WG;
    st->global = ins->numel * GPU_RED_WG;
    gpu_kernel_close(g, out, &body, 0, st);
  } else {
    gpu_kernel_close(g, out, &body, ins->numel, st);
  }
}

/* The source's head: the dialect's prelude, the helpers, the math the kernels call. */
/* Index arithmetic in 32 bits when every index fits (64-bit division is several times slower). */
static bool gpu_small_indices(const exec_program *p) {
  for (int i = 0; i < p->ninstr; i++)
    if (p->instr[i].numel >= ((int64_t)1 << 31) - 2 * GPU_WG * GPU_RED_WG) return false;
  return true;
}

static void gpu_source_head(const exec_program *p, const gpu_dialect *d, const gpu_caps *caps,
                            rd_sb *out) {
  if (caps->fp64) rd_sb_puts(out, "#define GC_FP64 1\n");
  rd_sb_puts(out, d->prelude);
  rd_sb_printf(out, "typedef %s gi_t; /* index arithmetic */\n",
                gpu_small_indices(p) ? "int32_t" : "int64_t");
  rd_sb_puts(out, caps->fp64 ? gpu_helpers_fp64 : gpu_helpers_fp32);
  rd_sb_puts(out, gpu_helpers);
  if (caps->row_vec && d->vprelude) {
    rd_sb_printf(out, "#define GC_VW %d /* lanes of the row form */\n", caps->row_vec);
    rd_sb_puts(out, d->vprelude);
  }
  const char *math = cpu_math_src, *dbl = strstr(math, "static inline double gm_sigmoid");
  if (caps->fp64 || !dbl) {
    rd_sb_puts(out, math);
  } else { /* the f32 approximations only */
    rd_sb t = {0};
    rd_sb_printf(&t, "%.*s", (int)(dbl - math), math);
    rd_sb_puts(out, t.s ? t.s : "");
    rd_sb_free(&t);
  }
  rd_sb_puts(out, "\n");
  if (caps->fp64) {
    rd_sb_puts(out, ops_math_src);
    rd_sb_puts(out, "\n");
    rd_sb_puts(out, ir_op_math_src);
  }
}

static int gpu_add_step(gpu_program *gp, gpu_step st) {
  gpu_step *s = realloc(gp->steps, sizeof *s * ((size_t)gp->nsteps + 1));
  if (!s) return -1;
  gp->steps = s;
  gp->steps[gp->nsteps++] = st;
  return 0;
}

/* A library or fallback step reads whole buffers: its operands (a GEMM's transposed views read
 * their source). */
static int gpu_operand_step(const exec_program *p, const fuse_plan *pl, int i, gpu_step *st) {
  const exec_instr *ins = &p->instr[i];
  st->slot = i;
  st->nargs = ins->nin;
  st->args = malloc(sizeof(int) * ((size_t)ins->nin + 1));
  if (!st->args) return -1;
  for (int k = 0; k < ins->nin; k++) {
    int trans = 0;
    st->args[k] = st->kind == GPU_STEP_LIBRARY ? fuse_library_operand(p, pl, ins->in[k], &trans)
                                               : ins->in[k];
    if (k < 2) st->trans[k] = trans;
  }
  return 0;
}

/* A kernel or reduction step: a row group on a CPU-type device (its members are then done),
 * else a kernel of its own. */
static void gpu_kernel_step(gpu_cg *g, gpu_program *gp, int i, rd_sb *out, gpu_step *st,
                            unsigned char *done) {
  st->kind = GPU_STEP_KERNEL;
  if (g->r.p->instr[i].numel == 0) {
    st->global = 0; /* nothing to launch: the buffer is empty */
    return;
  }
  st->kernel = gp->nkernels++;
  if (g->r.pl->role[i] == FUSE_KERNEL) gpu_kernel_map(g, i, st->kernel, out, st);
  else if (!gpu_kernel_rows(g, i, st->kernel, out, st, done))
    gpu_kernel_reduce(g, i, st->kernel, out, st);
}

static int gpu_render_steps(gpu_cg *g, gpu_program *gp, rd_sb *out) {
  const exec_program *p = g->r.p;
  unsigned char *done = calloc((size_t)p->ninstr + 1, 1); /* written by a row group */
  if (!done) rd_fail(&g->r, "out of memory");
  for (int i = 0; i < p->ninstr && !g->r.failed; i++) {
    int role = g->r.pl->role[i];
    gpu_step st = {.slot = i, .kernel = -1};
    if (done[i]) {
      continue;
    } else if (role == FUSE_KERNEL || role == FUSE_REDUCE) {
      gpu_kernel_step(g, gp, i, out, &st, done);
    } else if (role == FUSE_LIBRARY && p->instr[i].op != IR_DOT) {
      st.kind = GPU_STEP_KERNEL;
      st.global = 0;
      if (p->instr[i].numel) {
        st.kernel = gp->nkernels++;
        gpu_kernel_special(g, i, st.kernel, out, &st);
        gp->uses_status |= st.status;
      }
    } else if (role == FUSE_LIBRARY || role == FUSE_FALLBACK) {
      st.kind = role == FUSE_LIBRARY ? GPU_STEP_LIBRARY : GPU_STEP_FALLBACK;
      if (gpu_operand_step(p, g->r.pl, i, &st)) rd_fail(&g->r, "out of memory");
    } else {
      continue;
    }
    if (gpu_add_step(gp, st)) {
      free(st.args);
      rd_fail(&g->r, "out of memory");
    }
  }
  free(done);
  return g->r.failed ? -1 : 0;
}

static int gpu_last_steps(const exec_program *p, gpu_program *gp) {
  gp->last_step = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  if (!gp->last_step) return -1;
  for (int s = 0; s < p->ninstr; s++) gp->last_step[s] = -1;
  for (int k = 0; k < gp->nsteps; k++)
    for (int a = 0; a < gp->steps[k].nargs; a++) gp->last_step[gp->steps[k].args[a]] = k;
  return 0;
}

/* GRAFT_DUMP_DIR: the program as its kernels run, each kernel step's outputs its cluster. */
static void gpu_dump_picture(const exec_program *p, const fuse_plan *pl, const gpu_dialect *d,
                             const gpu_program *gp) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  int *kof = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  if (!kof) return;
  for (int s = 0; s < p->ninstr; s++) kof[s] = -1;
  for (int i = 0; i < gp->nsteps; i++) {
    const gpu_step *st = &gp->steps[i];
    if (st->kind != GPU_STEP_KERNEL) continue;
    kof[st->slot] = st->kernel;
    for (int j = 0; j < st->nout; j++) kof[st->args[j]] = st->kernel;
  }
  picture_dump(p, pl, kof, NULL, gp->nkernels, d->ext);
  free(kof);
}

int gpu_render(const exec_program *p, const gpu_dialect *d, const gpu_caps *caps, gpu_program *gp) {
  memset(gp, 0, sizeof *gp);
  fuse_plan pl = {0};
  if (fuse_plan_build(p, gpu_classify_cb, (void *)caps, &pl)) return -1;
  gpu_cg g = {.r = {.p = p, .pl = &pl, .d = d->expr, .fp64 = caps->fp64, .ind = "  ", .itype = "gi_t"},
              .d = d, .caps = caps};
  g.r.reads = calloc((size_t)p->ninstr + 1, 1);
  rd_sb out = {0};
  int rc = -1;
  if (!g.r.reads) {
    err_set(GRAFT_ERR_OOM, "out of memory rendering kernels");
  } else {
    gpu_source_head(p, d, caps, &out);
    if (gpu_render_steps(&g, gp, &out) || out.oom || gpu_last_steps(p, gp))
      err_set(g.r.failed ? GRAFT_ERR_COMPILE : GRAFT_ERR_OOM, "%s renderer: %s", d->name,
              g.r.failed ? g.r.fail_what : "out of memory");
    else rc = 0;
  }
  if (rc) {
    rd_sb_free(&out);
    gpu_program_free(gp);
  } else {
    gp->source = out.s;
    gpu_dump_picture(p, &pl, d, gp);
  }
  free(g.r.reads);
  rd_memo_free(&g.r);
  rd_arena_free(&g.r.ar);
  fuse_plan_free(&pl);
  return rc;
}

void gpu_program_free(gpu_program *gp) {
  for (int k = 0; k < gp->nsteps; k++) free(gp->steps[k].args);
  free(gp->steps);
  free(gp->last_step);
  free(gp->source);
  memset(gp, 0, sizeof *gp);
}
