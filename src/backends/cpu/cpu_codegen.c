/* Renders a program as one C translation unit: a prelude (runtime struct, math), one function
 * per kernel (a fused loop nest; a "row group" runs several kernels row by row so a reduction
 * and the elementwise work that reads it back stay in cache: softmax, layer_norm), and the
 * entry `graft_entry`, which allocates, runs kernels (on the pool when big), calls BLAS and the
 * reference fallbacks, and frees buffers after their last use. */
#include "cpu_codegen.h"
#include "cpu_math.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define CPU_PAR_MIN_WORK 65536

static _Thread_local size_t *cpu_step_end;

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
    "static inline int64_t gc_clamp(int64_t q, int64_t n) { return q < 0 ? 0 : q >= n ? n - 1 : q; }\n";

typedef struct {
  int *inst; /* members, in order */
  int nm;
  int a;     /* outer dims (row mode); -1 = flat elementwise */
  const int64_t *oshape;
} cpu_group;

static bool cpu_is_trailing_reduce(const exec_program *p, int i, int *a) {
  const exec_instr *x = &p->instr[p->instr[i].in[0]];
  int64_t mask = p->instr[i].attr.a[0];
  int nr = 0;
  for (int d = 0; d < x->ndim; d++) nr += (int)(mask >> d & 1);
  *a = x->ndim - nr;
  int64_t want = ((int64_t)1 << x->ndim) - 1 - (((int64_t)1 << *a) - 1);
  return mask == want;
}

/* Loops over dims [from, nd) of shape, variables i<d>. */
static void cpu_open_loops(cpu_sb *b, int from, int nd, const int64_t *shape, const char *pragma) {
  for (int d = from; d < nd; d++) {
    if (pragma && d == nd - 1) cpu_sb_printf(b, "    %s\n", pragma);
    cpu_sb_printf(b, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d, shape[d], d);
  }
}
static void cpu_close_loops(cpu_sb *b, int n) {
  for (int d = 0; d < n; d++) cpu_sb_puts(b, "    }\n");
}

static cpu_pos cpu_loop_pos(cpu_cg *g, int nd, const int64_t *shape) {
  cpu_pos pos = {.nd = nd, .shape = shape, .has_c = 1};
  for (int d = 0; d < nd; d++) pos.c[d] = shape[d] == 1 ? "0" : cpu_fmt(&g->ar, "i%d", d);
  return pos;
}

/* Elementwise root i, row mode: outer vars i0..i<a-1> exist. */
static void cpu_member_kernel(cpu_cg *g, int i, int a) {
  const exec_instr *ins = &g->p->instr[i];
  cpu_open_loops(g->body, a, ins->ndim, ins->shape, NULL);
  g->nmemo = 0;
  g->self = i;
  cpu_pos pos = cpu_loop_pos(g, ins->ndim, ins->shape);
  const char *v = cpu_value(g, i, pos);
  cpu_sb_printf(g->body, "      p%d[%s] = %s;\n", i, cpu_pos_lin(g, &pos), v);
  cpu_close_loops(g->body, ins->ndim - a);
}

