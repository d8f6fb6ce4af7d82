/* The backend vtable: compile = plan + generate + the kernel library's bodies (compiled only
 * where no earlier graph had them); execute = bind buffers and walk the steps (allocation
 * through buffer_new for exact accounting, release at last use, host and reference fallbacks,
 * kernels on the thread pool, BLAS). */
#include "cpu_internal.h"
#include "trace.h"
#include "../ref/ref.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cpu_counters cpu_stats;
static char *cpu_last_src;

const char *cpu_last_source(void) { return cpu_last_src ? cpu_last_src : ""; }

typedef struct {
  cpu_code code;
  cpu_kernel_fn *fn; /* per body */
  int64_t **lits;    /* per body: a size-generic template's literals (cpu_sized.c), or NULL */
  uint64_t hash;
  cpu_profile prof; /* GRAFT_PROFILE: time per kernel and GEMM call site */
  int *out_buf;     /* per output: the slot whose buffer it is (cpu_plan_buffer_of) */
  /* Early outputs (backend_output_final): the outputs in the order their values become final,
   * and the step after which each does (-1: before the first, an input passed through). */
  int *final_order, *final_step;
  char **what; /* per launch (nwhat): its trace span's args (cpu_describe.c), or NULL */
  int nwhat;
  /* A progressive build (backend_partial_ready): it ran before every body had landed. fn[]
   * is read and filled with atomics; a launch whose body is missing runs on the first tier
   * (cpu_partial.c). */
  bool progressive;
  uint64_t (*key)[2];             /* per body: its key in the library */
  _Atomic size_t seen_version;    /* cpu_klib_version at the last look for missing bodies */
  cpu_partial *partial;
} cpu_exe;

typedef struct {
  const exec_program *p;
  exec_buffer **B;
  void **S;
  const unsigned char *is_param;
  cpu_exe *e;
  int site; /* the call site's index within this execution (profiling) */
  void **P; /* a kernel's buffers, gathered for its launch */
} cpu_run;

static bool cpu_supports(const exec_instr *ins) {
  return ins->op == IR_DATA || ref_kernels[ins->op] != NULL; /* what it doesn't generate, it falls back on */
}

/* Compiles may come from the background compile thread and from a caller at once (sync mode):
 * one at a time. */
static pthread_mutex_t cpu_compile_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cpu_src_mu = PTHREAD_MUTEX_INITIALIZER; /* cpu_last_src */

/* What a build may do: compile the missing kernels, only look them up, or (tests) none. */
typedef enum { CPU_BUILD_COMPILE, CPU_BUILD_LIBRARY, CPU_BUILD_UNLANDED } cpu_build;
static void *cpu_compile_locked(const exec_program *p, cpu_opt *opt, cpu_build how);

static void *cpu_compile_opt(const exec_program *p, cpu_opt *opt) {
  pthread_mutex_lock(&cpu_compile_mu);
  void *e = cpu_compile_locked(p, opt, CPU_BUILD_COMPILE);
  pthread_mutex_unlock(&cpu_compile_mu);
  return e;
}

static void *cpu_compile(const exec_program *p) {
  cpu_opt opt = CPU_OPT_FULL;
  return cpu_compile_opt(p, &opt);
}

static void *cpu_compile_quick(const exec_program *p, bool *full) {
  cpu_opt opt = CPU_OPT_QUICK;
  void *e = cpu_compile_opt(p, &opt);
  *full = opt == CPU_OPT_FULL;
  return e;
}

/* On the tracing thread, beside a compile in progress (which may take seconds): it compiles
 * nothing, so it needs no turn (code generation keeps no shared state; the library, the
 * skeletons and the counters have their own locks). */
static void *cpu_compile_cached(const exec_program *p, bool *full) {
  cpu_opt opt = CPU_OPT_QUICK;
  void *e = cpu_compile_locked(p, &opt, CPU_BUILD_LIBRARY);
  *full = opt == CPU_OPT_FULL;
  return e;
}

/* Without the compile lock: a build holds it for seconds, and graft_metrics_get asks here with
 * graft's lock held (graft.metrics() after a step waited 1.7 s for resnet18's background build,
 * and every traced op with it). Every counter is written with atomics. */
