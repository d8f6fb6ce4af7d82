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
#include "../gpu/gpu_runner.h"
#include "../host_bridge.h"
#include "device.h"
#include "error.h"
#include <inttypes.h>
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

static gpu_counters ocl_counters = GPU_COUNTERS_INIT;

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
  gpu_dump_source(p, &gpu_dialect_opencl, x->gp.source);
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
  gpu_count_compile(&ocl_counters, disk_hit);
  return x;
}

static int ocl_launch(void *e, const gpu_step *st, void *const *mem, int nmem, const char *what) {
  ocl_exe *x = e;
  cl_kernel k = x->kernels[st->kernel];
  cl_int err = CL_SUCCESS;
  for (int a = 0; a < nmem && err == CL_SUCCESS; a++) {
    cl_mem m = (cl_mem)mem[a];
    err = ocl.clSetKernelArg(k, (cl_uint)a, sizeof m, &m);
  }
  if (st->status && err == CL_SUCCESS)
    err = ocl.clSetKernelArg(k, (cl_uint)nmem, sizeof x->status, &x->status);
  size_t global = (size_t)st->global, local = (size_t)st->local;
  if (err == CL_SUCCESS)
    err = ocl.clEnqueueNDRangeKernel(x->dev->queue, k, 1, NULL, &global, local ? &local : NULL, 0,
                                     NULL, NULL);
  if (err == CL_SUCCESS) return 0;
  err_set(err == CL_OUT_OF_RESOURCES || err == CL_MEM_OBJECT_ALLOCATION_FAILURE ? GRAFT_ERR_OOM
                                                                                : GRAFT_ERR_INTERNAL,
          "opencl device %d (%s): launching %s failed: %s", x->dev->id, x->dev->name, what,
          ocl_status_str(err));
  return -1;
}

static int ocl_gemm_run(void *e, const gpu_gemm *g, void *a, void *b, void *c) {
  ocl_exe *x = e;
  return ocl_blas_gemm(x->dev, g, (cl_mem)a, (cl_mem)b, (cl_mem)c);
}

static const cl_long ocl_zeros[GPU_STATUS_WORDS];

static int ocl_status_reset(void *e) {
  ocl_exe *x = e;
  cl_int st = ocl.clEnqueueWriteBuffer(x->dev->queue, x->status, CL_FALSE, 0, sizeof ocl_zeros,
                                       ocl_zeros, 0, NULL, NULL);
  if (st == CL_SUCCESS) return 0;
  err_set(GRAFT_ERR_INTERNAL, "opencl device %d: resetting a status buffer: %s", x->dev->id,
          ocl_status_str(st));
  return -1;
}

static int ocl_status_read(void *e, int64_t w[GPU_STATUS_WORDS]) {
  ocl_exe *x = e;
  cl_long v[GPU_STATUS_WORDS];
  cl_int st = ocl.clEnqueueReadBuffer(x->dev->queue, x->status, CL_TRUE, 0, sizeof v, v, 0, NULL, NULL);
  if (st != CL_SUCCESS) {
    err_set(GRAFT_ERR_INTERNAL, "opencl device %d: reading a status buffer: %s", x->dev->id,
            ocl_status_str(st));
    return -1;
  }
  for (int i = 0; i < GPU_STATUS_WORDS; i++) w[i] = (int64_t)v[i];
  return 0;
}

static int ocl_finish(void *e, const char *what) {
  ocl_exe *x = e;
  cl_int st = ocl.clFinish(x->dev->queue);
  if (st == CL_SUCCESS) return 0;
  err_set(GRAFT_ERR_INTERNAL, "opencl device %d: running %s: %s", x->dev->id, what, ocl_status_str(st));
  return -1;
}

static const gpu_runtime ocl_runtime = {
    .name = "OpenCL",
    .kernel_what = "an OpenCL kernel",
    .library_what = "a CLBlast GEMM",
    .launch = ocl_launch,
    .gemm = ocl_gemm_run,
    .status_reset = ocl_status_reset,
    .status_read = ocl_status_read,
    .finish = ocl_finish,
    .counters = &ocl_counters,
};

static int ocl_execute(void *e, const exec_program *p, exec_buffer *const *params, exec_buffer **outs) {
  ocl_exe *x = e;
  return gpu_run(&ocl_runtime, x, &x->gp, p, params, outs);
}

static void ocl_stats(backend_stats *out) {
  gpu_counters_get(&ocl_counters, out);
}

static void ocl_explain(void *e, const exec_program *p, int slot, char *buf, size_t n, char **source) {
  ocl_exe *x = e;
  (void)p;
  gpu_explain(&ocl_runtime, &x->gp, slot, buf, n, source);
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
