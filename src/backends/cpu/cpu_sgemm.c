/* graft's own f32 GEMM for CPUs with AVX-512, single-threaded (cpu_blas.c splits a product
 * over the pool and calls this per part). OpenBLAS here runs its Haswell (AVX2) kernels, as
 * OPENBLAS_CORETYPE selects, at ~105 GF/s a core; a 12x32 tile of C held in 24 512-bit
 * registers runs the MLP's and resnet18's shapes at 160-220 GF/s a core.
 *
 * The BLIS structure: op(B) is packed in panels of 32 columns (kc rows each), op(A) in
 * panels of 12 rows; the micro-kernel multiplies one of each into a tile of C. A is read in
 * place instead where that measured faster: untransposed (12 rows read along k: 2-15% over
 * packing it, 128x256x1152 the most), or when C has at most CPU_SG_DIRECT_N columns (each A
 * element would serve too few columns to repay its packing). Every C element sums its k terms in order with FMAs,
 * carried through C between kc blocks, so a result does not depend on how C was tiled or
 * split over threads. */
#include "cpu_internal.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum {
  CPU_SG_MR = 12,         /* rows of a tile */
  CPU_SG_NR = 32,         /* columns of a tile: two registers */
  CPU_SG_KC = 256,        /* depth of a packed block: a B panel of 32 KB stays in L1 */
  CPU_SG_MC = 192,        /* rows of a packed A block (192 KB, in L2) */
  CPU_SG_NC = 2048,       /* columns of a packed B block (2 MB) */
  CPU_SG_DIRECT_N = 128,  /* at most this many columns: A^T read in place too */
};

typedef struct {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  const float *A, *B;
  float *C;
  float *pa, *pb; /* pack buffers */
} cpu_sg_job;

/* Pack buffers (A's block, then B's), kept between calls in a free list (a GEMM a kernel
 * apart would otherwise fault in 2 MB each time): one per GEMM running at once (the pool's
 * threads, an asynchronous step's thread), reachable from the list while idle. Not thread-local:
 * a thread that exits would strand its buffer. */
typedef struct cpu_sg_buf {
  struct cpu_sg_buf *next;
} cpu_sg_buf;
enum { CPU_SG_HEAD = 64 }; /* the link, padded so the floats after it stay 64-byte aligned */
static pthread_mutex_t cpu_sg_lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_sg_buf *cpu_sg_idle;

static float *cpu_sg_take(void) {
  pthread_mutex_lock(&cpu_sg_lock);
  cpu_sg_buf *b = cpu_sg_idle;
  if (b) cpu_sg_idle = b->next;
  pthread_mutex_unlock(&cpu_sg_lock);
  if (!b) {
    size_t n = (size_t)CPU_SG_MC * CPU_SG_KC + (size_t)CPU_SG_KC * (CPU_SG_NC + CPU_SG_NR);
    b = aligned_alloc(64, CPU_SG_HEAD + sizeof(float) * n);
  }
  return b ? (float *)((char *)b + CPU_SG_HEAD) : NULL;
}

static void cpu_sg_give(float *pa) {
  cpu_sg_buf *b = (cpu_sg_buf *)((char *)pa - CPU_SG_HEAD);
  pthread_mutex_lock(&cpu_sg_lock);
  b->next = cpu_sg_idle;
  cpu_sg_idle = b;
  pthread_mutex_unlock(&cpu_sg_lock);
}

#define CPU_SG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* c[12][32] (row stride ldc) = c (when load) + sum over kc of a column of A times a row of
 * the B panel. A's element (r, p) is a[r * rs + p * ps]: a packed panel (1, 12) or A in
 * place. */