static void cpu_backend_stats(backend_stats *out) {
  out->compiles = __atomic_load_n(&cpu_stats.compiles, __ATOMIC_RELAXED);
  out->disk_hits = __atomic_load_n(&cpu_stats.disk_hits, __ATOMIC_RELAXED);
  out->kernels_compiled = __atomic_load_n(&cpu_stats.bodies_compiled, __ATOMIC_RELAXED);
  out->kernels_reused = __atomic_load_n(&cpu_stats.bodies_reused, __ATOMIC_RELAXED);
  out->kernels_sized = __atomic_load_n(&cpu_stats.bodies_sized, __ATOMIC_RELAXED);
  out->disk_refused = __atomic_load_n(&cpu_stats.disk_refused, __ATOMIC_RELAXED);
  out->kernel_choices = __atomic_load_n(&cpu_stats.choices, __ATOMIC_RELAXED);
  out->kernels_demoted = __atomic_load_n(&cpu_stats.demoted, __ATOMIC_RELAXED);
  for (int op = 0; op < IR_OP_COUNT; op++) /* runs on two threads add to them */
    out->fallbacks[op] = __atomic_load_n(&cpu_stats.fallback[op], __ATOMIC_RELAXED);
}

static void cpu_backend_shutdown(void) {
  cpu_pool_shutdown();
  cpu_klib_shutdown();
  cpu_sized_forget();
  pthread_mutex_lock(&cpu_src_mu);
  free(cpu_last_src);
  cpu_last_src = NULL;
  pthread_mutex_unlock(&cpu_src_mu);
}

/* The rendering to GRAFT_DUMP_DIR, beside the IR dumps. */
static void cpu_dump_source(const exec_program *p, const char *src) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".c", dir, p->hash);
  FILE *f = fopen(path, "w");
  if (f) {
    fputs(src, f);
    fclose(f);
  }
}

static void cpu_free_exe(void *exe);

/* The source as the last compile's (cpu_last_source) and into GRAFT_DUMP_DIR. */
static void cpu_keep_source(const exec_program *p, const char *src) {
  pthread_mutex_lock(&cpu_src_mu);
  free(cpu_last_src);
  cpu_last_src = strdup(src);
  pthread_mutex_unlock(&cpu_src_mu);
  cpu_dump_source(p, src);
}

static int cpu_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Each output's final step (e->final_step, e->final_order): the last step that may write its
 * buffer: a kernel naming it (its slots do not say which
 * it reads), a GEMM into it, or the slot's own host or reference kernel; -1 when none does. Slots are
 * written by their own instruction's code only, so after that step the value is final. */
static int cpu_final_steps(cpu_exe *e, const exec_program *p) {
  const cpu_code *c = &e->code;
  int *last = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  if (!last) return -1;
  for (int s = 0; s < p->ninstr; s++) last[s] = -1;
  for (int st = 0; st < c->nstep; st++) {
    int a = c->step[st].arg;
    switch ((cpu_step_kind)c->step[st].kind) {
    case CPU_STEP_FALLBACK: last[a] = st; break;
    case CPU_STEP_GEMM: last[c->gemm[a].c] = st; break;
    case CPU_STEP_KERNEL:
      for (int j = 0; j < c->launch[a].nslot; j++) last[c->slots[c->launch[a].slot0 + j]] = st;
      break;
    default: break;
    }
  }
  int64_t *key = malloc(sizeof(int64_t) * ((size_t)p->noutputs + 1));
  if (!key) {
    free(last);
    return -1;
  }
  for (int k = 0; k < p->noutputs; k++) { /* (step + 1, output): sorted, the outputs in order */
    e->final_step[k] = last[e->out_buf[k]];
    key[k] = (int64_t)(e->final_step[k] + 1) << 32 | k;
  }
  qsort(key, (size_t)p->noutputs, sizeof *key, cpu_cmp_i64);
  for (int k = 0; k < p->noutputs; k++) e->final_order[k] = (int)(key[k] & 0xffffffff);
  free(key);
  free(last);
  return 0;
}

