/* The OpenCL device's backends. The compiler renders a program's fused kernels to OpenCL C
 * (src/backends/gpu), builds them for the device and runs them on its in-order queue, with
 * CLBlast for GEMMs and one wait at the end of the graph; an instruction it does not lower runs
 * on the host (a CPU host kernel or the reference kernel) with its operands downloaded and its
 * result uploaded, counted per op. The reference backend and the first tier run the whole
 * program on the host with transfers (host_bridge.h): a graph's first run costs no build. */
#include "ocl_backend.h"
#include "ocl.h"
#include "ocl_blas.h"
#include "../cpu/cpu_internal.h"
#include "../gpu/gpu_render.h"
#include "../host_bridge.h"
#include "../ref/ref.h"
#include "device.h"
#include "error.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HOSTBRIDGE_BACKEND(ocl_ref_backend, "opencl-ref (host)", ref_backend);
HOSTBRIDGE_BACKEND(ocl_first_backend, "opencl-first-tier (host)", cpu_interp_backend);

#ifndef GRAFT_HAVE_OPENCL_HEADERS
/* Built without OpenCL headers: no OpenCL device is ever listed, so this never runs. */
HOSTBRIDGE_BACKEND(ocl_backend, "opencl", cpu_backend);
#else

/* OpenCL C 1.2; no warnings (generated code compares a value with itself to find NaN, and the
 * like: as the CPU backend's -w). */
#define OCL_BUILD_OPTIONS "-cl-std=CL1.2 -w"

static pthread_mutex_t ocl_stats_mu = PTHREAD_MUTEX_INITIALIZER;
static backend_stats ocl_counters;

typedef struct {
  ocl_device *dev;
  gpu_program gp;
  cl_program prog;
  cl_kernel *kernels;
  cl_mem status; /* gp.uses_status: GPU_STATUS_WORDS int64 (a kernel's runtime failure) */
} ocl_exe;

static void ocl_free(void *e) {
  ocl_exe *x = e;
  if (!x) return;
  for (int k = 0; x->kernels && k < x->gp.nkernels; k++)
    if (x->kernels[k]) ocl.clReleaseKernel(x->kernels[k]);
  free(x->kernels);
  if (x->status) ocl.clReleaseMemObject(x->status);
  if (x->prog) ocl.clReleaseProgram(x->prog);
  gpu_program_free(&x->gp);
  free(x);
}

static int ocl_make_kernels(ocl_exe *x) {
  x->kernels = calloc((size_t)x->gp.nkernels + 1, sizeof *x->kernels);
  if (!x->kernels) return err_set(GRAFT_ERR_OOM, "opencl: out of memory"), -1;
  for (int k = 0; k < x->gp.nkernels; k++) {
    char name[32];
    cl_int st;
    snprintf(name, sizeof name, "k%d", k);
    x->kernels[k] = ocl.clCreateKernel(x->prog, name, &st);
    if (st != CL_SUCCESS) {
      err_set(GRAFT_ERR_COMPILE, "opencl: kernel %s: %s", name, ocl_status_str(st));
      return -1;
    }
  }
  return 0;
}

/* GRAFT_DUMP_DIR: the rendered source beside the graph's IR dump (graph_<hash>.cl). */
static void ocl_dump_source(const exec_program *p, const char *source) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir || !source) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".%s", dir, p->hash, gpu_dialect_opencl.ext);
  FILE *f = fopen(path, "w");
  if (!f) return; /* best effort, as the IR dumps */
  fputs(source, f);
  fclose(f);
}

/* Lanes of the vector row form: 16 on a CPU-type device (on pocl float16 rows beat float8 and
 * scalar lanes; AVX-512 here, two halves on AVX2), none on a GPU; GRAFT_OPENCL_ROW_VEC = 0, 2,
 * 4, 8 or 16 chooses (0: the GPU forms), to compare them. */
static int ocl_row_vec(const ocl_device *d) {
  const char *env = getenv("GRAFT_OPENCL_ROW_VEC");
  if (env && *env) {
    int w = atoi(env);
    if (w == 0 || w == 2 || w == 4 || w == 8 || w == 16) return w;
  }
  return d->cpu ? 16 : 0;
}

