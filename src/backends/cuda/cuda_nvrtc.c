/* NVRTC (cuda.h): CUDA C to a cubin for the device's own architecture, cached on disk like the
 * CPU's shared objects (dcache.h). Opened with dlopen: $GRAFT_NVRTC, else the loader's
 * libnvrtc.so.13 / .12 / .so (the toolkit's, or the package index's nvidia-cuda-nvrtc wheel's
 * folder on LD_LIBRARY_PATH). */
#include "cuda.h"
#include "error.h"
#include "graft.h"
#include "../dcache.h"
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* No contraction of a multiply and an add into an FMA (as the CPU build's -ffp-contract=off:
 * results match the reference kernels'; an explicit fmaf in the math text still fuses). */
#define CUDA_NVRTC_OPTIONS "--std=c++17", "--fmad=false"

typedef struct nvrtc_prog *nvrtc_program;
#define NVRTC_FUNCS(X)                                                                           \
  X(nvrtcVersion, (int *major, int *minor))                                                      \
  X(nvrtcCreateProgram, (nvrtc_program * p, const char *src, const char *name, int nheaders,     \
                         const char *const *headers, const char *const *include_names))          \
  X(nvrtcCompileProgram, (nvrtc_program p, int nopts, const char *const *opts))                  \
  X(nvrtcGetProgramLogSize, (nvrtc_program p, size_t * n))                                       \
  X(nvrtcGetProgramLog, (nvrtc_program p, char *log))                                            \
  X(nvrtcGetCUBINSize, (nvrtc_program p, size_t * n))                                            \
  X(nvrtcGetCUBIN, (nvrtc_program p, char *cubin))                                               \
  X(nvrtcDestroyProgram, (nvrtc_program * p))

static struct {
#define NVRTC_MEMBER(f, params) int(*f) params;
  NVRTC_FUNCS(NVRTC_MEMBER)
#undef NVRTC_MEMBER
} nvrtc;
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static char nvrtc_why[300];
static char nvrtc_version[32];

static void nvrtc_load(void) {
  const char *env = getenv("GRAFT_NVRTC");
  const char *names[] = {env, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  void *lib = NULL;
  for (size_t i = 0; i < sizeof names / sizeof *names && !lib; i++)
    if (names[i] && *names[i]) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(nvrtc_why, sizeof nvrtc_why, "no NVRTC: GRAFT_NVRTC=%s, libnvrtc.so.13/.12 not found "
             "(the CUDA toolkit's, or the nvidia-cuda-nvrtc wheel's lib folder on LD_LIBRARY_PATH)",
             env ? env : "");
    return;
  }
  const char *missing = NULL;
#define NVRTC_RESOLVE(f, params) \
  if (!(*(void **)&nvrtc.f = dlsym(lib, #f)) && !missing) missing = #f;
  NVRTC_FUNCS(NVRTC_RESOLVE)
#undef NVRTC_RESOLVE
  int major = 0, minor = 0;
  if (missing || nvrtc.nvrtcVersion(&major, &minor)) {
    snprintf(nvrtc_why, sizeof nvrtc_why, "no NVRTC: the library found lacks %s (older than CUDA 11.1)",
             missing ? missing : "a working nvrtcVersion");
    memset(&nvrtc, 0, sizeof nvrtc);
    dlclose(lib);
    return;
  }
  snprintf(nvrtc_version, sizeof nvrtc_version, "nvrtc %d.%d", major, minor);
}

bool cuda_nvrtc_available(const char **why) {
  pthread_once(&nvrtc_once, nvrtc_load);
  if (why) *why = nvrtc_why;
  return nvrtc.nvrtcCompileProgram != NULL;
}

void *cuda_nvrtc_compile(const char *source, const char *arch, const char *what, size_t *n, char **log) {
  const char *why;
  if (log) *log = NULL;
  if (!cuda_nvrtc_available(&why)) return err_set(GRAFT_ERR_COMPILE, "cuda: %s", why);
  nvrtc_program prog = NULL;
  char opt[48];
  snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {opt, CUDA_NVRTC_OPTIONS};
  if (nvrtc.nvrtcCreateProgram(&prog, source, "graft.cu", 0, NULL, NULL))
    return err_set(GRAFT_ERR_OOM, "cuda: NVRTC could not make a program for %s", what);
  int rc = nvrtc.nvrtcCompileProgram(prog, 3, opts);
  size_t sz = 0;
  char *text = NULL;
  if (!nvrtc.nvrtcGetProgramLogSize(prog, &sz) && (text = calloc(sz + 1, 1))) nvrtc.nvrtcGetProgramLog(prog, text);
  void *image = NULL;
  if (rc) {
    const char *e = text ? strstr(text, "error") : NULL;
    err_set(GRAFT_ERR_COMPILE, "cuda: NVRTC (%s, %s) failed on %s (result %d%s): %.1500s", nvrtc_version, arch,
            what, rc, rc == 7 ? ": its builtins library, libnvrtc-builtins, is not on the loader's path" : "",
            e ? e : text && *text ? text : "(no log)");
  } else if (!n) {
    if (!(image = strdup(""))) err_set(GRAFT_ERR_OOM, "cuda: out of memory"); /* a check: no image */
  } else if (!nvrtc.nvrtcGetCUBINSize(prog, n) && *n && (image = malloc(*n))) {
    if (nvrtc.nvrtcGetCUBIN(prog, image)) free(image), image = NULL;
    if (!image) err_set(GRAFT_ERR_INTERNAL, "cuda: NVRTC compiled %s but gave no cubin for %s", what, arch);
  } else {
    err_set(GRAFT_ERR_INTERNAL, "cuda: NVRTC compiled %s but gave no cubin for %s (a virtual architecture?)",
            what, arch);
  }
  nvrtc.nvrtcDestroyProgram(&prog);
  if (log) *log = text;
  else free(text);
  return image;
}

void *cuda_nvrtc_cubin(const char *source, const char *arch, const char *what, size_t *n, bool *disk_hit) {
  const char *why;
  *disk_hit = false;
  if (!cuda_nvrtc_available(&why)) return err_set(GRAFT_ERR_COMPILE, "cuda: %s", why);
  char dir[1100], name[64];
  if (dcache_dir(dir, sizeof dir, &why)) dir[0] = 0; /* refused: the CPU backend warns about it */
  uint64_t h = dcache_hash(source, strlen(source), 13);
  const char *tags[] = {nvrtc_version, arch, CUDA_NVRTC_OPTIONS, GRAFT_VERSION}; /* options: part of the key */
  for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) h = dcache_hash(tags[t], strlen(tags[t]), h);
  snprintf(name, sizeof name, "cuda-%016" PRIx64, h);
  void *image = dir[0] ? dcache_load(dir, name, "cubin", n) : NULL;
  if (image) {
    *disk_hit = true;
    return image;
  }
  image = cuda_nvrtc_compile(source, arch, what, n, NULL);
  if (image && dir[0]) (void)dcache_store(dir, name, "cubin", image, *n); /* best effort */
  return image;
}
