/* Generates a program's kernels and the steps that run them (cpu_code). A kernel is one C
 * function (a fused loop nest; a "row group" runs several kernels row by row so a reduction
 * and the elementwise work that reads it back stay in cache: softmax, layer_norm; an expensive
 * value several members compute, softmax's exp, is kept in a row scratch by the first one);
 * kernels of equal code share one body (cpu_dedup.c), compiled once by the kernel library
 * (cpu_klib.c) for every graph that has it. The steps allocate, run kernels (on the pool when
 * big), call BLAS (transposed operands by its transpose flags) and the host or reference
 * fallbacks, and free buffers after their last use; the runner walks them (cpu_backend.c), so
 * no code is compiled per graph. Outputs past CPU_NT_MIN_BYTES leave through streaming
 * stores. */
#include "cpu_codegen.h"
#include "cpu_math.h"
#include "../render/render.h"
#include "opmath.h"
#include "dtype.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPU_PAR_MIN_WORK 65536
/* Outputs at least this big (default; GRAFT_NT_MIN_BYTES overrides) are written with streaming
 * stores: bigger than half the last-level cache here, they would not be read back from it. */
#define CPU_NT_MIN_BYTES ((size_t)16 << 20)
/* A graph output that nothing in the graph reads again (an optimizer's new parameter or state)
 * is not read until the next step. When the step's buffers exceed CPU_NT_FOOTPRINT, everything
 * between will have gone through the cache, so it streams out from CPU_NT_OUT_MIN_BYTES
 * (GRAFT_NT_OUT_MIN_BYTES overrides): resnet18's momentum updates (a ~200 MB step) ran 10.5 ->
 * 8.0 ms a step so. A step that fits keeps it cached: a lone 47 MB update ran 1.5 -> 2.4 ms
 * with streaming stores, its next run reading from memory what it had just written. */
#define CPU_NT_OUT_MIN_BYTES ((size_t)1 << 20)
#define CPU_NT_FOOTPRINT ((size_t)64 << 20)
#define CPU_NT_BLOCK 2048               /* elements per streamed block of a flat kernel */
#define CPU_ROW_SCRATCH_BYTES (64 << 10) /* per-row scratch (stack) of one kernel, at most */
#define CPU_F32_RUN 8192                /* elements an f32 sum adds in f32 lanes, at most */

static const char cpu_prelude[] =
    "#include <stdint.h>\n#include <math.h>\n"
    "static inline int64_t gc_d2i(double v) { return v != v ? 0 : v >= 9223372036854775808.0 ? "
    "INT64_MAX : v <= -9223372036854775808.0 ? INT64_MIN : (int64_t)v; }\n"
    "static inline int32_t gc_sat32(int64_t x) { return (int32_t)(x > INT32_MAX ? INT32_MAX : x < "
    "INT32_MIN ? INT32_MIN : x); }\n"
    "static inline int64_t gc_idiv(int64_t a, int64_t b) { return b == 0 ? 0 : b == -1 ? "
    "(int64_t)(0ull - (uint64_t)a) : a / b; }\n"
    "static inline int64_t gc_irem(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }\n"
    "/* hides a float->double widening so gcc cannot narrow (float)f((double)x) to f##f(x) */\n"
    "static inline double gc_wide(double x) { __asm__(\"\" : \"+x\"(x)); return x; }\n"
    "/* an f32 rounding of a double that gcc cannot drop (see graft's rd_unary_float) */\n"
    "static inline float gc_f32(double x) { float f = (float)x; __asm__(\"\" : \"+x\"(f)); return f; }\n"
    /* an integer made a float: the integer opaque, so that gcc cannot fold a float -> integer
     * -> float round trip into trunc() (which keeps -0.0 where the integer 0 gives +0.0) */
    "static inline float gc_f32i(int64_t x) { __asm__(\"\" : \"+r\"(x)); float f = (float)x; "
    "__asm__(\"\" : \"+x\"(f)); return f; }\n"
    "static inline double gc_f64i(int64_t x) { __asm__(\"\" : \"+r\"(x)); return (double)x; }\n"
    "static inline int64_t gc_clamp(int64_t q, int64_t n) { return q < 0 ? 0 : q >= n ? n - 1 : q; }\n"
    /* a size-generic template's floating literals, passed by their bits (cpu_sized.c) */
    "static inline float gc_lf(int64_t b) { uint32_t u = (uint32_t)b; float f; "
    "__builtin_memcpy(&f, &u, 4); return f; }\n"
    "static inline double gc_ld(int64_t b) { double d; __builtin_memcpy(&d, &b, 8); return d; }\n"
    /* Streaming (non-temporal) stores for large outputs nobody reads soon: a kernel computes a
     * block into a local buffer, then gc_stream copies it out bypassing the cache (no read for
     * ownership of the destination lines). gcc emits no NT stores from plain C: inline asm. */
    "#if defined(__AVX512F__)\n"
    "#define GC_NTV 64\ntypedef float gc_vnt __attribute__((vector_size(64)));\n"
    "#define GC_NT_ASM \"vmovntps %1, %0\" : \"=m\"(*(gc_vnt *)d) : \"v\"(v)\n"
    "#elif defined(__AVX__)\n"
    "#define GC_NTV 32\ntypedef float gc_vnt __attribute__((vector_size(32)));\n"
    "#define GC_NT_ASM \"vmovntps %1, %0\" : \"=m\"(*(gc_vnt *)d) : \"x\"(v)\n"
    "#elif defined(__SSE2__)\n"
    "#define GC_NTV 16\ntypedef float gc_vnt __attribute__((vector_size(16)));\n"
    "#define GC_NT_ASM \"movntps %1, %0\" : \"=m\"(*(gc_vnt *)d) : \"x\"(v)\n"
    "#endif\n"
    "static void gc_stream(void *dst, const void *src, int64_t n) {\n"
    "  char *d = (char *)dst; const char *s = (const char *)src;\n"
    "#ifdef GC_NTV\n"
    "  int64_t head = (int64_t)(-(uintptr_t)d & (GC_NTV - 1));\n"
    "  if (head > n) head = n;\n"
    "  __builtin_memcpy(d, s, (__SIZE_TYPE__)head); d += head; s += head; n -= head;\n"
    "  for (; n >= GC_NTV; n -= GC_NTV, d += GC_NTV, s += GC_NTV) {\n"
    "    gc_vnt v; __builtin_memcpy(&v, s, GC_NTV); __asm__ volatile(GC_NT_ASM);\n"
    "  }\n"
    "#endif\n"
    "  __builtin_memcpy(d, s, (__SIZE_TYPE__)n);\n"
    "}\n"
    "static inline void gc_sfence(void) {\n"
    "#ifdef GC_NTV\n"
    "  __asm__ volatile(\"sfence\" ::: \"memory\");\n"
    "#endif\n"
    "}\n";

typedef struct {
  int *inst; /* members, in order */
  int nm;
  int a;     /* outer dims (row mode); -1 = flat elementwise */
  const int64_t *oshape;
  int ond;   /* dims of oshape */
} cpu_group;

