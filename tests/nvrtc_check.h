/* Tests' check of the CUDA dialect without a GPU: a program rendered by the GPU renderer in CUDA
 * C must compile with NVRTC (the CUDA backend's own loader, src/backends/cuda/cuda_nvrtc.c) for
 * compute_80 and compute_90 with nothing in its log; the first one is also built to a cubin for
 * sm_90 through the disk cache, twice (the second from the cache), as the runtime does. NVRTC is
 * opened at run time: $GRAFT_NVRTC, else the loader's libnvrtc.so.13 / .12 / .so; absent, the
 * check passes, and nvrtc_summary says it was skipped and why (the Makefile's check-asan points
 * GRAFT_NVRTC at the torch wheel's copy). Included by test_op_coverage.c and
 * test_cpu_backend.c (its compare(), so every graph of that suite and the fuzz seeds). */
#ifndef GRAFT_TEST_NVRTC_CHECK_H
#define GRAFT_TEST_NVRTC_CHECK_H
#include "program.h"
#include "../src/backends/gpu/gpu_runner.h"
#include "../src/backends/cuda/cuda.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
  int compiled;
  int cubins; /* 0 not yet; 1 built and read back from the disk cache; -1 failed */
  char cubin_why[600];
} nvrtc_stats;

/* The real-architecture build the runtime makes, through the disk cache: built (or found), then
 * found. */
static int nvrtc_cubin_check(const char *src, char *why, size_t n) {
  size_t n1 = 0, n2 = 0;
  bool hit1 = false, hit2 = false;
  unsigned char *a = cuda_nvrtc_cubin(src, "sm_90", "a test graph", &n1, &hit1);
  unsigned char *b = a ? cuda_nvrtc_cubin(src, "sm_90", "a test graph", &n2, &hit2) : NULL;
  bool ok = a && b && n1 == n2 && !memcmp(a, b, n1) && n1 > 4 && !memcmp(a, "\177ELF", 4) &&
            (hit2 || (getenv("GRAFT_DISK_CACHE") && !strcmp(getenv("GRAFT_DISK_CACHE"), "0")));
  if (!ok) snprintf(why, n, "sm_90 cubin through the disk cache: %s", a && b ? "differs, not ELF, or no disk hit"
                                                                            : graft_last_error());
  graft_clear_error();
  free(a);
  free(b);
  nvrtc_stats.cubins = ok ? 1 : -1;
  return !ok;
}

/* 0 when p renders in CUDA C and compiles cleanly (or NVRTC is absent); else 1, why in why. */
static int nvrtc_check(const exec_program *p, char *why, size_t n) {
  const char *dev = getenv("GRAFT_TEST_DEVICE");
  if (dev && !strncmp(dev, "cuda", 4)) return 0; /* on a GPU: the device's own builds check it */
  if (!cuda_nvrtc_available(NULL)) return 0;
  gpu_caps caps = {.fp64 = true, .have_gemm = true, .max_wg = 1024, .row_vec = 0};
  gpu_program gp;
  if (gpu_render(p, &gpu_dialect_cuda, &caps, &gp)) {
    snprintf(why, n, "the CUDA renderer failed: %s", graft_last_error());
    graft_clear_error();
    return 1;
  }
  gpu_dump_source(p, &gpu_dialect_cuda, gp.source); /* GRAFT_DUMP_DIR: graph_<hash>.cu */
  static const char *const archs[] = {"compute_80", "compute_90"};
  int bad = 0;
  for (int a = 0; a < 2 && gp.nkernels && !bad; a++) {
    char *log = NULL;
    char *ok = cuda_nvrtc_compile(gp.source, archs[a], "a test graph", NULL, &log);
    if (!ok || (log && strspn(log, " \n\r\t") != strlen(log))) {
      snprintf(why, n, "NVRTC (%s) %s: %.1400s", archs[a], ok ? "warned" : "failed",
               ok ? log : graft_last_error());
      graft_clear_error();
      if (getenv("SHOW_CUDA")) fputs(gp.source, stderr);
      bad = 1;
    } else {
      nvrtc_stats.compiled++;
    }
    free(ok);
    free(log);
  }
  if (!bad && gp.nkernels && !nvrtc_stats.cubins) bad = nvrtc_cubin_check(gp.source, why, n);
  gpu_program_free(&gp);
  return bad;
}

static void nvrtc_summary(void) {
  const char *why;
  if (cuda_nvrtc_available(&why))
    printf("  CUDA C: %d sources compiled by NVRTC (compute_80 and compute_90), none warned; "
           "an sm_90 cubin %s\n", nvrtc_stats.compiled,
           nvrtc_stats.cubins > 0 ? "built and read back from the disk cache" : "not built");
  else
    printf("  CUDA C: skipped: %s\n", why);
}
#endif
