/* The OpenCL device's backends (registered in src/backends/builtin.c). */
#ifndef GRAFT_OCL_BACKEND_H
#define GRAFT_OCL_BACKEND_H
#include "backend.h"

/* The reference kernels and the first tier, run on the host with transfers (host_bridge.h). */
extern const backend ocl_ref_backend;
extern const backend ocl_first_backend;
/* The compiler: the fused kernels rendered to OpenCL C and built for the device. */
extern const backend ocl_backend;
/* Registers every OpenCL device found (ocl_runtime.c). */
void ocl_discover(void);
#endif
