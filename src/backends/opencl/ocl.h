/* The OpenCL runtime (ocl_runtime.c): the loader opened with dlopen (nothing in the build needs
 * an OpenCL library; without one, or without a device, no OpenCL device is listed), one context
 * and in-order queue per device, device memory, program builds. Private to src/backends/opencl. */
#ifndef GRAFT_OCL_H
#define GRAFT_OCL_H
#include <stdbool.h>
#include <stddef.h>

#if defined(__has_include)
#if __has_include(<CL/cl.h>)
#define GRAFT_HAVE_OPENCL_HEADERS 1
#endif
#endif

#ifdef GRAFT_HAVE_OPENCL_HEADERS
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

/* The entry points graft calls, resolved from libOpenCL.so.1. */
#define OCL_FUNCS(X)                                                                             \
  X(clGetPlatformIDs) X(clGetPlatformInfo) X(clGetDeviceIDs) X(clGetDeviceInfo)                  \
  X(clCreateContext) X(clReleaseContext) X(clCreateCommandQueue) X(clReleaseCommandQueue)        \
  X(clCreateBuffer) X(clReleaseMemObject) X(clEnqueueWriteBuffer) X(clEnqueueReadBuffer)         \
  X(clEnqueueCopyBuffer) X(clFinish) X(clFlush) X(clCreateProgramWithSource)                     \
  X(clCreateProgramWithBinary) X(clBuildProgram) X(clGetProgramBuildInfo) X(clGetProgramInfo)    \
  X(clReleaseProgram) X(clCreateKernel) X(clReleaseKernel) X(clSetKernelArg)                     \
  X(clEnqueueNDRangeKernel) X(clGetKernelWorkGroupInfo) X(clWaitForEvents) X(clReleaseEvent)

typedef struct {
#define OCL_MEMBER(f) __typeof__(&f) f;
  OCL_FUNCS(OCL_MEMBER)
#undef OCL_MEMBER
} ocl_api;
/* The resolved entry points (valid once a device was found). */
extern ocl_api ocl;

typedef struct {
  int id; /* graft's device id */
  cl_platform_id platform;
  cl_device_id dev;
  cl_context ctx;
  cl_command_queue queue; /* in order: launches and transfers run in submission order */
  char name[160];
  char version[160]; /* platform + driver versions: part of every binary's cache key */
  size_t max_wg;     /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
  size_t local_mem;
  bool fp64;
  bool cpu; /* CL_DEVICE_TYPE_CPU (pocl): rows get the vector row form (gpu_caps.row_vec) */
} ocl_device;

/* The OpenCL device behind graft device id, or NULL. */
ocl_device *ocl_device_get(int id);
/* A readable name for an OpenCL status code ("CL_OUT_OF_RESOURCES"). */
const char *ocl_status_str(cl_int st);
/* Builds source for d with options, or loads its binary from the disk cache (*disk_hit); a
 * built program's binary is stored there. On failure NULL with the error set to the build
 * log's first error (GRAFT_ERR_COMPILE); what names the program in messages. */
cl_program ocl_build(ocl_device *d, const char *source, const char *options, const char *what,
                     bool *disk_hit);
#endif

/* Registers every OpenCL device found (GRAFT_OPENCL=0: none); called once by device discovery. */
void ocl_discover(void);
/* Releases the queues and contexts (graft_shutdown). */
void ocl_shutdown(void);
#endif