static bool cpu_is_trailing_reduce(const exec_program *p, int i, int *a) {
  const exec_instr *x = &p->instr[p->instr[i].in[0]];
  int64_t mask = IR_ATTR(p->instr[i].attr, REDUCE, mask);
  int nr = 0;
  for (int d = 0; d < x->ndim; d++) nr += (int)(mask >> d & 1);
  *a = x->ndim - nr;
  int64_t want = ((int64_t)1 << x->ndim) - 1 - (((int64_t)1 << *a) - 1);
  return mask == want;
}

/* Loops over dims [from, nd) of shape, variables i<d>. */
static void cpu_open_loops(rd_sb *b, int from, int nd, const int64_t *shape, const char *pragma) {
  for (int d = from; d < nd; d++) {
    if (pragma && d == nd - 1) rd_sb_printf(b, "    %s\n", pragma);
    rd_sb_printf(b, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d, shape[d], d);
  }
}
static void cpu_close_loops(rd_sb *b, int n) {
  for (int d = 0; d < n; d++) rd_sb_puts(b, "    }\n");
}

static rd_pos cpu_loop_pos(cpu_cg *g, int nd, const int64_t *shape) {
  rd_pos pos = {.nd = nd, .shape = shape, .has_c = 1};
  for (int d = 0; d < nd; d++) pos.c[d] = shape[d] == 1 ? "0" : rd_fmt(&g->r.ar, "i%d", d);
  return pos;
}

/* Elementwise root i, row mode: outer vars i0..i<a-1> exist. */
/* The split factor for member i's innermost loop (see cpu_cg.split_var): a trial generation
 * into a scratch body, with row-scratch caching off so that it changes no planning state. */
static int64_t cpu_member_split(cpu_cg *g, int i, int a) {
  const exec_instr *ins = &g->r.p->instr[i];
  int L = ins->ndim - 1;
  if (L < a || ins->shape[L] < 2) return 0;
  rd_sb trial = {0}, *body = g->r.body;
  unsigned char *rc_state = g->rc_state;
  g->r.body = &trial;
  g->rc_state = NULL;
  g->split_var = rd_fmt(&g->r.ar, "i%d", L);
  g->split_want = 0;
  g->split_f = 0;
  g->r.nmemo = 0;
  g->r.self = i;
  rd_value(&g->r, i, cpu_loop_pos(g, ins->ndim, ins->shape));
  g->r.body = body;
  g->rc_state = rc_state;
  rd_sb_free(&trial);
  int64_t F = g->split_want;
  return F > 1 && ins->shape[L] % F == 0 && ins->shape[L] > F ? F : 0;
}

/* A lone row kernel whose trailing dims [from, ndim) were merged (cpu_kernel_merge): one loop
 * on the innermost merged dim over their product; the others read "0". */
static void cpu_member_kernel_merged(cpu_cg *g, int i, int a) {
  const exec_instr *ins = &g->r.p->instr[i];
  int nl = 0;
  for (int d = a; d < ins->ndim; d++) {
    if (g->aff_gone >> d & 1) continue;
    int64_t n = ins->shape[d];
    for (int e = a; e < ins->ndim && d == g->aff_inner; e++)
      if (g->aff_gone >> e & 1) n *= ins->shape[e];
    rd_sb_printf(g->r.body, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d, n, d);
    nl++;
  }
  g->r.nmemo = 0;
  g->r.self = i;
  rd_pos pos = cpu_loop_pos(g, ins->ndim, ins->shape);
  pos.ap = cpu_aff_root(g, ins->ndim);
  for (int d = 0; d < ins->ndim; d++)
    if (g->aff_gone >> d & 1) pos.c[d] = "0";
  const char *v = rd_value(&g->r, i, pos);
  pos.ap = NULL; /* the output: row-major, so its merged dims compose */
  pos.lin = NULL;
  rd_sb_printf(g->r.body, "      p%d[%s] = %s;\n", i, rd_lin(&g->r.ar, ins->ndim, ins->shape, pos.c), v);
  cpu_close_loops(g->r.body, nl);
}

/* The loops over dims [a, ndim) of a kernel member, the innermost split by F (when not 0). */
static void cpu_member_loops(cpu_cg *g, const exec_instr *ins, int a, int64_t F) {
  int L = ins->ndim - 1;
  if (F) {
    cpu_open_loops(g->r.body, a, L, ins->shape, NULL);
    rd_sb_printf(g->r.body, "    for (int64_t i%dh = 0; i%dh < %" PRId64 "; i%dh++)\n", L, L,
                  ins->shape[L] / F, L);
    rd_sb_printf(g->r.body, "    for (int64_t i%dl = 0; i%dl < %" PRId64 "; i%dl++) {\n", L, L, F, L);
    rd_sb_printf(g->r.body, "      const int64_t i%d = i%dh * %" PRId64 " + i%dl;\n", L, L, F, L);
  } else {
    cpu_open_loops(g->r.body, a, ins->ndim, ins->shape, NULL);
  }
}

/* A member's element loops are generated in two bodies: the statements that run once per row
 * (g->row_pre: cpu_concat_rowsel's part pointers) and the element loop's own, written out
 * by cpu_row_body_end as the first, the loops over dims [a, ndim), the second. Returns the body
 * to restore. */
static rd_sb *cpu_row_body_begin(cpu_cg *g, int a) {
  rd_sb *outer = g->r.body;
  g->r.body = calloc(1, sizeof(rd_sb));
  g->row_pre = calloc(1, sizeof(rd_sb));
  if (!g->r.body || !g->row_pre) { /* generate into the outer body, nothing per row */
    free(g->r.body), free(g->row_pre);
    g->r.body = outer, g->row_pre = NULL;
    g->r.failed = 1;
    return NULL;
  }
  g->row_vars = a;
  return outer;
}

/* Opens the loops; the caller closes them. */
static void cpu_row_body_end(cpu_cg *g, rd_sb *outer, const exec_instr *ins, int a, int64_t F) {
  g->row_vars = 0;
  if (!outer) {
    cpu_member_loops(g, ins, a, F); /* (a failed generation: the text is never compiled) */
    return;
  }
  rd_sb *elems = g->r.body, *pre = g->row_pre;
  g->r.body = outer;
  g->row_pre = NULL;
  if (pre->n) rd_sb_puts(outer, pre->s);
  cpu_member_loops(g, ins, a, F);
  if (elems->n) rd_sb_puts(outer, elems->s);
  if (elems->oom || pre->oom) g->r.failed = 1;
  rd_sb_free(elems), rd_sb_free(pre);
  free(elems), free(pre);
}

/* A lone concat kernel whose axis is a row dim (im2col's taps: [C, 9, N*H*W]): the part a
 * row lies in is fixed for the row, so the if/else chain runs once per row around the inner
 * loops, each branch its own loops, instead of inside the innermost loop for every element. */
