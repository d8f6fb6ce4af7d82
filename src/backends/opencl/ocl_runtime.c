/* The OpenCL runtime (ocl.h). The loader is opened at discovery, not linked: a machine without
 * OpenCL runs graft as before and simply lists no OpenCL device. */
#include "ocl.h"
#include "device.h"
#include "error.h"
#include "graft.h"
#include "../dcache.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef GRAFT_HAVE_OPENCL_HEADERS
void ocl_discover(void) { device_note_absent("opencl", "graft was built without OpenCL's headers (CL/cl.h)"); }
void ocl_shutdown(void) {}
#else
#include <dlfcn.h>
#include <inttypes.h>

ocl_api ocl;
static void *ocl_lib;
#define OCL_MAX_DEVICES 8
static ocl_device ocl_devs[OCL_MAX_DEVICES];
static int ocl_ndevs;

const char *ocl_status_str(cl_int st) {
  switch (st) {
#define S(c) case c: return #c;
  S(CL_SUCCESS) S(CL_DEVICE_NOT_FOUND) S(CL_OUT_OF_RESOURCES) S(CL_OUT_OF_HOST_MEMORY)
  S(CL_MEM_OBJECT_ALLOCATION_FAILURE) S(CL_BUILD_PROGRAM_FAILURE) S(CL_INVALID_VALUE)
  S(CL_INVALID_KERNEL_ARGS) S(CL_INVALID_WORK_GROUP_SIZE) S(CL_INVALID_BUFFER_SIZE)
  S(CL_INVALID_MEM_OBJECT) S(CL_INVALID_KERNEL_NAME) S(CL_INVALID_PROGRAM_EXECUTABLE)
  S(CL_INVALID_ARG_SIZE) S(CL_INVALID_ARG_INDEX) S(CL_INVALID_COMMAND_QUEUE)
  S(CL_INVALID_WORK_ITEM_SIZE) S(CL_INVALID_GLOBAL_WORK_SIZE) S(CL_INVALID_BINARY)
  S(CL_INVALID_OPERATION) S(CL_INVALID_PROGRAM) S(CL_INVALID_KERNEL)
#undef S
  default: return "an OpenCL error";
  }
}

ocl_device *ocl_device_get(int id) {
  for (int i = 0; i < ocl_ndevs; i++)
    if (ocl_devs[i].id == id) return &ocl_devs[i];
  return NULL;
}

/* ---- device memory (device.h's operations) ---- */
static int ocl_mem_alloc(void *ctx, size_t bytes, void **handle) {
  ocl_device *d = ctx;
  cl_int st;
  cl_mem m = ocl.clCreateBuffer(d->ctx, CL_MEM_READ_WRITE, bytes, NULL, &st);
  if (st != CL_SUCCESS || !m) {
    err_set(GRAFT_ERR_OOM, "out of memory on opencl device %d (%s): %zu bytes (%s)", d->id,
            d->name, bytes, ocl_status_str(st));
    return -1;
  }
  *handle = m;
  return 0;
}

static void ocl_mem_free(void *ctx, void *handle) {
  (void)ctx;
  ocl.clReleaseMemObject((cl_mem)handle);
}

static int ocl_fail(ocl_device *d, const char *what, cl_int st) {
  err_set(st == CL_MEM_OBJECT_ALLOCATION_FAILURE || st == CL_OUT_OF_RESOURCES ? GRAFT_ERR_OOM
                                                                               : GRAFT_ERR_INTERNAL,
          "opencl device %d (%s): %s failed: %s", d->id, d->name, what, ocl_status_str(st));
  return -1;
}

static int ocl_mem_upload(void *ctx, void *handle, const void *src, size_t bytes) {
  ocl_device *d = ctx;
  cl_int st = ocl.clEnqueueWriteBuffer(d->queue, (cl_mem)handle, CL_TRUE, 0, bytes, src, 0, NULL, NULL);
  return st == CL_SUCCESS ? 0 : ocl_fail(d, "an upload", st);
}

