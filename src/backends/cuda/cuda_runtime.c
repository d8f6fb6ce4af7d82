/* The CUDA runtime (cuda.h): the driver opened at discovery, each device's primary context and
 * stream, and device memory (device.h's operations; the buffer pool above caches blocks by size,
 * so a freed block is reused without a driver call). */
#include "cuda.h"
#include "device.h"
#include "error.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cuda_api cuda;
#define CUDA_MAX_DEVICES 8
static cuda_device cuda_devs[CUDA_MAX_DEVICES];
static int cuda_ndevs;

const char *cuda_status_str(CUresult st) {
  const char *name = NULL;
  if (cuda.cuGetErrorName && cuda.cuGetErrorName(st, &name) == CUDA_SUCCESS && name) return name;
  return "a CUDA driver error";
}

int cuda_fail(const cuda_device *d, const char *what, CUresult st) {
  err_set(st == CUDA_ERROR_OUT_OF_MEMORY ? GRAFT_ERR_OOM : GRAFT_ERR_INTERNAL,
          "cuda device %d (%s): %s failed: %s (%d)", d->id, d->name, what, cuda_status_str(st), (int)st);
  return -1;
}

cuda_device *cuda_device_get(int id) {
  for (int i = 0; i < cuda_ndevs; i++)
    if (cuda_devs[i].id == id) return &cuda_devs[i];
  return NULL;
}

int cuda_enter(cuda_device *d) {
  CUresult st = cuda.cuCtxPushCurrent_v2(d->ctx);
  return st == CUDA_SUCCESS ? 0 : cuda_fail(d, "making its context current", st);
}

void cuda_leave(void) {
  CUcontext c;
  (void)cuda.cuCtxPopCurrent_v2(&c);
}

/* ---- device memory (device.h's operations); transfers on the stream, so in order with the
 * kernels; a transfer from or to host memory waits, since the host block may go at once ---- */
static int cuda_mem_alloc(void *ctx, size_t bytes, void **handle) {
  cuda_device *d = ctx;
  CUdeviceptr p = 0;
  if (cuda_enter(d)) return -1;
  CUresult st = cuda.cuMemAlloc_v2(&p, bytes ? bytes : 1);
  cuda_leave();
  if (st != CUDA_SUCCESS) {
    err_set(st == CUDA_ERROR_OUT_OF_MEMORY ? GRAFT_ERR_OOM : GRAFT_ERR_INTERNAL,
            "out of memory on cuda device %d (%s): %zu bytes (%s)", d->id, d->name, bytes,
            cuda_status_str(st));
    return -1;
  }
  *handle = (void *)(uintptr_t)p;
  return 0;
}

static void cuda_mem_free(void *ctx, void *handle) {
  cuda_device *d = ctx;
  if (cuda_enter(d)) return;
  (void)cuda.cuMemFree_v2((CUdeviceptr)(uintptr_t)handle);
  cuda_leave();
}

static int cuda_mem_upload(void *ctx, void *handle, const void *src, size_t bytes) {
  cuda_device *d = ctx;
  if (cuda_enter(d)) return -1;
  CUresult st = cuda.cuMemcpyHtoDAsync_v2((CUdeviceptr)(uintptr_t)handle, src, bytes, d->stream);
  if (st == CUDA_SUCCESS) st = cuda.cuStreamSynchronize(d->stream);
  cuda_leave();
  return st == CUDA_SUCCESS ? 0 : cuda_fail(d, "an upload", st);
}

static int cuda_mem_download(void *ctx, const void *handle, void *dst, size_t bytes) {
  cuda_device *d = ctx;
  if (cuda_enter(d)) return -1;
  CUresult st = cuda.cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)(uintptr_t)handle, bytes, d->stream);
  if (st == CUDA_SUCCESS) st = cuda.cuStreamSynchronize(d->stream);
  cuda_leave();
  return st == CUDA_SUCCESS ? 0 : cuda_fail(d, "a download", st);
}

static int cuda_mem_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  cuda_device *d = ctx;
  if (cuda_enter(d)) return -1;
  CUresult st = cuda.cuMemcpyDtoDAsync_v2((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                          bytes, d->stream);
  cuda_leave();
  return st == CUDA_SUCCESS ? 0 : cuda_fail(d, "a copy", st);
}

