/* The shared device step runner (gpu_runner.h). */
#include "gpu_runner.h"
#include "../cpu/cpu_internal.h"
#include "../ref/ref.h"
#include "device.h"
#include "error.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One execution: a buffer per slot as the steps make them. */
typedef struct {
  const gpu_runtime *rt;
  void *exe;
  const gpu_program *gp;
  const exec_program *p;
  exec_buffer **B;
  unsigned char *own; /* B[s] holds a reference of this run (made here, or a donated input) */
} gpu_exec;

static int gpu_launch_step(gpu_exec *r, const gpu_step *st) {
  void **mem = malloc(((size_t)st->nargs + 1) * sizeof *mem);
  if (!mem) return err_set(GRAFT_ERR_OOM, "%s: out of memory", r->rt->name), -1;
  mem[0] = r->B[st->slot]->ptr;
  for (int a = 0; a < st->nargs; a++) mem[a + 1] = r->B[st->args[a]]->ptr;
  char what[96];
  snprintf(what, sizeof what, "kernel k%d (%s %%%d)", st->kernel, ir_ops[r->p->instr[st->slot].op].name,
           st->slot);
  int rc = r->rt->launch(r->exe, st, mem, st->nargs + 1, what);
  free(mem);
  return rc;
}

static int gpu_gemm_step(gpu_exec *r, const gpu_step *st) {
  const exec_instr *ins = &r->p->instr[st->slot];
  const exec_instr *a = &r->p->instr[ins->in[0]];
  gpu_gemm g = {.m = (size_t)ins->shape[ins->ndim - 2], .n = (size_t)ins->shape[ins->ndim - 1],
                .k = (size_t)a->shape[a->ndim - 1], .batch = 1, .trans_a = st->trans[0],
                .trans_b = st->trans[1], .f64 = ins->dtype == GRAFT_F64};
  for (int d = 0; d < ins->ndim - 2; d++) g.batch *= (size_t)ins->shape[d];
  if (!g.m || !g.n || !g.batch) return 0;
  if (!g.k) { /* an empty sum: zeros */
    exec_buffer *z = buffer_new(r->B[st->slot]->bytes, r->p->device, 1, "a GEMM of empty sums");
    if (!z) return -1;
    buffer_release(r->B[st->slot]);
    r->B[st->slot] = z;
    return 0;
  }
  return r->rt->gemm(r->exe, &g, r->B[st->args[0]]->ptr, r->B[st->args[1]]->ptr, r->B[st->slot]->ptr);
}

/* An instruction the renderer does not lower: its operands come to the host, a CPU host kernel
 * (or the reference kernel) computes it, the result goes back. */
static int gpu_fallback_step(gpu_exec *r, const gpu_step *st) {
  const exec_instr *ins = &r->p->instr[st->slot];
  int n = ins->nin, rc = -1;
  exec_buffer **h = calloc((size_t)n + 2, sizeof *h);
  ref_arg *a = calloc((size_t)n + 1, sizeof *a);
  if (!h || !a) {
    err_set(GRAFT_ERR_OOM, "%s: out of memory", r->rt->name);
    goto done;
  }
  for (int k = 0; k < n; k++) {
    const exec_instr *src = &r->p->instr[ins->in[k]];
    if (!(h[k] = buffer_to_device(r->B[ins->in[k]], 0, "a fallback's operand"))) goto done;
    a[k] = (ref_arg){h[k]->ptr, src->dtype, src->ndim, src->shape, src->numel, NULL};
  }
  exec_buffer *out = h[n] = buffer_new(r->B[st->slot]->bytes, 0, 0, "a fallback's result");
  if (!out) goto done;
  cpu_host_fn host = cpu_host_kernel(ins, a);
  rc = host ? host(ins, a, out->ptr) : ref_kernels[ins->op](ins, a, out->ptr);
  if (!rc) rc = buffer_upload(r->B[st->slot], out->ptr, out->bytes);
  pthread_mutex_lock(&r->rt->counters->mu);
  r->rt->counters->s.fallbacks[ins->op]++;
  pthread_mutex_unlock(&r->rt->counters->mu);
done:
  for (int k = 0; h && k <= n; k++) buffer_release(h[k]);
  free(h);
  free(a);
  return rc;
}

static void gpu_drop(gpu_exec *r, int s) {
  if (r->own[s]) buffer_release(r->B[s]);
  r->B[s] = NULL;
  r->own[s] = 0;
}

/* The buffer a step writes to slot s. */
static int gpu_output(gpu_exec *r, int s) {
  r->B[s] = program_instr_buffer(r->p, &r->p->instr[s]);
  if (!r->B[s]) return -1;
  r->own[s] = 1;
  return 0;
}