static void *ocl_compile(const exec_program *p) {
  ocl_device *d = ocl_device_get(p->device);
  if (!d) return err_set(GRAFT_ERR_DEVICE, "opencl: device %d is not an OpenCL device", p->device);
  ocl_exe *x = calloc(1, sizeof *x);
  if (!x) return err_set(GRAFT_ERR_OOM, "opencl: out of memory");
  x->dev = d;
  gpu_caps caps = {.fp64 = d->fp64, .have_gemm = ocl_blas_available(), .max_wg = (int64_t)d->max_wg,
                   .row_vec = ocl_row_vec(d)};
  if (gpu_render(p, &gpu_dialect_opencl, &caps, &x->gp)) {
    free(x);
    return NULL;
  }
  char what[64];
  snprintf(what, sizeof what, "the kernels of graph %016" PRIx64, p->hash);
  ocl_dump_source(p, x->gp.source);
  bool disk_hit = false;
  if (x->gp.nkernels && (!(x->prog = ocl_build(d, x->gp.source, OCL_BUILD_OPTIONS, what, &disk_hit)) ||
                         ocl_make_kernels(x))) {
    ocl_free(x);
    return NULL;
  }
  cl_int st = CL_SUCCESS;
  if (x->gp.uses_status)
    x->status = ocl.clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, GPU_STATUS_WORDS * sizeof(cl_long), NULL, &st);
  if (st != CL_SUCCESS) {
    err_set(GRAFT_ERR_OOM, "opencl device %d: a status buffer: %s", d->id, ocl_status_str(st));
    ocl_free(x);
    return NULL;
  }
  pthread_mutex_lock(&ocl_stats_mu);
  ocl_counters.compiles++;
  ocl_counters.disk_hits += disk_hit;
  pthread_mutex_unlock(&ocl_stats_mu);
  return x;
}

/* One execution: a buffer per slot as the steps make them. */
typedef struct {
  ocl_exe *x;
  const exec_program *p;
  exec_buffer **B;
  unsigned char *own; /* B[s] holds a reference of this run (made here, or a donated input) */
} ocl_run;

static cl_mem ocl_mem_of(const ocl_run *r, int s) { return (cl_mem)r->B[s]->ptr; }

static int ocl_launch(ocl_run *r, const gpu_step *st) {
  cl_kernel k = r->x->kernels[st->kernel];
  cl_mem out = ocl_mem_of(r, st->slot);
  cl_int e = ocl.clSetKernelArg(k, 0, sizeof out, &out);
  for (int a = 0; a < st->nargs && e == CL_SUCCESS; a++) {
    cl_mem m = ocl_mem_of(r, st->args[a]);
    e = ocl.clSetKernelArg(k, (cl_uint)a + 1, sizeof m, &m);
  }
  if (st->status && e == CL_SUCCESS)
    e = ocl.clSetKernelArg(k, (cl_uint)st->nargs + 1, sizeof r->x->status, &r->x->status);
  size_t global = (size_t)st->global, local = (size_t)st->local;
  if (e == CL_SUCCESS)
    e = ocl.clEnqueueNDRangeKernel(r->x->dev->queue, k, 1, NULL, &global, local ? &local : NULL, 0,
                                   NULL, NULL);
  if (e == CL_SUCCESS) return 0;
  err_set(e == CL_OUT_OF_RESOURCES || e == CL_MEM_OBJECT_ALLOCATION_FAILURE ? GRAFT_ERR_OOM
                                                                            : GRAFT_ERR_INTERNAL,
          "opencl device %d (%s): launching kernel k%d (%s %%%d) failed: %s", r->x->dev->id,
          r->x->dev->name, st->kernel, ir_ops[r->p->instr[st->slot].op].name, st->slot,
          ocl_status_str(e));
  return -1;
}

static int ocl_gemm_step(ocl_run *r, const gpu_step *st) {
  const exec_instr *ins = &r->p->instr[st->slot];
  const exec_instr *a = &r->p->instr[ins->in[0]];
  ocl_gemm g = {.m = (size_t)ins->shape[ins->ndim - 2], .n = (size_t)ins->shape[ins->ndim - 1],
                .k = (size_t)a->shape[a->ndim - 1], .batch = 1,
                .trans_a = st->trans[0], .trans_b = st->trans[1]};
  for (int d = 0; d < ins->ndim - 2; d++) g.batch *= (size_t)ins->shape[d];
  if (!g.m || !g.n || !g.batch) return 0;
  if (!g.k) { /* an empty sum: zeros */
    exec_buffer *z = buffer_new(r->B[st->slot]->bytes, r->p->device, 1, "a GEMM of empty sums");
    if (!z) return -1;
    buffer_release(r->B[st->slot]);
    r->B[st->slot] = z;
    return 0;
  }
  return ocl_blas_gemm(r->x->dev, ins->dtype == GRAFT_F64, &g, ocl_mem_of(r, st->args[0]),
                       ocl_mem_of(r, st->args[1]), ocl_mem_of(r, st->slot));
}

