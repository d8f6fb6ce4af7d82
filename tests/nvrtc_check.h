/* Tests' check of the CUDA dialect without a GPU: a program rendered by the GPU renderer in CUDA
 * C must compile with NVRTC for compute_80 and compute_90 with nothing in its log. NVRTC is
 * opened at run time: $GRAFT_NVRTC, else the loader's libnvrtc.so.13 / .12 / .so; absent, the
 * check passes, and nvrtc_summary says it was skipped and why (the Makefile's check-asan points
 * GRAFT_NVRTC at the torch wheel's copy). Included by test_op_coverage.c and
 * test_cpu_backend.c (its compare(), so every graph of that suite and the fuzz seeds). */
#ifndef GRAFT_TEST_NVRTC_CHECK_H
#define GRAFT_TEST_NVRTC_CHECK_H
#include "program.h"
#include "../src/backends/gpu/gpu_render.h"
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*nvrtc_create_fn)(void **, const char *, const char *, int, const char *const *,
                               const char *const *);
typedef int (*nvrtc_compile_fn)(void *, int, const char *const *);
typedef int (*nvrtc_logsize_fn)(void *, size_t *);
typedef int (*nvrtc_log_fn)(void *, char *);
typedef int (*nvrtc_destroy_fn)(void **);
static struct {
  int state; /* 0 not tried, 1 open, 2 absent */
  void *dl;
  nvrtc_create_fn create;
  nvrtc_compile_fn compile;
  nvrtc_logsize_fn logsize;
  nvrtc_log_fn log;
  nvrtc_destroy_fn destroy;
  char why[300];
  int compiled;
} nvrtc;

static bool nvrtc_open(void) {
  if (nvrtc.state) return nvrtc.state == 1;
  const char *env = getenv("GRAFT_NVRTC"), *names[] = {env, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  for (size_t i = 0; i < sizeof names / sizeof *names && !nvrtc.dl; i++)
    if (names[i] && *names[i]) nvrtc.dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (nvrtc.dl) {
    nvrtc.create = (nvrtc_create_fn)dlsym(nvrtc.dl, "nvrtcCreateProgram");
    nvrtc.compile = (nvrtc_compile_fn)dlsym(nvrtc.dl, "nvrtcCompileProgram");
    nvrtc.logsize = (nvrtc_logsize_fn)dlsym(nvrtc.dl, "nvrtcGetProgramLogSize");
    nvrtc.log = (nvrtc_log_fn)dlsym(nvrtc.dl, "nvrtcGetProgramLog");
    nvrtc.destroy = (nvrtc_destroy_fn)dlsym(nvrtc.dl, "nvrtcDestroyProgram");
  }
  bool ok = nvrtc.dl && nvrtc.create && nvrtc.compile && nvrtc.logsize && nvrtc.log && nvrtc.destroy;
  if (!ok)
    snprintf(nvrtc.why, sizeof nvrtc.why, "no NVRTC (GRAFT_NVRTC=%s; libnvrtc.so.13/.12 %s)",
             env ? env : "", nvrtc.dl ? "lacks its entry points" : "not found");
  nvrtc.state = ok ? 1 : 2;
  return ok;
}

/* The source compiled for arch; its log into log (empty: clean). */
static int nvrtc_build(const char *src, const char *arch, char *log, size_t n) {
  void *prog = NULL;
  char opt[64];
  snprintf(opt, sizeof opt, "--gpu-architecture=%s", arch);
  const char *opts[] = {opt, "--std=c++17"};
  log[0] = 0;
  if (nvrtc.create(&prog, src, "graft.cu", 0, NULL, NULL)) return -1;
  int rc = nvrtc.compile(prog, 2, opts);
  size_t sz = 0;
  if (!nvrtc.logsize(prog, &sz) && sz > 1) {
    char *l = malloc(sz);
    if (l && !nvrtc.log(prog, l)) snprintf(log, n, "%s", l);
    free(l);
  }
  nvrtc.destroy(&prog);
  return rc;
}

/* 0 when p renders in CUDA C and compiles cleanly (or NVRTC is absent); else 1, why in why. */
static int nvrtc_check(const exec_program *p, char *why, size_t n) {
  if (!nvrtc_open()) return 0;
  gpu_caps caps = {.fp64 = true, .have_gemm = true, .max_wg = 1024, .row_vec = 0};
  gpu_program gp;
  if (gpu_render(p, &gpu_dialect_cuda, &caps, &gp)) {
    snprintf(why, n, "the CUDA renderer failed: %s", graft_last_error());
    graft_clear_error();
    return 1;
  }
  static const char *const archs[] = {"compute_80", "compute_90"};
  int bad = 0;
  for (int a = 0; a < 2 && gp.nkernels && !bad; a++) {
    char log[1500];
    int rc = nvrtc_build(gp.source, archs[a], log, sizeof log);
    if (rc || strspn(log, " \n\r\t") != strlen(log)) {
      snprintf(why, n, "NVRTC (%s) %s: %s", archs[a], rc ? "failed" : "warned", log);
      if (getenv("SHOW_CUDA")) fputs(gp.source, stderr);
      bad = 1;
    } else {
      nvrtc.compiled++;
    }
  }
  gpu_program_free(&gp);
  return bad;
}

static void nvrtc_summary(void) {
  if (nvrtc.state == 1)
    printf("  CUDA C: %d sources compiled by NVRTC (compute_80 and compute_90), none warned\n", nvrtc.compiled);
  else if (nvrtc.state == 2)
    printf("  CUDA C: skipped: %s\n", nvrtc.why);
}
#endif