static int ocl_mem_download(void *ctx, const void *handle, void *dst, size_t bytes) {
  ocl_device *d = ctx;
  cl_int st = ocl.clEnqueueReadBuffer(d->queue, (cl_mem)handle, CL_TRUE, 0, bytes, dst, 0, NULL, NULL);
  return st == CL_SUCCESS ? 0 : ocl_fail(d, "a download", st);
}

static int ocl_mem_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  ocl_device *d = ctx;
  cl_int st = ocl.clEnqueueCopyBuffer(d->queue, (cl_mem)src, (cl_mem)dst, 0, 0, bytes, 0, NULL, NULL);
  return st == CL_SUCCESS ? 0 : ocl_fail(d, "a copy", st);
}

static const device_mem ocl_mem = {ocl_mem_alloc, ocl_mem_free, ocl_mem_upload, ocl_mem_download,
                                   ocl_mem_copy};

/* ---- discovery ---- */
static bool ocl_load(void) {
  ocl_lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!ocl_lib) ocl_lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
  if (!ocl_lib) return false;
  bool ok = true;
#define OCL_RESOLVE(f) ok = ok && (*(void **)&ocl.f = dlsym(ocl_lib, #f)) != NULL;
  OCL_FUNCS(OCL_RESOLVE)
#undef OCL_RESOLVE
  if (!ok) {
    dlclose(ocl_lib);
    ocl_lib = NULL;
  }
  return ok;
}

static void ocl_add(cl_platform_id plat, cl_device_id dev) {
  ocl_device *d = &ocl_devs[ocl_ndevs];
  cl_int st;
  char pname[48] = "", dname[96] = "", pver[80] = "", dver[64] = "";
  ocl.clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
  ocl.clGetPlatformInfo(plat, CL_PLATFORM_VERSION, sizeof pver - 1, pver, NULL);
  ocl.clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL);
  ocl.clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof dver - 1, dver, NULL);
  cl_ulong mem = 0, local = 0;
  cl_device_fp_config fp64 = 0;
  cl_device_type type = 0;
  ocl.clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
  ocl.clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
  ocl.clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof d->max_wg, &d->max_wg, NULL);
  ocl.clGetDeviceInfo(dev, CL_DEVICE_DOUBLE_FP_CONFIG, sizeof fp64, &fp64, NULL);
  ocl.clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL);
  d->ctx = ocl.clCreateContext(NULL, 1, &dev, NULL, NULL, &st);
  if (st != CL_SUCCESS) return;
  d->queue = ocl.clCreateCommandQueue(d->ctx, dev, 0, &st);
  if (st != CL_SUCCESS) {
    ocl.clReleaseContext(d->ctx);
    return;
  }
  d->platform = plat;
  d->dev = dev;
  d->local_mem = (size_t)local;
  d->fp64 = fp64 != 0;
  d->cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
  snprintf(d->name, sizeof d->name, "%s: %s", pname, dname);
  snprintf(d->version, sizeof d->version, "%s; driver %s", pver, dver);
  d->id = device_register("opencl", d->name, (size_t)mem, &ocl_mem, d);
  if (d->id < 0) {
    ocl.clReleaseCommandQueue(d->queue);
    ocl.clReleaseContext(d->ctx);
    return;
  }
  ocl_ndevs++;
}

void ocl_discover(void) {
  const char *env = getenv("GRAFT_OPENCL");
  if (env && !strcmp(env, "0")) {
    device_note_absent("opencl", "GRAFT_OPENCL=0 hides OpenCL devices");
    return;
  }
  if (!ocl_load()) {
    device_note_absent("opencl", "no OpenCL runtime: libOpenCL.so.1 (e.g. Debian's ocl-icd-libopencl1) "
                                 "could not be opened, or lacks OpenCL 1.2's entry points");
    return;
  }
  cl_platform_id plats[8];
  cl_uint np = 0;
  if (ocl.clGetPlatformIDs(8, plats, &np) != CL_SUCCESS) np = 0;
  for (cl_uint p = 0; p < np && p < 8; p++) {
    cl_device_id devs[8];
    cl_uint nd = 0;
    if (ocl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 8, devs, &nd) != CL_SUCCESS) continue;
    for (cl_uint i = 0; i < nd && i < 8 && ocl_ndevs < OCL_MAX_DEVICES; i++) ocl_add(plats[p], devs[i]);
  }
  if (!ocl_ndevs)
    device_note_absent("opencl", "the OpenCL runtime lists no usable device: a driver that lists one "
                                 "is needed (e.g. pocl-opencl-icd; check with clinfo -l)");
}

