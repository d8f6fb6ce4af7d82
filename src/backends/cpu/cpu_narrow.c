/* f32 GEMMs with a side of 16, on AVX-512 registers: a convolution on a 2x2 plane at batch 4
 * (resnet18's layer4) has 16 output columns forward ([512,4608] x [4608,16]), and its backward
 * products are C[4608,16] = W^T dY (k 512) and dW[512,4608] = dY cols^T (k 16). OpenBLAS's
 * Haswell kernels (as OPENBLAS_CORETYPE selects here) ran these at 50-82 GF/s on one thread;
 * each kernel below holds a 16-float row of the narrow side in one register. Every C element
 * sums its k terms in order. AVX-512 only, checked at run time (valgrind's CPU has none). */
#include "cpu_internal.h"
#include <immintrin.h>
#include <stdint.h>

typedef struct {
  int64_t m, n, k, lda, ldb, ldc;
  const float *A, *B;
  float *C;
} cpu_narrow_job;

#define CPU_V16(p) _mm512_loadu_ps(p)
#define CPU_FMA(acc, x, v) (acc) = _mm512_fmadd_ps(_mm512_set1_ps(x), (v), (acc))

/* NN, C[m,16] = A[m,k] B[k,16]: each row of A streamed once against B's rows, four rows of C
 * in registers (144 GF/s on one thread). Task t is rows 4t..4t+3. */
__attribute__((target("avx512f"))) static void cpu_nn16(void **S, int64_t lo, int64_t hi) {
  const cpu_narrow_job *j = (const cpu_narrow_job *)S;
  for (int64_t i = lo * 4; i < hi * 4 && i < j->m; i += 4) {
    int64_t rows = j->m - i < 4 ? j->m - i : 4;
    const float *a[4];
    for (int r = 0; r < 4; r++) a[r] = j->A + (i + (r < rows ? r : 0)) * j->lda;
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t p = 0; p < j->k; p++) {
      __m512 b = CPU_V16(j->B + p * j->ldb);
      CPU_FMA(c0, a[0][p], b), CPU_FMA(c1, a[1][p], b), CPU_FMA(c2, a[2][p], b), CPU_FMA(c3, a[3][p], b);
    }
    __m512 c[4] = {c0, c1, c2, c3};
    for (int r = 0; r < rows; r++) _mm512_storeu_ps(j->C + (i + r) * j->ldc, c[r]);
  }
}

/* TN, C[m,16] = A^T B with A [k,m]: sixteen rows of C in registers; each step reads one
 * 16-float line of A's row p (broadcast per element) against B's row p (4608x16x512: 69 ->
 * 150 GF/s on one thread). Task t is rows 16t..16t+15. */
__attribute__((target("avx512f"))) static void cpu_tn16_row(const cpu_narrow_job *j, int64_t i) {
  __m512 c = _mm512_setzero_ps();
  for (int64_t p = 0; p < j->k; p++) CPU_FMA(c, j->A[p * j->lda + i], CPU_V16(j->B + p * j->ldb));
  _mm512_storeu_ps(j->C + i * j->ldc, c);
}

__attribute__((target("avx512f"))) static void cpu_tn16(void **S, int64_t lo, int64_t hi) {
  const cpu_narrow_job *j = (const cpu_narrow_job *)S;
  for (int64_t i = lo * 16; i < hi * 16 && i < j->m; i += 16) {
    if (j->m - i < 16) {
      for (; i < j->m; i++) cpu_tn16_row(j, i);
      return;
    }
    __m512 c[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) c[r] = _mm512_setzero_ps();
    for (int64_t p = 0; p < j->k; p++) {
      __m512 b = CPU_V16(j->B + p * j->ldb);
      const float *a = j->A + p * j->lda + i;
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) CPU_FMA(c[r], a[r], b);
    }
    for (int r = 0; r < 16; r++) _mm512_storeu_ps(j->C + (i + r) * j->ldc, c[r]);
  }
}