__attribute__((target("avx512f"), always_inline)) static inline void
cpu_sg_tile_at(int64_t kc, const float *a, int64_t rs, int64_t ps, const float *b, float *c,
               int64_t ldc, bool load) {
#define CPU_SG_DECL(r) __m512 c##r##a, c##r##b;
  CPU_SG_ROWS(CPU_SG_DECL)
  if (load) {
#define CPU_SG_LOAD(r)                                                                         \
  c##r##a = _mm512_loadu_ps(c + r * ldc), c##r##b = _mm512_loadu_ps(c + r * ldc + 16);
    CPU_SG_ROWS(CPU_SG_LOAD)
  } else {
#define CPU_SG_ZERO(r) c##r##a = _mm512_setzero_ps(), c##r##b = _mm512_setzero_ps();
    CPU_SG_ROWS(CPU_SG_ZERO)
  }
  for (int64_t p = 0; p < kc; p++, a += ps, b += CPU_SG_NR) {
    __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define CPU_SG_FMA(r)                                                                          \
  {                                                                                            \
    __m512 x = _mm512_set1_ps(a[r * rs]);                                                      \
    c##r##a = _mm512_fmadd_ps(x, b0, c##r##a), c##r##b = _mm512_fmadd_ps(x, b1, c##r##b);      \
  }
    CPU_SG_ROWS(CPU_SG_FMA)
  }
#define CPU_SG_STORE(r)                                                                        \
  _mm512_storeu_ps(c + r * ldc, c##r##a), _mm512_storeu_ps(c + r * ldc + 16, c##r##b);
  CPU_SG_ROWS(CPU_SG_STORE)
}

/* The tile with its A strides known where they can be (offsets in the instructions, not in
 * registers): packed (1, 12), A^T in place (1, lda), A in place (lda, 1). */
__attribute__((target("avx512f"))) static void cpu_sg_tile(int64_t kc, const float *a,
                                                           int64_t rs, int64_t ps,
                                                           const float *b, float *c,
                                                           int64_t ldc, bool load) {
  if (rs == 1 && ps == CPU_SG_MR) cpu_sg_tile_at(kc, a, 1, CPU_SG_MR, b, c, ldc, load);
  else if (rs == 1) cpu_sg_tile_at(kc, a, 1, ps, b, c, ldc, load);
  else cpu_sg_tile_at(kc, a, rs, 1, b, c, ldc, load);
}

/* op(A)[i0 .. i0+mc, p0 .. p0+kc] as 12-row panels, each kc x 12, rows past mc zero. */
static void cpu_sg_pack_a(const cpu_sg_job *j, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                          float *pa) {
  for (int64_t i = 0; i < mc; i += CPU_SG_MR) {
    int64_t rows = mc - i < CPU_SG_MR ? mc - i : CPU_SG_MR;
    for (int64_t p = 0; p < kc; p++, pa += CPU_SG_MR) {
      for (int64_t r = 0; r < rows; r++)
        pa[r] = j->ta ? j->A[(p0 + p) * j->lda + i0 + i + r] : j->A[(i0 + i + r) * j->lda + p0 + p];
      for (int64_t r = rows; r < CPU_SG_MR; r++) pa[r] = 0;
    }
  }
}

/* dst[t * ldd + q] = src[q * ld + t] for a 16x16 block, in registers: the four rounds of
 * shuffles that interleave 1, 2, 4 then 8 floats at a time. Only the columns of src in `cols`
 * are read (the others read as 0). */
__attribute__((target("avx512f"), always_inline)) static inline void
cpu_transpose16_at(const float *src, int64_t ld, float *dst, int64_t ldd, const __mmask16 cols) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int q = 0; q < 16; q++)
    r[q] = cols == 0xFFFF ? _mm512_loadu_ps(src + q * ld) : _mm512_maskz_loadu_ps(cols, src + q * ld);
#pragma GCC unroll 8
  for (int q = 0; q < 16; q += 2)
    t[q] = _mm512_unpacklo_ps(r[q], r[q + 1]), t[q + 1] = _mm512_unpackhi_ps(r[q], r[q + 1]);
