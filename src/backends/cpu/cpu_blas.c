/* OpenBLAS, loaded at run time so libgraft has no link-time BLAS dependency: a machine without
 * it runs dot on the reference kernel. GRAFT_BLAS=0 disables it.
 *
 * oneDNN (libdnnl, also loaded at run time where present) is the f32 library kernel when it is
 * there: its JIT-generated AVX-512 kernels ran the products of the bench's models at 165-180
 * GF/s a core where OpenBLAS's Haswell kernels (and graft's own, which lose 12-28% to packing
 * op(B) on products with few rows) ran 110-155. It is called single-threaded on each of the
 * pool's parts, its OpenMP thread count set to 1 for the call and restored after (OpenMP
 * threads of its own would spin after each call and fight the pool's next kernel for the
 * cores). GRAFT_GEMM_LIB=openblas keeps OpenBLAS as the library (the A/B).
 *
 * GEMMs are split by rows (or columns, when short and wide) over graft's own thread pool, each
 * part a single-threaded call: cpu_sgemm.c's AVX-512 kernel for f32 where the CPU has it and
 * the part suits its tiles, OpenBLAS otherwise. OpenBLAS's own threads spin (sched_yield)
 * after each call and fought the pool's next kernel for the two cores, so the process's BLAS
 * thread count (shared with PyTorch, which links the same library) is set to 1 only for the
 * duration of a call and restored after. */
#include "cpu_internal.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef void (*cpu_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                             const float *, int, float, float *, int);
typedef void (*cpu_dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                             const double *, int, double, double *, int);

/* Products of at most CPU_GEMM_SMALL_MNK multiply-adds take OpenBLAS's small-matrix kernels
 * (0.3.x, AVX-512 builds); a long k is cut in blocks of CPU_GEMM_KB for them. */
enum { CPU_GEMM_KB = 256 };
#define CPU_GEMM_SMALL_MNK (64.0 * 64.0 * 64.0)

/* oneDNN's row-major sgemm: transposes as 'N'/'T', dims and leading dimensions int64 */
typedef int (*cpu_dnnl_sgemm_fn)(char, char, int64_t, int64_t, int64_t, float, const float *,
                                 int64_t, const float *, int64_t, float, float *, int64_t);

static cpu_blas_fns cpu_blas_tab;
static cpu_dnnl_sgemm_fn dnnl_sgemm;
static void (*omp_set_threads)(int);
static int (*omp_get_threads)(void);
static cpu_sgemm_fn raw_sgemm;
static cpu_dgemm_fn raw_dgemm;
static void (*set_threads)(int);
static int (*get_threads)(void);
static pthread_once_t cpu_blas_once = PTHREAD_ONCE_INIT;

typedef struct {
  int dbl, ta, tb, m, n, k, lda, ldb, ldc, parts, cols;
  double alpha, beta;
  const void *A, *B;
  void *C;
  bool lib;     /* the library for every part (the measured choice of cpu_choice.c) */
  bool dnnl;    /* the library is oneDNN (cpu_gemm_lib_dnnl, read once per product) */
  int own_ran;  /* a part ran on graft's own kernel (atomic: parts run on the pool) */
} cpu_gemm_job;


/* One single-threaded f32 product: graft's AVX-512 kernel where it takes it (unless lib), else
 * the library's (oneDNN where dnnl, else OpenBLAS). True when graft's kernel ran. */
