/* GEMM through CLBlast (ocl_blas.c). Private to src/backends/opencl. */
#ifndef GRAFT_OCL_BLAS_H
#define GRAFT_OCL_BLAS_H
#include "ocl.h"
#include "../gpu/gpu_runner.h"

/* True when CLBlast could be opened (once). */
bool ocl_blas_available(void);

#ifdef GRAFT_HAVE_OPENCL_HEADERS
/* Enqueues the GEMM on d's queue; 0, or -1 with the error set. */
int ocl_blas_gemm(ocl_device *d, const gpu_gemm *g, cl_mem a, cl_mem b, cl_mem c);
#endif
#endif
