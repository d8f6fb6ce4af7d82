/* The backends built into graft, registered in one place (core/backend.h explains why this is
 * an explicit call and not a constructor). The only file that names them all. */
#include "backend.h"
#include "device.h"
#include "cpu/cpu.h"
#include "cuda/cuda_backend.h"
#include "opencl/ocl_backend.h"
#include "ref/ref.h"

void backend_register_builtin(void) {
  cpu_pool_fork_register();
  backend_register("cpu", BACKEND_REFERENCE, &ref_backend);
  backend_register("cpu", BACKEND_FIRST_TIER, &cpu_interp_backend);
  backend_register("cpu", BACKEND_COMPILER, &cpu_backend);
  backend_register("opencl", BACKEND_REFERENCE, &ocl_ref_backend);
  backend_register("opencl", BACKEND_FIRST_TIER, &ocl_first_backend);
  backend_register("opencl", BACKEND_COMPILER, &ocl_backend);
  backend_register("cuda", BACKEND_REFERENCE, &cuda_ref_backend);
  backend_register("cuda", BACKEND_FIRST_TIER, &cuda_first_backend);
  backend_register("cuda", BACKEND_COMPILER, &cuda_backend);
}

void device_discover_builtin(void) {
  ocl_discover();
  cuda_discover();
}