static bool cpu_sgemm_one(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                          int lda, const float *b, int ldb, float beta, float *c, int ldc,
                          bool lib, bool dnnl) {
  if (!lib && alpha == 1.0f && beta == 0.0f &&
      cpu_sgemm_avx512(ta != CPU_CBLAS_NO_TRANS, tb != CPU_CBLAS_NO_TRANS, m, n, k, a, lda, b, ldb, c, ldc))
    return true;
  if (dnnl) {
    int saved = omp_get_threads();
    if (saved != 1) omp_set_threads(1);
    int st = dnnl_sgemm(ta == CPU_CBLAS_NO_TRANS ? 'N' : 'T', tb == CPU_CBLAS_NO_TRANS ? 'N' : 'T', m, n, k,
                        alpha, a, lda, b, ldb, beta, c, ldc);
    if (saved != 1) omp_set_threads(saved);
    if (st == 0) {
      __atomic_fetch_add(&cpu_stats.onednn_gemms, 1, __ATOMIC_RELAXED);
      return false;
    } /* else (out of memory for its packing): OpenBLAS below */
  }
  /* OpenBLAS's kernel for small products sums a long k in one chain: alexnet's [4,4096] x
   * [4096,10] head came out at 3-12x float32's usual error. Such a product is summed in blocks
   * of CPU_GEMM_KB terms carried through C, as its kernels for larger products and graft's
   * own do. */
  if (k > 4 * CPU_GEMM_KB && (double)m * n * k <= CPU_GEMM_SMALL_MNK) {
    for (int p0 = 0; p0 < k; p0 += CPU_GEMM_KB) {
      int kb = k - p0 < CPU_GEMM_KB ? k - p0 : CPU_GEMM_KB;
      const float *ab = a + (ta == CPU_CBLAS_NO_TRANS ? (size_t)p0 : (size_t)p0 * (size_t)lda);
      const float *bb = b + (tb == CPU_CBLAS_NO_TRANS ? (size_t)p0 * (size_t)ldb : (size_t)p0);
      raw_sgemm(CPU_CBLAS_ROW_MAJOR, ta, tb, m, n, kb, alpha, ab, lda, bb, ldb, p0 ? 1.0f : beta, c, ldc);
    }
    return false;
  }
  raw_sgemm(CPU_CBLAS_ROW_MAJOR, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return false;
}

static void cpu_gemm_part(void **S, int64_t lo, int64_t hi) {
  const cpu_gemm_job *j = (const cpu_gemm_job *)S;
  for (int64_t part = lo; part < hi; part++) {
    int m = j->m, n = j->n;
    size_t aoff = 0, boff = 0, coff = 0;
    if (j->cols) { /* columns c0..c1 of op(B) and C */
      int c0 = (int)(part * j->n / j->parts), c1 = (int)((part + 1) * j->n / j->parts);
      n = c1 - c0;
      boff = j->tb == CPU_CBLAS_NO_TRANS ? (size_t)c0 : (size_t)c0 * (size_t)j->ldb;
      coff = (size_t)c0;
    } else { /* rows r0..r1 of op(A) and C */
      int r0 = (int)(part * j->m / j->parts), r1 = (int)((part + 1) * j->m / j->parts);
      m = r1 - r0;
      aoff = j->ta == CPU_CBLAS_NO_TRANS ? (size_t)r0 * (size_t)j->lda : (size_t)r0;
      coff = (size_t)r0 * (size_t)j->ldc;
    }
    if (m <= 0 || n <= 0) continue;
    if (j->dbl)
      raw_dgemm(CPU_CBLAS_ROW_MAJOR, j->ta, j->tb, m, n, j->k, j->alpha, (const double *)j->A + aoff,
                j->lda, (const double *)j->B + boff, j->ldb, j->beta, (double *)j->C + coff, j->ldc);
    else if (cpu_sgemm_one(j->ta, j->tb, m, n, j->k, (float)j->alpha, (const float *)j->A + aoff,
                           j->lda, (const float *)j->B + boff, j->ldb, (float)j->beta,
                           (float *)j->C + coff, j->ldc, j->lib, j->dnnl))
      __atomic_store_n(&((cpu_gemm_job *)j)->own_ran, 1, __ATOMIC_RELAXED);
  }
}

/* The split product on the pool (graft's kernels unless j->lib); true when one of them ran. */
static bool cpu_gemm_split(cpu_gemm_job *j);

/* An f32 product's kernels are a measured choice per class of (transposes, sizes): graft's own
 * or the library's (cpu_choice.c). The default: oneDNN where it is present, except for the
 * products graft's few-row kernels take (1.7-2.2x oneDNN on bench_gemm's 8x1024x1024 and
 * 16x81x4096; its narrow kernels lost to oneDNN by 1.3-1.5x on 9- and 16-wide products);
 * graft's own where the library is OpenBLAS. */
static void cpu_gemm_run(cpu_gemm_job *j) {
  if (j->dbl || j->alpha != 1.0 || j->beta != 0.0 || !cpu_own_gemm()) {
    cpu_gemm_split(j);
    return;
  }
  int ta = j->ta != CPU_CBLAS_NO_TRANS, tb = j->tb != CPU_CBLAS_NO_TRANS;
  /* the kernel of graft's that would run is part of the class: sizes a half octave apart
   * may fall on either side of a kernel's bounds */
  int64_t own = cpu_narrow_takes(ta, tb, j->m, j->n, j->k) * 2 + cpu_fewrows_takes(ta, tb, j->m, j->n, j->k);
  bool lib_first = !(own & 1) && j->dnnl;
  int64_t dims[7] = {ta, tb, own, lib_first, j->m, j->n, j->k};
  cpu_choice_ticket t;
  int pick = cpu_choice_begin("sgemm (transposes, kernel, library first, m, n, k)", dims, 7, 4, 2, &t);
  j->lib = pick == (lib_first ? 0 : 1);
  bool ran = !j->lib && (cpu_narrow_gemm(ta, tb, j->m, j->n, j->k, j->A, j->lda, j->B, j->ldb, j->C, j->ldc) ||
                         cpu_fewrows_gemm(ta, tb, j->m, j->n, j->k, j->A, j->lda, j->B, j->ldb, j->C, j->ldc));
  if (!ran) ran = cpu_gemm_split(j);
  /* no kernel of graft's takes this class: its default stays (the library ran either way) */
  if (!j->lib && !ran) cpu_choice_only(&t);
  cpu_choice_end(&t);
}

static bool cpu_gemm_split(cpu_gemm_job *j) {
  double flops = 2.0 * j->m * j->n * j->k;
  int saved = get_threads && set_threads ? get_threads() : 0;
  if (saved > 1) set_threads(1);
  /* Rows, unless there are few of them and many columns (a convolution's [32, 1024]: 0.11 ms
   * by columns against 0.23 by rows), or at least 4x more columns than rows: each part packs
   * all of the operand the split does not cut, op(B) (k x n) by rows and op(A) (m x k) by
   * columns. An MLP's [256, 784] x [784, 1024]: 1.84-1.93 -> 1.72-1.75 ms by columns; at 2x
   * (resnet18's [128, 1152] x [1152, 256]) columns measured no better. */
  j->cols = j->n > j->m && (j->m < 128 || j->n >= 4 * j->m);
  bool small = flops < CPU_GEMM_PAR_MIN_FLOPS || (j->cols ? j->n : j->m) < 32;
  j->parts = small ? 1 : cpu_pool_threads();
  if (j->parts == 1) cpu_gemm_part((void **)j, 0, 1);
  else cpu_parallel_run(cpu_gemm_part, (void **)j, j->parts);
  if (saved > 1) set_threads(saved);
  return __atomic_load_n(&j->own_ran, __ATOMIC_RELAXED);
}

static void cpu_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (order != CPU_CBLAS_ROW_MAJOR) {
    raw_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cpu_gemm_job j = {0, ta, tb, m, n, k, lda, ldb, ldc, 1, 0, alpha, beta, a, b, c, false, cpu_gemm_lib_dnnl(), 0};
  cpu_gemm_run(&j);
}

static void cpu_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha,
                      const double *a, int lda, const double *b, int ldb, double beta, double *c,
                      int ldc) {
  if (order != CPU_CBLAS_ROW_MAJOR) {
    raw_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cpu_gemm_job j = {1, ta, tb, m, n, k, lda, ldb, ldc, 1, 0, alpha, beta, a, b, c, false, false, 0};
  cpu_gemm_run(&j);
}

/* A batch of small products: whole items spread over the pool, each a single-threaded BLAS
 * call (attention's 64 products of 256x256x64 ran at ~40% of the machine split by rows). */
typedef struct {
  int dbl, ta, tb, m, n, k, lda, ldb, ldc;
  int64_t sa, sb, sc;
  const void *A, *B;
  void *C;
  bool dnnl; /* the library is oneDNN: its default for such products, as in cpu_gemm_run */
} cpu_batch_job;

static void cpu_batch_part(void **S, int64_t lo, int64_t hi) {
  const cpu_batch_job *j = (const cpu_batch_job *)S;
  for (int64_t q = lo; q < hi; q++) {
    if (j->dbl)
      raw_dgemm(CPU_CBLAS_ROW_MAJOR, j->ta, j->tb, j->m, j->n, j->k, 1.0, (const double *)j->A + q * j->sa,
                j->lda, (const double *)j->B + q * j->sb, j->ldb, 0.0, (double *)j->C + q * j->sc,
                j->ldc);
    else
      cpu_sgemm_one(j->ta, j->tb, j->m, j->n, j->k, 1.0f, (const float *)j->A + q * j->sa, j->lda,
                    (const float *)j->B + q * j->sb, j->ldb, 0.0f, (float *)j->C + q * j->sc,
                    j->ldc, j->dnnl, j->dnnl);
  }
}

static void cpu_gemm_batch(int dbl, int ta, int tb, int m, int n, int k, const void *a, int lda,
                           int64_t sa, const void *b, int ldb, int64_t sb, void *c, int ldc,
                           int64_t sc, int64_t batch) {
  size_t es = dbl ? sizeof(double) : sizeof(float);
  int nt = cpu_pool_threads();
  bool dnnl = !dbl && cpu_gemm_lib_dnnl();
  /* Items big enough to split well by rows keep the row split (one item at a time). */
  if (batch < nt || 2.0 * m * n * k >= 64e6) {
    for (int64_t q = 0; q < batch; q++) {
      cpu_gemm_job j = {dbl, ta, tb, m, n, k, lda, ldb, ldc, 1, 0, 1.0, 0.0,
                        (const char *)a + (size_t)(q * sa) * es, (const char *)b + (size_t)(q * sb) * es,
                        (char *)c + (size_t)(q * sc) * es, false, dnnl, 0};
      cpu_gemm_run(&j);
    }
    return;
  }
  int saved = get_threads && set_threads ? get_threads() : 0;
  if (saved > 1) set_threads(1);
  cpu_batch_job j = {dbl, ta, tb, m, n, k, lda, ldb, ldc, sa, sb, sc, a, b, c, dnnl};
  cpu_parallel_run(cpu_batch_part, (void **)&j, batch);
  if (saved > 1) set_threads(saved);
}

/* oneDNN's sgemm and its OpenMP's thread-count calls, where the library is installed. */
static void cpu_dnnl_load(void) {
  static const char *names[] = {"libdnnl.so.3", "libdnnl.so.2"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    /* the OpenMP runtime oneDNN's own calls resolve to: the process's first (PyTorch's
     * bundled libgomp.so.1 where torch was imported first), else the one it loaded */
    void *self = dlopen(NULL, RTLD_NOW); /* the process's global scope */
    void *f = dlsym(h, "dnnl_sgemm"), *st = self ? dlsym(self, "omp_set_num_threads") : NULL,
         *gt = self ? dlsym(self, "omp_get_max_threads") : NULL;
    if (self) dlclose(self);
    if (!st || !gt) st = dlsym(h, "omp_set_num_threads"), gt = dlsym(h, "omp_get_max_threads");
    if (f && st && gt) {
      memcpy(&dnnl_sgemm, &f, sizeof f);
      memcpy(&omp_set_threads, &st, sizeof st);
      memcpy(&omp_get_threads, &gt, sizeof gt);
      return; /* kept loaded for the life of the process */
    }
    dlclose(h);
  }
}

bool cpu_gemm_lib_dnnl(void) {
  cpu_blas();
  const char *e = getenv("GRAFT_GEMM_LIB"); /* read per product, as GRAFT_OWN_GEMM is */
  return dnnl_sgemm && !(e && !strcmp(e, "openblas"));
}

static void cpu_blas_load(void) {
  const char *e = getenv("GRAFT_BLAS");
  if (e && !strcmp(e, "0")) return;
  static const char *names[] = {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    void *s = dlsym(h, "cblas_sgemm"), *d = dlsym(h, "cblas_dgemm");
    if (s && d) {
      memcpy(&raw_sgemm, &s, sizeof s);
      memcpy(&raw_dgemm, &d, sizeof d);
      void *st = dlsym(h, "openblas_set_num_threads"), *gt = dlsym(h, "openblas_get_num_threads");
      if (st && gt) {
        memcpy(&set_threads, &st, sizeof st);
        memcpy(&get_threads, &gt, sizeof gt);
      }
      cpu_blas_tab.sgemm = cpu_sgemm;
      cpu_blas_tab.dgemm = cpu_dgemm;
      cpu_blas_tab.gemm = cpu_gemm_batch;
      cpu_dnnl_load(); /* its products come through the same split, so only beside a BLAS */
      return; /* kept loaded for the life of the process */
    }
    dlclose(h);
  }
}

const cpu_blas_fns *cpu_blas(void) {
  pthread_once(&cpu_blas_once, cpu_blas_load);
  return &cpu_blas_tab;
}
