/* f32 GEMMs with a side of 8 to 16, on AVX-512 registers, that side in one (masked) register:
 * a convolution on a 2x2 plane at batch 4 (resnet18's layer4) has 16 output columns forward
 * ([512,4608] x [4608,16]), and its backward products are C[4608,16] = W^T dY (k 512) and
 * dW[512,4608] = dY cols^T (k 16); a 3x3 plane at batch 1 has 9, a 4-class head 8 to 16 rows of
 * a transposed weight. OpenBLAS's Haswell kernels (as OPENBLAS_CORETYPE selects here) ran the
 * 16-wide ones at 50-82 GF/s on one thread; each kernel below holds a row of the narrow side in
 * one register, its lanes past the side masked off. Every C element sums its k terms in order.
 * A long k is summed in blocks of CPU_NARROW_KB terms, each block from zero and then added to
 * the element's total, as a BLAS's kc blocks are: one chain of 4096 terms was 3x float32's
 * usual error (alexnet's [4,4096] x [4096,10] head on the first tier). The blocks start at fixed
 * k, so a result does not depend on how the rows were split.
 * AVX-512 only, checked at run time (valgrind's CPU has none); where OpenBLAS runs a class
 * faster, the measured choice (cpu_choice.c) sends it there. */
#include "cpu_internal.h"
#include <immintrin.h>
#include <stdint.h>

typedef struct {
  int64_t m, n, k, lda, ldb, ldc;
  const float *A, *B;
  float *C;
  __mmask16 side; /* the narrow side's lanes: n (NN, TN) or k (NT) of them */
} cpu_narrow_job;

enum { CPU_NARROW_MIN = 8, CPU_NARROW_MAX = 16, CPU_NARROW_KB = 256 };

#define CPU_V16(p) _mm512_loadu_ps(p)
/* A row of the narrow side; masked only when it is under 16 wide (a masked load in the inner
 * loop cost the 16-wide products 15-35%): each kernel is inlined twice, full and masked. */
#define CPU_VS(p) (full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(side, p))
#define CPU_STS(p, v) (full ? _mm512_storeu_ps(p, v) : _mm512_mask_storeu_ps(p, side, v))
#define CPU_NARROW_TWICE(name)                                                                  \
  __attribute__((target("avx512f"))) static void name(void **S, int64_t lo, int64_t hi) {      \
    const cpu_narrow_job *j = (const cpu_narrow_job *)S;                                        \
    if (j->side == 0xFFFF) name##_at(j, lo, hi, true, j->side);                                 \
    else name##_at(j, lo, hi, false, j->side);                                                   \
  }
#define CPU_FMA(acc, x, v) (acc) = _mm512_fmadd_ps(_mm512_set1_ps(x), (v), (acc))

/* NN, C[m,16] = A[m,k] B[k,16]: each row of A streamed once against B's rows, four rows of C
 * in registers (144 GF/s on one thread). Task t is rows 4t..4t+3. */
__attribute__((target("avx512f"), always_inline)) static inline void
cpu_nn16_at(const cpu_narrow_job *j, int64_t lo, int64_t hi, const bool full, const __mmask16 side) {
  for (int64_t i = lo * 4; i < hi * 4 && i < j->m; i += 4) {
    int64_t rows = j->m - i < 4 ? j->m - i : 4;
    const float *a[4];
    for (int r = 0; r < 4; r++) a[r] = j->A + (i + (r < rows ? r : 0)) * j->lda;
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t p0 = 0; p0 < j->k; p0 += CPU_NARROW_KB) {
      int64_t p1 = j->k - p0 < CPU_NARROW_KB ? j->k : p0 + CPU_NARROW_KB;
      __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t p = p0; p < p1; p++) {
        __m512 b = CPU_VS(j->B + p * j->ldb);
        CPU_FMA(s0, a[0][p], b), CPU_FMA(s1, a[1][p], b), CPU_FMA(s2, a[2][p], b), CPU_FMA(s3, a[3][p], b);
      }
      c0 = _mm512_add_ps(c0, s0), c1 = _mm512_add_ps(c1, s1), c2 = _mm512_add_ps(c2, s2), c3 = _mm512_add_ps(c3, s3);
    }
    __m512 c[4] = {c0, c1, c2, c3};
    for (int r = 0; r < rows; r++) CPU_STS(j->C + (i + r) * j->ldc, c[r]);
  }
}
CPU_NARROW_TWICE(cpu_nn16)