/* An instruction the renderer does not lower: its operands come to the host, a CPU host kernel
 * (or the reference kernel) computes it, the result goes back. */
static int ocl_fallback_step(ocl_run *r, const gpu_step *st) {
  const exec_instr *ins = &r->p->instr[st->slot];
  int n = ins->nin, rc = -1;
  exec_buffer **h = calloc((size_t)n + 2, sizeof *h);
  ref_arg *a = calloc((size_t)n + 1, sizeof *a);
  if (!h || !a) {
    err_set(GRAFT_ERR_OOM, "opencl: out of memory");
    goto done;
  }
  for (int k = 0; k < n; k++) {
    const exec_instr *src = &r->p->instr[ins->in[k]];
    if (!(h[k] = buffer_to_device(r->B[ins->in[k]], 0, "a fallback's operand"))) goto done;
    a[k] = (ref_arg){h[k]->ptr, src->dtype, src->ndim, src->shape, src->numel};
  }
  exec_buffer *out = h[n] = buffer_new(r->B[st->slot]->bytes, 0, 0, "a fallback's result");
  if (!out) goto done;
  cpu_host_fn host = cpu_host_kernel(ins, a);
  rc = host ? host(ins, a, out->ptr) : ref_kernels[ins->op](ins, a, out->ptr);
  if (!rc) rc = buffer_upload(r->B[st->slot], out->ptr, out->bytes);
  pthread_mutex_lock(&ocl_stats_mu);
  ocl_counters.fallbacks[ins->op]++;
  pthread_mutex_unlock(&ocl_stats_mu);
done:
  for (int k = 0; h && k <= n; k++) buffer_release(h[k]);
  free(h);
  free(a);
  return rc;
}

static void ocl_drop(ocl_run *r, int s) {
  if (r->own[s]) buffer_release(r->B[s]);
  r->B[s] = NULL;
  r->own[s] = 0;
}

/* The buffer step k writes to slot s. */
static int ocl_output(ocl_run *r, int s) {
  const exec_instr *ins = &r->p->instr[s];
  r->B[s] = program_instr_buffer(r->p, ins);
  if (!r->B[s]) return -1;
  r->own[s] = 1;
  return 0;
}

static int ocl_step(ocl_run *r, int k) {
  const gpu_step *st = &r->x->gp.steps[k];
  const exec_instr *ins = &r->p->instr[st->slot];
  if (ocl_output(r, st->slot)) return -1;
  for (int a = 0; a < st->nout; a++) /* a row group's other outputs */
    if (ocl_output(r, st->args[a])) return -1;
  if (!ins->numel) return 0;
  int rc = st->kind == GPU_STEP_KERNEL ? ocl_launch(r, st)
         : st->kind == GPU_STEP_LIBRARY ? ocl_gemm_step(r, st)
                                        : ocl_fallback_step(r, st);
  if (rc) return -1;
  for (int a = 0; a < st->nargs; a++) { /* operands read for the last time */
    int s = st->args[a];
    if (r->x->gp.last_step[s] == k && !r->p->instr[s].is_output) ocl_drop(r, s);
  }
  return 0;
}

static const cl_long ocl_zeros[GPU_STATUS_WORDS];

static int ocl_status_reset(ocl_exe *x) {
  if (!x->status) return 0;
  cl_int st = ocl.clEnqueueWriteBuffer(x->dev->queue, x->status, CL_FALSE, 0, sizeof ocl_zeros,
                                       ocl_zeros, 0, NULL, NULL);
  if (st == CL_SUCCESS) return 0;
  err_set(GRAFT_ERR_INTERNAL, "opencl device %d: resetting a status buffer: %s", x->dev->id,
          ocl_status_str(st));
  return -1;
}

/* A kernel that failed at run time (a gather's index out of range) fails the graph with the
 * reference kernel's message. The status words are control data, not a tensor: not counted. */
