/* GEMM on the device through CLBlast (Debian's libclblast), opened with dlopen like the OpenCL
 * loader: without it, GEMMs run as fallbacks (counted) and nothing else changes. */
#include "ocl_blas.h"
#include "error.h"
#include <stdio.h>

#if defined(GRAFT_HAVE_OPENCL_HEADERS) && __has_include(<clblast_c.h>)
#include <clblast_c.h>
#include <dlfcn.h>
#include <pthread.h>

static struct {
  __typeof__(&CLBlastSgemmStridedBatched) s;
  __typeof__(&CLBlastDgemmStridedBatched) d;
} ocl_blas_fn;
static pthread_once_t ocl_blas_once = PTHREAD_ONCE_INIT;

static void ocl_blas_load(void) {
  void *h = dlopen("libclblast.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libclblast.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) return;
  *(void **)&ocl_blas_fn.s = dlsym(h, "CLBlastSgemmStridedBatched");
  *(void **)&ocl_blas_fn.d = dlsym(h, "CLBlastDgemmStridedBatched");
  if (!ocl_blas_fn.s || !ocl_blas_fn.d) ocl_blas_fn.s = NULL, ocl_blas_fn.d = NULL;
}

bool ocl_blas_available(void) {
  pthread_once(&ocl_blas_once, ocl_blas_load);
  return ocl_blas_fn.s != NULL;
}

int ocl_blas_gemm(ocl_device *d, const gpu_gemm *g, cl_mem a, cl_mem b, cl_mem c) {
  if (!ocl_blas_available()) {
    err_set(GRAFT_ERR_INTERNAL, "opencl: CLBlast is not available");
    return -1;
  }
  CLBlastTranspose ta = g->trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
  CLBlastTranspose tb = g->trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
  size_t lda = g->trans_a ? g->m : g->k, ldb = g->trans_b ? g->k : g->n;
  size_t sa = g->m * g->k, sb = g->k * g->n, sc = g->m * g->n;
  CLBlastStatusCode st =
      g->f64 ? ocl_blas_fn.d(CLBlastLayoutRowMajor, ta, tb, g->m, g->n, g->k, 1.0, a, 0, lda, sa, b, 0,
                          ldb, sb, 0.0, c, 0, g->n, sc, g->batch, &d->queue, NULL)
          : ocl_blas_fn.s(CLBlastLayoutRowMajor, ta, tb, g->m, g->n, g->k, 1.0f, a, 0, lda, sa, b, 0,
                          ldb, sb, 0.0f, c, 0, g->n, sc, g->batch, &d->queue, NULL);
  if (st == CLBlastSuccess) return 0;
  err_set(st == CLBlastOpenCLOutOfResources || st == CLBlastOpenCLOutOfHostMemory ? GRAFT_ERR_OOM
                                                                                  : GRAFT_ERR_INTERNAL,
          "opencl device %d (%s): CLBlast %cgemm [%zu x %zu x %zu, batch %zu] failed with status %d",
          d->id, d->name, g->f64 ? 'd' : 's', g->m, g->k, g->n, g->batch, (int)st);
  return -1;
}
#else
bool ocl_blas_available(void) { return false; }
#endif
