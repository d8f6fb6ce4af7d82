/* OpenBLAS, loaded at run time so libgraft has no link-time BLAS dependency: a machine without
 * it runs dot on the reference kernel. GRAFT_BLAS=0 disables it. */
#include "cpu_internal.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static cpu_blas_fns cpu_blas_tab;
static pthread_once_t cpu_blas_once = PTHREAD_ONCE_INIT;

static void cpu_blas_load(void) {
  const char *e = getenv("GRAFT_BLAS");
  if (e && !strcmp(e, "0")) return;
  static const char *names[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    void *s = dlsym(h, "cblas_sgemm"), *d = dlsym(h, "cblas_dgemm");
    if (s && d) {
      memcpy(&cpu_blas_tab.sgemm, &s, sizeof s);
      memcpy(&cpu_blas_tab.dgemm, &d, sizeof d);
      /* GEMM runs between the pool's parallel regions, so BLAS may use as many threads as the
       * pool (it was found running on one here, at half the machine's rate). */
      void *nt = dlsym(h, "openblas_set_num_threads");
      if (nt) {
        void (*set)(int);
        memcpy(&set, &nt, sizeof nt);
        set(cpu_pool_threads());
      }
      return; /* kept loaded for the life of the process */
    }
    dlclose(h);
  }
}

const cpu_blas_fns *cpu_blas(void) {
  pthread_once(&cpu_blas_once, cpu_blas_load);
  return &cpu_blas_tab;
}
