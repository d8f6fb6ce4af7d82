/* f32 products A B^T with few rows (2 <= m <= 32), on AVX-512 registers: a recurrent step's
 * h W^T at a batch of 4 ([4,128] x [512,128]^T), a linear layer at a small batch, a
 * convolution's weight gradient with few output channels (dY [16, N*L] x cols^T). BLAS-style
 * kernels pack op(B) for tiles that serve 12 or more rows; with 4 rows each element of B serves
 * 4 products, and turning B^T's rows into column panels costs more than they do (OpenBLAS:
 * 4x512x128 at ~30 GF/s). Here each C element is a dot product of two contiguous rows, 16
 * accumulators (rows x columns of C) each summing 16 lanes of k, reduced together at the end:
 * B is read in place, once per group of 4 rows (4x512x128: 76 GF/s, 2.4x OpenBLAS;
 * 16x81x4096 2.3x; 32x1024x1024 1.8x OpenBLAS and 1.5x cpu_sgemm.c's 12x32 tiles, which
 * read B packed once per 12 rows but waste most of a tile's columns' loads at these sizes;
 * `bench_gemm`).
 * The sums run in another order than the other kernels' (lanes, then a tree); a result does
 * not depend on how C was split over threads. A single row (a matrix-vector product: memory
 * bound, OpenBLAS as fast) is not taken; untransposed B with at most 8 rows has its own kernel
 * below. */
#include "cpu_internal.h"
#include <immintrin.h>
#include <string.h>

enum { CPU_FR_MAX_ROWS = 32 };

typedef struct {
  int64_t m, n, k, lda, ldb, ldc;
  const float *A, *B;
  float *C;
  int64_t cols; /* columns per task */
} cpu_fr_job;

/* The mask of a 16-float vector of which `left` are valid (all 16 when more). */
static inline __mmask16 cpu_fr_mask(int64_t left) {
  return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* C[r0 .. r0+rows, c0 .. c0+NC) = A's rows dot B's rows, NR of A and NC of B (NR * NC = 16
 * accumulators), 16 terms of k a lane (masked at the end of k); the 16 sums then reduced at
 * once in a butterfly of shuffles (the transpose-and-add of cpu_transpose16's rounds), lane
 * NC r + c holding C[r0 + r, c0 + c]. Rows past rows repeat the first row, unstored. */
__attribute__((target("avx512f"), always_inline)) static inline void
cpu_fr_dots(const cpu_fr_job *j, int64_t r0, int rows, int64_t c0, const int NR, const int NC) {
  int cols = j->n - c0 < NC ? (int)(j->n - c0) : NC;
  __m512 x[16];
#pragma GCC unroll 16
  for (int q = 0; q < 16; q++) x[q] = _mm512_setzero_ps();
  const float *a[16], *b[16];
  for (int r = 0; r < NR; r++) a[r] = j->A + (r0 + (r < rows ? r : 0)) * j->lda;
  for (int c = 0; c < NC; c++) b[c] = j->B + (c0 + (c < cols ? c : 0)) * j->ldb;
  for (int64_t p = 0; p < j->k; p += 16) {
    __mmask16 mk = cpu_fr_mask(j->k - p);
    __m512 av[16], bv[16];
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++) av[r] = _mm512_maskz_loadu_ps(mk, a[r] + p);
#pragma GCC unroll 16
    for (int c = 0; c < NC; c++) bv[c] = _mm512_maskz_loadu_ps(mk, b[c] + p);
#pragma GCC unroll 16
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 16
      for (int c = 0; c < NC; c++) x[NC * r + c] = _mm512_fmadd_ps(av[r], bv[c], x[NC * r + c]);
  }
  __m512 v[8], w[4], s[2];
#pragma GCC unroll 8
  for (int q = 0; q < 8; q++)
    v[q] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * q], x[2 * q + 1]), _mm512_unpackhi_ps(x[2 * q], x[2 * q + 1]));
#pragma GCC unroll 4
  for (int q = 0; q < 4; q++) {
    __m512d lo = _mm512_castps_pd(v[2 * q]), hi = _mm512_castps_pd(v[2 * q + 1]);
    w[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi)), _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi)));
  }
#pragma GCC unroll 2
  for (int q = 0; q < 2; q++)
    s[q] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * q], w[2 * q + 1], 0xdd));
  __m512 sum = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x88), _mm512_shuffle_f32x4(s[0], s[1], 0xdd));
  float out[16] __attribute__((aligned(64)));
  _mm512_store_ps(out, sum);
  for (int r = 0; r < rows; r++) memcpy(j->C + (r0 + r) * j->ldc + c0, out + NC * r, sizeof(float) * (size_t)cols);
}

__attribute__((target("avx512f"))) static void cpu_fr_dots_1x16(const cpu_fr_job *j, int64_t r0, int rows, int64_t c0) {
  cpu_fr_dots(j, r0, rows, c0, 1, 16);
}
__attribute__((target("avx512f"))) static void cpu_fr_dots_2x8(const cpu_fr_job *j, int64_t r0, int rows, int64_t c0) {
  cpu_fr_dots(j, r0, rows, c0, 2, 8);
}
__attribute__((target("avx512f"))) static void cpu_fr_dots_4x4(const cpu_fr_job *j, int64_t r0, int rows, int64_t c0) {
  cpu_fr_dots(j, r0, rows, c0, 4, 4);
}