typedef struct {
  cpu_exe *e;
  const exec_program *p;
  const fuse_plan *pl;
} cpu_ready_ctx;

/* A progressive build's executable is complete but for the missing bodies: it is handed out. */
static void cpu_ready(void *arg) {
  cpu_ready_ctx *x = arg;
  x->e->partial = cpu_partial_plan(x->p, x->pl, &x->e->code, x->e->fn);
  if (!x->e->partial) { /* out of memory: it is not handed out */
    graft_clear_error();
    return;
  }
  x->e->progressive = true;
  atomic_store(&x->e->seen_version, cpu_klib_version());
  backend_partial_ready(x->e);
}

void *cpu_compile_unlanded(const exec_program *p) {
  cpu_opt opt = CPU_OPT_QUICK;
  pthread_mutex_lock(&cpu_compile_mu);
  void *e = cpu_compile_locked(p, &opt, CPU_BUILD_UNLANDED);
  pthread_mutex_unlock(&cpu_compile_mu);
  return e;
}

/* e's kernels (code generated into e; plan pl, kof and src its generation's): each body's run
 * function from the library, compiled where it is missing unless lib_only; a progressive
 * build hands e out first (backend_partial_ready). 0, or -1 with the error set. */
static int cpu_kernels(cpu_exe *e, const exec_program *p, const fuse_plan *pl, const int *kof,
                       const rd_sb *src, cpu_opt *opt, bool lib_only, bool draw) {
  /* what the runner of a handed-out executable reads is made first */
  bool progressive = !lib_only && backend_partial_wanted() && !atomic_load(&p->varying);
  if (kof && progressive && (e->what = cpu_describe_kernels(p, pl, &e->code, kof)))
    e->nwhat = e->code.nlaunch;
  e->key = progressive ? malloc(sizeof *e->key * ((size_t)e->code.nbody + 1)) : NULL;
  double *weight = e->key ? calloc((size_t)e->code.nbody + 1, sizeof *weight) : NULL;
  for (int l = 0; weight && l < e->code.nlaunch; l++)
    weight[e->code.launch[l].body] += (double)e->code.launch[l].work;
  cpu_ready_ctx ready = {e, p, pl};
  cpu_klib_progress prog = {e->key, weight, cpu_ready, &ready};
  int rc = cpu_klib_resolve(e->code.body, e->code.nbody, opt, lib_only, atomic_load(&p->varying),
                            e->fn, e->lits, e->key ? &prog : NULL);
  free(weight);
  if (rc) return -1;
  if (src->s && lib_only) cpu_keep_source(p, src->s);
  if (kof && draw && lib_only) cpu_dump_picture(p, pl, &e->code, kof);
  /* described once it builds: most library-only attempts find a kernel missing */
  if (kof && !progressive && (e->what = cpu_describe_kernels(p, pl, &e->code, kof)))
    e->nwhat = e->code.nlaunch;
  for (int k = 0; k < e->code.nbody; k++) { /* only the keys' hashing needed the texts */
    free(e->code.body[k].text);
    e->code.body[k].text = NULL;
  }
  return 0;
}

