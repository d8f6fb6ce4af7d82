/* The OpenCL device's backends. Placeholder compiler: the CPU compiler's code run on the host
 * with transfers, until the kernel renderer lands. */
#include "ocl_backend.h"
#include "../cpu/cpu.h"
#include "../host_bridge.h"
#include "../ref/ref.h"

HOSTBRIDGE_BACKEND(ocl_ref_backend, "opencl-ref (host)", ref_backend);
HOSTBRIDGE_BACKEND(ocl_first_backend, "opencl-first-tier (host)", cpu_interp_backend);
HOSTBRIDGE_BACKEND(ocl_backend, "opencl-host", cpu_backend);
