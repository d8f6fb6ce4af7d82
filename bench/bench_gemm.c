/* graft's f32 GEMM against the libraries on the shapes the bench's models run, all through the
 * path compiled graphs call (cpu_blas()->sgemm: the product split over graft's pool, each part
 * single-threaded), timed in alternating blocks (the machine is shared; its speed drifts):
 *   BENCH gemm_<NN|NT|TN>_<m>x<n>x<k> graft_gflops= own_gflops= onednn_gflops= openblas_gflops=
 *         vs_onednn= vs_openblas=
 * graft: the default (each class's measured choice; oneDNN first where it is installed);
 * own: graft's AVX-512 kernels where they take the product (GRAFT_KERNEL_CHOICE=0 with
 * GRAFT_GEMM_LIB=openblas); onednn: oneDNN on every product (GRAFT_OWN_GEMM=0; 0 when
 * absent); openblas: OpenBLAS on every product. On a CPU without AVX-512 own is the library. */
#define _POSIX_C_SOURCE 200809L
#include "../src/backends/cpu/cpu.h"
#include "../src/backends/cpu/cpu_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { ROUNDS = 5, CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

typedef struct {
  int m, n, k, ta, tb;
  const char *what;
} shape;

/* Seconds a product, over a block of at least ~20 ms. */
static double block(const cpu_blas_fns *bl, const shape *s, const float *A, const float *B,
                    float *C, int reps) {
  double t0 = now_s();
  for (int r = 0; r < reps; r++)
    bl->sgemm(CBLAS_ROW_MAJOR, s->ta ? CBLAS_TRANS : CBLAS_NO_TRANS,
              s->tb ? CBLAS_TRANS : CBLAS_NO_TRANS, s->m, s->n, s->k, 1.0f, A, s->ta ? s->m : s->k,
              B, s->tb ? s->k : s->n, 0.0f, C, s->n);
  return (now_s() - t0) / reps;
}

enum { MODE_GRAFT, MODE_OWN, MODE_ONEDNN, MODE_OPENBLAS, MODES };

static void bench_mode(int mode) {
  unsetenv("GRAFT_OWN_GEMM"), unsetenv("GRAFT_GEMM_LIB"), unsetenv("GRAFT_KERNEL_CHOICE");
  if (mode == MODE_OWN) setenv("GRAFT_GEMM_LIB", "openblas", 1), setenv("GRAFT_KERNEL_CHOICE", "0", 1);
  if (mode == MODE_ONEDNN || mode == MODE_OPENBLAS) setenv("GRAFT_OWN_GEMM", "0", 1);
  if (mode == MODE_OPENBLAS) setenv("GRAFT_GEMM_LIB", "openblas", 1);
}

static void bench_shape(const cpu_blas_fns *bl, const shape *s) {
  size_t na = (size_t)s->m * s->k, nb = (size_t)s->k * s->n, nc = (size_t)s->m * s->n;
  float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
  if (!A || !B || !C) {
    fprintf(stderr, "bench_gemm: out of memory\n");
    exit(1);
  }
  for (size_t i = 0; i < na; i++) A[i] = (float)(i % 97) / 97.0f - 0.5f;
  for (size_t i = 0; i < nb; i++) B[i] = (float)(i % 89) / 89.0f - 0.5f;
  double flops = 2.0 * s->m * s->n * s->k, t[MODES][ROUNDS], gf[MODES] = {0};
  int reps = (int)(4e9 / flops) + 1; /* ~20 ms at 200 GF/s */
  bool dnnl = cpu_gemm_lib_dnnl();
  block(bl, s, A, B, C, 1);
  for (int r = 0; r < ROUNDS; r++)
    for (int mode = 0; mode < MODES; mode++) {
      if (mode == MODE_ONEDNN && !dnnl) continue;
      bench_mode(mode);
      block(bl, s, A, B, C, 1); /* warm: caches, the pool's threads */
      t[mode][r] = block(bl, s, A, B, C, reps);
    }
  bench_mode(MODE_GRAFT);
  for (int mode = 0; mode < MODES; mode++) {
    if (mode == MODE_ONEDNN && !dnnl) continue;
    qsort(t[mode], ROUNDS, sizeof(double), cmp);
    gf[mode] = flops / t[mode][ROUNDS / 2] / 1e9;
  }
  printf("BENCH gemm_%c%c_%dx%dx%d graft_gflops=%.1f own_gflops=%.1f onednn_gflops=%.1f "
         "openblas_gflops=%.1f vs_onednn=%.2f vs_openblas=%.2f (%s)\n",
         s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, gf[MODE_GRAFT], gf[MODE_OWN],
         gf[MODE_ONEDNN], gf[MODE_OPENBLAS], dnnl ? gf[MODE_GRAFT] / gf[MODE_ONEDNN] : 0.0,
         gf[MODE_GRAFT] / gf[MODE_OPENBLAS], s->what);
  fflush(stdout);
  free(A);
  free(B);
  free(C);
}

int main(void) {
  const cpu_blas_fns *bl = cpu_blas();
  if (!bl->sgemm) {
    printf("bench_gemm: no OpenBLAS here: skipped\n");
    return 0;
  }
  static const shape shapes[] = {
      {2048, 2048, 2048, 0, 0, "the roofline reference's product"},
      {256, 1024, 784, 0, 1, "MLP forward, x W^T"},
      {256, 1024, 1024, 0, 0, "MLP input gradient"},
      {1024, 1024, 256, 1, 0, "MLP weight gradient"},
      {2048, 1536, 512, 0, 1, "encoder in-projection"},
      {64, 1024, 576, 0, 0, "resnet18 layer1 conv forward"},
      {128, 1152, 256, 0, 1, "resnet18 layer2 conv weight gradient"},
      {2304, 64, 256, 1, 0, "resnet18 layer3 conv input gradient"},
      {512, 16, 4608, 0, 0, "resnet18 layer4 conv forward (16 columns)"},
      {4608, 16, 512, 1, 0, "resnet18 layer4 conv input gradient"},
      {512, 4608, 16, 0, 1, "resnet18 layer4 conv weight gradient (k 16)"},
      {4, 512, 128, 0, 1, "an LSTM step at batch 4, h W_hh^T (few rows)"},
      {4, 128, 512, 0, 0, "an LSTM step's input gradient (few rows)"},
      {1, 1000, 512, 0, 1, "a classifier at batch 1 (few rows)"},
      {8, 1024, 1024, 0, 1, "a linear layer at batch 8 (few rows)"},
      {16, 81, 4096, 0, 1, "a 3-D conv's weight gradient, 16 outputs (few rows)"},
      {32, 1024, 1024, 0, 1, "a linear layer at batch 32 (few rows)"},
      {384, 3072, 768, 0, 1, "a transformer's MLP up-projection, 384 tokens"},
      {96, 768, 256, 0, 1, "a projection of the varying-length LM at 96 tokens"},
  };
  printf("# bench_gemm: %s; oneDNN %s; pool of %d threads\n",
         cpu_own_gemm() ? "graft's AVX-512 kernels" : "no AVX-512: own is the library",
         cpu_gemm_lib_dnnl() ? "loaded" : "absent (its column 0)", cpu_pool_threads());
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) bench_shape(bl, &shapes[i]);
  cpu_pool_shutdown();
  return 0;
}