static void *cpu_compile_locked(const exec_program *p, cpu_opt *opt, cpu_build how) {
  bool lib_only = how == CPU_BUILD_LIBRARY;
  const cpu_blas_fns *bl = cpu_blas();
  fuse_plan pl;
  if (cpu_plan_build(p, bl->sgemm && bl->dgemm, &pl)) return NULL;
  cpu_exe *e = calloc(1, sizeof *e);
  if (!e) {
    fuse_plan_free(&pl);
    return err_set(GRAFT_ERR_OOM, "cpu: out of memory");
  }
  rd_sb src = {0};
  const char *dump = getenv("GRAFT_DUMP_DIR");
  bool draw = dump && *dump;
  int *kof = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  for (int s = 0; kof && s < p->ninstr; s++) kof[s] = -1;
  int rc = cpu_codegen(p, &pl, &e->code, &src, kof);
  e->out_buf = malloc(sizeof(int) * ((size_t)p->noutputs + 1));
  e->final_order = malloc(sizeof(int) * ((size_t)p->noutputs + 1));
  e->final_step = malloc(sizeof(int) * ((size_t)p->noutputs + 1));
  e->fn = calloc((size_t)e->code.nbody + 1, sizeof *e->fn);
  e->lits = calloc((size_t)e->code.nbody + 1, sizeof *e->lits);
  for (int k = 0; e->out_buf && k < p->noutputs; k++)
    e->out_buf[k] = cpu_plan_buffer_of(p, &pl, p->output_slot[k]);
  /* a compile's source (and picture) is kept even when the compiler fails (to see why); a
   * library-only attempt's only when it builds (most of them find a kernel missing) */
  if (!rc && src.s && !lib_only) cpu_keep_source(p, src.s);
  if (!rc && kof && draw && !lib_only) cpu_dump_picture(p, &pl, &e->code, kof);
  if (!rc && (!e->out_buf || !e->final_order || !e->final_step || !e->fn || !e->lits))
    rc = -1, err_set(GRAFT_ERR_OOM, "cpu: out of memory");
  if (!rc && cpu_final_steps(e, p)) rc = -1, err_set(GRAFT_ERR_OOM, "cpu: out of memory");
  e->hash = p->hash;
  bool built = false;
  if (!rc && how == CPU_BUILD_UNLANDED) /* tests: every kernel on the first tier, none looked up */
    built = (e->partial = cpu_partial_plan(p, &pl, &e->code, e->fn)) != NULL;
  else if (!rc)
    built = !cpu_kernels(e, p, &pl, kof, &src, opt, lib_only, draw);
  if (!built && !e->progressive) cpu_free_exe(e); /* one handed out is the hook's now */
  fuse_plan_free(&pl);
  free(kof);
  rd_sb_free(&src);
  return built ? e : NULL;
}

static int cpu_run_alloc(cpu_run *r, int s) {
  const exec_instr *ins = &r->p->instr[s];
  if (r->B[s]) return 0;
  r->B[s] = program_instr_buffer(r->p, ins);
  if (!r->B[s]) return -1;
  r->S[s] = r->B[s]->ptr;
  return 0;
}

static void cpu_run_release(cpu_run *r, int s) {
  if (r->is_param[s] && !(r->B[s] && r->B[s]->donated)) return; /* borrowed from the caller */
  buffer_release(r->B[s]);
  r->B[s] = NULL;
  r->S[s] = NULL;
}

/* Whether slot s is released by the steps right after st (st is its last reader). */
static bool cpu_released_next(const cpu_run *r, const cpu_step *st, int s) {
  const cpu_code *c = &r->e->code;
  for (const cpu_step *q = st + 1; q < c->step + c->nstep && q->kind == CPU_STEP_RELEASE; q++)
    if (q->arg == s) return true;
  return false;
}

/* A scatter_add writes its result over its input when that input dies here and nothing else
 * holds it: an embedding's gradient (zeros [V, D] plus the rows) otherwise copied all V x D
 * values once more than eager does (a 50000x128 table: 25 MB read and written a step). */
static void cpu_run_inplace(cpu_run *r, const cpu_step *st, const exec_instr *ins, int i) {
  int s = ins->in[0];
  exec_buffer *b = r->B[s];
  if (ins->op != IR_SCATTER_ADD || (ins->dtype != GRAFT_F32 && ins->dtype != GRAFT_F64) ||
      ins->in[1] == s || ins->in[2] == s || /* x.scatter_add(0, i, x): its rows are the source */
      r->B[i] || !b || r->is_param[s] || buffer_refs(b) != 1 ||
      b->bytes != (size_t)ins->numel * graft_dtype_size(ins->dtype) || !cpu_released_next(r, st, s))
    return;
  buffer_retain(b);
  r->B[i] = b;
  r->S[i] = r->S[s];
}