void ocl_shutdown(void) {
  for (int i = 0; i < ocl_ndevs; i++) ocl.clFinish(ocl_devs[i].queue);
}

static cl_program ocl_build_source(ocl_device *d, const char *source, const char *options,
                                   const char *what) {
  cl_int st;
  cl_program prog = ocl.clCreateProgramWithSource(d->ctx, 1, &source, NULL, &st);
  if (st != CL_SUCCESS) {
    ocl_fail(d, what, st);
    return NULL;
  }
  st = ocl.clBuildProgram(prog, 1, &d->dev, options, NULL, NULL);
  if (st == CL_SUCCESS) return prog;
  size_t need = 0; /* the whole log must fit, or nothing is written */
  ocl.clGetProgramBuildInfo(prog, d->dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &need);
  char *log = calloc(need + 1, 1);
  if (log) ocl.clGetProgramBuildInfo(prog, d->dev, CL_PROGRAM_BUILD_LOG, need, log, NULL);
  ocl.clReleaseProgram(prog);
  const char *err = log ? strstr(log, "error:") : NULL; /* the first error, not the warnings */
  err_set(GRAFT_ERR_COMPILE, "opencl device %d (%s): building %s failed (%s); build log: %.1500s",
          d->id, d->name, what, ocl_status_str(st), err ? err : log && log[0] ? log : "(empty)");
  free(log);
  return NULL;
}

/* ---- the disk cache of program binaries (dcache.h's folder and rules) ---- */
static void ocl_cache_name(ocl_device *d, const char *source, const char *options, char *out, size_t n) {
  uint64_t h = dcache_hash(source, strlen(source), 11);
  const char *tags[] = {d->name, d->version, options, GRAFT_VERSION};
  for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) h = dcache_hash(tags[t], strlen(tags[t]), h);
  snprintf(out, n, "ocl-%016" PRIx64, h);
}

static cl_program ocl_from_binary(ocl_device *d, const unsigned char *bin, size_t n, const char *options) {
  cl_int st, bst;
  cl_program prog = ocl.clCreateProgramWithBinary(d->ctx, 1, &d->dev, &n, &bin, &bst, &st);
  if (st != CL_SUCCESS || bst != CL_SUCCESS) {
    if (prog) ocl.clReleaseProgram(prog);
    return NULL;
  }
  if (ocl.clBuildProgram(prog, 1, &d->dev, options, NULL, NULL) != CL_SUCCESS) {
    ocl.clReleaseProgram(prog);
    return NULL;
  }
  return prog;
}

static void ocl_store_binary(cl_program prog, const char *dir, const char *name) {
  size_t n = 0;
  if (ocl.clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof n, &n, NULL) != CL_SUCCESS || !n)
    return;
  unsigned char *bin = malloc(n);
  if (bin && ocl.clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS)
    (void)dcache_store(dir, name, "clbin", bin, n); /* best effort: a later run builds again */
  free(bin);
}

cl_program ocl_build(ocl_device *d, const char *source, const char *options, const char *what,
                     bool *disk_hit) {
  char dir[1100], name[64];
  const char *why;
  *disk_hit = false;
  if (dcache_dir(dir, sizeof dir, &why)) dir[0] = 0; /* refused: the CPU backend warns about it */
  ocl_cache_name(d, source, options, name, sizeof name);
  size_t n = 0;
  unsigned char *bin = dir[0] ? dcache_load(dir, name, "clbin", &n) : NULL;
  cl_program prog = bin ? ocl_from_binary(d, bin, n, options) : NULL;
  free(bin);
  if (prog) {
    *disk_hit = true;
    return prog;
  }
  prog = ocl_build_source(d, source, options, what);
  if (prog && dir[0]) ocl_store_binary(prog, dir, name);
  return prog;
}
#endif
