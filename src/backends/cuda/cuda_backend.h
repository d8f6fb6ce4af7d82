/* The CUDA device's backends (registered in src/backends/builtin.c). */
#ifndef GRAFT_CUDA_BACKEND_H
#define GRAFT_CUDA_BACKEND_H
#include "backend.h"

/* The reference kernels and the first tier, run on the host with transfers (host_bridge.h). */
extern const backend cuda_ref_backend;
extern const backend cuda_first_backend;
/* The compiler: the fused kernels rendered to CUDA C, compiled by NVRTC, run on the stream. */
extern const backend cuda_backend;
/* Registers every CUDA device found (cuda_runtime.c). */
void cuda_discover(void);
#endif