static int cpu_run_fallback(cpu_run *r, const cpu_step *st) {
  int i = st->arg;
  const exec_instr *ins = &r->p->instr[i];
  ref_arg args[16], *a = args;
  if (ins->nin > 16 && !(a = malloc(sizeof *a * (size_t)ins->nin))) {
    err_set(GRAFT_ERR_OOM, "cpu: out of memory");
    return -1;
  }
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *src = &r->p->instr[ins->in[k]];
    a[k] = (ref_arg){r->S[ins->in[k]], src->dtype, src->ndim, src->shape, src->numel, NULL};
  }
  cpu_host_fn host = cpu_host_kernel(ins, a);
  if (host) cpu_run_inplace(r, st, ins, i);
  int rc = cpu_run_alloc(r, i);
  if (!rc && !program_instr_empty(ins)) rc = host ? host(ins, a, r->S[i]) : ref_kernels[ins->op](ins, a, r->S[i]);
  if (a != args) free(a);
  if (!host) /* only true reference runs count; a syncing thread may run a graph too */
    __atomic_fetch_add(&cpu_stats.fallback[ins->op], 1, __ATOMIC_RELAXED);
  return rc;
}

/* A progressive build's bodies that landed since the last look (the thread that runs it). */
static void cpu_exe_refresh(cpu_exe *e) {
  if (!e->progressive) return; /* every step runs this: most executables never were */
  size_t v = cpu_klib_version();
  if (atomic_load(&e->seen_version) == v) return;
  atomic_store(&e->seen_version, v);
  for (int k = 0; k < e->code.nbody; k++) {
    if (__atomic_load_n(&e->fn[k], __ATOMIC_ACQUIRE)) continue;
    cpu_kernel_fn f = cpu_klib_get(e->key[k]);
    if (f) __atomic_store_n(&e->fn[k], f, __ATOMIC_RELEASE);
  }
}

static double cpu_native_share(void *exe) {
  cpu_exe *e = exe;
  cpu_exe_refresh(e);
  double all = 0, native = 0;
  for (int l = 0; l < e->code.nlaunch; l++) {
    const cpu_launch *la = &e->code.launch[l];
    all += (double)la->work;
    if (__atomic_load_n(&e->fn[la->body], __ATOMIC_ACQUIRE)) native += (double)la->work;
  }
  return all > 0 ? native / all : 1.0;
}

static void cpu_run_kernel(cpu_run *r, const cpu_launch *l, cpu_kernel_fn fn) {
  const cpu_code *c = &r->e->code;
  for (int j = 0; j < l->nslot; j++) r->P[j] = r->S[c->slots[l->slot0 + j]];
  r->P[l->nslot] = r->e->lits[l->body]; /* a template's literals, after its buffers */
  if (l->par) cpu_parallel_run(fn, r->P, l->units);
  else fn(r->P, 0, l->units);
}

static void cpu_run_gemm(cpu_run *r, const cpu_gemm_call *g) {
  if (g->k == 0) {
    if (g->numel > 0) memset(r->S[g->c], 0, (size_t)g->numel * (g->dbl ? sizeof(double) : sizeof(float)));
    return;
  }
  cpu_blas()->gemm(g->dbl, g->ta, g->tb, (int)g->m, (int)g->n, (int)g->k, r->S[g->a], (int)g->lda,
                   g->sa, r->S[g->b], (int)g->ldb, g->sb, r->S[g->c], (int)g->ldc, g->sc, g->batch);
}

/* A step as a span of the trace: a kernel (its body and work units), a GEMM (its shape, FLOPs)
 * or a fallback (its op). */
