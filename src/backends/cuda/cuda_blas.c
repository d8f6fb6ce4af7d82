/* GEMM through cuBLAS (cuda.h), opened with dlopen like the driver: without it, GEMMs run as
 * host fallbacks (counted) and nothing else changes. Row-major C = op(A) x op(B) is cuBLAS's
 * column-major C^T = op(B)^T x op(A)^T: the operands swap, no transposes are made. */
#include "cuda.h"
#include "error.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cublas_ctx *cublas_handle;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
#define CUBLAS_FUNCS(X)                                                                          \
  X(cublasCreate_v2, (cublas_handle * h))                                                        \
  X(cublasDestroy_v2, (cublas_handle h))                                                         \
  X(cublasSetStream_v2, (cublas_handle h, CUstream s))                                           \
  X(cublasSetMathMode, (cublas_handle h, int mode))                                              \
  X(cublasSgemmStridedBatched, (cublas_handle h, int ta, int tb, int m, int n, int k,            \
                                const float *alpha, CUdeviceptr a, int lda, long long sa,        \
                                CUdeviceptr b, int ldb, long long sb, const float *beta,         \
                                CUdeviceptr c, int ldc, long long sc, int batch))                \
  X(cublasDgemmStridedBatched, (cublas_handle h, int ta, int tb, int m, int n, int k,            \
                                const double *alpha, CUdeviceptr a, int lda, long long sa,       \
                                CUdeviceptr b, int ldb, long long sb, const double *beta,        \
                                CUdeviceptr c, int ldc, long long sc, int batch))

static struct {
#define CUBLAS_MEMBER(f, params) int(*f) params;
  CUBLAS_FUNCS(CUBLAS_MEMBER)
#undef CUBLAS_MEMBER
} cublas;
static pthread_once_t cublas_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cublas_mu = PTHREAD_MUTEX_INITIALIZER; /* a handle serves one thread at a time */
#define CUBLAS_MAX_DEVICES 16
static struct {
  int device;
  cublas_handle h;
} cublas_handles[CUBLAS_MAX_DEVICES];

static void cublas_load(void) {
  const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) return;
  bool ok = true;
#define CUBLAS_RESOLVE(f, params) ok = ok && (*(void **)&cublas.f = dlsym(lib, #f)) != NULL;
  CUBLAS_FUNCS(CUBLAS_RESOLVE)
#undef CUBLAS_RESOLVE
  if (!ok) memset(&cublas, 0, sizeof cublas);
}

bool cuda_blas_available(void) {
  pthread_once(&cublas_once, cublas_load);
  return cublas.cublasSgemmStridedBatched != NULL;
}

/* d's handle, made on first use on its stream (called with cublas_mu held). */
static cublas_handle cublas_handle_of(cuda_device *d) {
  int i = 0;
  for (; i < CUBLAS_MAX_DEVICES && cublas_handles[i].h; i++)
    if (cublas_handles[i].device == d->id) return cublas_handles[i].h;
  if (i == CUBLAS_MAX_DEVICES) return NULL;
  cublas_handle h = NULL;
  const char *tf32 = getenv("GRAFT_ALLOW_TF32");
  if (cublas.cublasCreate_v2(&h)) return NULL;
  if (cublas.cublasSetStream_v2(h, d->stream) ||
      cublas.cublasSetMathMode(h, tf32 && !strcmp(tf32, "1") ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH)) {
    cublas.cublasDestroy_v2(h);
    return NULL;
  }
  cublas_handles[i].device = d->id;
  cublas_handles[i].h = h;
  return h;
}

int cuda_blas_gemm(cuda_device *d, const gpu_gemm *g, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c) {
  if (!cuda_blas_available()) return err_set(GRAFT_ERR_INTERNAL, "cuda: cuBLAS is not available"), -1;
  if (g->m > 0x7fffffff || g->n > 0x7fffffff || g->k > 0x7fffffff || g->batch > 0x7fffffff)
    return err_set(GRAFT_ERR_SHAPE, "cuda: a GEMM [%zu x %zu x %zu, batch %zu] exceeds cuBLAS's int sizes",
                   g->m, g->k, g->n, g->batch), -1;
  if (cuda_enter(d)) return -1;
  int m = (int)g->m, n = (int)g->n, k = (int)g->k;
  int lda = g->trans_a ? m : k, ldb = g->trans_b ? k : n;
  long long sa = (long long)g->m * g->k, sb = (long long)g->k * g->n, sc = (long long)g->m * g->n;
  int ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  pthread_mutex_lock(&cublas_mu);
  cublas_handle h = cublas_handle_of(d);
  int st = -1;
  if (h && g->f64) {
    const double one = 1, zero = 0;
    st = cublas.cublasDgemmStridedBatched(h, ta, tb, n, m, k, &one, b, ldb, sb, a, lda, sa, &zero, c, n, sc,
                                          (int)g->batch);
  } else if (h) {
    const float one = 1, zero = 0;
    st = cublas.cublasSgemmStridedBatched(h, ta, tb, n, m, k, &one, b, ldb, sb, a, lda, sa, &zero, c, n, sc,
                                          (int)g->batch);
  }
  pthread_mutex_unlock(&cublas_mu);
  cuda_leave();
  if (!st) return 0;
  err_set(st == 3 ? GRAFT_ERR_OOM : GRAFT_ERR_INTERNAL, /* 3: CUBLAS_STATUS_ALLOC_FAILED */
          "cuda device %d (%s): cuBLAS %cgemm [%zu x %zu x %zu, batch %zu] failed with status %d%s", d->id,
          d->name, g->f64 ? 'd' : 's', g->m, g->k, g->n, g->batch, st, h ? "" : " (no handle)");
  return -1;
}