/* NT with k 16, C[m,n] = A[m,16] B[n,16]^T: a task is a block of C's columns and rows; it
 * transposes its columns of B into bt (16 rows of CPU_NT_COLS, by cpu_sgemm.c's 16x16
 * register transpose), then each row of C is sixteen
 * broadcasts of A's row against bt (512x4608x16: 49 -> 130 GF/s on one thread). */
enum { CPU_NT_COLS = 256, CPU_NT_ROWS = 128 };

__attribute__((target("avx512f"))) static void cpu_nt16_rows(const cpu_narrow_job *j,
                                                             const float *bt, int64_t c0,
                                                             int64_t w, int64_t r0, int64_t r1) {
  enum { L = CPU_NT_COLS };
  for (int64_t i = r0; i < r1; i++) {
    const float *a = j->A + i * j->lda;
    float *c = j->C + i * j->ldc + c0;
    __m512 av[16];
#pragma GCC unroll 16
    for (int p = 0; p < 16; p++) av[p] = _mm512_set1_ps(a[p]);
    int64_t q = 0;
    for (; q + 16 <= w; q += 16) {
      const float *t = bt + q;
      __m512 s = _mm512_mul_ps(av[0], CPU_V16(t));
#pragma GCC unroll 15
      for (int p = 1; p < 16; p++) s = _mm512_fmadd_ps(av[p], CPU_V16(t + p * L), s);
      _mm512_storeu_ps(c + q, s);
    }
    for (; q < w; q++) {
      float s = a[0] * bt[q];
      for (int p = 1; p < 16; p++) s += a[p] * bt[p * L + q];
      c[q] = s;
    }
  }
}

static int64_t cpu_nt16_row_blocks(const cpu_narrow_job *j) {
  return (j->m + CPU_NT_ROWS - 1) / CPU_NT_ROWS;
}

__attribute__((target("avx512f"))) static void cpu_nt16(void **S, int64_t lo, int64_t hi) {
  const cpu_narrow_job *j = (const cpu_narrow_job *)S;
  float bt[16 * CPU_NT_COLS] __attribute__((aligned(64)));
  int64_t rb = cpu_nt16_row_blocks(j), cached = -1;
  for (int64_t t = lo; t < hi; t++) {
    int64_t c0 = t / rb * CPU_NT_COLS, r0 = t % rb * CPU_NT_ROWS;
    int64_t w = j->n - c0 < CPU_NT_COLS ? j->n - c0 : CPU_NT_COLS;
    if (c0 != cached) { /* consecutive tasks share a column block */
      int64_t q = 0;
      for (; q + 16 <= w; q += 16) cpu_transpose16(j->B + (c0 + q) * j->ldb, j->ldb, bt + q, CPU_NT_COLS);
      for (; q < w; q++)
        for (int p = 0; p < 16; p++) bt[p * CPU_NT_COLS + q] = j->B[(c0 + q) * j->ldb + p];
      cached = c0;
    }
    int64_t r1 = j->m - r0 < CPU_NT_ROWS ? j->m : r0 + CPU_NT_ROWS;
    cpu_nt16_rows(j, bt, c0, w, r0, r1);
  }
}

bool cpu_narrow_gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc) {
  if (!cpu_own_gemm()) return false;
  cpu_narrow_job j = {m, n, k, lda, ldb, ldc, a, b, c};
  cpu_kernel_fn fn;
  int64_t tasks;
  if (!tb && n == 16 && k >= 64 && m >= (ta ? 16 : 4)) {
    fn = ta ? cpu_tn16 : cpu_nn16;
    tasks = ta ? (m + 15) / 16 : (m + 3) / 4;
  } else if (!ta && tb && k == 16 && n >= 16) {
    fn = cpu_nt16;
    tasks = (n + CPU_NT_COLS - 1) / CPU_NT_COLS * cpu_nt16_row_blocks(&j);
  } else {
    return false;
  }
  __atomic_fetch_add(&cpu_stats.narrow_gemms, 1, __ATOMIC_RELAXED);
  if (2.0 * m * n * k < CPU_GEMM_PAR_MIN_FLOPS) fn((void **)&j, 0, tasks);
  else cpu_parallel_run(fn, (void **)&j, tasks);
  return true;
}