static void cpu_trace_step(const cpu_run *r, const cpu_step *st, uint64_t t0) {
  const cpu_code *c = &r->e->code;
  char name[96], args[128];
  const char *cat = "kernel";
  args[0] = 0;
  if (st->kind == CPU_STEP_KERNEL) {
    const cpu_launch *l = &c->launch[st->arg];
    bool landed = __atomic_load_n(&r->e->fn[l->body], __ATOMIC_RELAXED) != NULL;
    snprintf(name, sizeof name, landed ? "kernel k%d" : "kernel k%d (first tier)", st->arg);
    if (st->arg < r->e->nwhat && r->e->what[st->arg]) {
      trace_span(cat, name, t0, trace_now(), r->e->what[st->arg]);
      return;
    }
    snprintf(args, sizeof args, "\"units\": %" PRId64, (int64_t)l->units);
  } else if (st->kind == CPU_STEP_GEMM) {
    const cpu_gemm_call *g = &c->gemm[st->arg];
    cat = "gemm";
    snprintf(name, sizeof name, "%s %c%c %" PRId64 "x%" PRId64 "x%" PRId64, g->dbl ? "dgemm" : "sgemm",
             g->ta == CPU_CBLAS_TRANS ? 'T' : 'N', g->tb == CPU_CBLAS_TRANS ? 'T' : 'N', (int64_t)g->m,
             (int64_t)g->n, (int64_t)g->k);
    snprintf(args, sizeof args, "\"batch\": %" PRId64 ", \"flops\": %.0f", (int64_t)g->batch,
             2.0 * (double)g->m * (double)g->n * (double)g->k * (double)g->batch);
  } else {
    const exec_instr *ins = &r->p->instr[st->arg];
    int64_t bytes = ins->numel * (int64_t)graft_dtype_size(ins->dtype);
    for (int k = 0; k < ins->nin; k++)
      bytes += r->p->instr[ins->in[k]].numel * (int64_t)graft_dtype_size(r->p->instr[ins->in[k]].dtype);
    cat = "fallback";
    snprintf(name, sizeof name, "host %s", ir_ops[ins->op].name);
    snprintf(args, sizeof args, "\"bytes\": %" PRId64, bytes);
  }
  trace_span(cat, name, t0, trace_now(), args[0] ? args : NULL);
}

/* One step; under GRAFT_PROFILE, each kernel, GEMM and fallback is timed as a call site, in
 * execution order, which a compiled graph keeps from run to run. */
static int cpu_run_step(cpu_run *r, const cpu_step *st, bool prof) {
  const cpu_code *c = &r->e->code;
  double t0 = prof ? cpu_profile_now() : 0;
  switch ((cpu_step_kind)st->kind) {
  case CPU_STEP_ALLOC: return cpu_run_alloc(r, st->arg);
  case CPU_STEP_RELEASE: cpu_run_release(r, st->arg); return 0;
  case CPU_STEP_FALLBACK: {
    int rc = cpu_run_fallback(r, st);
    if (prof)
      cpu_profile_host(&r->e->prof, r->site++, &r->p->instr[st->arg], r->p, cpu_profile_now() - t0);
    return rc;
  }
  case CPU_STEP_KERNEL: {
    const cpu_launch *l = &c->launch[st->arg];
    cpu_kernel_fn fn = __atomic_load_n(&r->e->fn[l->body], __ATOMIC_ACQUIRE);
    if (!fn) return cpu_partial_run(r->e->partial, st->arg, r->B, r->S); /* not landed */
    cpu_run_kernel(r, l, fn);
    if (prof) cpu_profile_kernel(&r->e->prof, r->site++, fn, l->units, cpu_profile_now() - t0);
    return 0;
  }
  case CPU_STEP_GEMM: {
    const cpu_gemm_call *g = &c->gemm[st->arg];
    cpu_run_gemm(r, g);
    if (prof && g->k)
      cpu_profile_gemm(&r->e->prof, r->site++, g->dbl, g->ta == CPU_CBLAS_TRANS,
                       g->tb == CPU_CBLAS_TRANS, (int)g->m,
                       (int)g->n, (int)g->k, g->batch, cpu_profile_now() - t0);
    return 0;
  }
  }
  return -1;
}