/* Reduction root i: vars for its kept dims exist; the unit index r is the output index. */
static void cpu_member_reduce(cpu_cg *g, int i) {
  const exec_instr *ins = &g->p->instr[i];
  const exec_instr *x = &g->p->instr[ins->in[0]];
  int64_t mask = ins->attr.a[0];
  graft_dtype dt = ins->dtype;
  bool fl = dt == GRAFT_F32 || dt == GRAFT_F64;
  bool mx = ins->op == IR_REDUCE_MAX, mn = ins->op == IR_REDUCE_MIN;
  const char *T = cpu_ctype(dt), *acc_t, *init, *red;
  if (fl && !mx && !mn) {
    acc_t = "double";
    init = ins->op == IR_REDUCE_SUM ? "0.0" : "1.0";
  } else if (fl) {
    acc_t = T;
    init = mx ? "-INFINITY" : "INFINITY";
  } else if (!mx && !mn) {
    acc_t = "uint64_t";
    init = ins->op == IR_REDUCE_SUM ? "0" : "1";
  } else {
    acc_t = "int64_t";
    static const char *mins[] = {[GRAFT_I32] = "INT32_MIN", [GRAFT_I64] = "INT64_MIN",
                                 [GRAFT_U8] = "0", [GRAFT_BOOL] = "0"};
    static const char *maxs[] = {[GRAFT_I32] = "INT32_MAX", [GRAFT_I64] = "INT64_MAX",
                                 [GRAFT_U8] = "255", [GRAFT_BOOL] = "1"};
    init = mx ? mins[dt] : maxs[dt];
  }
  red = ins->op == IR_REDUCE_SUM ? "+" : ins->op == IR_REDUCE_PROD ? "*" : mx ? "max" : "min";
  int last = -1, nr = 0;
  for (int d = 0; d < x->ndim; d++)
    if (mask >> d & 1) { last = d; nr++; }
  cpu_sb_printf(g->body, "    %s acc%d = %s; int nfa%d = 0; (void)nfa%d;\n", acc_t, i, init, i, i);
  /* outer reduced loops */
  for (int d = 0; d < x->ndim; d++)
    if ((mask >> d & 1) && d != last)
      cpu_sb_printf(g->body, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", d, d,
                    x->shape[d], d);
  const char *a2 = nr ? "a2" : cpu_fmt(&g->ar, "acc%d", i), *nf = nr ? "nf" : cpu_fmt(&g->ar, "nfa%d", i);
  if (nr) {
    cpu_sb_printf(g->body, "    %s a2 = %s; int nf = 0;\n", acc_t, init);
    cpu_sb_printf(g->body, "    #pragma omp simd reduction(%s:a2)%s\n", red,
                  fl && (mx || mn) ? " reduction(|:nf)" : "");
    cpu_sb_printf(g->body, "    for (int64_t i%d = 0; i%d < %" PRId64 "; i%d++) {\n", last, last,
                  x->shape[last], last);
  }
  g->nmemo = 0;
  g->self = -1;
  cpu_pos pos = cpu_loop_pos(g, x->ndim, x->shape);
  const char *v = cpu_value(g, ins->in[0], pos);
  if (fl && !mx && !mn) cpu_sb_printf(g->body, "      %s %s= (double)%s;\n", a2, red, v);
  else if (fl) cpu_sb_printf(g->body, "      %s = %s %s %s ? %s : %s; %s |= %s != %s;\n", a2, v,
                             mx ? ">" : "<", a2, v, a2, nf, v, v);
  else if (!mx && !mn) cpu_sb_printf(g->body, "      %s %s= (uint64_t)(int64_t)%s;\n", a2, red, v);
  else cpu_sb_printf(g->body, "      %s = (int64_t)%s %s %s ? (int64_t)%s : %s;\n", a2, v,
                     mx ? ">" : "<", a2, v, a2);
  if (nr) {
    cpu_sb_puts(g->body, "    }\n");
    if (!mx && !mn) cpu_sb_printf(g->body, "    acc%d %s= a2;\n", i, red);
    else cpu_sb_printf(g->body, "    acc%d = a2 %s acc%d ? a2 : acc%d; nfa%d |= nf;\n", i,
                       mx ? ">" : "<", i, i, i);
    cpu_close_loops(g->body, nr - 1);
  }
  const char *fin;
  if (fl && (mx || mn)) fin = cpu_fmt(&g->ar, "nfa%d ? (%s)NAN : acc%d", i, T, i);
  else if (fl) fin = cpu_fmt(&g->ar, "(%s)acc%d", T, i);
  else if (dt == GRAFT_BOOL) fin = cpu_fmt(&g->ar, "(uint8_t)(acc%d != 0)", i);
  else fin = cpu_fmt(&g->ar, "(%s)(uint64_t)acc%d", T, i);
  cpu_sb_printf(g->body, "    p%d[r] = %s;\n", i, fin);
}

/* Pointer declarations for the slots a kernel touches. */
static void cpu_kernel_head(cpu_cg *g, cpu_sb *out, int kid, const unsigned char *writes) {
  cpu_sb_printf(out, "static void k%d(void **S, int64_t lo, int64_t hi) {\n", kid);
  for (int s = 0; s < g->p->ninstr; s++) {
    if (!g->reads[s] && !writes[s]) continue;
    const char *T = cpu_ctype(g->p->instr[s].dtype);
    cpu_sb_printf(out, "  %s%s *restrict p%d = (%s%s *)S[%d];\n", writes[s] ? "" : "const ", T,
                  s, writes[s] ? "" : "const ", T, s);
  }
}

/* Generates the kernel of group G into out; returns 0, or 1 when a member violated
 * row-locality (the caller shrinks the group), or 2 for a flat kernel that needed coords. */