static const device_mem cuda_mem = {cuda_mem_alloc, cuda_mem_free, cuda_mem_upload, cuda_mem_download,
                                    cuda_mem_copy};

/* ---- discovery ---- */
/* GRAFT_CUDA_DRIVER names the driver library (tests point it at something else); default the
 * loader's libcuda.so.1, which the NVIDIA driver installs. */
static int cuda_load(char *why, size_t n) {
  const char *env = getenv("GRAFT_CUDA_DRIVER");
  const char *name = env && *env ? env : "libcuda.so.1";
  void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(why, n, "no CUDA driver: %s could not be opened (%s); a CUDA device needs NVIDIA's "
             "driver (libcuda.so.1)", name, e ? e : "not found");
    return -1;
  }
  const char *missing = NULL;
#define CUDA_RESOLVE(f, params) \
  if (!(*(void **)&cuda.f = dlsym(lib, #f)) && !missing) missing = #f;
  CUDA_FUNCS(CUDA_RESOLVE)
#undef CUDA_RESOLVE
  if (missing) {
    snprintf(why, n, "no CUDA driver: %s lacks %s (not NVIDIA's driver, or too old)", name, missing);
    memset(&cuda, 0, sizeof cuda); /* lib stays open: glibc's dlclose leaks its dependency list */
    return -1;
  }
  return 0; /* kept open for the process's life */
}

static void cuda_add(int ordinal) {
  cuda_device *d = &cuda_devs[cuda_ndevs];
  size_t mem = 0;
  int major = 0, minor = 0;
  if (cuda.cuDeviceGet(&d->dev, ordinal) != CUDA_SUCCESS) return;
  cuda.cuDeviceGetName(d->name, (int)sizeof d->name - 1, d->dev);
  cuda.cuDeviceTotalMem_v2(&mem, d->dev);
  cuda.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev);
  cuda.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev);
  cuda.cuDeviceGetAttribute(&d->max_threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, d->dev);
  cuda.cuDriverGetVersion(&d->driver_version);
  snprintf(d->arch, sizeof d->arch, "sm_%d%d", major, minor);
  if (cuda.cuDevicePrimaryCtxRetain(&d->ctx, d->dev) != CUDA_SUCCESS) return;
  CUresult st = cuda.cuCtxPushCurrent_v2(d->ctx);
  if (st == CUDA_SUCCESS) {
    st = cuda.cuStreamCreate(&d->stream, 0);
    cuda_leave();
  }
  if (st != CUDA_SUCCESS) {
    cuda.cuDevicePrimaryCtxRelease_v2(d->dev);
    return;
  }
  d->id = device_register("cuda", d->name, mem, &cuda_mem, d);
  if (d->id < 0) {
    if (cuda.cuCtxPushCurrent_v2(d->ctx) == CUDA_SUCCESS) {
      cuda.cuStreamDestroy_v2(d->stream);
      cuda_leave();
    }
    cuda.cuDevicePrimaryCtxRelease_v2(d->dev);
    return;
  }
  cuda_ndevs++;
}

void cuda_discover(void) {
  char why[400];
  const char *env = getenv("GRAFT_CUDA");
  if (env && !strcmp(env, "0")) {
    device_note_absent("cuda", "GRAFT_CUDA=0 hides CUDA devices");
    return;
  }
  if (cuda_load(why, sizeof why)) {
    device_note_absent("cuda", why);
    return;
  }
  int count = 0;
  CUresult st = cuda.cuInit(0);
  if (st == CUDA_SUCCESS) st = cuda.cuDeviceGetCount(&count);
  if (st != CUDA_SUCCESS || !count) {
    snprintf(why, sizeof why, "the CUDA driver lists no device (%s)",
             st != CUDA_SUCCESS ? cuda_status_str(st) : "0 devices");
    device_note_absent("cuda", why);
    return;
  }
  for (int i = 0; i < count && cuda_ndevs < CUDA_MAX_DEVICES; i++) cuda_add(i);
  if (!cuda_ndevs) device_note_absent("cuda", "the CUDA driver lists devices, but none could be opened "
                                              "(a context or stream could not be made)");
}

void cuda_shutdown(void) {
  for (int i = 0; i < cuda_ndevs; i++)
    if (!cuda_enter(&cuda_devs[i])) {
      (void)cuda.cuStreamSynchronize(cuda_devs[i].stream);
      cuda_leave();
    }
}