static int gpu_step_run(gpu_exec *r, int k) {
  const gpu_step *st = &r->gp->steps[k];
  const exec_instr *ins = &r->p->instr[st->slot];
  if (gpu_output(r, st->slot)) return -1;
  for (int a = 0; a < st->nout; a++) /* a row group's other outputs */
    if (gpu_output(r, st->args[a])) return -1;
  if (!ins->numel) return 0;
  int rc = st->kind == GPU_STEP_KERNEL    ? gpu_launch_step(r, st)
           : st->kind == GPU_STEP_LIBRARY ? gpu_gemm_step(r, st)
                                          : gpu_fallback_step(r, st);
  if (rc) return -1;
  for (int a = 0; a < st->nargs; a++) { /* operands read for the last time */
    int s = st->args[a];
    if (r->gp->last_step[s] == k && !r->p->instr[s].is_output) gpu_drop(r, s);
  }
  return 0;
}

/* A kernel that failed at run time (a gather's index out of range) fails the graph with the
 * reference kernel's message. The status words are control data, not a tensor: not counted. */
static int gpu_status_check(gpu_exec *r) {
  if (!r->gp->uses_status) return 0;
  int64_t w[GPU_STATUS_WORDS];
  if (r->rt->status_read(r->exe, w)) return -1;
  if (!w[0]) return 0;
  const exec_program *p = r->p;
  int slot = w[2] >= 0 && w[2] < p->ninstr ? (int)w[2] : 0;
  err_set(GRAFT_ERR_ARG, "%s: index %lld out of range [0, %lld) on axis %d", ir_ops[p->instr[slot].op].name,
          (long long)w[1], (long long)w[3], (int)IR_ATTR(p->instr[slot].attr, AXIS, axis));
  return -1;
}

int gpu_run(const gpu_runtime *rt, void *exe, const gpu_program *gp, const exec_program *p,
            exec_buffer *const *params, exec_buffer **outs) {
  gpu_exec r = {.rt = rt, .exe = exe, .gp = gp, .p = p};
  r.B = calloc((size_t)p->ninstr + 1, sizeof *r.B);
  r.own = calloc((size_t)p->ninstr + 1, 1);
  if (!r.B || !r.own) {
    err_set(GRAFT_ERR_OOM, "%s: out of memory running a graph", rt->name);
    gpu_release_donated(p, params);
    free(r.B);
    free(r.own);
    return -1;
  }
  for (int k = 0; k < p->nparams; k++) {
    r.B[p->param_slot[k]] = params[k];
    r.own[p->param_slot[k]] = (unsigned char)params[k]->donated;
  }
  int rc = gp->uses_status ? rt->status_reset(exe) : 0;
  for (int k = 0; k < gp->nsteps && !rc; k++) rc = gpu_step_run(&r, k);
  char what[48];
  snprintf(what, sizeof what, "graph %016" PRIx64, p->hash);
  if (rc) { /* the graph's one wait, after a failure too, keeping the step's message */
    err_saved e;
    err_save(&e);
    rt->finish(exe, what);
    err_restore(&e);
  } else {
    rc = rt->finish(exe, what);
  }
  if (!rc) rc = gpu_status_check(&r);
  for (int k = 0; k < p->noutputs; k++) {
    int s = p->output_slot[k];
    outs[k] = NULL;
    if (!rc && r.B[s]) {
      outs[k] = r.B[s];
      if (r.own[s]) r.own[s] = 0; /* the caller takes this run's reference */
      else buffer_retain(outs[k]);
    }
  }
  for (int s = 0; s < p->ninstr; s++)
    if (r.B[s]) gpu_drop(&r, s);
  free(r.B);
  free(r.own);
  return rc;
}

void gpu_release_donated(const exec_program *p, exec_buffer *const *params) {
  for (int k = 0; k < p->nparams; k++)
    if (params[k]->donated) buffer_release(params[k]);
}

void gpu_count_compile(gpu_counters *c, bool disk_hit) {
  pthread_mutex_lock(&c->mu);
  c->s.compiles++;
  c->s.disk_hits += disk_hit;
  pthread_mutex_unlock(&c->mu);
}

void gpu_counters_get(gpu_counters *c, backend_stats *out) {
  pthread_mutex_lock(&c->mu);
  *out = c->s;
  pthread_mutex_unlock(&c->mu);
}

static bool gpu_step_writes(const gpu_step *st, int slot) {
  for (int a = 0; a < st->nout; a++)
    if (st->args[a] == slot) return true;
  return st->slot == slot;
}

void gpu_explain(const gpu_runtime *rt, const gpu_program *gp, int slot, char *buf, size_t n,
                 char **source) {
  snprintf(buf, n, "inlined into a kernel of the %s program", rt->name);
  for (int k = 0; k < gp->nsteps; k++) {
    const gpu_step *st = &gp->steps[k];
    if (!gpu_step_writes(st, slot)) continue;
    if (st->kind == GPU_STEP_KERNEL) snprintf(buf, n, "%s (k%d)", rt->kernel_what, st->kernel);
    else snprintf(buf, n, "%s", st->kind == GPU_STEP_LIBRARY ? rt->library_what : "a host fallback");
  }
  if (source) *source = gp->source ? strdup(gp->source) : NULL;
}

void gpu_dump_source(const exec_program *p, const gpu_dialect *d, const char *source) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir || !source) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".%s", dir, p->hash, d->ext);
  FILE *f = fopen(path, "w");
  if (!f) return; /* best effort, as the IR dumps */
  fputs(source, f);
  fclose(f);
}