static void cpu_member_concat_rows(cpu_cg *g, int i, int a, int64_t F) {
  const exec_instr *ins = &g->r.p->instr[i];
  int ax = (int)IR_ATTR(ins->attr, AXIS, axis), nparts = 0, seen = 0;
  for (int k = 0; k < ins->nin; k++) nparts += g->r.p->instr[ins->in[k]].shape[ax] != 0;
  int64_t off = 0;
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *xk = &g->r.p->instr[ins->in[k]];
    int64_t ext = xk->shape[ax];
    if (ext == 0) continue;
    seen++;
    if (seen == 1 && nparts > 1) rd_sb_printf(g->r.body, "    if (i%d < %" PRId64 ") {\n", ax, off + ext);
    else if (seen < nparts) rd_sb_printf(g->r.body, "    } else if (i%d < %" PRId64 ") {\n", ax, off + ext);
    else if (nparts > 1) rd_sb_puts(g->r.body, "    } else {\n");
    rd_sb *outer = cpu_row_body_begin(g, a);
    g->split_var = F ? rd_fmt(&g->r.ar, "i%d", ins->ndim - 1) : NULL;
    g->split_f = F;
    g->r.nmemo = 0;
    g->r.self = i;
    rd_pos pos = cpu_loop_pos(g, ins->ndim, ins->shape);
    rd_pos qk = {.nd = xk->ndim, .shape = xk->shape, .has_c = 1};
    for (int d = 0; d < ins->ndim; d++) qk.c[d] = pos.c[d];
    qk.c[ax] = off ? rd_fmt(&g->r.ar, "(%s - %" PRId64 ")", pos.c[ax], off) : pos.c[ax];
    const char *v = rd_value(&g->r, ins->in[k], qk);
    rd_sb_printf(g->r.body, "      p%d[%s] = %s;\n", i, rd_pos_lin(&g->r, &pos), v);
    cpu_row_body_end(g, outer, ins, a, F);
    cpu_close_loops(g->r.body, ins->ndim - a);
    off += ext;
  }
  if (nparts > 1) rd_sb_puts(g->r.body, "    }\n");
  g->split_var = NULL;
  g->split_f = 0;
}

static void cpu_member_kernel(cpu_cg *g, int i, int a, bool lone) {
  const exec_instr *ins = &g->r.p->instr[i];
  if (g->kmerge_from >= 0 && g->aff_emit) {
    cpu_member_kernel_merged(g, i, a);
    return;
  }
  int64_t F = cpu_member_split(g, i, a);
  int L = ins->ndim - 1;
  if (lone && g->stream != i && ins->op == IR_CONCAT && IR_ATTR(ins->attr, AXIS, axis) < a) {
    cpu_member_concat_rows(g, i, a, F);
    return;
  }
  rd_sb *outer = cpu_row_body_begin(g, a);
  g->split_var = F ? rd_fmt(&g->r.ar, "i%d", L) : NULL;
  g->split_f = F;
  g->r.nmemo = 0;
  g->r.self = i;
  rd_pos pos = cpu_loop_pos(g, ins->ndim, ins->shape);
  const char *v = rd_value(&g->r, i, pos);
  g->split_var = NULL;
  g->split_f = 0;
  cpu_row_body_end(g, outer, ins, a, F);
  if (g->stream == i) {
    rd_sb_printf(g->r.body, "      ob%d[%s] = %s;\n", i, cpu_row_inner(g), v);
    cpu_close_loops(g->r.body, ins->ndim - a);
    int64_t len = cpu_row_len(g);
    rd_sb_printf(g->r.body, "    gc_stream(p%d + r * %" PRId64 ", ob%d, %" PRId64 ");\n", i, len, i,
                  len * (int64_t)graft_dtype_size(ins->dtype));
    return;
  }
  rd_sb_printf(g->r.body, "      p%d[%s] = %s;\n", i, rd_pos_lin(&g->r, &pos), v);
  cpu_close_loops(g->r.body, ins->ndim - a);
}

/* Reduction root i: vars for its kept dims exist; the unit index r is the output index. */
static void cpu_member_reduce(cpu_cg *g, int i, bool merge) {
  const exec_instr *ins = &g->r.p->instr[i];
  const exec_instr *x = &g->r.p->instr[ins->in[0]];
  int64_t mask = IR_ATTR(ins->attr, REDUCE, mask);
  graft_dtype dt = ins->dtype;
  rd_red R = rd_reduce(&rd_dialect_c, true, ins);
  bool fl = R.fl, mx = R.mx, mn = R.mn;
  const char *acc_t = R.acc_t, *init = R.init, *red = R.combine;
  int last = -1, nr = 0, cand[GRAFT_MAX_DIMS], nc = 0;
  for (int d = 0; d < x->ndim; d++)
    if (mask >> d & 1) {
      last = d;
      nr++;
      if (x->shape[d] > 1) cand[nc++] = d;
    }
  /* A lone reduction's reduced dims whose strides compose in every load run as one loop
   * (cpu_aff.c); the innermost of them carries it, over the product of their sizes. */
  g->r.self = -1;
  int64_t run = last >= 0 ? x->shape[last] : 1;
  if (merge && cpu_aff_plan(g, ins->in[0], x->ndim, x->shape, cand, nc)) {
    last = g->aff_inner;
    run = x->shape[last];
    for (int d = 0; d < x->ndim; d++)
      if (g->aff_gone >> d & 1) run *= x->shape[d];
    nr -= __builtin_popcount(g->aff_gone);
  }
  rd_sb_printf(g->r.body, "    %s acc%d = %s; int nfa%d = 0; (void)nfa%d;\n", acc_t, i, init, i, i);
  /* outer reduced loops */
  for (int d = 0; d < x->ndim; d++)
    if ((mask >> d & 1) && d != last && !(g->aff_emit && (g->aff_gone >> d & 1)))
      rd_sb_printf(g->r.body, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d,
                    x->shape[d], d);
  const char *a2 = nr ? "a2" : rd_fmt(&g->r.ar, "acc%d", i), *nf = nr ? "nf" : rd_fmt(&g->r.ar, "nfa%d", i);
  /* An f32 sum over a short innermost run accumulates in f32 lanes (full vector width; PyTorch
   * sums in f32 throughout), and the runs add up in double; a merged run longer than
   * CPU_F32_RUN does so in blocks of CPU_F32_RUN. */
  bool f32_lanes = dt == GRAFT_F32 && ins->op == IR_REDUCE_SUM && nr &&
                   (run <= CPU_F32_RUN || g->aff_emit);
  bool blocks = f32_lanes && run > CPU_F32_RUN;
  if (blocks)
    rd_sb_printf(g->r.body, "    for (int64_t i%db = 0; i%db < %" PRId64 "; i%db += %d) {\n", last,
                  last, run, last, CPU_F32_RUN);
  if (nr) {
    rd_sb_printf(g->r.body, "    %s a2 = %s; int nf = 0;\n", f32_lanes ? "float" : acc_t, init);
    rd_sb_printf(g->r.body, "    #pragma omp simd reduction(%s:a2)%s\n", red,
                  fl && (mx || mn) ? " reduction(|:nf)" : "");
    if (blocks)
      rd_sb_printf(g->r.body, "    for (int64_t i%d = i%db; i%d < (i%db + %d < %" PRId64 " ? i%db + %d : %"
                    PRId64 "); i%d++) {\n", last, last, last, last, CPU_F32_RUN, run, last,
                    CPU_F32_RUN, run, last);
    else
      rd_sb_printf(g->r.body, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", last, last,
                    run, last);
  }
  g->r.nmemo = 0;
  rd_pos pos = cpu_loop_pos(g, x->ndim, x->shape);
  if (g->aff_emit) {
    pos.ap = cpu_aff_root(g, x->ndim);
    for (int d = 0; d < x->ndim; d++)
      if (g->aff_gone >> d & 1) pos.c[d] = "0";
  }
  const char *v = rd_value(&g->r, ins->in[0], pos);
  cpu_aff_end(g);
  if (f32_lanes) rd_sb_printf(g->r.body, "      %s += %s;\n", a2, v);
  else rd_red_step(g->r.body, "      ", &R, a2, nf, v);
  if (nr) {
    rd_sb_puts(g->r.body, "    }\n");
    if (!mx && !mn) rd_sb_printf(g->r.body, "    acc%d %s= a2;\n", i, red);
    else rd_sb_printf(g->r.body, "    acc%d = a2 %s acc%d ? a2 : acc%d; nfa%d |= nf;\n", i,
                       mx ? ">" : "<", i, i, i);
    cpu_close_loops(g->r.body, nr - 1 + blocks);
  }
  const char *fin = rd_red_final(&g->r.ar, &rd_dialect_c, ins, &R, rd_fmt(&g->r.ar, "acc%d", i),
                                 rd_fmt(&g->r.ar, "nfa%d", i));
  rd_sb_printf(g->r.body, "    p%d[r] = %s;\n", i, fin);
}

