/* The backend vtable: compile = plan + generate + compile/load; execute = bind buffers and call
 * the generated entry with the runtime callbacks (allocation through buffer_new for exact
 * accounting, release at last use, reference-kernel fallbacks, the thread pool, BLAS). */
#include "cpu_internal.h"
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
  cpu_object obj;
  int nkernels;
  uint64_t hash;
  cpu_profile prof; /* GRAFT_PROFILE: time per kernel and GEMM call site */
  int *out_buf;     /* per output: the slot whose buffer it is (cpu_plan_buffer_of) */
} cpu_exe;

typedef struct {
  const exec_program *p;
  exec_buffer **B;
  void **S;
  const unsigned char *is_param;
  cpu_exe *e;
  int site; /* the call site's index within this execution (profiling) */
} cpu_run;

static bool cpu_supports(const exec_instr *ins) {
  return ins->op == IR_DATA || ref_kernels[ins->op] != NULL; /* what it doesn't generate, it falls back on */
}

/* Compiles may come from the background compile thread and from a caller at once (sync mode):
 * one at a time, and the counters they write are read under the same lock. */
static pthread_mutex_t cpu_compile_mu = PTHREAD_MUTEX_INITIALIZER;

static void *cpu_compile_locked(const exec_program *p, cpu_opt *opt);

static void *cpu_compile_opt(const exec_program *p, cpu_opt *opt) {
  pthread_mutex_lock(&cpu_compile_mu);
  void *e = cpu_compile_locked(p, opt);
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

static void cpu_backend_stats(backend_stats *out) {
  pthread_mutex_lock(&cpu_compile_mu);
  out->compiles = cpu_stats.compiles;
  out->disk_hits = cpu_stats.disk_hits;
  out->disk_refused = cpu_stats.disk_refused;
  out->kernel_choices = __atomic_load_n(&cpu_stats.choices, __ATOMIC_RELAXED);
  out->kernels_demoted = __atomic_load_n(&cpu_stats.demoted, __ATOMIC_RELAXED);
  memcpy(out->fallbacks, cpu_stats.fallback, sizeof out->fallbacks);
  pthread_mutex_unlock(&cpu_compile_mu);
}

static void cpu_backend_shutdown(void) {
  cpu_pool_shutdown();
  pthread_mutex_lock(&cpu_compile_mu);
  free(cpu_last_src);
  cpu_last_src = NULL;
  pthread_mutex_unlock(&cpu_compile_mu);
}

static void *cpu_compile_locked(const exec_program *p, cpu_opt *opt) {
  const cpu_blas_fns *bl = cpu_blas();
  fuse_plan pl;
  if (cpu_plan_build(p, bl->sgemm && bl->dgemm, &pl)) return NULL;
  cpu_sb src = {0};
  int nk = 0;
  int rc = cpu_codegen(p, &pl, &src, &nk, NULL);
  int *out_buf = malloc(sizeof(int) * ((size_t)p->noutputs + 1));
  for (int k = 0; out_buf && k < p->noutputs; k++)
    out_buf[k] = cpu_plan_buffer_of(p, &pl, p->output_slot[k]);
  fuse_plan_free(&pl);
  if (rc || !out_buf) {
    cpu_sb_free(&src);
    free(out_buf);
    return rc ? NULL : err_set(GRAFT_ERR_OOM, "cpu: out of memory");
  }
  free(cpu_last_src);
  cpu_last_src = strdup(src.s);
  const char *dir = getenv("GRAFT_DUMP_DIR"); /* the generated source beside the IR dumps */
  if (dir && *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".c", dir, p->hash);
    FILE *f = fopen(path, "w");
    if (f) {
      fputs(src.s, f);
      fclose(f);
    }
  }
  cpu_exe *e = calloc(1, sizeof *e);
  if (!e) {
    cpu_sb_free(&src);
    free(out_buf);
    return err_set(GRAFT_ERR_OOM, "cpu: out of memory");
  }
  e->out_buf = out_buf;
  rc = cpu_compile_source(src.s, opt, &e->obj);
  cpu_sb_free(&src);
  if (rc) {
    free(out_buf);
    free(e);
    return NULL;
  }
  e->nkernels = nk;
  e->hash = p->hash;
  cpu_stats.kernels += (uint64_t)nk;
  return e;
}

