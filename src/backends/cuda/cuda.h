/* The CUDA runtime (cuda_runtime.c): the driver (libcuda.so.1) opened with dlopen and declared
 * here, not included (nothing in the build needs a CUDA toolkit; without a driver, or without a
 * device, no CUDA device is listed and device_absent("cuda") says why); each device's primary
 * context and one stream, on which every launch, GEMM and transfer of the device is queued in
 * order (so device memory reused from the buffer pool is stream-ordered); NVRTC
 * (cuda_nvrtc.c) and cuBLAS (cuda_blas.c), opened the same way. Private to src/backends/cuda. */
#ifndef GRAFT_CUDA_H
#define GRAFT_CUDA_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../gpu/gpu_runner.h"

typedef int CUresult; /* 0: CUDA_SUCCESS */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NO_DEVICE 100
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76

/* The driver entry points graft calls: (name, return, parameters), resolved by these names. */
#define CUDA_FUNCS(X)                                                                            \
  X(cuInit, (unsigned flags))                                                                    \
  X(cuDriverGetVersion, (int *version))                                                          \
  X(cuDeviceGetCount, (int *count))                                                              \
  X(cuDeviceGet, (CUdevice * dev, int ordinal))                                                  \
  X(cuDeviceGetName, (char *name, int len, CUdevice dev))                                        \
  X(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev))                                         \
  X(cuDeviceGetAttribute, (int *value, int attribute, CUdevice dev))                             \
  X(cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))                                   \
  X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev))                                                \
  X(cuCtxPushCurrent_v2, (CUcontext ctx))                                                        \
  X(cuCtxPopCurrent_v2, (CUcontext * ctx))                                                       \
  X(cuStreamCreate, (CUstream * stream, unsigned flags))                                         \
  X(cuStreamDestroy_v2, (CUstream stream))                                                       \
  X(cuStreamSynchronize, (CUstream stream))                                                      \
  X(cuMemAlloc_v2, (CUdeviceptr * ptr, size_t bytes))                                            \
  X(cuMemFree_v2, (CUdeviceptr ptr))                                                             \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))     \
  X(cuMemcpyDtoHAsync_v2, (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))           \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))     \
  X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t n, CUstream stream))          \
  X(cuModuleLoadData, (CUmodule * mod, const void *image))                                       \
  X(cuModuleUnload, (CUmodule mod))                                                              \
  X(cuModuleGetFunction, (CUfunction * fn, CUmodule mod, const char *name))                      \
  X(cuLaunchKernel, (CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,          \
                     unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,  \
                     void **extra))                                                              \
  X(cuGetErrorName, (CUresult err, const char **name))

typedef struct {
#define CUDA_MEMBER(f, params) CUresult(*f) params;
  CUDA_FUNCS(CUDA_MEMBER)
#undef CUDA_MEMBER
} cuda_api;
/* The resolved entry points (valid once a device was found). */
extern cuda_api cuda;

typedef struct {
  int id; /* graft's device id */
  CUdevice dev;
  CUcontext ctx; /* the device's primary context (shared with PyTorch's CUDA in one process) */
  CUstream stream;
  char name[160];
  char arch[16];   /* "sm_90": what NVRTC compiles for */
  int max_threads; /* per block */
  int driver_version;
} cuda_device;

/* The CUDA device behind graft device id, or NULL. */
cuda_device *cuda_device_get(int id);
/* Makes d's context current on this thread (pushed: cuda_leave brings back the caller's, e.g.
 * PyTorch's current device); 0, or -1 with the error set (then nothing to leave). */
int cuda_enter(cuda_device *d);
void cuda_leave(void);
/* "CUDA_ERROR_OUT_OF_MEMORY" for a driver status. */
const char *cuda_status_str(CUresult st);
/* Sets the error for a failed driver call: "cuda device 4 (NVIDIA H200): what failed: NAME"
 * (GRAFT_ERR_OOM for out of memory); returns -1. */
int cuda_fail(const cuda_device *d, const char *what, CUresult st);

/* NVRTC (cuda_nvrtc.c). True when it could be opened; else why says why (once per process). */
bool cuda_nvrtc_available(const char **why);
/* source compiled by NVRTC for arch: a real one ("sm_90") gives the cubin (malloc'd, its size in
 * *n); with n NULL (a virtual one, "compute_90", is enough) only the compile is checked and the
 * answer is an empty string. NULL with the error set when it fails. log, when not NULL, gets
 * NVRTC's log (malloc'd, may be empty or NULL). No cache. */
void *cuda_nvrtc_compile(const char *source, const char *arch, const char *what, size_t *n, char **log);
/* The CUDA C source compiled for arch ("sm_90") to a cubin, from the disk cache when it holds it
 * (key: source, NVRTC's version, arch, graft's version; *disk_hit). malloc'd image and its size,
 * or NULL with the error set to NVRTC's log (GRAFT_ERR_COMPILE); what names it in messages. */
void *cuda_nvrtc_cubin(const char *source, const char *arch, const char *what, size_t *n, bool *disk_hit);

/* cuBLAS (cuda_blas.c): true when it could be opened. */
bool cuda_blas_available(void);
/* Queues g on d's stream (f32 exact unless GRAFT_ALLOW_TF32=1, as PyTorch's allow_tf32). */
int cuda_blas_gemm(cuda_device *d, const gpu_gemm *g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c);
#endif

/* Waits for every device's stream (graft_shutdown). */
void cuda_shutdown(void);