#pragma GCC unroll 4
  for (int q = 0; q < 16; q += 4)
    for (int h = 0; h < 2; h++) {
      __m512d x = _mm512_castps_pd(t[q + h]), y = _mm512_castps_pd(t[q + h + 2]);
      r[q + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
      r[q + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
    }
#pragma GCC unroll 2
  for (int q = 0; q < 16; q += 8)
    for (int h = 0; h < 4; h++) {
      t[q + h] = _mm512_shuffle_f32x4(r[q + h], r[q + h + 4], 0x88);
      t[q + h + 4] = _mm512_shuffle_f32x4(r[q + h], r[q + h + 4], 0xdd);
    }
#pragma GCC unroll 8
  for (int h = 0; h < 8; h++) {
    r[h] = _mm512_shuffle_f32x4(t[h], t[h + 8], 0x88);
    r[h + 8] = _mm512_shuffle_f32x4(t[h], t[h + 8], 0xdd);
  }
#pragma GCC unroll 16
  for (int q = 0; q < 16; q++) _mm512_storeu_ps(dst + q * ldd, r[q]);
}

__attribute__((target("avx512f"))) void cpu_transpose16(const float *src, int64_t ld, float *dst,
                                                        int64_t ldd) {
  cpu_transpose16_at(src, ld, dst, ldd, 0xFFFF);
}

__attribute__((target("avx512f"))) void cpu_transpose16_masked(const float *src, int64_t ld,
                                                               float *dst, int64_t ldd,
                                                               __mmask16 cols) {
  if (cols == 0xFFFF) cpu_transpose16_at(src, ld, dst, ldd, 0xFFFF);
  else cpu_transpose16_at(src, ld, dst, ldd, cols);
}

/* op(B)[p0 .. p0+kc, j0 .. j0+nc] as 32-column panels, each kc x 32, columns past nc zero.
 * B is read along its rows, which are contiguous: a row of op(B) at a time for B (a panel at
 * a time would step 4 KB between 128-byte reads), 16x16 blocks of B's rows for B^T. */
static void cpu_sg_pack_bt(const cpu_sg_job *j, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                           float *pb) {
  for (int64_t c = 0; c < nc; c += CPU_SG_NR, pb += kc * CPU_SG_NR) {
    int64_t cols = nc - c < CPU_SG_NR ? nc - c : CPU_SG_NR;
    int64_t q16 = cols / 16 * 16, p16 = kc / 16 * 16;
    for (int64_t q = 0; q < q16; q += 16)
      for (int64_t p = 0; p < p16; p += 16)
        cpu_transpose16(j->B + (j0 + c + q) * j->ldb + p0 + p, j->ldb, pb + p * CPU_SG_NR + q, CPU_SG_NR);
    for (int64_t q = 0; q < CPU_SG_NR; q++) { /* the edges, element by element */
      const float *src = j->B + (j0 + c + q) * j->ldb + p0;
      for (int64_t p = q < q16 ? p16 : 0; p < kc; p++) pb[p * CPU_SG_NR + q] = q < cols ? src[p] : 0;
    }
  }
}

static void cpu_sg_pack_b(const cpu_sg_job *j, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
                          float *pb) {
  if (j->tb) {
    cpu_sg_pack_bt(j, p0, kc, j0, nc, pb);
    return;
  }
  for (int64_t p = 0; p < kc; p++) {
    const float *src = j->B + (p0 + p) * j->ldb + j0;
    for (int64_t c = 0; c < nc; c += CPU_SG_NR) {
      float *dst = pb + c * kc + p * CPU_SG_NR;
      int64_t cols = nc - c < CPU_SG_NR ? nc - c : CPU_SG_NR;
      if (cols == CPU_SG_NR) { /* a fixed size: inlined, not a call */
        memcpy(dst, src + c, sizeof(float) * CPU_SG_NR);
        continue;
      }
      memcpy(dst, src + c, sizeof(float) * (size_t)cols);
      memset(dst + cols, 0, sizeof(float) * (size_t)(CPU_SG_NR - cols));
    }
  }
}

/* One tile of C at (i, c): rows x cols of it valid; partial tiles go through a local one. */
static void cpu_sg_edge(int64_t kc, const float *a, int64_t rs, int64_t ps, const float *b,
                        float *c, int64_t ldc, int64_t rows, int64_t cols, bool load) {
  float tile[CPU_SG_MR * CPU_SG_NR] __attribute__((aligned(64)));
  if (load)
    for (int64_t r = 0; r < rows; r++) memcpy(tile + r * CPU_SG_NR, c + r * ldc, sizeof(float) * (size_t)cols);
  cpu_sg_tile(kc, a, rs, ps, b, tile, CPU_SG_NR, load);
  for (int64_t r = 0; r < rows; r++) memcpy(c + r * ldc, tile + r * CPU_SG_NR, sizeof(float) * (size_t)cols);
}

/* Asks for the tile of C that follows (i, c) in cpu_sg_block's order (down a column of tiles,
 * then the next column) to be brought to L1 while this one computes: C's rows are ldc apart
 * and no hardware prefetcher predicts the jump; a tile loaded cold from L3 stalled its first
 * FMAs (2048x2048x2048 on one core 125 -> 139 GF/s, 1024x1024x256 TN 145 -> 157). */
static void cpu_sg_prefetch_next(const cpu_sg_job *j, int64_t i0, int64_t mc, int64_t j0, int64_t nc,
                                 int64_t i, int64_t c) {
  const float *next;
  int64_t rows;
  if (i + CPU_SG_MR < mc) {
    next = j->C + (i0 + i + CPU_SG_MR) * j->ldc + j0 + c;
    rows = mc - i - CPU_SG_MR;
  } else if (c + CPU_SG_NR < nc) {
    next = j->C + i0 * j->ldc + j0 + c + CPU_SG_NR;
    rows = mc;
  } else {
    return;
  }
  for (int64_t r = 0; r < rows && r < CPU_SG_MR; r++) {
    __builtin_prefetch(next + r * j->ldc, 1, 3);
    __builtin_prefetch(next + r * j->ldc + 16, 1, 3);
  }
}

/* C's rows i0 .. i0+mc against the packed block of B (columns j0 .. j0+nc, depth p0 .. +kc). */
static void cpu_sg_block(const cpu_sg_job *j, int64_t i0, int64_t mc, int64_t j0, int64_t nc,
                         int64_t p0, int64_t kc) {
  bool direct = !j->ta || j->n <= CPU_SG_DIRECT_N, load = p0 > 0;
  int64_t full = mc / CPU_SG_MR * CPU_SG_MR; /* rows in whole panels */
  if (!direct) cpu_sg_pack_a(j, i0, mc, p0, kc, j->pa);
  else if (full < mc) cpu_sg_pack_a(j, i0 + full, mc - full, p0, kc, j->pa); /* the last rows, padded */
  for (int64_t c = 0; c < nc; c += CPU_SG_NR) {
    int64_t cols = nc - c < CPU_SG_NR ? nc - c : CPU_SG_NR;
    const float *b = j->pb + c * kc;
    for (int64_t i = 0; i < mc; i += CPU_SG_MR) {
      int64_t rows = mc - i < CPU_SG_MR ? mc - i : CPU_SG_MR;
      const float *a = j->pa + i * kc;
      int64_t rs = 1, ps = CPU_SG_MR;
      if (direct && i < full) { /* in place: A's row i0+i from column p0 */
        a = j->ta ? j->A + p0 * j->lda + i0 + i : j->A + (i0 + i) * j->lda + p0;
        rs = j->ta ? 1 : j->lda, ps = j->ta ? j->lda : 1;
      } else if (direct) {
        a = j->pa;
      }
      float *cp = j->C + (i0 + i) * j->ldc + j0 + c;
      cpu_sg_prefetch_next(j, i0, mc, j0, nc, i, c);
      if (rows == CPU_SG_MR && cols == CPU_SG_NR) cpu_sg_tile(kc, a, rs, ps, b, cp, j->ldc, load);
      else cpu_sg_edge(kc, a, rs, ps, b, cp, j->ldc, rows, cols, load);
    }
  }
}

bool cpu_own_gemm(void) {
  const char *e = getenv("GRAFT_OWN_GEMM"); /* read per product: cheap next to one */
  return __builtin_cpu_supports("avx512f") && !(e && !strcmp(e, "0"));
}

/* Whether the tiles that cover C are mostly C: a product with few rows or columns (an LSTM's
 * batch of 4, a classifier's 10 outputs, half of resnet18's 147-column stem gradient) wastes
 * most of each 12x32 tile and runs better on OpenBLAS's smaller ones. */
static bool cpu_sg_fits(int64_t m, int64_t n) {
  int64_t tm = (m + CPU_SG_MR - 1) / CPU_SG_MR * CPU_SG_MR;
  int64_t tn = (n + CPU_SG_NR - 1) / CPU_SG_NR * CPU_SG_NR;
  return 4 * m * n >= 3 * tm * tn;
}

bool cpu_sgemm_avx512(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0 || !cpu_sg_fits(m, n) || !cpu_own_gemm()) return false;
  float *pa = cpu_sg_take();
  if (!pa) return false;
  __atomic_fetch_add(&cpu_stats.own_gemms, 1, __ATOMIC_RELAXED);
  cpu_sg_job j = {ta, tb, m, n, k, lda, ldb, ldc, a, b, c, pa, pa + CPU_SG_MC * CPU_SG_KC};
  for (int64_t j0 = 0; j0 < n; j0 += CPU_SG_NC) {
    int64_t nc = n - j0 < CPU_SG_NC ? n - j0 : CPU_SG_NC;
    for (int64_t p0 = 0; p0 < k; p0 += CPU_SG_KC) {
      int64_t kc = k - p0 < CPU_SG_KC ? k - p0 : CPU_SG_KC;
      cpu_sg_pack_b(&j, p0, kc, j0, nc, j.pb);
      for (int64_t i0 = 0; i0 < m; i0 += CPU_SG_MC)
        cpu_sg_block(&j, i0, m - i0 < CPU_SG_MC ? m - i0 : CPU_SG_MC, j0, nc, p0, kc);
    }
  }
  cpu_sg_give(pa);
  return true;
}