static int cpu_rt_alloc(void *ctx, int s) {
  cpu_run *r = ctx;
  const exec_instr *ins = &r->p->instr[s];
  if (r->B[s]) return 0;
  r->B[s] = program_instr_buffer(r->p, ins);
  if (!r->B[s]) return -1;
  r->S[s] = r->B[s]->ptr;
  return 0;
}

static void cpu_rt_release(void *ctx, int s) {
  cpu_run *r = ctx;
  if (r->is_param[s] && !(r->B[s] && r->B[s]->donated)) return; /* borrowed from the caller */
  buffer_release(r->B[s]);
  r->B[s] = NULL;
  r->S[s] = NULL;
}

static int cpu_rt_fallback(void *ctx, int i) {
  cpu_run *r = ctx;
  const exec_instr *ins = &r->p->instr[i];
  ref_arg args[16], *a = args;
  if (ins->nin > 16 && !(a = malloc(sizeof *a * (size_t)ins->nin))) {
    err_set(GRAFT_ERR_OOM, "cpu: out of memory");
    return -1;
  }
  for (int k = 0; k < ins->nin; k++) {
    const exec_instr *src = &r->p->instr[ins->in[k]];
    a[k] = (ref_arg){r->S[ins->in[k]], src->dtype, src->ndim, src->shape, src->numel};
  }
  int rc = cpu_rt_alloc(ctx, i);
  cpu_host_fn host = cpu_host_kernel(ins, a);
  if (!rc && !program_instr_empty(ins)) rc = host ? host(ins, a, r->S[i]) : ref_kernels[ins->op](ins, a, r->S[i]);
  if (a != args) free(a);
  if (!host) cpu_stats.fallback[ins->op]++; /* only true reference runs count */
  return rc;
}

static int cpu_rt_fallback_prof(void *ctx, int i) {
  cpu_run *r = ctx;
  double t0 = cpu_profile_now();
  int rc = cpu_rt_fallback(ctx, i);
  cpu_profile_host(&r->e->prof, r->site++, &r->p->instr[i], r->p, cpu_profile_now() - t0);
  return rc;
}

static void cpu_rt_parallel(void *ctx, cpu_kernel_fn fn, void **S, int64_t total) {
  (void)ctx;
  cpu_parallel_run(fn, S, total);
}

static void cpu_rt_serial(void *ctx, cpu_kernel_fn fn, void **S, int64_t total) {
  (void)ctx;
  fn(S, 0, total);
}

/* Profiling: a kernel call, serial or over the pool, timed as call site r->site. */
static void cpu_rt_kernel_prof(void *ctx, cpu_kernel_fn fn, void **S, int64_t total, bool par) {
  cpu_run *r = ctx;
  double t0 = cpu_profile_now();
  if (par) cpu_parallel_run(fn, S, total);
  else fn(S, 0, total);
  cpu_profile_kernel(&r->e->prof, r->site++, fn, total, cpu_profile_now() - t0);
}

static void cpu_rt_serial_prof(void *ctx, cpu_kernel_fn fn, void **S, int64_t total) {
  cpu_rt_kernel_prof(ctx, fn, S, total, false);
}

static void cpu_rt_parallel_prof(void *ctx, cpu_kernel_fn fn, void **S, int64_t total) {
  cpu_rt_kernel_prof(ctx, fn, S, total, true);
}

/* GEMMs do not pass ctx: the run being profiled is per thread (a program runs on one). */
static _Thread_local cpu_run *cpu_prof_run;

static void cpu_rt_gemm_prof(int dbl, int ta, int tb, int m, int n, int k, const void *a, int lda,
                             int64_t sa, const void *b, int ldb, int64_t sb, void *c, int ldc,
                             int64_t sc, int64_t batch) {
  cpu_run *r = cpu_prof_run;
  double t0 = cpu_profile_now();
  cpu_blas()->gemm(dbl, ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch);
  cpu_profile_gemm(&r->e->prof, r->site++, dbl, ta != 111, tb != 111, m, n, k, batch,
                   cpu_profile_now() - t0);
}