static bool cpu_is_arg(ir_op op) { return op == IR_ARGMAX || op == IR_ARGMIN; }

enum { CPU_COLSUM_BLOCK = 512 };

/* A float sum that keeps the operand's innermost dim (a bias gradient: [256,1024] summed over
 * rows): the row-at-a-time form read a column with a stride of a whole row per element. This
 * form walks the reduced dims outside and a block of up to CPU_COLSUM_BLOCK contiguous
 * columns inside, accumulating each column in double in the operand's order. */
static bool cpu_is_colsum(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  const exec_instr *x = &p->instr[ins->in[0]];
  int64_t mask = IR_ATTR(ins->attr, REDUCE, mask);
  return ins->op == IR_REDUCE_SUM && (ins->dtype == GRAFT_F32 || ins->dtype == GRAFT_F64) &&
         x->ndim >= 2 && !(mask >> (x->ndim - 1) & 1) && mask != 0 && x->shape[x->ndim - 1] > 1;
}

static void cpu_member_colsum(cpu_cg *g, int i) {
  const exec_instr *ins = &g->r.p->instr[i];
  const exec_instr *x = &g->r.p->instr[ins->in[0]];
  int64_t mask = IR_ATTR(ins->attr, REDUCE, mask);
  int last = x->ndim - 1;
  int64_t W = x->shape[last];
  rd_sb *b = g->r.body;
  rd_sb_printf(b, "  double cacc[%d];\n", CPU_COLSUM_BLOCK);
  rd_sb_puts(b, "  for (int64_t r0 = lo; r0 < hi;) {\n");
  rd_sb_printf(b, "    const int64_t o = r0 / %" PRId64 ", w0 = r0 %% %" PRId64 ";\n", W, W);
  rd_sb_printf(b, "    int64_t w1 = w0 + (hi - r0);\n    if (w1 > %" PRId64 ") w1 = %" PRId64
                ";\n    if (w1 - w0 > %d) w1 = w0 + %d;\n", W, W, CPU_COLSUM_BLOCK, CPU_COLSUM_BLOCK);
  int64_t st = 1;
  for (int d = last - 1; d >= 0; d--) { /* the other kept dims, from o */
    if (mask >> d & 1) continue;
    rd_sb_printf(b, "    const int64_t i%d = o / %" PRId64 " %% %" PRId64 ";\n", d, st, x->shape[d]);
    st *= x->shape[d];
  }
  rd_sb_puts(b, "    for (int64_t w = 0; w < w1 - w0; w++) cacc[w] = 0.0;\n");
  int nr = 0;
  for (int d = 0; d < last; d++)
    if (mask >> d & 1) {
      rd_sb_printf(b, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d, x->shape[d], d);
      nr++;
    }
  rd_sb_printf(b, "    #pragma omp simd\n    for (int64_t i%d = w0; i%d < w1; i%d++) {\n", last,
                last, last);
  g->r.nmemo = 0;
  g->r.self = -1;
  rd_pos pos = cpu_loop_pos(g, x->ndim, x->shape);
  const char *v = rd_value(&g->r, ins->in[0], pos);
  rd_sb_printf(b, "      cacc[i%d - w0] += (double)%s;\n    }\n", last, v);
  cpu_close_loops(b, nr);
  rd_sb_printf(b, "    for (int64_t w = w0; w < w1; w++) p%d[o * %" PRId64 " + w] = %s(cacc[w - w0]);\n",
                i, W, ins->dtype == GRAFT_F32 ? "gc_f32" : "");
  rd_sb_puts(b, "    r0 += w1 - w0;\n  }\n");
}

/* argmax/argmin root i (a standalone kernel: vars for the other dims exist; r is the output
 * index). As the reference: the first extreme wins; for floats the first NaN is the extreme. */
static void cpu_member_arg(cpu_cg *g, int i) {
  const exec_instr *ins = &g->r.p->instr[i];
  const exec_instr *x = &g->r.p->instr[ins->in[0]];
  int ax = (int)IR_ATTR(ins->attr, ARG, axis);
  bool fl = dtype_is_float(x->dtype), mn = ins->op == IR_ARGMIN;
  const char *T = fl ? cpu_ctype(x->dtype) : "int64_t";
  g->r.nmemo = 0;
  g->r.self = -1;
  rd_pos pos = cpu_loop_pos(g, x->ndim, x->shape);
  pos.c[ax] = "0";
  const char *v0 = rd_value(&g->r, ins->in[0], pos);
  rd_sb_printf(g->r.body, "    %s bv = (%s)%s; int64_t best = 0;\n", T, T, v0);
  rd_sb_printf(g->r.body, "    for (int64_t i%d = 1; i%d < %" PRId64 "; i%d++) {\n", ax, ax,
                x->shape[ax], ax);
  g->r.nmemo = 0;
  pos = cpu_loop_pos(g, x->ndim, x->shape);
  const char *v = rd_value(&g->r, ins->in[0], pos);
  if (fl)
    rd_sb_printf(g->r.body, "      const %s v = %s;\n      if (bv == bv && (v != v || v %s bv)) "
                  "{ bv = v; best = i%d; }\n", T, v, mn ? "<" : ">", ax);
  else
    rd_sb_printf(g->r.body, "      const int64_t v = (int64_t)%s;\n      if (v %s bv) { bv = v; "
                  "best = i%d; }\n", v, mn ? "<" : ">", ax);
  rd_sb_printf(g->r.body, "    }\n    p%d[r] = best;\n", i);
}

/* The kernel's signature: the slots it touches are restrict-qualified parameters of k<kid>_
 * (gcc honours restrict on parameters; on locals loaded from S it versioned loops for aliasing
 * and gave up vectorizing past a few dozen pointers), called by k<kid>(S, lo, hi). */
/* ", const float *restrict p<s>" for each slot the kernel reads or writes, in slot order. */
static void cpu_kernel_params(cpu_cg *g, rd_sb *out, const unsigned char *writes) {
  for (int s = 0; s < g->r.p->ninstr; s++) {
    if (!g->r.reads[s] && !writes[s]) continue;
    rd_sb_printf(out, ", %s%s *restrict p%d", writes[s] ? "" : "const ",
                  cpu_ctype(g->r.p->instr[s].dtype), s);
  }
}

/* Kernel kid's definition head: "static void k<kid>_(lo, hi, buffers) {" and the row scratch
 * and streaming buffers' declarations. */