/* Task t: columns t * cols .. of every row: two rows or four at a time (one: a last row). */
static void cpu_fr_part(void **S, int64_t lo, int64_t hi) {
  const cpu_fr_job *j = (const cpu_fr_job *)S;
  for (int64_t t = lo; t < hi; t++)
    for (int64_t r0 = 0; r0 < j->m; r0 += 4) {
      int rows = j->m - r0 < 4 ? (int)(j->m - r0) : 4;
      int64_t c0 = t * j->cols, c1 = c0 + j->cols < j->n ? c0 + j->cols : j->n;
      if (rows == 1)
        for (int64_t c = c0; c < c1; c += 16) cpu_fr_dots_1x16(j, r0, 1, c);
      else if (rows == 2)
        for (int64_t c = c0; c < c1; c += 8) cpu_fr_dots_2x8(j, r0, 2, c);
      else
        for (int64_t c = c0; c < c1; c += 4) cpu_fr_dots_4x4(j, r0, rows, c);
    }
}

/* ---- NN, C[m,n] = A[m,k] B[k,n] with m <= 8: an input gradient dY W at a few rows (a
 * transformer's last stage at 8 tokens: [8,3072] x [3072,768]). B is the big operand and each
 * element serves m products; OpenBLAS packed it first (its kernels at 16-53 GF/s, 2x MKL's time:
 * B read twice and written once). Here B is read in place once: a task holds every row of C over
 * 48 columns in registers (8 x 3 vectors) and walks k; each block of CPU_FR_KB terms is summed
 * from zero and added to C, as the narrow kernels do. */
enum { CPU_FR_NN_ROWS = 8, CPU_FR_NN_VECS = 3, CPU_FR_NN_COLS = 16 * CPU_FR_NN_VECS, CPU_FR_KB = 256 };

__attribute__((target("avx512f"))) static void cpu_fr_nn_block(const cpu_fr_job *j, int64_t c0) {
  __mmask16 mk[CPU_FR_NN_VECS];
  for (int v = 0; v < CPU_FR_NN_VECS; v++) mk[v] = cpu_fr_mask(j->n - c0 - 16 * v);
  int rows = (int)j->m;
  for (int64_t p0 = 0; p0 < j->k; p0 += CPU_FR_KB) {
    int64_t p1 = j->k - p0 < CPU_FR_KB ? j->k : p0 + CPU_FR_KB;
    __m512 acc[CPU_FR_NN_ROWS][CPU_FR_NN_VECS];
#pragma GCC unroll 8
    for (int r = 0; r < CPU_FR_NN_ROWS; r++)
#pragma GCC unroll 3
      for (int v = 0; v < CPU_FR_NN_VECS; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = p0; p < p1; p++) {
      const float *b = j->B + p * j->ldb + c0;
      __m512 bv[CPU_FR_NN_VECS];
#pragma GCC unroll 3
      for (int v = 0; v < CPU_FR_NN_VECS; v++) bv[v] = _mm512_maskz_loadu_ps(mk[v], b + 16 * v);
#pragma GCC unroll 8
      for (int r = 0; r < CPU_FR_NN_ROWS; r++) {
        if (r >= rows) break;
        __m512 a = _mm512_set1_ps(j->A[r * j->lda + p]);
#pragma GCC unroll 3
        for (int v = 0; v < CPU_FR_NN_VECS; v++) acc[r][v] = _mm512_fmadd_ps(a, bv[v], acc[r][v]);
      }
    }
    for (int r = 0; r < rows; r++)
      for (int v = 0; v < CPU_FR_NN_VECS; v++) {
        float *c = j->C + r * j->ldc + c0 + 16 * v;
        __m512 old = p0 ? _mm512_maskz_loadu_ps(mk[v], c) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(c, mk[v], _mm512_add_ps(old, acc[r][v]));
      }
  }
}

static void cpu_fr_nn_part(void **S, int64_t lo, int64_t hi) {
  const cpu_fr_job *j = (const cpu_fr_job *)S;
  for (int64_t t = lo; t < hi; t++) cpu_fr_nn_block(j, t * CPU_FR_NN_COLS);
}

bool cpu_fewrows_takes(int ta, int tb, int64_t m, int64_t n, int64_t k) {
  if (!ta && !tb) return m >= 2 && m <= CPU_FR_NN_ROWS && n >= 64 && k >= 64;
  return !ta && tb && m >= 2 && m <= CPU_FR_MAX_ROWS && n >= 16 && k >= 1;
}

bool cpu_fewrows_gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                      const float *b, int ldb, float *c, int ldc) {
  if (!cpu_fewrows_takes(ta, tb, m, n, k) || !cpu_own_gemm()) return false;
  bool nn = !tb;
  cpu_fr_job j = {m, n, k, lda, ldb, ldc, a, b, c, nn ? CPU_FR_NN_COLS : 16};
  int64_t tasks = (n + j.cols - 1) / j.cols;
  cpu_kernel_fn fn = nn ? cpu_fr_nn_part : cpu_fr_part;
  __atomic_fetch_add(&cpu_stats.fewrows_gemms, 1, __ATOMIC_RELAXED);
  if (2.0 * m * n * k < CPU_GEMM_PAR_MIN_FLOPS || tasks < 2) fn((void **)&j, 0, tasks);
  else cpu_parallel_run(fn, (void **)&j, tasks);
  return true;
}