static int ocl_status_check(ocl_exe *x, const exec_program *p) {
  if (!x->status) return 0;
  cl_long w[GPU_STATUS_WORDS];
  cl_int st = ocl.clEnqueueReadBuffer(x->dev->queue, x->status, CL_TRUE, 0, sizeof w, w, 0, NULL, NULL);
  if (st != CL_SUCCESS) {
    err_set(GRAFT_ERR_INTERNAL, "opencl device %d: reading a status buffer: %s", x->dev->id,
            ocl_status_str(st));
    return -1;
  }
  if (!w[0]) return 0;
  int slot = w[2] >= 0 && w[2] < p->ninstr ? (int)w[2] : 0;
  err_set(GRAFT_ERR_ARG, "%s: index %lld out of range [0, %lld) on axis %d", ir_ops[p->instr[slot].op].name,
          (long long)w[1], (long long)w[3], (int)IR_ATTR(p->instr[slot].attr, AXIS, axis));
  return -1;
}

static int ocl_execute(void *e, const exec_program *p, exec_buffer *const *params, exec_buffer **outs) {
  ocl_exe *x = e;
  ocl_run r = {.x = x, .p = p};
  r.B = calloc((size_t)p->ninstr + 1, sizeof *r.B);
  r.own = calloc((size_t)p->ninstr + 1, 1);
  if (!r.B || !r.own) {
    err_set(GRAFT_ERR_OOM, "opencl: out of memory running a graph");
    for (int k = 0; k < p->nparams; k++)
      if (params[k]->donated) buffer_release(params[k]); /* given to this run: released either way */
    free(r.B);
    free(r.own);
    return -1;
  }
  for (int k = 0; k < p->nparams; k++) {
    r.B[p->param_slot[k]] = params[k];
    r.own[p->param_slot[k]] = (unsigned char)params[k]->donated;
  }
  int rc = ocl_status_reset(x);
  for (int k = 0; k < x->gp.nsteps && !rc; k++) rc = ocl_step(&r, k);
  cl_int st = ocl.clFinish(x->dev->queue); /* the graph's one wait */
  if (!rc && st != CL_SUCCESS)
    rc = -1, err_set(GRAFT_ERR_INTERNAL, "opencl device %d: running graph %016" PRIx64 ": %s",
                     x->dev->id, p->hash, ocl_status_str(st));
  if (!rc) rc = ocl_status_check(x, p);
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
    if (r.B[s]) ocl_drop(&r, s);
  free(r.B);
  free(r.own);
  return rc;
}

static void ocl_stats(backend_stats *out) {
  pthread_mutex_lock(&ocl_stats_mu);
  *out = ocl_counters;
  pthread_mutex_unlock(&ocl_stats_mu);
}

static const char *ocl_step_name(gpu_step_kind k) {
  return k == GPU_STEP_KERNEL ? "an OpenCL kernel" : k == GPU_STEP_LIBRARY ? "a CLBlast GEMM"
                                                                            : "a host fallback";
}

static bool ocl_step_writes(const gpu_step *st, int slot) {
  for (int a = 0; a < st->nout; a++)
    if (st->args[a] == slot) return true;
  return st->slot == slot;
}

static void ocl_explain(void *e, const exec_program *p, int slot, char *buf, size_t n, char **source) {
  ocl_exe *x = e;
  (void)p;
  snprintf(buf, n, "inlined into a kernel of the OpenCL program");
  for (int k = 0; k < x->gp.nsteps; k++)
    if (ocl_step_writes(&x->gp.steps[k], slot)) {
      if (x->gp.steps[k].kind == GPU_STEP_KERNEL)
        snprintf(buf, n, "%s (k%d)", ocl_step_name(x->gp.steps[k].kind), x->gp.steps[k].kernel);
      else
        snprintf(buf, n, "%s", ocl_step_name(x->gp.steps[k].kind));
    }
  if (source) *source = x->gp.source ? strdup(x->gp.source) : NULL;
}

const backend ocl_backend = {
    .name = "opencl",
    .supports = NULL, /* what it does not lower falls back per instruction, counted */
    .compile = ocl_compile,
    .execute = ocl_execute,
    .free_exe = ocl_free,
    .stats = ocl_stats,
    .shutdown = ocl_shutdown,
    .explain = ocl_explain,
};
#endif