static int cpu_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                       exec_buffer **outs) {
  cpu_exe *e = exe;
  int n = p->ninstr;
  cpu_run run = {p, calloc((size_t)n + 1, sizeof(exec_buffer *)), calloc((size_t)n + 1, sizeof(void *)),
                 NULL, e, 0, calloc((size_t)e->code.max_params + 1, sizeof(void *))};
  unsigned char *is_param = calloc((size_t)n + 1, 1);
  if (!run.B || !run.S || !run.P || !is_param) {
    free(run.B);
    free(run.S);
    free(run.P);
    free(is_param);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory running a graph");
    return -1;
  }
  run.is_param = is_param;
  for (int k = 0; k < p->nparams; k++) {
    int s = p->param_slot[k];
    run.B[s] = params[k];
    run.S[s] = params[k]->ptr;
    is_param[s] = 1;
  }
  cpu_exe_refresh(e);
  bool prof = cpu_profile_enabled(), tr = trace_on(); /* both read once per execution */
  for (int k = 0; prof && e->progressive && k < e->code.nbody; k++) /* its call sites differ */
    prof = __atomic_load_n(&e->fn[k], __ATOMIC_RELAXED) != NULL;
  double t0 = prof ? cpu_profile_now() : 0;
  int rc = 0, next = 0, nout = backend_final_wanted() ? p->noutputs : 0;
  for (int k = -1; k < e->code.nstep && !rc; k++) {
    const cpu_step *st = k >= 0 ? &e->code.step[k] : NULL;
    bool span = tr && st && st->kind != CPU_STEP_ALLOC && st->kind != CPU_STEP_RELEASE;
    uint64_t s0 = span ? trace_now() : 0;
    if (st) rc = cpu_run_step(&run, st, prof);
    if (span) cpu_trace_step(&run, st, s0);
    for (; !rc && next < nout && e->final_step[e->final_order[next]] <= k; next++) {
      int o = e->final_order[next];
      if (run.B[e->out_buf[o]]) backend_output_final(o, run.B[e->out_buf[o]]);
    }
  }
  if (prof) cpu_profile_run(&e->prof, e->hash, cpu_profile_now() - t0);
  if (rc && !err_pending()) err_set(GRAFT_ERR_INTERNAL, "cpu: a step of the compiled graph failed");
  for (int k = 0; k < p->noutputs && !rc; k++) {
    outs[k] = run.B[e->out_buf[k]];
    if (outs[k]) buffer_retain(outs[k]);
    else {
      rc = -1;
      err_set(GRAFT_ERR_INTERNAL, "cpu: output %d was not computed", k);
    }
  }
  if (rc)
    for (int k = 0; k < p->noutputs; k++)
      if (outs[k]) { buffer_release(outs[k]); outs[k] = NULL; }
  for (int s = 0; s < n; s++)
    if (run.B[s] && (!is_param[s] || run.B[s]->donated)) buffer_release(run.B[s]);
  for (int k = 0; k < p->noutputs && !rc; k++) /* a donated input's buffer an output shares */
    if (outs[k]->donated) outs[k]->donated = 0; /* is the output's now, no longer donated (a */
                                                /* plain input another run reads is not written) */
  free(is_param);
  free(run.B);
  free(run.S);
  free(run.P);
  return rc;
}

/* GRAFT_CHECK: which code computed slot. The plan and source are generated again (they are
 * deterministic: the same text the compile hashed, so the one its object came from), with the
 * map from slots to kernels; the kernel's inlined instructions are the slots between it and
 * the buffers it reads. */