static int cpu_gen_group(cpu_cg *g, const cpu_group *G, int kid, cpu_sb *out) {
  const exec_program *p = g->p;
  int n = p->ninstr;
  unsigned char *writes = calloc((size_t)n, 1);
  cpu_sb body = {0};
  g->body = &body;
  memset(g->reads, 0, (size_t)n);
  memset(g->member, 0, (size_t)n);
  g->violation = 0;
  g->need_unravel = 0;
  g->ntmp = 0;
  g->gouter = G->a > 0 ? G->a : 0;
  g->oshape = G->oshape;
  int rc = 0;
  if (G->a < 0) { /* flat elementwise */
    int i = G->inst[0];
    const exec_instr *ins = &p->instr[i];
    writes[i] = 1;
    cpu_sb_puts(&body, "  for (int64_t L = lo; L < hi; L++) {\n");
    g->nmemo = 0;
    g->self = i;
    cpu_pos pos = {.nd = ins->ndim, .shape = ins->shape, .lin = "L"};
    if (ins->ndim <= 1) {
      pos.has_c = 1;
      if (ins->ndim == 1) pos.c[0] = ins->shape[0] == 1 ? "0" : "L";
    }
    const char *v = cpu_value(g, i, pos);
    cpu_sb_printf(&body, "      p%d[L] = %s;\n  }\n", i, v);
    if (g->need_unravel && ins->ndim >= 2) rc = 2;
  } else {
    const exec_instr *f = &p->instr[G->inst[0]];
    bool standalone_reduce = G->nm == 1 && ir_ops[f->op].kind == IR_K_REDUCE;
    cpu_sb_puts(&body, "  for (int64_t r = lo; r < hi; r++) {\n");
    if (standalone_reduce) { /* unravel r over the kept dims of the operand */
      const exec_instr *x = &p->instr[f->in[0]];
      int64_t st = 1;
      for (int d = x->ndim - 1; d >= 0; d--) {
        if (f->attr.a[0] >> d & 1) continue;
        cpu_sb_printf(&body, "    const int64_t i%d = r / %" PRId64 " %% %" PRId64 ";\n", d, st,
                      x->shape[d]);
        st *= x->shape[d];
      }
    } else {
      int64_t st = 1;
      for (int d = G->a - 1; d >= 0; d--) {
        cpu_sb_printf(&body, "    const int64_t i%d = r / %" PRId64 " %% %" PRId64 ";\n", d, st,
                      G->oshape[d]);
        st *= G->oshape[d];
      }
    }
    for (int m = 0; m < G->nm && !g->violation; m++) {
      int i = G->inst[m];
      cpu_sb_printf(&body, "    { /* %s */\n", ir_ops[p->instr[i].op].name);
      if (ir_ops[p->instr[i].op].kind == IR_K_REDUCE) cpu_member_reduce(g, i);
      else cpu_member_kernel(g, i, G->a);
      cpu_sb_puts(&body, "    }\n");
      writes[i] = 1;
      if (G->nm > 1) g->member[i] = 1;
    }
    cpu_sb_puts(&body, "  }\n");
    if (g->violation) rc = 1;
  }
  if (!rc) {
    cpu_kernel_head(g, out, kid, writes);
    cpu_sb_puts(out, body.s ? body.s : "");
    cpu_sb_puts(out, "}\n\n");
  }
  if (body.oom) g->failed = 1;
  cpu_sb_free(&body);
  free(writes);
  return rc;
}

/* Records where step `step` ends in the entry text; releases are inserted there once every
 * step's reads are known (cpu_finish_entry). */
static void cpu_emit_releases(const exec_program *p, const cpu_plan *pl, const int *last_step,
                              int step, cpu_sb *entry) {
  (void)p; (void)pl; (void)last_step;
  if (step < p->ninstr) cpu_step_end[step] = entry->n;
}

static void cpu_finish_entry(const exec_program *p, const cpu_plan *pl, const int *last_step,
                             int nsteps, const cpu_sb *entry, cpu_sb *out) {
  size_t from = 0;
  for (int st = 0; st < nsteps; st++) {
    size_t to = cpu_step_end[st];
    if (to < from) continue;
    if (entry->s) {
      char *chunk = strndup(entry->s + from, to - from);
      if (chunk) cpu_sb_puts(out, chunk);
      else out->oom = 1;
      free(chunk);
    }
    from = to;
    for (int s = 0; s < p->ninstr; s++)
      if (last_step[s] == st && pl->role[s] != CPU_PARAM && !p->instr[s].is_output)
        cpu_sb_printf(out, "  rt->release(rt->ctx, %d);\n", s);
  }
  if (entry->s) cpu_sb_puts(out, entry->s + from);
}