static void cpu_kernel_head(cpu_cg *g, rd_sb *out, int kid, const unsigned char *writes) {
  rd_sb_printf(out, "static void k%d_(int64_t lo, int64_t hi", kid);
  cpu_kernel_params(g, out, writes);
  rd_sb_puts(out, ") {\n");
  int64_t len = g->oshape ? cpu_row_len(g) : 0;
  for (int s = 0; s < g->r.p->ninstr && g->rc_state; s++)
    if (g->rc_state[s])
      rd_sb_printf(out, "  %s rc%d[%" PRId64 "] __attribute__((aligned(64)));\n",
                    cpu_ctype(g->r.p->instr[s].dtype), s, len);
  if (g->stream >= 0)
    rd_sb_printf(out, "  %s ob%d[%" PRId64 "] __attribute__((aligned(64)));\n",
                  cpu_ctype(g->r.p->instr[g->stream].dtype), g->stream, g->oshape ? len : CPU_NT_BLOCK);
}

/* Records kernel kid: its body (a new one's definition def also goes to the rendering out
 * under the name k<kid>_), and its buffers, in the body's parameter order, for the launch that
 * follows (cpu_gen_launch). */
static void cpu_kernel_emit(cpu_cg *g, rd_sb *out, int kid, const unsigned char *writes,
                            const rd_sb *def) {
  if (g->trial) return;
  bool fresh = false;
  int body = def->s ? cpu_dedup_find(&g->dedup, def->s, &fresh) : -1;
  if (body < 0) {
    g->r.failed = 1;
    return;
  }
  g->cur_body = body;
  g->cur_slot0 = g->code->nslots;
  g->cur_nslot = 0;
  for (int s = 0; s < g->r.p->ninstr; s++)
    if (g->r.reads[s] || writes[s]) {
      cpu_code_slot(g->code, s);
      g->cur_nslot++;
    }
  if (!fresh) return;
  g->body_kid[body] = kid;
  cpu_body b = {NULL, g->cur_nslot};
  cpu_code_body(g->code, &b); /* its text: the canonical one, moved over at the end */
  rd_sb_puts(out, def->s);
}

/* What generating a group's kernel found: done, a member read another member's output off its
 * row (the caller shrinks the group), or a flat kernel needed coordinates (it becomes a row
 * kernel, whose innermost loop is a real dim). */
enum { CPU_GEN_OK = 0, CPU_GEN_NOT_ROW_LOCAL = 1, CPU_GEN_NEEDS_COORDS = 2 };

/* A flat kernel: one loop over the linear index L, every member (all of one shape) computed
 * and stored at L in turn, so a later member reads an earlier one's element of this iteration
 * (or its value, memoized); the member whose output streams out (the last) goes through a
 * block buffer. Returns CPU_GEN_NEEDS_COORDS when some load needs coordinates. */
static int cpu_gen_flat(cpu_cg *g, const cpu_group *G, unsigned char *writes, rd_sb *body) {
  const exec_program *p = g->r.p;
  bool streams = g->stream >= 0;
  if (streams) { /* blocks computed into ob<i>, streamed out */
    rd_sb_printf(body, "  for (int64_t L0 = lo; L0 < hi; L0 += %d) {\n", CPU_NT_BLOCK);
    rd_sb_printf(body, "    const int64_t L1 = L0 + %d < hi ? L0 + %d : hi;\n", CPU_NT_BLOCK,
                  CPU_NT_BLOCK);
    rd_sb_puts(body, "    for (int64_t L = L0; L < L1; L++) {\n");
  } else {
    rd_sb_puts(body, "  for (int64_t L = lo; L < hi; L++) {\n");
  }
  g->r.nmemo = 0;
  for (int m = 0; m < G->nm && !g->violation; m++) {
    int i = G->inst[m];
    const exec_instr *ins = &p->instr[i];
    writes[i] = 1;
    g->r.self = i;
    rd_pos pos = {.nd = ins->ndim, .shape = ins->shape, .lin = "L"};
    if (ins->ndim <= 1) {
      pos.has_c = 1;
      if (ins->ndim == 1) pos.c[0] = ins->shape[0] == 1 ? "0" : "L";
    }
    const char *v = rd_value(&g->r, i, pos);
    if (g->stream == i) rd_sb_printf(body, "      ob%d[L - L0] = %s;\n", i, v);
    else rd_sb_printf(body, "      p%d[L] = %s;\n", i, v);
    if (G->nm > 1) g->member[i] = 1;
  }
  if (streams)
    rd_sb_printf(body, "    }\n    gc_stream(p%d + L0, ob%d, (L1 - L0) * %d);\n  }\n", g->stream,
                  g->stream, (int)graft_dtype_size(p->instr[g->stream].dtype));
  else
    rd_sb_puts(body, "  }\n");
  if (g->violation) return CPU_GEN_NOT_ROW_LOCAL;
  return g->r.need_unravel && p->instr[G->inst[0]].ndim >= 2 ? CPU_GEN_NEEDS_COORDS : CPU_GEN_OK;
}

/* Generates the kernel of group G into out; returns a CPU_GEN_* code. One function (~95 lines):
 * the loop nest's header, members' bodies and stores, and the row-scratch and streaming
 * declarations share the same per-kernel locals; split, each piece would take most of them. */
static int cpu_gen_once(cpu_cg *g, const cpu_group *G, int kid, rd_sb *out) {
  const exec_program *p = g->r.p;
  int n = p->ninstr;
  unsigned char *writes = calloc((size_t)n, 1);
  rd_sb body = {0};
  g->r.body = &body;
  memset(g->r.reads, 0, (size_t)n);
  memset(g->member, 0, (size_t)n);
  g->violation = 0;
  g->r.need_unravel = 0;
  g->r.ntmp = 0;
  g->gouter = G->a > 0 ? G->a : 0;
  g->oshape = G->a >= 0 ? G->oshape : NULL;
  g->ond = G->a >= 0 ? G->ond : 0;
  int rc = 0;
  if (G->a < 0) {
    rc = cpu_gen_flat(g, G, writes, &body);
  } else {
    const exec_instr *f = &p->instr[G->inst[0]];
    bool standalone_reduce = G->nm == 1 && ir_ops[f->op].kind == IR_K_REDUCE;
    if (standalone_reduce && cpu_is_colsum(p, G->inst[0])) {
      cpu_member_colsum(g, G->inst[0]);
      writes[G->inst[0]] = 1;
      goto done;
    }
    rd_sb_puts(&body, "  for (int64_t r = lo; r < hi; r++) {\n");
    if (standalone_reduce) { /* unravel r over the kept dims of the operand */
      const exec_instr *x = &p->instr[f->in[0]];
      int64_t st = 1, mask = cpu_is_arg(f->op) ? (int64_t)1 << IR_ATTR(f->attr, ARG, axis)
                                               : IR_ATTR(f->attr, REDUCE, mask);
      for (int d = x->ndim - 1; d >= 0; d--) {
        if (mask >> d & 1) continue;
        rd_sb_printf(&body, "    const int64_t i%d = r / %" PRId64 " %% %" PRId64 ";\n", d, st,
                      x->shape[d]);
        st *= x->shape[d];
      }
    } else {
      int64_t st = 1;
      for (int d = G->a - 1; d >= 0; d--) {
        rd_sb_printf(&body, "    const int64_t i%d = r / %" PRId64 " %% %" PRId64 ";\n", d, st,
                      G->oshape[d]);
        st *= G->oshape[d];
      }
    }
    for (int m = 0; m < G->nm && !g->violation; m++) {
      int i = G->inst[m];
      rd_sb_printf(&body, "    { /* %s */\n", ir_ops[p->instr[i].op].name);
      if (cpu_is_arg(p->instr[i].op)) cpu_member_arg(g, i);
      else if (ir_ops[p->instr[i].op].kind == IR_K_REDUCE) cpu_member_reduce(g, i, G->nm == 1);
      else cpu_member_kernel(g, i, G->a, G->nm == 1);
      rd_sb_puts(&body, "    }\n");
      writes[i] = 1;
      if (G->nm > 1) g->member[i] = 1;
      for (int s = 0; s < n && g->rc_state; s++)
        if (g->rc_state[s] == 3) g->rc_state[s] = 2;
    }
    rd_sb_puts(&body, "  }\n");
    if (g->violation) rc = CPU_GEN_NOT_ROW_LOCAL;
  }
done:
  if (g->stream >= 0) rd_sb_puts(&body, "  gc_sfence();\n");
  if (!rc) {
    rd_sb def = {0};
    cpu_kernel_head(g, &def, kid, writes);
    rd_sb_puts(&def, body.s ? body.s : "");
    rd_sb_puts(&def, "}\n\n");
    if (def.oom) g->r.failed = 1;
    cpu_kernel_emit(g, out, kid, writes, &def);
    rd_sb_free(&def);
  }
  if (body.oom) g->r.failed = 1;
  rd_sb_free(&body);
  free(writes);
  return rc;
}

