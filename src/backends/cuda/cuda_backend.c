/* The CUDA device's backends. The compiler renders a program's fused kernels to CUDA C (the GPU
 * renderer's CUDA dialect), compiles them with NVRTC for the device's architecture (cubins cached
 * on disk), loads them once per executable and runs them with the shared step runner
 * (gpu_runner.h) on the device's stream, with cuBLAS for GEMMs; what it does not lower runs on
 * the host with transfers, counted per op. The reference backend and the first tier run the
 * whole program on the host with transfers (host_bridge.h), as on OpenCL. */
#include "cuda_backend.h"
#include "cuda.h"
#include "../host_bridge.h"
#include "../cpu/cpu_internal.h"
#include "error.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HOSTBRIDGE_BACKEND(cuda_ref_backend, "cuda-ref (host)", ref_backend);
HOSTBRIDGE_BACKEND(cuda_first_backend, "cuda-first-tier (host)", cpu_interp_backend);

static gpu_counters cuda_counters = GPU_COUNTERS_INIT;

typedef struct {
  cuda_device *dev;
  gpu_program gp;
  CUmodule mod;
  CUfunction *fns;
  CUdeviceptr status; /* gp.uses_status: GPU_STATUS_WORDS int64 */
} cuda_exe;

static void cuda_free_exe(void *e) {
  cuda_exe *x = e;
  if (!x) return;
  if ((x->mod || x->status) && !cuda_enter(x->dev)) {
    if (x->status) cuda.cuMemFree_v2(x->status);
    if (x->mod) cuda.cuModuleUnload(x->mod);
    cuda_leave();
  }
  free(x->fns);
  gpu_program_free(&x->gp);
  free(x);
}

static int cuda_load_kernels(cuda_exe *x, const char *what, bool *disk_hit) {
  size_t n = 0;
  void *image = cuda_nvrtc_cubin(x->gp.source, x->dev->arch, what, &n, disk_hit);
  if (!image) return -1;
  if (!(x->fns = calloc((size_t)x->gp.nkernels + 1, sizeof *x->fns))) {
    free(image);
    return err_set(GRAFT_ERR_OOM, "cuda: out of memory"), -1;
  }
  if (cuda_enter(x->dev)) return free(image), -1;
  CUresult st = cuda.cuModuleLoadData(&x->mod, image);
  free(image);
  if (st != CUDA_SUCCESS) x->mod = NULL;
  char failed[64] = "loading a module";
  for (int k = 0; st == CUDA_SUCCESS && k < x->gp.nkernels; k++) {
    char name[24];
    snprintf(name, sizeof name, "k%d", k);
    snprintf(failed, sizeof failed, "finding kernel %s in its module", name);
    st = cuda.cuModuleGetFunction(&x->fns[k], x->mod, name);
  }
  cuda_leave();
  return st == CUDA_SUCCESS ? 0 : cuda_fail(x->dev, failed, st);
}

static void *cuda_compile(const exec_program *p) {
  cuda_device *d = cuda_device_get(p->device);
  if (!d) return err_set(GRAFT_ERR_DEVICE, "cuda: device %d is not a CUDA device", p->device);
  cuda_exe *x = calloc(1, sizeof *x);
  if (!x) return err_set(GRAFT_ERR_OOM, "cuda: out of memory");
  x->dev = d;
  gpu_caps caps = {.fp64 = true, .have_gemm = cuda_blas_available(), .max_wg = d->max_threads, .row_vec = 0};
  if (gpu_render(p, &gpu_dialect_cuda, &caps, &x->gp)) {
    free(x);
    return NULL;
  }
  gpu_dump_source(p, &gpu_dialect_cuda, x->gp.source);
  char what[64];
  snprintf(what, sizeof what, "the kernels of graph %016" PRIx64, p->hash);
  bool disk_hit = false;
  if (x->gp.nkernels && cuda_load_kernels(x, what, &disk_hit)) {
    cuda_free_exe(x);
    return NULL;
  }
  if (x->gp.uses_status) {
    CUresult st = CUDA_SUCCESS;
    if (!cuda_enter(d)) {
      st = cuda.cuMemAlloc_v2(&x->status, GPU_STATUS_WORDS * 8);
      cuda_leave();
      if (st != CUDA_SUCCESS) cuda_fail(d, "a status buffer", st);
    }
    if (!x->status || st != CUDA_SUCCESS) {
      x->status = 0;
      cuda_free_exe(x);
      return NULL;
    }
  }
  gpu_count_compile(&cuda_counters, disk_hit);
  return x;
}