static void cpu_explain(void *exe, const exec_program *p, int slot, char *buf, size_t n,
                        char **source) {
  cpu_exe *e = exe;
  const exec_instr *ins = &p->instr[slot];
  const char *op = ir_ops[ins->op].name;
  if (source) *source = NULL;
  snprintf(buf, n, "%s %%%d (the compiled code could not be mapped)", op, slot);
  int *kof = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  int *stack = malloc(sizeof(int) * ((size_t)p->ninstr + 1));
  unsigned char *seen = calloc((size_t)p->ninstr + 1, 1);
  fuse_plan pl = {0};
  rd_sb src = {0};
  cpu_code code;
  pthread_mutex_lock(&cpu_compile_mu);
  const cpu_blas_fns *bl = cpu_blas();
  bool planned = kof && stack && seen && !cpu_plan_build(p, bl->sgemm && bl->dgemm, &pl);
  if (planned) for (int s = 0; s < p->ninstr; s++) kof[s] = -1;
  bool ok = planned && !cpu_codegen(p, &pl, &code, &src, kof);
  int nk = ok ? code.nlaunch : 0;
  if (ok) cpu_code_free(&code);
  pthread_mutex_unlock(&cpu_compile_mu);
  if (!ok) goto done; /* the report just says less (the caller restores the error state) */
  size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__))
  int role = pl.role[slot], under = cpu_plan_buffer_of(p, &pl, slot);
  if (under != slot) {
    PUT("the buffer of %s %%%d (this output is a reshape of it and shares it)",
        ir_ops[p->instr[under].op].name, under);
  } else if (role == FUSE_LIBRARY) {
    PUT("a BLAS GEMM step of graph_%016" PRIx64 ".c (dot %%%d x %%%d)", e->hash,
        ins->in[0], ins->in[1]);
  } else if (role == FUSE_FALLBACK) {
    ref_arg a[16];
    for (int q = 0; q < ins->nin && q < 16; q++) {
      const exec_instr *x = &p->instr[ins->in[q]];
      a[q] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, NULL};
    }
    bool host = ins->nin <= 16 && cpu_host_kernel(ins, a);
    PUT("the %s for %s %%%d, a fallback step of graph_%016" PRIx64 ".c",
        host ? "host kernel (cpu_kernels.c)" : "reference kernel", op, slot, e->hash);
  } else if (kof[slot] >= 0) {
    int kid = kof[slot], ni = 0, nm = 0, nr = 0, top = 0;
    PUT("generated kernel k%d (kernel %d of %d of graph_%016" PRIx64 ".c)", kid, kid + 1, nk,
        e->hash);
    for (int s = 0; s < p->ninstr; s++)
      if (kof[s] == kid && s != slot) PUT("%s%%%d %s", nm++ ? ", " : "; it also writes ", s,
                                          ir_ops[p->instr[s].op].name);
    /* the slot's inlined cone, and the buffers at its edge */
    seen[slot] = 1;
    stack[top++] = slot;
    while (top) {
      const exec_instr *x = &p->instr[stack[--top]];
      for (int q = 0; q < x->nin; q++) {
        int s = x->in[q];
        if (seen[s]) continue;
        seen[s] = 1;
        if (pl.role[s] == FUSE_INLINE) stack[top++] = s;
      }
    }
    for (int s = 0; s < p->ninstr; s++)
      if (seen[s] && s != slot && pl.role[s] == FUSE_INLINE)
        PUT("%s%%%d %s", ni++ ? ", " : "; inlined into it: ", s, ir_ops[p->instr[s].op].name);
    for (int s = 0; s < p->ninstr; s++)
      if (seen[s] && s != slot && pl.role[s] != FUSE_INLINE)
        PUT("%s%%%d %s", nr++ ? ", " : "; it reads the buffers ", s, ir_ops[p->instr[s].op].name);
  } else {
    PUT("%s %%%d (no kernel writes it in the regenerated source)", op, slot);
  }
#undef PUT
  if (source) {
    *source = src.s; /* handed over */
    src.s = NULL;
  }
done:
  fuse_plan_free(&pl);
  rd_sb_free(&src);
  free(kof);
  free(stack);
  free(seen);
}

static void cpu_free_exe(void *exe) {
  cpu_exe *e = exe;
  if (!e) return;
  cpu_profile_free(&e->prof);
  cpu_describe_free(e->what, e->nwhat);
  for (int k = 0; e->lits && k < e->code.nbody; k++) free(e->lits[k]);
  free(e->lits);
  cpu_code_free(&e->code);
  free(e->fn);
  free(e->out_buf);
  free(e->final_order);
  free(e->final_step);
  free(e->key);
  cpu_partial_free(e->partial);
  free(e);
}

const backend cpu_backend = {
    .name = "cpu",
    .supports = cpu_supports,
    .compile = cpu_compile,
    .compile_quick = cpu_compile_quick,
    .compile_cached = cpu_compile_cached,
    .cached_pieces = cpu_klib_pieces,
    .native_share = cpu_native_share,
    .execute = cpu_execute,
    .free_exe = cpu_free_exe,
    .stats = cpu_backend_stats,
    .shutdown = cpu_backend_shutdown,
    .explain = cpu_explain,
};