static size_t cpu_env_bytes(const char *name, size_t dflt) {
  const char *e = getenv(name);
  return e && *e ? (size_t)strtoull(e, NULL, 10) : dflt;
}

/* The size from which instruction ins's output leaves through streaming stores. */
static size_t cpu_nt_min_bytes(const cpu_cg *g, const exec_instr *ins) {
  size_t all = cpu_env_bytes("GRAFT_NT_MIN_BYTES", CPU_NT_MIN_BYTES);
  if (!ins->is_output || ins->last_use >= 0 || g->footprint < CPU_NT_FOOTPRINT) return all;
  size_t out = cpu_env_bytes("GRAFT_NT_OUT_MIN_BYTES", CPU_NT_OUT_MIN_BYTES);
  return out < all ? out : all;
}

/* Generates group G: picks the member whose output streams out, and (row groups) the values
 * worth a row scratch, by generating it a few times and counting re-evaluations. */
static int cpu_gen_group(cpu_cg *g, const cpu_group *G, int kid, rd_sb *out) {
  const exec_program *p = g->r.p;
  int n = p->ninstr, last = G->inst[G->nm - 1];
  const exec_instr *li = &p->instr[last];
  size_t esz = graft_dtype_size(li->dtype);
  g->stream = -1;
  if (g->r.pl->role[last] == FUSE_KERNEL && (size_t)li->numel * esz >= cpu_nt_min_bytes(g, li)) {
    if (G->a < 0) g->stream = last;
    else if (li->ndim == G->ond && !memcmp(li->shape, G->oshape, sizeof(int64_t) * (size_t)G->ond)) {
      int64_t len = 1;
      for (int d = G->a; d < G->ond; d++) len *= G->oshape[d];
      if (len * (int64_t)esz <= CPU_ROW_SCRATCH_BYTES && len * (int64_t)esz >= 256) g->stream = last;
    }
  }
  if (G->a < 0 || G->nm < 2) return cpu_gen_once(g, G, kid, out);
  memset(g->rc_state, 0, (size_t)n);
  int64_t len = 1, used = 0;
  for (int d = G->a; d < G->ond; d++) len *= G->oshape[d];
  for (int it = 0; it < 4; it++) {
    memset(g->rc_count, 0, sizeof(int) * (size_t)n);
    rd_sb tmp = {0};
    g->trial = 1;
    int rc = cpu_gen_once(g, G, kid, &tmp);
    g->trial = 0;
    rd_sb_free(&tmp);
    for (int s = 0; s < n; s++)
      if (g->rc_state[s]) g->rc_state[s] = 1;
    if (rc) break;
    int best = -1;
    for (int s = n - 1; s >= 0 && best < 0; s--) {
      int64_t bytes = len * (int64_t)graft_dtype_size(p->instr[s].dtype);
      if (!g->rc_state[s] && g->rc_count[s] >= 2 && g->cost[s] >= 8 &&
          used + bytes <= CPU_ROW_SCRATCH_BYTES)
        best = s;
    }
    if (best < 0) break;
    g->rc_state[best] = 1;
    used += len * (int64_t)graft_dtype_size(p->instr[best].dtype);
  }
  int rc = cpu_gen_once(g, G, kid, out);
  memset(g->rc_state, 0, (size_t)n);
  return rc;
}

void cpu_costs(const exec_program *p, const fuse_plan *pl, int *cost) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (pl->role[i] != FUSE_INLINE) { cost[i] = 0; continue; }
    int c = ir_ops[ins->op].cost; /* ops.def's cost column */
    for (int k = 0; k < ins->nin; k++) c += cost[ins->in[k]];
    cost[i] = c > 1000 ? 1000 : c;
  }
}

/* Records where instruction step `step` ends among the code's steps; releases are inserted
 * there once every step's reads are known (cpu_finish_steps). */
static void cpu_emit_releases(cpu_cg *g, int step) {
  if (step < g->r.p->ninstr) g->step_end[step] = (size_t)g->code->nstep;
}

/* The code's steps with each buffer's release after the step of its last use. */
static void cpu_finish_steps(const cpu_cg *g, const int *last_step, int nsteps) {
  const exec_program *p = g->r.p;
  cpu_code *c = g->code;
  cpu_step *raw = c->step;
  int nraw = c->nstep, from = 0;
  c->step = NULL;
  c->nstep = c->cap[0] = 0;
  for (int st = 0; st < nsteps; st++) {
    int to = (int)g->step_end[st];
    if (to < from) continue;
    for (; from < to; from++) cpu_code_step(c, raw[from].kind, raw[from].arg);
    for (int s = 0; s < p->ninstr; s++)
      if (last_step[s] == st && !p->instr[s].is_output) /* params: only if donated */
        cpu_code_step(c, CPU_STEP_RELEASE, s);
  }
  for (; from < nraw; from++) cpu_code_step(c, raw[from].kind, raw[from].arg);
  free(raw);
}

static int64_t cpu_work(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  return ir_ops[ins->op].kind == IR_K_REDUCE ? p->instr[ins->in[0]].numel : ins->numel;
}

/* Can step i join a group whose first member set (a, oshape)? */
static bool cpu_can_join(const exec_program *p, const fuse_plan *pl, int i, int a,
                         const int64_t *oshape) {
  const exec_instr *ins = &p->instr[i];
  if (pl->role[i] == FUSE_REDUCE) {
    int ra;
    if (cpu_is_arg(ins->op) || !cpu_is_trailing_reduce(p, i, &ra) || ra != a) return false;
    const exec_instr *x = &p->instr[ins->in[0]];
    return !memcmp(x->shape, oshape, sizeof(int64_t) * (size_t)a);
  }
  if (pl->role[i] != FUSE_KERNEL || ins->ndim < a) return false;
  return !memcmp(ins->shape, oshape, sizeof(int64_t) * (size_t)a);
}


