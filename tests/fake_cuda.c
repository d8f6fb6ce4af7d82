/* A stand-in for NVIDIA's driver (libcuda.so.1) for tests on machines without a GPU: the driver
 * entry points graft resolves (src/backends/cuda/cuda.h), with one device whose "device memory"
 * is host memory, so discovery, contexts, streams, allocation, transfers, the memory limit and
 * the errors of a failing driver run for real. Kernels cannot run: cuLaunchKernel fails with
 * CUDA_ERROR_NOT_SUPPORTED (801) after checking its arguments, and graft must report it.
 * FAKE_CUDA_MEMORY: bytes the device has (default 1 GiB); an allocation past it fails with
 * CUDA_ERROR_OUT_OF_MEMORY. FAKE_CUDA_DEVICES=0: the driver lists no device. Loaded by
 * tests/test_device.c through GRAFT_CUDA_DRIVER. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_IMAGE = 200,
       NOT_FOUND = 500, NOT_SUPPORTED = 801 };

#include <stdatomic.h>
static int inited;
static _Atomic size_t used; /* graft frees from its pool's threads too */
static char ctx_token, stream_token, module_token, function_token;

static size_t capacity(void) {
  const char *e = getenv("FAKE_CUDA_MEMORY");
  return e && *e ? (size_t)strtoull(e, NULL, 10) : (size_t)1 << 30;
}

CUresult cuInit(unsigned flags) { inited = flags == 0; return inited ? OK : INVALID_VALUE; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) {
  const char *e = getenv("FAKE_CUDA_DEVICES");
  *n = e && *e ? atoi(e) : 1;
  return inited ? OK : NOT_INITIALIZED;
}
CUresult cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal == 0 ? OK : INVALID_VALUE; }
CUresult cuDeviceGetName(char *name, int len, int dev) {
  (void)dev;
  strncpy(name, "graft fake GPU (host memory)", (size_t)len);
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = capacity(); return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  (void)dev;
  *v = attr == 1 ? 1024 : attr == 75 ? 9 : attr == 76 ? 0 : attr == 16 ? 132 : 0;
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = &ctx_token; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
/* The current-context stack of the calling thread: graft pushes its context and pops it back. */
static _Thread_local int depth;
CUresult cuCtxPushCurrent_v2(void *ctx) {
  if (ctx != &ctx_token) return INVALID_VALUE;
  depth++;
  return OK;
}
CUresult cuCtxPopCurrent_v2(void **ctx) {
  if (depth <= 0) return INVALID_VALUE; /* a pop without its push */
  depth--;
  if (ctx) *ctx = &ctx_token;
  return OK;
}
#define NEED_CTX \
  if (depth <= 0) return 201 /* CUDA_ERROR_INVALID_CONTEXT */
CUresult cuStreamCreate(void **s, unsigned flags) {
  NEED_CTX;
  (void)flags;
  *s = &stream_token;
  return OK;
}
CUresult cuStreamDestroy_v2(void *s) { return s == &stream_token ? OK : INVALID_VALUE; }
CUresult cuStreamSynchronize(void *s) { return s == &stream_token ? OK : INVALID_VALUE; }

/* Each block carries its size in front, for the accounting. */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  NEED_CTX;
  if (!bytes) return INVALID_VALUE;
  if (used + bytes > capacity()) return OUT_OF_MEMORY;
  size_t *b = malloc(bytes + 16);
  if (!b) return OUT_OF_MEMORY;
  b[0] = bytes;
  used += bytes;
  *p = (CUdeviceptr)(uintptr_t)(b + 2);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX;
  if (!p) return OK;
  size_t *b = (size_t *)(uintptr_t)p - 2;
  used -= b[0];
  free(b);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
  if (st != &stream_token) return INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, s, n);
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
  if (st != &stream_token) return INVALID_VALUE;
  memcpy(d, (const void *)(uintptr_t)s, n);
  return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  if (st != &stream_token) return INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *st) {
  if (st != &stream_token) return INVALID_VALUE;
  memset((void *)(uintptr_t)d, v, n);
  return OK;
}
/* A cubin is an ELF image (NVRTC's, for sm_90). */
CUresult cuModuleLoadData(void **m, const void *image) {
  NEED_CTX;
  if (memcmp(image, "\177ELF", 4)) return INVALID_IMAGE;
  *m = &module_token;
  return OK;
}
CUresult cuModuleUnload(void *m) { return m == &module_token ? OK : INVALID_VALUE; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  if (m != &module_token || name[0] != 'k') return NOT_FOUND;
  *f = &function_token;
  return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *st, void **params, void **extra) {
  (void)shared;
  (void)extra;
  NEED_CTX;
  if (f != &function_token || st != &stream_token || !gx || !bx || bx > 1024 || gy != 1 || gz != 1 ||
      by != 1 || bz != 1 || !params || !params[0] || !*(void **)params[0])
    return INVALID_VALUE;
  return NOT_SUPPORTED;
}
CUresult cuGetErrorName(CUresult e, const char **name) {
  static const char *const names[] = {[OK] = "CUDA_SUCCESS", [INVALID_VALUE] = "CUDA_ERROR_INVALID_VALUE",
                                      [OUT_OF_MEMORY] = "CUDA_ERROR_OUT_OF_MEMORY",
                                      [NOT_INITIALIZED] = "CUDA_ERROR_NOT_INITIALIZED"};
  *name = e >= 0 && e <= NOT_INITIALIZED ? names[e] : e == INVALID_IMAGE ? "CUDA_ERROR_INVALID_IMAGE"
          : e == NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : e == NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED" : NULL;
  return *name ? OK : INVALID_VALUE;
}