static int64_t cpu_work(const exec_program *p, int i) {
  const exec_instr *ins = &p->instr[i];
  return ir_ops[ins->op].kind == IR_K_REDUCE ? p->instr[ins->in[0]].numel : ins->numel;
}

/* Can step i join a group whose first member set (a, oshape)? */
static bool cpu_can_join(const exec_program *p, const cpu_plan *pl, int i, int a,
                         const int64_t *oshape) {
  const exec_instr *ins = &p->instr[i];
  if (pl->role[i] == CPU_REDUCE) {
    int ra;
    if (ins->op == IR_ARGMAX || !cpu_is_trailing_reduce(p, i, &ra) || ra != a) return false;
    const exec_instr *x = &p->instr[ins->in[0]];
    return !memcmp(x->shape, oshape, sizeof(int64_t) * (size_t)a);
  }
  if (pl->role[i] != CPU_KERNEL || ins->ndim < a) return false;
  return !memcmp(ins->shape, oshape, sizeof(int64_t) * (size_t)a);
}

int cpu_codegen(const exec_program *p, const cpu_plan *pl, cpu_sb *out, int *nkernels) {
  int n = p->ninstr;
  cpu_cg *g = calloc(1, sizeof *g);
  int *last_step = malloc(sizeof(int) * ((size_t)n + 1));
  int *inst = malloc(sizeof(int) * ((size_t)n + 1));
  cpu_step_end = calloc((size_t)n + 1, sizeof(size_t));
  if (!g || !last_step || !inst || !cpu_step_end) {
    free(cpu_step_end);
    free(g);
    free(last_step);
    free(inst);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory generating code");
    return -1;
  }
  g->p = p;
  g->pl = pl;
  g->reads = calloc((size_t)n + 1, 1);
  g->member = calloc((size_t)n + 1, 1);
  cpu_sb kern = {0}, entry = {0};
  cpu_sb_puts(out, cpu_prelude);
  cpu_sb_puts(out, cpu_rt_src);
  cpu_sb_puts(out, "\n");
  cpu_sb_puts(out, cpu_math_src);
  cpu_sb_puts(out, "\n\n");
  cpu_sb_puts(&entry, "int graft_entry(const cpu_rt *rt) {\n  void **S = rt->S;\n  (void)S;\n");
  for (int i = 0; i < n; i++) last_step[i] = -1;
  int kid = 0, step = 0;
  for (int i = 0; i < n && g->reads; i++, step++) {
    int role = pl->role[i];
    const exec_instr *ins = &p->instr[i];
    if (role == CPU_FALLBACK) {
      cpu_sb_printf(&entry, "  if (rt->fallback(rt->ctx, %d)) return -1;\n", i);
      for (int k = 0; k < ins->nin; k++) last_step[ins->in[k]] = step;
      cpu_emit_releases(p, pl, last_step, step, &entry);
      continue;
    }
    if (role == CPU_GEMM) {
      const exec_instr *A = &p->instr[ins->in[0]];
      int64_t M = A->shape[A->ndim - 2], K = A->shape[A->ndim - 1], N = ins->shape[ins->ndim - 1];
      int64_t batch = (M != 0 && N != 0) ? ins->numel / (M * N) : 0;
      const char *T = cpu_ctype(ins->dtype);
      bool f = ins->dtype == GRAFT_F32;
      cpu_sb_printf(&entry, "  if (rt->alloc(rt->ctx, %d)) return -1;\n  {\n", i);
      cpu_sb_printf(&entry, "    const %s *A = (const %s *)S[%d], *B = (const %s *)S[%d];\n", T,
                    T, ins->in[0], T, ins->in[1]);
      cpu_sb_printf(&entry, "    %s *C = (%s *)S[%d];\n    (void)A; (void)B; (void)C;\n", T, T, i);
      if (K == 0)
        cpu_sb_printf(&entry, "    for (int64_t q = 0; q < %" PRId64 "; q++) C[q] = 0;\n", ins->numel);
      else if (batch)
        cpu_sb_printf(&entry,
                      "    for (int64_t q = 0; q < %" PRId64 "; q++)\n      rt->%s(101, 111, 111, %"
                      PRId64 ", %" PRId64 ", %" PRId64 ", 1, A + q * %" PRId64 ", %" PRId64
                      ", B + q * %" PRId64 ", %" PRId64 ", 0, C + q * %" PRId64 ", %" PRId64 ");\n",
                      batch, f ? "sgemm" : "dgemm", M, N, K, M * K, K, K * N, N, M * N, N);
      cpu_sb_puts(&entry, "  }\n");
      for (int k = 0; k < ins->nin; k++) last_step[ins->in[k]] = step;
      cpu_emit_releases(p, pl, last_step, step, &entry);
      continue;
    }
    if (role != CPU_KERNEL && role != CPU_REDUCE) { step--; continue; }
    /* Form a group: this step plus following kernel/reduce steps sharing its rows. */
    cpu_group G = {.inst = inst, .nm = 0, .a = -1, .oshape = NULL};
    int a = 0;
    const int64_t *osh = NULL;
    if (role == CPU_REDUCE && cpu_is_trailing_reduce(p, i, &a)) osh = p->instr[ins->in[0]].shape;
    else if (role == CPU_KERNEL && ins->ndim >= 2) { a = ins->ndim - 1; osh = ins->shape; }
    inst[G.nm++] = i;
    int j = i + 1;
    if (osh && a >= 1) {
      for (; j < n; j++) {
        int rj = pl->role[j];
        if (rj == CPU_INLINE || rj == CPU_DEAD || rj == CPU_PARAM) continue;
        if (!cpu_can_join(p, pl, j, a, osh)) break;
        inst[G.nm++] = j;
      }
    }
    int rc;
    if (G.nm == 1 && role == CPU_KERNEL) {
      G.a = -1; /* try flat */
      rc = cpu_gen_group(g, &G, kid, &kern);
      if (rc == 2) {
        G.a = ins->ndim - 1;
        G.oshape = ins->shape;
        rc = cpu_gen_group(g, &G, kid, &kern);
      }
    } else {
      G.a = G.nm > 1 ? a : 0;
      G.oshape = osh;
      if (G.nm == 1) G.a = role == CPU_REDUCE ? 0 : G.a;
      while ((rc = cpu_gen_group(g, &G, kid, &kern)) == 1 && G.nm > 1) G.nm--;
      if (G.nm == 1 && rc == 1) rc = cpu_gen_group(g, &G, kid, &kern);
    }
    if (rc) g->failed = 1;
    /* units and work */
    int64_t units, work = 0;
    if (G.a < 0) units = ins->numel;
    else if (G.nm == 1 && role == CPU_REDUCE) units = ins->numel;
    else {
      units = 1;
      for (int d = 0; d < G.a; d++) units *= G.oshape[d];
    }
    for (int m = 0; m < G.nm; m++) {
      work += cpu_work(p, G.inst[m]);
      cpu_sb_printf(&entry, "  if (rt->alloc(rt->ctx, %d)) return -1;\n", G.inst[m]);
    }
    if (work >= CPU_PAR_MIN_WORK && units >= 2)
      cpu_sb_printf(&entry, "  rt->parallel(rt->ctx, k%d, S, %" PRId64 ");\n", kid, units);
    else cpu_sb_printf(&entry, "  k%d(S, 0, %" PRId64 ");\n", kid, units);
    for (int s = 0; s < n; s++)
      if (g->reads[s]) last_step[s] = step;
    kid++;
    /* skip the members we consumed (and inline/dead nodes between them) */
    i = G.inst[G.nm - 1];
    cpu_emit_releases(p, pl, last_step, step, &entry);
  }
  cpu_sb_puts(&entry, "  return 0;\n}\n");
  cpu_sb_puts(out, kern.s ? kern.s : "");
  cpu_finish_entry(p, pl, last_step, step, &entry, out);
  free(cpu_step_end);
  cpu_step_end = NULL;
  int failed = g->failed || !g->reads || !g->member || kern.oom || entry.oom || out->oom;
  cpu_sb_free(&kern);
  cpu_sb_free(&entry);
  cpu_arena_free(&g->ar);
  free(g->reads);
  free(g->member);
  free(g);
  free(last_step);
  free(inst);
  *nkernels = kid;
  if (failed) {
    err_set(GRAFT_ERR_INTERNAL, "cpu: code generation failed");
    return -1;
  }
  return 0;
}