void cpu_gen_prelude(rd_sb *out) {
  rd_sb_puts(out, cpu_prelude);
  rd_sb_puts(out, cpu_rt_src);
  rd_sb_puts(out, "\n");
  rd_sb_puts(out, cpu_math_src);
  rd_sb_puts(out, "\n");
  rd_sb_puts(out, ops_math_src);
  rd_sb_puts(out, "\n");
  rd_sb_puts(out, ir_op_math_src);
  rd_sb_puts(out, "\n");
}

/* A BLAS call for the GEMM instruction i (a zero fill when K == 0); marks what it reads. */
static void cpu_gen_gemm_call(const cpu_cg *g, int i, int step, int *last_step) {
  const exec_program *p = g->r.p;
  const exec_instr *ins = &p->instr[i], *A = &p->instr[ins->in[0]];
  int64_t M = A->shape[A->ndim - 2], K = A->shape[A->ndim - 1], N = ins->shape[ins->ndim - 1];
  int64_t batch = (M != 0 && N != 0) ? ins->numel / (M * N) : 0;
  int ta, tb, sa = fuse_library_operand(p, g->r.pl, ins->in[0], &ta), sb = fuse_library_operand(p, g->r.pl, ins->in[1], &tb);
  cpu_gemm_call c = {.dbl = ins->dtype != GRAFT_F32, .ta = ta ? CPU_CBLAS_TRANS : CPU_CBLAS_NO_TRANS,
                     .tb = tb ? CPU_CBLAS_TRANS : CPU_CBLAS_NO_TRANS, .a = sa, .b = sb, .c = i,
                     .m = M, .n = N, .k = batch ? K : 0, .lda = ta ? M : K, .sa = M * K,
                     .ldb = tb ? K : N, .sb = K * N, .ldc = N, .sc = M * N, .batch = batch,
                     .numel = ins->numel};
  cpu_code_step(g->code, CPU_STEP_ALLOC, i);
  cpu_code_step(g->code, CPU_STEP_GEMM, cpu_code_gemm(g->code, &c));
  last_step[sa] = last_step[sb] = step;
}

/* The group starting at kernel/reduce step i: it plus the following kernel/reduce steps that
 * share its rows (dims [0, *a) of *osh). */
static void cpu_form_group(const cpu_cg *g, int i, int *inst, cpu_group *G, int *a,
                           const int64_t **osh, int *ond) {
  const exec_program *p = g->r.p;
  const exec_instr *ins = &p->instr[i];
  int role = g->r.pl->role[i];
  *a = 0, *ond = 0, *osh = NULL;
  *G = (cpu_group){.inst = inst, .nm = 0, .a = -1, .oshape = NULL};
  if (role == FUSE_REDUCE && !cpu_is_arg(ins->op) && cpu_is_trailing_reduce(p, i, a)) {
    *osh = p->instr[ins->in[0]].shape;
    *ond = p->instr[ins->in[0]].ndim;
  } else if (role == FUSE_KERNEL && ins->ndim >= 2) {
    *a = ins->ndim - 1;
    *osh = ins->shape;
    *ond = ins->ndim;
  }
  inst[G->nm++] = i;
  if (!*osh || *a < 1) return;
  for (int j = i + 1; j < p->ninstr; j++) {
    int rj = g->r.pl->role[j];
    if (rj == FUSE_INLINE || rj == FUSE_DEAD || rj == FUSE_PARAM) continue;
    if (!cpu_can_join(p, g->r.pl, j, *a, *osh)) break;
    inst[G->nm++] = j;
  }
}

/* A lone kernel that needs coordinates: the first of its trailing dims (from dim 1 on, so the
 * rows stay units of parallel work) whose strides compose in every load, merged into one loop
 * (cpu_aff.c; the emitting state stays set for cpu_member_kernel), or -1. Not for outputs that
 * stream out (their rows are written through cpu_row_inner's coordinates). */
static int cpu_kernel_merge(cpu_cg *g, int i) {
  const exec_instr *ins = &g->r.p->instr[i];
  if ((size_t)ins->numel * graft_dtype_size(ins->dtype) >= cpu_nt_min_bytes(g, ins)) return -1;
  int cand[GRAFT_MAX_DIMS], nc = 0;
  for (int d = 1; d < ins->ndim; d++)
    if (ins->shape[d] > 1) cand[nc++] = d;
  rd_sb scratch = {0};
  g->r.body = &scratch;
  memset(g->member, 0, (size_t)g->r.p->ninstr);
  g->split_var = NULL;
  g->r.self = i;
  int k = cpu_aff_plan(g, i, ins->ndim, ins->shape, cand, nc);
  g->r.body = NULL;
  rd_sb_free(&scratch);
  return k ? cand[nc - k] : -1;
}

/* A group of several elementwise members of one shape: a candidate for one flat loop (the
 * rows of a [512, 512, 3, 3] weight update would be 3 elements long). */
static bool cpu_group_flat_shaped(const cpu_cg *g, const cpu_group *G) {
  const exec_program *p = g->r.p;
  const exec_instr *f = &p->instr[G->inst[0]];
  if (G->nm < 2) return false;
  for (int m = 0; m < G->nm; m++) {
    const exec_instr *x = &p->instr[G->inst[m]];
    if (g->r.pl->role[G->inst[m]] != FUSE_KERNEL || x->ndim != f->ndim ||
        memcmp(x->shape, f->shape, sizeof(int64_t) * (size_t)f->ndim))
      return false;
  }
  return true;
}

/* Generates group G's kernel: a lone kernel, or a group of elementwise members of one shape,
 * flat when it can be, else by rows; a row group shrinks until its members are row-local. Returns a CPU_GEN_* code (OK when done). */
static int cpu_gen_group_fitted(cpu_cg *g, cpu_group *G, int a, const int64_t *osh, int ond,
                                int kid, rd_sb *kern) {
  const exec_instr *ins = &g->r.p->instr[G->inst[0]];
  int role = g->r.pl->role[G->inst[0]], rc;
  if (G->nm == 1 && role == FUSE_KERNEL) {
    G->a = -1; /* try flat */
    rc = cpu_gen_group(g, G, kid, kern);
    if (rc == CPU_GEN_NEEDS_COORDS) {
      G->a = ins->ndim - 1;
      G->oshape = ins->shape;
      G->ond = ins->ndim;
      int from = cpu_kernel_merge(g, G->inst[0]);
      if (from >= 1) G->a = g->kmerge_from = from;
      rc = cpu_gen_group(g, G, kid, kern);
      g->kmerge_from = -1;
      cpu_aff_end(g);
    }
    return rc;
  }
  if (cpu_group_flat_shaped(g, G)) { /* flat when no load needs coordinates */
    G->a = -1;
    rc = cpu_gen_group(g, G, kid, kern);
    if (rc == CPU_GEN_OK) return rc;
  }
  G->a = G->nm > 1 ? a : 0;
  G->oshape = osh;
  G->ond = ond;
  if (G->nm == 1) G->a = role == FUSE_REDUCE ? 0 : G->a;
  while ((rc = cpu_gen_group(g, G, kid, kern)) == CPU_GEN_NOT_ROW_LOCAL && G->nm > 1) G->nm--;
  if (G->nm == 1 && rc == CPU_GEN_NOT_ROW_LOCAL) rc = cpu_gen_group(g, G, kid, kern);
  return rc;
}