static int cpu_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                       exec_buffer **outs) {
  cpu_exe *e = exe;
  int n = p->ninstr;
  cpu_run run = {p, calloc((size_t)n + 1, sizeof(exec_buffer *)), calloc((size_t)n + 1, sizeof(void *)),
                 NULL, e, 0};
  if (!run.B || !run.S) {
    free(run.B);
    free(run.S);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory running a graph");
    return -1;
  }
  unsigned char *is_param = calloc((size_t)n + 1, 1);
  if (!is_param) {
    free(run.B);
    free(run.S);
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
  const cpu_blas_fns *bl = cpu_blas();
  cpu_rt rt = {&run, run.S, cpu_rt_alloc, cpu_rt_release, cpu_rt_fallback, cpu_rt_parallel,
               cpu_rt_serial, bl->gemm};
  bool prof = cpu_profile_enabled();
  double t0 = 0;
  if (prof) {
    rt.parallel = cpu_rt_parallel_prof;
    rt.serial = cpu_rt_serial_prof;
    rt.fallback = cpu_rt_fallback_prof;
    rt.gemm = cpu_rt_gemm_prof;
    cpu_prof_run = &run;
    t0 = cpu_profile_now();
  }
  int rc = e->obj.entry(&rt);
  if (prof) cpu_profile_run(&e->prof, e->hash, cpu_profile_now() - t0);
  if (rc && !err_pending()) err_set(GRAFT_ERR_INTERNAL, "cpu: generated code failed");
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
    outs[k]->donated = 0;                      /* is the output's now, no longer donated */
  free(is_param);
  free(run.B);
  free(run.S);
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
  cpu_sb src = {0};
  int nk = 0;
  pthread_mutex_lock(&cpu_compile_mu);
  const cpu_blas_fns *bl = cpu_blas();
  bool planned = kof && stack && seen && !cpu_plan_build(p, bl->sgemm && bl->dgemm, &pl);
  if (planned) for (int s = 0; s < p->ninstr; s++) kof[s] = -1;
  bool ok = planned && !cpu_codegen(p, &pl, &src, &nk, kof);
  pthread_mutex_unlock(&cpu_compile_mu);
  if (!ok) goto done; /* the report just says less (the caller restores the error state) */
  size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < n ? n - k : 0, __VA_ARGS__))
  int role = pl.role[slot], under = cpu_plan_buffer_of(p, &pl, slot);
  if (under != slot) {
    PUT("the buffer of %s %%%d (this output is a reshape of it and shares it)",
        ir_ops[p->instr[under].op].name, under);
  } else if (role == FUSE_LIBRARY) {
    PUT("a BLAS GEMM call in cpu_entry of graph_%016" PRIx64 ".c (dot %%%d x %%%d)", e->hash,
        ins->in[0], ins->in[1]);
  } else if (role == FUSE_FALLBACK) {
    ref_arg a[16];
    for (int q = 0; q < ins->nin && q < 16; q++) {
      const exec_instr *x = &p->instr[ins->in[q]];
      a[q] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel};
    }
    bool host = ins->nin <= 16 && cpu_host_kernel(ins, a);
    PUT("the %s for %s %%%d, called from cpu_entry of graph_%016" PRIx64 ".c (rt->fallback)",
        host ? "host kernel (cpu_kernels.c)" : "reference kernel", op, slot, e->hash);
  } else if (kof[slot] >= 0) {
    int kid = kof[slot], ni = 0, nm = 0, nr = 0, top = 0;
    PUT("generated kernel k%d (static void k%d_ in graph_%016" PRIx64 ".c, kernel %d of %d)",
        kid, kid, e->hash, kid + 1, nk);
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
  cpu_sb_free(&src);
  free(kof);
  free(stack);
  free(seen);
}

static void cpu_free_exe(void *exe) {
  cpu_exe *e = exe;
  if (!e) return;
  cpu_profile_free(&e->prof);
  cpu_object_close(&e->obj);
  free(e->out_buf);
  free(e);
}

const backend cpu_backend = {
    .name = "cpu",
    .supports = cpu_supports,
    .compile = cpu_compile,
    .compile_quick = cpu_compile_quick,
    .execute = cpu_execute,
    .free_exe = cpu_free_exe,
    .stats = cpu_backend_stats,
    .shutdown = cpu_backend_shutdown,
    .explain = cpu_explain,
};
