/* GEMM through CLBlast (ocl_blas.c). Private to src/backends/opencl. */
#ifndef GRAFT_OCL_BLAS_H
#define GRAFT_OCL_BLAS_H
#include "ocl.h"

/* True when CLBlast could be opened (once). */
bool ocl_blas_available(void);

#ifdef GRAFT_HAVE_OPENCL_HEADERS
/* Row-major C[b] = op(A[b]) x op(B[b]) for b < batch, each matrix dense and consecutive. */
typedef struct {
  size_t m, n, k, batch;
  bool trans_a, trans_b; /* A stored [k, m] / B stored [n, k] */
} ocl_gemm;
/* Enqueues the GEMM on d's queue; 0, or -1 with the error set. */
int ocl_blas_gemm(ocl_device *d, bool f64, const ocl_gemm *g, cl_mem a, cl_mem b, cl_mem c);
#endif
#endif