/* The steps of kernel kid: allocates the members' outputs, then runs it over its units
 * on the pool when its work (elements times a rough per-element cost: a col2im sum of 9 padded
 * slices over a small tensor is worth both threads; a copy of the same size is not) is enough. */
static void cpu_gen_launch(const cpu_cg *g, const cpu_group *G, int kid, int *kernel_of) {
  const exec_program *p = g->r.p;
  const exec_instr *ins = &p->instr[G->inst[0]];
  int64_t units, work = 0;
  if (G->a < 0) units = ins->numel;
  else if (G->nm == 1 && g->r.pl->role[G->inst[0]] == FUSE_REDUCE) units = ins->numel;
  else {
    units = 1;
    for (int d = 0; d < G->a; d++) units *= G->oshape[d];
  }
  int mem0 = g->code->nmembers;
  for (int m = 0; m < G->nm; m++) {
    int64_t c = 1;
    const exec_instr *mi = &p->instr[G->inst[m]];
    for (int k = 0; k < mi->nin && g->cost; k++) c += g->cost[mi->in[k]];
    work += cpu_work(p, G->inst[m]) * c;
    cpu_code_step(g->code, CPU_STEP_ALLOC, G->inst[m]);
    cpu_code_member(g->code, G->inst[m]);
    if (kernel_of) kernel_of[G->inst[m]] = kid;
  }
  cpu_launch l = {g->cur_body, work >= CPU_PAR_MIN_WORK && units >= 2, units, g->cur_slot0,
                  g->cur_nslot, mem0, G->nm, work};
  cpu_code_step(g->code, CPU_STEP_KERNEL, cpu_code_launch(g->code, &l));
}

static cpu_cg *cpu_cg_new(const exec_program *p, const fuse_plan *pl) {
  size_t n = (size_t)p->ninstr + 1;
  cpu_cg *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->r.p = p;
  g->r.pl = pl;
  cpu_expr_init(g);
  g->step_end = calloc(n, sizeof(size_t));
  g->r.reads = calloc(n, 1);
  g->member = calloc(n, 1);
  g->rc_state = calloc(n, 1);
  g->rc_count = calloc(n, sizeof(int));
  g->cost = calloc(n, sizeof(int));
  g->body_kid = calloc(n, sizeof(int));
  if (g->cost) cpu_costs(p, pl, g->cost);
  g->kmerge_from = -1;
  for (int i = 0; i < p->ninstr; i++)
    if (pl->role[i] != FUSE_INLINE && pl->role[i] != FUSE_DEAD)
      g->footprint += (size_t)p->instr[i].numel * graft_dtype_size(p->instr[i].dtype);
  return g;
}

static void cpu_cg_free(cpu_cg *g) {
  rd_arena_free(&g->r.ar);
  cpu_dedup_free(&g->dedup);
  rd_memo_free(&g->r);
  free(g->step_end);
  free(g->r.reads);
  free(g->member);
  free(g->rc_state);
  free(g->rc_count);
  free(g->cost);
  free(g->body_kid);
  free(g);
}

/* The steps, per instruction with work: fallbacks, GEMM calls and kernels (each a group of
 * instructions sharing rows). Returns the number of instruction steps (releases come later);
 * the new bodies' definitions go to kern. */
static int cpu_gen_steps(cpu_cg *g, int *inst, int *last_step, int *kernel_of, rd_sb *kern) {
  const exec_program *p = g->r.p;
  int n = p->ninstr, kid = 0, step = 0;
  for (int i = 0; i < n; i++) last_step[i] = -1;
  for (int i = 0; i < n; i++, step++) {
    int role = g->r.pl->role[i];
    const exec_instr *ins = &p->instr[i];
    if (role == FUSE_FALLBACK) {
      cpu_code_step(g->code, CPU_STEP_FALLBACK, i);
      for (int k = 0; k < ins->nin; k++) last_step[ins->in[k]] = step;
    } else if (role == FUSE_LIBRARY) {
      cpu_gen_gemm_call(g, i, step, last_step);
    } else if (role == FUSE_KERNEL || role == FUSE_REDUCE) {
      cpu_group G;
      int a, ond;
      const int64_t *osh;
      cpu_form_group(g, i, inst, &G, &a, &osh, &ond);
      g->cur_body = -1;
      if (cpu_gen_group_fitted(g, &G, a, osh, ond, kid, kern) != CPU_GEN_OK || g->cur_body < 0)
        g->r.failed = 1;
      cpu_gen_launch(g, &G, kid, kernel_of);
      for (int s = 0; s < n; s++)
        if (g->r.reads[s]) last_step[s] = step;
      kid++;
      i = G.inst[G.nm - 1]; /* skip the members consumed (and inline/dead nodes between) */
    } else {
      step--; /* inlined, dead or a parameter: no step */
      continue;
    }
    cpu_emit_releases(g, step);
  }
  return step;
}

int cpu_codegen(const exec_program *p, const fuse_plan *pl, cpu_code *code, rd_sb *out,
                int *kernel_of) {
  int n = p->ninstr;
  memset(code, 0, sizeof *code);
  cpu_cg *g = cpu_cg_new(p, pl);
  int *last_step = malloc(sizeof(int) * ((size_t)n + 1));
  int *inst = malloc(sizeof(int) * ((size_t)n + 1));
  bool ok = g && last_step && inst && g->step_end && g->r.reads && g->member && g->rc_state &&
            g->rc_count && g->cost && g->body_kid;
  if (!ok) {
    if (g) cpu_cg_free(g);
    free(last_step);
    free(inst);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory generating code");
    return -1;
  }
  g->code = code;
  rd_sb kern = {0};
  cpu_gen_prelude(out);
  int nsteps = cpu_gen_steps(g, inst, last_step, kernel_of, &kern);
  for (int k = 0; k < p->noutputs; k++) /* a buffer an output shares lives past the run */
    last_step[cpu_plan_buffer_of(p, pl, p->output_slot[k])] = -1;
  cpu_finish_steps(g, last_step, nsteps);
  for (int k = 0; k < code->nbody && k < g->dedup.n; k++) { /* the canonical texts move over */
    code->body[k].text = g->dedup.v[k].text;
    g->dedup.v[k].text = NULL;
  }
  rd_sb_puts(out, kern.s ? kern.s : "");
  cpu_code_render(code, p, g->body_kid, out);
  int failed = g->r.failed || kern.oom || out->oom || code->oom || code->nbody != g->dedup.n;
  char fail_what[sizeof g->r.fail_what + 2];
  snprintf(fail_what, sizeof fail_what, "%s%s", g->r.failed && g->r.fail_what[0] ? ": " : "",
           g->r.failed ? g->r.fail_what : "");
  rd_sb_free(&kern);
  cpu_cg_free(g);
  free(last_step);
  free(inst);
  if (failed) {
    cpu_code_free(code);
    err_set(GRAFT_ERR_INTERNAL, "cpu: code generation failed%s", fail_what);
    return -1;
  }
  return 0;
}