/* A block size that divides n, when the renderer left it to the runtime. */
static unsigned cuda_block_for(int64_t n, int max_threads) {
  unsigned b = max_threads >= 256 ? 256 : (unsigned)max_threads;
  while (b > 1 && n % b) b /= 2;
  return b;
}

static int cuda_launch(void *e, const gpu_step *st, void *const *mem, int nmem, const char *what) {
  cuda_exe *x = e;
  void **params = malloc(((size_t)nmem + 1) * sizeof *params);
  if (!params) return err_set(GRAFT_ERR_OOM, "cuda: out of memory"), -1;
  for (int a = 0; a < nmem; a++) params[a] = (void *)&mem[a]; /* each a device pointer's address */
  if (st->status) params[nmem] = &x->status;
  unsigned block = st->local ? (unsigned)st->local : cuda_block_for(st->global, x->dev->max_threads);
  int64_t grid = st->global / block;
  CUresult rc = grid > 0x7fffffff ? 1 /* CUDA_ERROR_INVALID_VALUE */ : CUDA_SUCCESS;
  if (rc == CUDA_SUCCESS)
    rc = cuda.cuLaunchKernel(x->fns[st->kernel], (unsigned)grid, 1, 1, block, 1, 1, 0, x->dev->stream,
                             params, NULL);
  free(params);
  if (rc == CUDA_SUCCESS) return 0;
  char buf[160];
  snprintf(buf, sizeof buf, "launching %s [%" PRId64 " blocks of %u]", what, grid, block);
  return cuda_fail(x->dev, buf, rc);
}

static int cuda_gemm_run(void *e, const gpu_gemm *g, void *a, void *b, void *c) {
  cuda_exe *x = e;
  return cuda_blas_gemm(x->dev, g, (CUdeviceptr)(uintptr_t)a, (CUdeviceptr)(uintptr_t)b,
                        (CUdeviceptr)(uintptr_t)c);
}

static int cuda_status_reset(void *e) {
  cuda_exe *x = e;
  CUresult st = cuda.cuMemsetD8Async(x->status, 0, GPU_STATUS_WORDS * 8, x->dev->stream);
  return st == CUDA_SUCCESS ? 0 : cuda_fail(x->dev, "resetting a status buffer", st);
}

static int cuda_status_read(void *e, int64_t w[GPU_STATUS_WORDS]) {
  cuda_exe *x = e;
  CUresult st = cuda.cuMemcpyDtoHAsync_v2(w, x->status, GPU_STATUS_WORDS * 8, x->dev->stream);
  if (st == CUDA_SUCCESS) st = cuda.cuStreamSynchronize(x->dev->stream);
  return st == CUDA_SUCCESS ? 0 : cuda_fail(x->dev, "reading a status buffer", st);
}

static int cuda_finish(void *e, const char *what) {
  cuda_exe *x = e;
  CUresult st = cuda.cuStreamSynchronize(x->dev->stream);
  if (st == CUDA_SUCCESS) return 0;
  char buf[96];
  snprintf(buf, sizeof buf, "running %s", what);
  return cuda_fail(x->dev, buf, st);
}

static const gpu_runtime cuda_runtime = {
    .name = "CUDA",
    .kernel_what = "a CUDA kernel",
    .library_what = "a cuBLAS GEMM",
    .launch = cuda_launch,
    .gemm = cuda_gemm_run,
    .status_reset = cuda_status_reset,
    .status_read = cuda_status_read,
    .finish = cuda_finish,
    .counters = &cuda_counters,
};

static int cuda_execute(void *e, const exec_program *p, exec_buffer *const *params, exec_buffer **outs) {
  cuda_exe *x = e;
  if (cuda_enter(x->dev)) return gpu_release_donated(p, params), -1;
  int rc = gpu_run(&cuda_runtime, x, &x->gp, p, params, outs);
  cuda_leave();
  return rc;
}

static void cuda_stats(backend_stats *out) {
  gpu_counters_get(&cuda_counters, out);
}

static void cuda_explain(void *e, const exec_program *p, int slot, char *buf, size_t n, char **source) {
  cuda_exe *x = e;
  (void)p;
  gpu_explain(&cuda_runtime, &x->gp, slot, buf, n, source);
}

const backend cuda_backend = {
    .name = "cuda",
    .supports = NULL, /* what it does not lower falls back per instruction, counted */
    .compile = cuda_compile,
    .execute = cuda_execute,
    .free_exe = cuda_free_exe,
    .stats = cuda_stats,
    .shutdown = cuda_shutdown,
    .explain = cuda_explain,
};