/* TN, C[m,16] = A^T B with A [k,m]: sixteen rows of C in registers; each step reads one
 * 16-float line of A's row p (broadcast per element) against B's row p (4608x16x512: 69 ->
 * 150 GF/s on one thread). Task t is rows 16t..16t+15. */
__attribute__((target("avx512f"))) static void cpu_tn16_row(const cpu_narrow_job *j, int64_t i) {
  __m512 c = _mm512_setzero_ps();
  for (int64_t p0 = 0; p0 < j->k; p0 += CPU_NARROW_KB) {
    int64_t p1 = j->k - p0 < CPU_NARROW_KB ? j->k : p0 + CPU_NARROW_KB;
    __m512 s = _mm512_setzero_ps();
    for (int64_t p = p0; p < p1; p++)
      CPU_FMA(s, j->A[p * j->lda + i], _mm512_maskz_loadu_ps(j->side, j->B + p * j->ldb));
    c = _mm512_add_ps(c, s);
  }
  _mm512_mask_storeu_ps(j->C + i * j->ldc, j->side, c);
}

__attribute__((target("avx512f"), always_inline)) static inline void
cpu_tn16_at(const cpu_narrow_job *j, int64_t lo, int64_t hi, const bool full, const __mmask16 side) {
  for (int64_t i = lo * 16; i < hi * 16 && i < j->m; i += 16) {
    if (j->m - i < 16) {
      for (; i < j->m; i++) cpu_tn16_row(j, i);
      return;
    }
    __m512 c[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) c[r] = _mm512_setzero_ps();
    for (int64_t p0 = 0; p0 < j->k; p0 += CPU_NARROW_KB) {
      int64_t p1 = j->k - p0 < CPU_NARROW_KB ? j->k : p0 + CPU_NARROW_KB;
      __m512 s[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) s[r] = _mm512_setzero_ps();
      for (int64_t p = p0; p < p1; p++) {
        __m512 b = CPU_VS(j->B + p * j->ldb);
        const float *a = j->A + p * j->lda + i;
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) CPU_FMA(s[r], a[r], b);
      }
#pragma GCC unroll 16
      for (int r = 0; r < 16; r++) c[r] = _mm512_add_ps(c[r], s[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++) CPU_STS(j->C + (i + r) * j->ldc, c[r]);
  }
}
CPU_NARROW_TWICE(cpu_tn16)

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
    for (int p = 0; p < 16; p++) av[p] = _mm512_set1_ps(p < j->k ? a[p] : 0.0f);
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
      for (int p = 1; p < j->k; p++) s += a[p] * bt[p * L + q];
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
      for (; q + 16 <= w; q += 16)
        cpu_transpose16_masked(j->B + (c0 + q) * j->ldb, j->ldb, bt + q, CPU_NT_COLS, j->side);
      for (; q < w; q++)
        for (int p = 0; p < 16; p++) bt[p * CPU_NT_COLS + q] = p < j->k ? j->B[(c0 + q) * j->ldb + p] : 0.0f;
      cached = c0;
    }
    int64_t r1 = j->m - r0 < CPU_NT_ROWS ? j->m : r0 + CPU_NT_ROWS;
    cpu_nt16_rows(j, bt, c0, w, r0, r1);
  }
}

/* 1: n is the narrow side (B untransposed), 2: k is (A B^T), 0: neither. */
int cpu_narrow_takes(int ta, int tb, int64_t m, int64_t n, int64_t k) {
  bool nside = n >= CPU_NARROW_MIN && n <= CPU_NARROW_MAX, kside = k >= CPU_NARROW_MIN && k <= CPU_NARROW_MAX;
  if (!tb && nside && k >= 64 && m >= (ta ? 16 : 4)) return 1;
  if (!ta && tb && kside && n >= 16) return 2;
  return 0;
}

bool cpu_narrow_gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc) {
  if (!cpu_own_gemm()) return false;
  int side = cpu_narrow_takes(ta, tb, m, n, k);
  cpu_narrow_job j = {m, n, k, lda, ldb, ldc, a, b, c, 0};
  cpu_kernel_fn fn;
  int64_t tasks;
  if (side == 1) {
    j.side = (__mmask16)((1u << n) - 1);
    fn = ta ? cpu_tn16 : cpu_nn16;
    tasks = ta ? (m + 15) / 16 : (m + 3) / 4;
  } else if (side == 2) {
    j.side = (__mmask16)((1u << k) - 1);
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
