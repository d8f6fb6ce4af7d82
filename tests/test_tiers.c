/* Tiered execution: a new graph runs at once on the first tier (reference kernels, BLAS and
 * host kernels for contractions and convolutions); it is compiled when it runs a second time,
 * or at graft_wait_compiles, or before its first run when the first tier would be slower than
 * the compiler. Each mode is set here (the suite may run under any GRAFT_COMPILE). */
#define _DEFAULT_SOURCE
#include "check.h"
#include "graft.h"
#include "backend.h" /* the registry: a test stands in a compiler */
#include "../src/graph/graph.h" /* tier_wait_idle */
#include "../src/backends/cpu/cpu.h" /* cpu_stats.views */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* setenv once no build runs: the compile thread reads the environment (the compiler's). */
static void set_env(const char *k, const char *v) {
  tier_wait_idle();
  setenv(k, v, 1);
}
static void unset_env(const char *k) {
  tier_wait_idle();
  unsetenv(k);
}

/* exp(x) * 2 + k over 1000 elements, synced; returns element 7. */
static float small_graph(graft_tensor *x, double k) {
  graft_scope_begin();
  graft_tensor *y = graft_add_scalar(graft_mul_scalar(graft_exp(x), 2), k);
  float out[1000];
  CHECK(graft_to_host(y, out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  return out[7];
}

/* Async mode and a 1000-element input (its values in *v). */
static graft_tensor *async_input(float scale, float **v) {
  set_env("GRAFT_COMPILE", "async");
  int64_t n = 1000;
  *v = ramp(n, scale);
  return graft_from_host(*v, GRAFT_F32, 1, &n, 0);
}

TEST(compiled_when_run_again) {
  float *v;
  graft_tensor *x = async_input(1, &v);
  graft_metrics_reset();
  float first = small_graph(x, 1);
  /* Run once: not queued. A queued compile of this graph would have landed within a second. */
  usleep(1000 * 1000);
  CHECK(M().native_compiles == 0 && M().compiled_executions == 0);
  small_graph(x, 2); /* a scalar is a parameter: the same graph, now queued */
  graft_wait_compiles();
  CHECK(M().native_compiles == 1);
  float third = small_graph(x, 1);
  CHECK(M().compiled_executions == 1);
  CHECK(M().graphs_compiled == 1);
  CHECK_NEAR(third, first, 1e-6);
  CHECK_NEAR(first, expf(v[7]) * 2 + 1, 1e-6);
  graft_release(x);
  free(v);
}

TEST(wait_compiles_builds_graphs_seen_once) {
  float *v;
  graft_tensor *x = async_input(0.5f, &v);
  graft_scope_begin();
  graft_tensor *y = graft_tanh(graft_sub(x, graft_exp(x)));
  float a[1000], b[1000];
  CHECK(graft_to_host(y, a, sizeof a) == GRAFT_OK);
  graft_scope_end();
  graft_metrics_reset();
  graft_wait_compiles();
  CHECK(M().native_compiles == 1);
  graft_scope_begin();
  y = graft_tanh(graft_sub(x, graft_exp(x)));
  CHECK(graft_to_host(y, b, sizeof b) == GRAFT_OK);
  graft_scope_end();
  CHECK(M().compiled_executions == 1);
  for (int i = 0; i < 1000; i++) CHECK_NEAR(b[i], a[i], 1e-6);
  graft_release(x);
  free(v);
}

/* A chain of KB kernels with distinct code (each reads the previous one's total, and its own
 * constant is in its code): its bodies are more source than one object takes, so they compile
 * as parallel objects in the background (threads: TSan runs this file). Returns the total. */
enum { KB = 160 };
static double many_kernels(graft_tensor *x, int64_t n) {
  graft_scope_begin();
  graft_tensor *s = graft_full(0.0, GRAFT_F32, 0, NULL);
  for (int k = 0; k < KB; k++) {
    graft_tensor *c = graft_full(0.001 * (k + 1), GRAFT_F32, 1, &n);
    graft_tensor *y = graft_tanh(graft_add(graft_mul(x, c), graft_broadcast_to(s, 1, &n)));
    s = graft_mean(y, NULL, 0, false);
  }
  float out = 0;
  CHECK(graft_to_host(s, &out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  return out;
}

TEST(many_kernels_compile_in_parallel_objects) {
  float *v;
  graft_tensor *x = async_input(1, &v);
  int64_t n = 1000;
  double want = 0;
  for (int k = 0; k < KB; k++) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += tanh(v[i] * (float)(0.001 * (k + 1)) + want);
    want = sum / (double)n;
  }
  graft_metrics_reset();
  double first = many_kernels(x, n);
  graft_wait_compiles();
  CHECK(M().kernels_compiled >= KB / 2); /* kernels of equal code share a body */
  double again = many_kernels(x, n);
  CHECK(M().compiled_executions == 1);
  CHECK_NEAR(first, want, 1e-4);
  CHECK_NEAR(again, want, 1e-4);
  graft_release(x);
  free(v);
}

/* Syncs a and b; in mode 1 with one more output, so that the graph differs from mode 0's
 * (else the second run would be a cache hit of the first mode's entry, not a first run). */
static void distinct_sync(graft_tensor *a, graft_tensor *b, int mode) {
  graft_tensor *ts[3] = {a, b, graft_neg(a)};
  CHECK(graft_sync(ts, 2 + mode) == GRAFT_OK);
}

/* The first tier's BLAS matmul and im2col convolution against the reference kernels. */
TEST(first_tier_matches_reference) {
  int64_t as[3] = {3, 40, 70}, bs[3] = {3, 70, 50}, xs[4] = {2, 3, 9, 9}, ws[4] = {4, 3, 3, 3};
  float *av = ramp(3 * 40 * 70, 1), *bv = ramp(3 * 70 * 50, 0.5f), *xv = ramp(2 * 3 * 81, 1),
        *wv = ramp(4 * 27, 0.3f);
  static float r[2][6000], c[2][1000];
  for (int mode = 0; mode < 2; mode++) {
    set_env("GRAFT_COMPILE", mode ? "async" : "off");
    graft_scope_begin();
    graft_tensor *a = graft_from_host(av, GRAFT_F32, 3, as, 0), *b = graft_from_host(bv, GRAFT_F32, 3, bs, 0);
    graft_tensor *x = graft_from_host(xv, GRAFT_F32, 4, xs, 0), *w = graft_from_host(wv, GRAFT_F32, 4, ws, 0);
    graft_tensor *m = graft_matmul(a, b);
    graft_tensor *y = graft_conv2d(x, w, (int[]){2, 2}, (int[]){1, 1}, NULL, 1);
    CHECK(graft_numel(m) == 6000 && graft_numel(y) == 2 * 4 * 5 * 5);
    graft_metrics_reset();
    distinct_sync(m, y, mode);
    CHECK(graft_to_host(m, r[mode], sizeof r[mode]) == GRAFT_OK);
    CHECK(graft_to_host(y, c[mode], sizeof(float) * 200) == GRAFT_OK);
    CHECK(M().compiled_executions == 0);
    graft_scope_end();
  }
  for (int i = 0; i < 6000; i++) CHECK_NEAR(r[1][i], r[0][i], 1e-5);
  for (int i = 0; i < 200; i++) CHECK_NEAR(c[1][i], c[0][i], 1e-5);
  free(av), free(bv), free(xv), free(wv);
}

/* GRAFT_COMPILE=off holds for a graph first seen under async: it is not compiled when it runs
 * again, nor at graft_wait_compiles. */
/* An unknown GRAFT_COMPILE value is said once on stderr (in a child, whose stderr is a file). */
TEST(unknown_mode_is_said_once) {
  char path[] = "/tmp/graft-test-stderr-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd, 2);
    float *v;
    graft_tensor *x = async_input(0.5f, &v);
    set_env("GRAFT_COMPILE", "bogus");
    float out[1000];
    for (int i = 0; i < 3; i++) /* a graph no other test made: new, then run again */
      if (graft_to_host(graft_sin(graft_mul_scalar(x, i)), out, sizeof out)) _exit(1);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char buf[4096] = {0};
  CHECK(pread(fd, buf, sizeof buf - 1, 0) > 0);
  const char *w = strstr(buf, "GRAFT_COMPILE=bogus");
  CHECK(w && !strstr(w + 1, "GRAFT_COMPILE=bogus"));
  close(fd);
  unlink(path);
}

TEST(off_means_no_compile) {
  float *v;
  graft_tensor *x = async_input(0.25f, &v);
  graft_tensor *c = graft_full(3, GRAFT_F32, 0, NULL); /* a constant: a graph of its own */
  graft_metrics_reset();
  graft_scope_begin();
  float out[1000];
  CHECK(graft_to_host(graft_mul(graft_exp(x), c), out, sizeof out) == GRAFT_OK);
  set_env("GRAFT_COMPILE", "off");
  CHECK(graft_to_host(graft_mul(graft_exp(x), c), out, sizeof out) == GRAFT_OK);
  graft_wait_compiles();
  CHECK(M().native_compiles == 0 && M().executions == 2 && M().graphs_compiled == 1);
  graft_scope_end();
  graft_release(c);
  graft_release(x);
  free(v);
}

/* The first tier's typed elementwise and movement loops do the reference's math: equal bits.
 * x is [d0,d1,d2]; big ones (over the first tier's 32768-element parallel threshold, with an
 * odd innermost dim) run the loops and copies in chunks on the pool. Returns the numel. */
static int64_t chain(graft_dtype dt, int mode, const int64_t *xs, double *res) {
  int64_t n = xs[0] * xs[1] * xs[2], bs[1] = {xs[2]};
  float *xv = ramp(n, 3), *bv = ramp(xs[2], 1);
  xv[5] = NAN;
  xv[n - 3] = NAN;
  graft_scope_begin();
  graft_tensor *x = graft_convert(graft_from_host(xv, GRAFT_F32, 3, xs, 0), dt);
  graft_tensor *b = graft_convert(graft_from_host(bv, GRAFT_F32, 1, bs, 0), dt);
  graft_tensor *y = graft_add(graft_tanh(x), graft_mul(graft_exp(b), graft_sigmoid(x))); /* broadcast */
  y = graft_maximum(graft_div(y, graft_add_scalar(graft_abs(x), 1)), graft_neg(graft_rsqrt(graft_add_scalar(graft_abs(y), 0.5))));
  y = graft_where(graft_gt(y, graft_scalar(0.1, dt)), graft_erf(y), graft_minimum(y, graft_reciprocal(graft_add_scalar(graft_abs(x), 2))));
  y = graft_transpose(y, (int[]){2, 0, 1});                                           /* [d2,d0,d1] */
  y = graft_slice(y, (int64_t[]){1, 0, 1}, (int64_t[]){xs[2], xs[0], xs[1]}, (int64_t[]){2, 1, 2});
  y = graft_convert(graft_sqrt(graft_log(graft_add_scalar(graft_abs(y), 1))), GRAFT_F64);
  int64_t m = graft_numel(y);
  CHECK(m == xs[2] / 2 * xs[0] * (xs[1] / 2));
  graft_metrics_reset();
  distinct_sync(y, x, mode);
  CHECK(graft_to_host(y, res, sizeof(double) * (size_t)m) == GRAFT_OK);
  CHECK(M().compiled_executions == 0);
  graft_scope_end();
  free(xv), free(bv);
  return m;
}

TEST(first_tier_elementwise_equals_reference) {
  static const int64_t sizes[2][3] = {{4, 6, 10}, {40, 60, 31}};
  for (int z = 0; z < 2; z++)
    for (int f = 0; f < 2; f++) {
      double *r[2];
      int64_t m = 0;
      for (int mode = 0; mode < 2; mode++) {
        r[mode] = malloc(sizeof(double) * 40 * 60 * 31);
        set_env("GRAFT_COMPILE", mode ? "async" : "off");
        uint64_t fused = cpu_stats.fused;
        m = chain(f ? GRAFT_F64 : GRAFT_F32, mode, sizes[z], r[mode]);
        /* the first tier runs the chains a chunk at a time (cpu_groups.c): tanh, exp, sigmoid,
         * the abs and add_scalar pairs, erf, reciprocal, log, sqrt... inside their readers */
        CHECK(mode ? cpu_stats.fused - fused >= 8 : cpu_stats.fused == fused);
      }
      int same = 1;
      for (int64_t i = 0; i < m; i++)
        same &= r[1][i] == r[0][i] || (isnan(r[1][i]) && isnan(r[0][i]));
      CHECK(same);
      free(r[0]), free(r[1]);
    }
}

/* Runs run() on the reference kernels (mode 0, GRAFT_COMPILE=off) and on the first tier (mode
 * 1) into r[0] and r[1] (cap doubles each; the caller frees them); returns the numel. */
static int64_t both_modes(int64_t (*run)(int mode, double *res), size_t cap, double *r[2]) {
  int64_t m = 0;
  for (int mode = 0; mode < 2; mode++) {
    r[mode] = malloc(sizeof(double) * cap);
    set_env("GRAFT_COMPILE", mode ? "async" : "off");
    m = run(mode, r[mode]);
  }
  return m;
}

/* The first tier's strided copies coalesce dims (a scalar broadcast is one fill, split for the
 * pool; a per-channel one copies rows of H*W equal values), and its bool logic and float fills
 * are typed loops: the reference kernels' values, bit for bit. Returns the numel. */
static int64_t copies(int mode, double *res) {
  int64_t cs[4] = {1, 6, 1, 1}, xs[4] = {5, 6, 7, 9}, big[4] = {40, 50, 1, 20};
  float *cv = ramp(6, 2), *xv = ramp(5 * 6 * 7 * 9, 3);
  graft_scope_begin();
  graft_tensor *c = graft_from_host(cv, GRAFT_F32, 4, cs, 0);
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 4, xs, 0);
  graft_tensor *s = graft_sum(c, NULL, 0, false);                                 /* a scalar */
  graft_tensor *fill = graft_broadcast_to(s, 4, big);                             /* 40000 */
  graft_tensor *chan = graft_mul(graft_broadcast_to(c, 4, xs), x);                /* [1,6,1,1] */
  graft_tensor *tr = graft_transpose(graft_reshape(x, 5, (int64_t[]){5, 1, 6, 7, 9}),
                                     (int[]){3, 1, 0, 4, 2});                     /* [7,1,5,9,6] */
  graft_tensor *sl = graft_slice(x, (int64_t[]){1, 0, 2, 0}, (int64_t[]){5, 6, 7, 9},
                                 (int64_t[]){2, 1, 3, 1});                        /* [2,6,2,9] */
  graft_tensor *pos = graft_gt(x, graft_scalar(40, GRAFT_F32)), *neg = graft_lt(x, graft_scalar(9, GRAFT_F32));
  graft_tensor *logic[4] = {graft_logical_or(pos, neg), graft_logical_and(pos, graft_logical_not(neg)),
                            graft_logical_xor(pos, graft_logical_not(pos)), graft_logical_not(neg)};
  graft_tensor *full = graft_add(graft_full(0.3, GRAFT_F32, 4, xs), x);
  /* inner dims that step as one: [6,5,63] at strides [63,378,1]; rows of 756 */
  graft_tensor *tr2 = graft_transpose(x, (int[]){1, 0, 2, 3});
  graft_tensor *sl2 = graft_slice(x, (int64_t[]){1, 2, 0, 0}, (int64_t[]){4, 6, 7, 9}, (int64_t[]){1, 1, 1, 1});
  /* pads: a convolution's [5,6,9,11] frame; interior fill and an i64 pad (8-byte elements) */
  graft_tensor *pad = graft_pad(x, (int64_t[]){0, 0, 1, 1}, (int64_t[]){0, 0, 1, 1}, -2.5);
  graft_tensor *padi = graft_pad_ex(x, (int64_t[]){1, 0, 0, 2}, (int64_t[]){0, 1, 2, 0},
                                    (int64_t[]){0, 1, 0, 2}, 7);               /* [6,12,9,27] */
  graft_tensor *pad64 = graft_convert(graft_pad(graft_convert(x, GRAFT_I64), (int64_t[]){1, 0, 2, 0},
                                                (int64_t[]){0, 0, 0, 1}, 3), GRAFT_F32); /* [6,6,9,10] */
  graft_tensor *parts[14] = {fill, chan, tr, sl, full, tr2, sl2, pad, padi, pad64};
  for (int k = 0; k < 4; k++) parts[10 + k] = graft_convert(logic[k], GRAFT_F32);
  graft_tensor *flat[14];
  for (int k = 0; k < 14; k++) flat[k] = graft_reshape(parts[k], 1, (int64_t[]){-1});
  graft_tensor *y = graft_convert(graft_concat(flat, 14, 0), GRAFT_F64);
  int64_t m = graft_numel(y);
  CHECK(m == 40000 + 216 + 1890 * 8 + 756 + 5 * 6 * 9 * 11 + 6 * 12 * 9 * 27 + 6 * 6 * 9 * 10);
  graft_metrics_reset();
  distinct_sync(y, x, mode);
  CHECK(graft_to_host(y, res, sizeof(double) * (size_t)m) == GRAFT_OK);
  CHECK(M().compiled_executions == 0);
  graft_scope_end();
  free(cv), free(xv);
  return m;
}

TEST(first_tier_copies_equal_reference) {
  double *r[2];
  int64_t m = both_modes(copies, 80000, r);
  CHECK(memcmp(r[0], r[1], sizeof(double) * (size_t)m) == 0);
  float *cv = ramp(6, 2), sum = 0;
  for (int i = 0; i < 6; i++) sum += cv[i];
  CHECK_NEAR(r[1][0], sum, 1e-5);
  CHECK(r[1][39999] == r[1][0]); /* the fill's last element */
  free(cv);
  free(r[0]), free(r[1]);
}

/* The first tier's typed reductions (cpu_reduce.c) give the reference kernels' results bit for
 * bit: sums, products, maxima and minima over axis masks, with a NaN, in f32 and f64. */
static void reductions(graft_dtype dt, int mode, double *res) {
  int64_t xs[4] = {3, 4, 5, 6};
  float *xv = ramp(360, 7);
  for (int i = 0; i < 360; i++) xv[i] = sinf(xv[i]) * 1.5f;
  xv[17] = NAN;
  graft_scope_begin();
  graft_tensor *x = graft_convert(graft_from_host(xv, GRAFT_F32, 4, xs, 0), dt);
  graft_tensor *parts[6] = {
      graft_sum(x, (int[]){1, 3}, 2, false),                                  /* [3,5] */
      graft_sum(x, NULL, 0, true),                                            /* [1,1,1,1] */
      graft_max(x, (int[]){0, 2}, 2, false),                                  /* [4,6] (NaN) */
      graft_min(x, (int[]){3}, 1, false),                                     /* [3,4,5] */
      graft_prod(graft_add_scalar(graft_mul_scalar(x, 0.1), 1), (int[]){2}, 1, false), /* [3,4,6] */
      graft_mean(x, (int[]){0}, 1, false),                                    /* [4,5,6] */
  };
  graft_tensor *flat[6];
  for (int k = 0; k < 6; k++) flat[k] = graft_reshape(parts[k], 1, (int64_t[]){-1});
  graft_tensor *y = graft_convert(graft_concat(flat, 6, 0), GRAFT_F64);
  CHECK(graft_numel(y) == 15 + 1 + 24 + 60 + 72 + 120);
  graft_metrics_reset();
  distinct_sync(y, x, mode);
  CHECK(graft_to_host(y, res, sizeof(double) * 292) == GRAFT_OK);
  CHECK(M().compiled_executions == 0);
  graft_scope_end();
  free(xv);
}

TEST(first_tier_reductions_equal_reference) {
  for (int f = 0; f < 2; f++) {
    double r[2][292];
    for (int mode = 0; mode < 2; mode++) {
      set_env("GRAFT_COMPILE", mode ? "async" : "off");
      reductions(f ? GRAFT_F64 : GRAFT_F32, mode, r[mode]);
    }
    int nan = 0;
    for (int i = 0; i < 292; i++) {
      CHECK(r[1][i] == r[0][i] || (isnan(r[1][i]) && isnan(r[0][i])));
      nan += isnan(r[0][i]);
    }
    CHECK(nan > 0 && nan < 292); /* the NaN reached some results, not all */
  }
}

/* Big reductions run on the pool, eight outputs at a time sharing the walk (batch norm's
 * per-channel sums among them): still the reference's bits. */
static int64_t big_reductions(int mode, double *res) {
  int64_t xs[4] = {6, 40, 12, 13};
  float *xv = ramp(6 * 40 * 12 * 13, 5);
  for (int i = 0; i < 6 * 40 * 12 * 13; i++) xv[i] = sinf(xv[i]) * 1.5f;
  xv[1234] = NAN;
  graft_scope_begin();
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 4, xs, 0);
  graft_tensor *parts[4] = {
      graft_sum(x, (int[]){0, 2, 3}, 3, false),   /* [40], per channel */
      graft_max(x, (int[]){1}, 1, false),         /* [6,12,13] */
      graft_sum(x, (int[]){3}, 1, false),         /* [6,40,12] */
      graft_min(x, NULL, 0, false),               /* [] */
  };
  graft_tensor *flat[4];
  for (int k = 0; k < 4; k++) flat[k] = graft_reshape(parts[k], 1, (int64_t[]){-1});
  graft_tensor *y = graft_convert(graft_concat(flat, 4, 0), GRAFT_F64);
  CHECK(graft_numel(y) == 40 + 936 + 2880 + 1);
  graft_metrics_reset();
  distinct_sync(y, x, mode);
  CHECK(graft_to_host(y, res, sizeof(double) * 3857) == GRAFT_OK);
  CHECK(M().compiled_executions == 0);
  graft_scope_end();
  free(xv);
  return 3857;
}

TEST(first_tier_big_reductions_equal_reference) {
  double *r[2];
  int64_t m = both_modes(big_reductions, 3857, r);
  int nan = 0;
  for (int64_t i = 0; i < m; i++) {
    CHECK(r[1][i] == r[0][i] || (isnan(r[1][i]) && isnan(r[0][i])));
    nan += isnan(r[0][i]);
  }
  CHECK(nan > 0 && nan < 100);
  free(r[0]), free(r[1]);
}

/* The first tier's views (cpu_views.c). Exact parts (r: the reference kernels' values bit for
 * bit): per-channel and scalar broadcasts and a transpose read by elementwise loops a chunk at a
 * time (one over CPU_COPY_PAR_MIN, on the pool), strided slices of a padded input flattened and
 * concatenated (a convolution's taps, also 8-byte i64), a transpose read by a reduction too (it
 * runs), a transposed output (it runs), the flattened parts' reshapes. Products (d: within
 * BLAS's rounding): transposes read as BLAS's transposed operands, a batch broadcast from one
 * matrix, a strided slice flattened into a product (no view BLAS can read: the slice runs).
 * Pads with interior points summed (a convolution's input gradient: views the adds gather). */
static int64_t views_graph(int variant, double *r, double *d, int64_t *nd) {
  int64_t as[2] = {70, 40}, bs[2] = {50, 70}, cs[3] = {1, 6, 1}, xs[3] = {5, 6, 1111},
          ps[4] = {2, 3, 9, 9}, b3[3] = {3, 70, 50}, a3[3] = {3, 40, 70};
  float *av = ramp(70 * 40, 1), *bv = ramp(50 * 70, 0.5f), *cv = ramp(6, 2), *xv = ramp(33330, 3),
        *pv = ramp(2 * 3 * 81, 1), *a3v = ramp(3 * 40 * 70, 0.7f);
  graft_scope_begin();
  graft_tensor *a = graft_from_host(av, GRAFT_F32, 2, as, 0), *b = graft_from_host(bv, GRAFT_F32, 2, bs, 0);
  graft_tensor *c = graft_from_host(cv, GRAFT_F32, 3, cs, 0), *x = graft_from_host(xv, GRAFT_F32, 3, xs, 0);
  graft_tensor *px = graft_from_host(pv, GRAFT_F32, 4, ps, 0), *x3 = graft_from_host(a3v, GRAFT_F32, 3, a3, 0);
  int t10[2] = {1, 0}, t021[3] = {0, 2, 1};
  graft_tensor *xt = graft_transpose(x, t021);                                   /* [5,1111,6] */
  graft_tensor *padded = graft_pad(px, (int64_t[]){0, 0, 1, 1}, (int64_t[]){0, 0, 1, 1}, -1.5);
  graft_tensor *padi = graft_convert(padded, GRAFT_I64);
  graft_tensor *tap[4], *tapi[4];
  for (int q = 0; q < 4; q++) { /* [2,3,5,5] at stride 2 from (q/2, q%2), as [2,3,1,25] */
    int64_t lo[4] = {0, 0, q / 2, q % 2}, hi[4] = {2, 3, q / 2 + 9, q % 2 + 9}, st[4] = {1, 1, 2, 2};
    tap[q] = graft_reshape(graft_slice(padded, lo, hi, st), 4, (int64_t[]){2, 3, 1, 25});
    tapi[q] = graft_reshape(graft_slice(padi, lo, hi, st), 4, (int64_t[]){2, 3, 1, 25});
  }
  /* a convolution's input gradient: each tap's part (a slice, flattened) placed by a pad with
   * interior points into the input's frame and summed (pads as views gathered by the adds); a
   * pad also read by a slice runs */
  graft_tensor *placed = NULL, *edge = NULL;
  for (int q = 0; q < 6; q++) {
    graft_tensor *part = graft_reshape(graft_slice(x, (int64_t[]){0, q, 0}, (int64_t[]){5, q + 1, 1111}, NULL),
                                       2, (int64_t[]){5, 1111});
    graft_tensor *t = graft_pad_ex(part, (int64_t[]){0, q}, (int64_t[]){1, 6 - q}, (int64_t[]){0, 1}, 0.25);
    placed = placed ? graft_add(placed, t) : t;                                  /* [6,2227] */
    if (q == 5) edge = graft_add(graft_slice(t, (int64_t[]){0, 0}, (int64_t[]){6, 2227}, (int64_t[]){2, 3}),
                                 graft_scalar(1, GRAFT_F32));
  }
  graft_tensor *exact[9] = {
      graft_mul(graft_broadcast_to(c, 3, xs), x),                                 /* 33330: pool */
      graft_add(graft_transpose(x, (int[]){1, 2, 0}),                           /* [6,1111,5] */
                graft_broadcast_to(graft_sum(c, NULL, 0, false), 3, (int64_t[]){6, 1111, 5})),
      graft_concat(tap, 4, 2),
      graft_convert(graft_concat(tapi, 4, 2), GRAFT_F32),
      graft_add(graft_sum(xt, (int[]){1}, 1, false), graft_sum(graft_mul(xt, xt), (int[]){1}, 1, false)),
      graft_where(graft_gt(xt, graft_broadcast_to(graft_scalar(900, GRAFT_F32), 3, (int64_t[]){5, 1111, 6})),
                  xt, graft_neg(xt)),
      NULL};
  graft_tensor *out_t = graft_transpose(x, (int[]){2, 1, 0});                   /* an output */
  exact[6] = out_t, exact[7] = placed, exact[8] = edge;
  graft_tensor *flat[9];
  for (int k = 0; k < 9; k++) flat[k] = graft_reshape(exact[k], 1, (int64_t[]){-1});
  graft_tensor *y = graft_convert(graft_concat(flat, 9, 0), GRAFT_F64);
  graft_tensor *sl = graft_slice(a, (int64_t[]){0, 0}, (int64_t[]){70, 40}, (int64_t[]){2, 1}); /* [35,40] */
  graft_tensor *prods[4] = {
      graft_matmul(graft_transpose(a, t10), graft_transpose(b, t10)),            /* [40,50]: TT */
      graft_matmul(x3, graft_broadcast_to(graft_reshape(b, 2, (int64_t[]){70, 50}), 3, b3)), /* [3,40,50] */
      graft_matmul(graft_transpose(x3, t021), x3),                               /* [3,70,70]: TN */
      graft_matmul(graft_reshape(sl, 2, (int64_t[]){40, 35}), sl),               /* [40,40] */
  };
  graft_tensor *pf[4];
  for (int k = 0; k < 4; k++) pf[k] = graft_reshape(prods[k], 1, (int64_t[]){-1});
  graft_tensor *z = graft_convert(graft_concat(pf, 4, 0), GRAFT_F64);
  int64_t m = graft_numel(y);
  *nd = graft_numel(z);
  CHECK(m == 33330 * 4 + 2 * 3 * 4 * 25 * 2 + 5 * 6 + 6 * 2227 + 3 * 743);
  CHECK(*nd == 40 * 50 + 3 * 40 * 50 + 3 * 70 * 70 + 40 * 40);
  graft_metrics_reset();
  graft_tensor *ts[5] = {y, z, out_t, graft_neg(y), graft_neg(z)}; /* a graph per variant */
  CHECK(graft_sync(ts, 3 + variant) == GRAFT_OK);
  CHECK(graft_to_host(y, r, sizeof(double) * (size_t)m) == GRAFT_OK);
  CHECK(graft_to_host(z, d, sizeof(double) * (size_t)*nd) == GRAFT_OK);
  CHECK(M().compiled_executions == 0);
  graft_scope_end();
  free(av), free(bv), free(cv), free(xv), free(pv), free(a3v);
  return m;
}

TEST(first_tier_views_equal_reference) {
  enum { CAP = 160000, DCAP = 30000 };
  double *r[2], *d[2];
  int64_t m = 0, nd = 0;
  for (int mode = 0; mode < 2; mode++) {
    r[mode] = malloc(sizeof(double) * CAP), d[mode] = malloc(sizeof(double) * DCAP);
    set_env("GRAFT_COMPILE", mode ? "async" : "off");
    uint64_t views = cpu_stats.views;
    m = views_graph(mode, r[mode], d[mode], &nd);
    /* planned: the two broadcasts, the transposes, the taps' slices and reshapes, the parts'
     * reshapes; the reference tier plans none */
    CHECK(mode ? cpu_stats.views - views >= 20 : cpu_stats.views == views);
  }
  CHECK(memcmp(r[0], r[1], sizeof(double) * (size_t)m) == 0);
  for (int64_t i = 0; i < nd; i++) CHECK_NEAR(d[1][i], d[0][i], 1e-4 * fabs(d[0][i]) + 1e-3);
  /* the same graph with views off runs every instruction: the same values */
  set_env("GRAFT_FIRST_TIER_VIEWS", "0");
  uint64_t views = cpu_stats.views;
  double *r2 = malloc(sizeof(double) * CAP), *d2 = malloc(sizeof(double) * DCAP);
  set_env("GRAFT_COMPILE", "async");
  views_graph(2, r2, d2, &nd);
  CHECK(cpu_stats.views == views);
  CHECK(memcmp(r2, r[1], sizeof(double) * (size_t)m) == 0);
  unset_env("GRAFT_FIRST_TIER_VIEWS");
  free(r[0]), free(r[1]), free(d[0]), free(d[1]), free(r2), free(d2);
}

/* 2*1024*2048*1024 FLOPs: slower on the first tier than compiling, so compiled first. */
TEST(heavy_graph_compiles_before_first_run) {
  set_env("GRAFT_COMPILE", "async");
  int64_t as[2] = {1024, 2048}, bs[2] = {2048, 1024};
  graft_scope_begin();
  graft_tensor *a = graft_full(0.5, GRAFT_F32, 2, as), *b = graft_full(0.25, GRAFT_F32, 2, bs);
  graft_tensor *in[2] = {graft_add(a, graft_scalar(0, GRAFT_F32)), graft_add(b, graft_scalar(0, GRAFT_F32))};
  CHECK(graft_sync(in, 2) == GRAFT_OK); /* data leaves */
  graft_metrics_reset();
  graft_tensor *m = graft_matmul(in[0], in[1]);
  float out[4];
  graft_tensor *s = graft_slice(m, (int64_t[]){0, 0}, (int64_t[]){2, 2}, NULL);
  CHECK(graft_to_host(s, out, sizeof out) == GRAFT_OK);
  CHECK(M().compiled_executions == 1);
  CHECK_NEAR(out[3], 0.5 * 0.25 * 2048, 1e-6);
  graft_scope_end();
}

/* The registry and the compiler's supports(): a stand-in compiler that declines tanh (and
 * counts its compiles, delegating to the real one). A graph with a tanh stays on the first tier
 * without a compile and without a failure; a graph without one is compiled. */
static const backend *real_compiler;
static int standin_compiles;
static bool standin_supports(const exec_instr *ins) {
  return ins->op != IR_TANH && (!real_compiler->supports || real_compiler->supports(ins));
}
static void *standin_compile(const exec_program *p) {
  standin_compiles++;
  return real_compiler->compile(p);
}

TEST(compiler_supports_decides_what_compiles) {
  graft_metrics reset;
  graft_metrics_get(&reset); /* registers the built-in backends */
  real_compiler = backend_find("cpu", BACKEND_COMPILER);
  CHECK(real_compiler != NULL && backend_find("cpu", BACKEND_REFERENCE) != NULL &&
        backend_find("cpu", BACKEND_FIRST_TIER) != NULL && backend_find("gpu", BACKEND_COMPILER) == NULL);
  if (!real_compiler) return;
  backend standin = *real_compiler;
  standin.name = "stand-in";
  standin.supports = standin_supports;
  standin.compile = standin_compile;
  CHECK(backend_register("cpu", BACKEND_COMPILER, &standin) == real_compiler);
  set_env("GRAFT_COMPILE", "sync");
  int64_t n = 1000;
  float *v = ramp(n, 1), out[1000];
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  graft_metrics_reset();
  standin_compiles = 0;
  graft_scope_begin();
  CHECK(graft_to_host(graft_tanh(graft_mul_scalar(x, 3)), out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  CHECK(standin_compiles == 0 && M().native_compiles == 0 && M().native_compile_failures == 0);
  CHECK(M().compiled_executions == 0);
  CHECK_NEAR(out[7], tanhf(3 * v[7]), 1e-6);
  graft_scope_begin();
  CHECK(graft_to_host(graft_exp(graft_mul_scalar(x, 3)), out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  CHECK(standin_compiles == 1 && M().native_compiles == 1 && M().compiled_executions == 1);
  CHECK_NEAR(out[7], expf(3 * v[7]), 1e-6);
  graft_release(x);
  free(v);
  /* the graph compiled by the stand-in stays cached; its free_exe is the real one's */
  CHECK(backend_register("cpu", BACKEND_COMPILER, real_compiler) == &standin);
  graft_shutdown(); /* drop the cache while standin's vtable is still alive */
}

/* Stand-ins with gates, to hold the executor inside the first tier and the compile thread
 * inside a quick build (both delegate to the real backends). The vtables are static: cache
 * entries made meanwhile point at them until graft_shutdown. */
static const backend *real_first;
static backend gated_first, gated_compiler;
static atomic_int first_open = 1, quick_open = 1, first_entered, first_runs, first_sleep_ms,
    quick_built;
static int gated_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                         exec_buffer **outs) {
  atomic_fetch_add(&first_entered, 1);
  while (!atomic_load(&first_open)) usleep(1000);
  atomic_fetch_add(&first_runs, 1);
  if (atomic_load(&first_sleep_ms)) usleep(1000 * (useconds_t)atomic_load(&first_sleep_ms));
  return real_first->execute(exe, p, params, outs);
}
static atomic_int quick_entered, quick_pass; /* quick_pass: builds let through a closed gate */
static void *gated_quick(const exec_program *p, bool *full) {
  atomic_fetch_add(&quick_entered, 1);
  while (!atomic_load(&quick_open)) {
    int pass = atomic_load(&quick_pass);
    if (pass > 0 && atomic_compare_exchange_strong(&quick_pass, &pass, pass - 1)) break;
    usleep(1000);
  }
  void *exe = real_compiler->compile_quick(p, full);
  atomic_fetch_add(&quick_built, 1);
  return exe;
}

static void gates_install(void) {
  graft_metrics reset;
  graft_metrics_get(&reset); /* registers the built-in backends */
  set_env("GRAFT_COMPILE", "async");
  unset_env("GRAFT_COMPILE_QUICK");
  set_env("GRAFT_INLINE", "0"); /* these small graphs must queue, not run on this thread */
  real_first = backend_find("cpu", BACKEND_FIRST_TIER);
  real_compiler = backend_find("cpu", BACKEND_COMPILER);
  CHECK(real_first && real_compiler && real_compiler->compile_quick);
  gated_first = *real_first;
  gated_first.execute = gated_execute;
  gated_compiler = *real_compiler;
  gated_compiler.compile_quick = gated_quick;
  backend_register("cpu", BACKEND_FIRST_TIER, &gated_first);
  backend_register("cpu", BACKEND_COMPILER, &gated_compiler);
  atomic_store(&first_entered, 0);
  atomic_store(&first_runs, 0);
  atomic_store(&quick_built, 0);
  atomic_store(&quick_entered, 0);
}

static void gates_remove(void) {
  atomic_store(&first_open, 1);
  atomic_store(&quick_open, 1);
  atomic_store(&quick_pass, 0);
  atomic_store(&first_sleep_ms, 0);
  graft_shutdown(); /* drop the cache while the stand-ins' vtables are registered */
  unset_env("GRAFT_INLINE");
  backend_register("cpu", BACKEND_FIRST_TIER, real_first);
  backend_register("cpu", BACKEND_COMPILER, real_compiler);
}

/* Waits (up to 60 s) for the quick build, then a moment for the compile thread to publish it
 * (not through the metrics: reading them drains the queue, which the gated executor holds). */
static void await_quick_build(void) {
  for (int i = 0; i < 60000 && !atomic_load(&quick_built); i++) usleep(1000);
  CHECK(atomic_load(&quick_built) == 1);
  usleep(500 * 1000);
}

/* sin(x * k): k is a parameter, so every k is the same graph; queued, not read. */
static graft_tensor *queue_sin(graft_tensor *x, double k) {
  graft_tensor *y = graft_sin(graft_mul_scalar(x, k));
  CHECK(graft_sync(&y, 1) == GRAFT_OK);
  return y;
}

/* Steps queued while no native code exists run the quick build once it lands, not the first
 * tier they would have run on when queued; later the full build replaces it, same values. */
TEST(queued_steps_switch_to_native_code) {
  gates_install();
  float *v;
  graft_tensor *x = async_input(1, &v);
  graft_metrics_reset();
  atomic_store(&first_open, 0);
  atomic_store(&quick_open, 0);
  graft_tensor *y[4];
  y[0] = queue_sin(x, 1);
  for (int i = 0; i < 10000 && !atomic_load(&first_entered); i++) usleep(1000);
  CHECK(atomic_load(&first_entered) == 1); /* the executor holds step 1 on the first tier */
  for (int k = 1; k < 4; k++) y[k] = queue_sin(x, 1 + k); /* step 2 queues the build */
  atomic_store(&quick_open, 1);
  await_quick_build();
  atomic_store(&first_open, 1);
  float out[4][1000];
  for (int k = 0; k < 4; k++) CHECK(graft_to_host(y[k], out[k], sizeof out[k]) == GRAFT_OK);
  CHECK(atomic_load(&first_runs) == 1);
  CHECK(M().compiled_executions == 3 && M().quick_compiles == 1);
  for (int k = 0; k < 4; k++) CHECK_NEAR(out[k][7], sinf((float)(1 + k) * v[7]), 1e-6);
  graft_wait_compiles(); /* the full build */
  CHECK(M().native_compiles == 1 && M().quick_compiles == 1);
  graft_scope_begin();
  float again[1000];
  CHECK(graft_to_host(queue_sin(x, 2), again, sizeof again) == GRAFT_OK);
  CHECK(M().compiled_executions == 4);
  CHECK(memcmp(again, out[1], sizeof again) == 0); /* -O3 equals -O1, bit for bit */
  graft_scope_end();
  for (int k = 0; k < 4; k++) graft_release(y[k]);
  graft_release(x);
  free(v);
  gates_remove();
}

/* Steps queued far ahead wait for a build that lands sooner than the first tier would run
 * them (here 200 ms a step, ten steps queued behind another graph's step, the build held for
 * 300 ms): after the first run, none runs on the first tier. */
TEST(queued_steps_wait_for_a_sooner_build) {
  gates_install();
  float *v;
  graft_tensor *x = async_input(1, &v);
  graft_metrics_reset();
  atomic_store(&first_sleep_ms, 200);
  atomic_store(&quick_open, 0);
  float out[1000];
  graft_scope_begin();
  CHECK(graft_to_host(graft_cos(graft_mul_scalar(x, 1)), out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  CHECK(atomic_load(&first_runs) == 1);
  /* another graph's step holds the executor until all ten are queued */
  atomic_store(&first_open, 0);
  atomic_store(&first_entered, 0);
  graft_tensor *blocker = graft_atan(x);
  CHECK(graft_sync(&blocker, 1) == GRAFT_OK);
  for (int i = 0; i < 10000 && !atomic_load(&first_entered); i++) usleep(1000);
  CHECK(atomic_load(&first_entered) == 1);
  graft_tensor *y[10];
  for (int k = 0; k < 10; k++) {
    y[k] = graft_cos(graft_mul_scalar(x, 2 + k));
    CHECK(graft_sync(&y[k], 1) == GRAFT_OK);
  }
  atomic_store(&first_open, 1);
  usleep(300 * 1000);
  atomic_store(&quick_open, 1);
  for (int k = 0; k < 10; k++) {
    CHECK(graft_to_host(y[k], out, sizeof out) == GRAFT_OK);
    CHECK_NEAR(out[7], cosf((float)(2 + k) * v[7]), 1e-6);
    graft_release(y[k]);
  }
  CHECK(atomic_load(&first_runs) == 2); /* the first run and the blocker */
  CHECK(M().compiled_executions == 10);
  graft_release(blocker);
  graft_release(x);
  free(v);
  gates_remove();
}

/* sin(x * 3) over n elements (its values in *v), synced, not read: one graph per n, each a
 * size of one family. */
static graft_tensor *queue_sized(int64_t n, float **v) {
  *v = ramp(n, 1);
  graft_tensor *x = graft_from_host(*v, GRAFT_F32, 1, &n, 0);
  graft_tensor *y = graft_sin(graft_mul_scalar(x, 3));
  graft_release(x);
  CHECK(graft_sync(&y, 1) == GRAFT_OK);
  return y;
}

/* Sizes traced while their family's first build runs are queued behind it; once it lands, the
 * next graph the tracing thread looks up builds them from its kernels (tier_library_drain)
 * rather than leaving them to the compile thread, which steps starve. Sizes 400 and 500 run
 * once (a family of two: no build); 600, the third, is queued at once and its build (the
 * templates) is held in the compiler; 700, 800, 900 are traced meanwhile. The build is let
 * through; the compile thread takes 700 next and is held; another graph is traced: 800 and 900
 * are built from the library on this thread. */
TEST(sizes_queued_behind_their_family_build_use_its_kernels) {
  gates_install();
  graft_metrics_reset();
  atomic_store(&quick_open, 0);
  const int64_t n[] = {400, 500, 600, 700, 800, 900};
  float *v[6], out[900];
  graft_tensor *y[6];
  for (int k = 0; k < 2; k++) {
    y[k] = queue_sized(n[k], &v[k]);
    CHECK(graft_to_host(y[k], out, sizeof(float) * (size_t)n[k]) == GRAFT_OK);
  }
  CHECK(atomic_load(&quick_entered) == 0); /* two sizes: each runs once, nothing builds */
  y[2] = queue_sized(n[2], &v[2]);
  for (int i = 0; i < 60000 && atomic_load(&quick_entered) < 1; i++) usleep(1000);
  CHECK(atomic_load(&quick_entered) == 1);
  for (int k = 3; k < 6; k++) y[k] = queue_sized(n[k], &v[k]);
  atomic_store(&quick_pass, 1);
  for (int i = 0; i < 60000 && atomic_load(&quick_entered) < 2; i++) usleep(1000);
  CHECK(atomic_load(&quick_built) == 1 && atomic_load(&quick_entered) == 2);
  CHECK(M().library_builds == 0);
  graft_scope_begin();
  graft_tensor *other = graft_cos(graft_mul_scalar(y[0], 2));
  CHECK(graft_sync(&other, 1) == GRAFT_OK);
  graft_scope_end();
  CHECK(M().library_builds == 2);
  atomic_store(&quick_open, 1);
  for (int k = 0; k < 6; k++) {
    CHECK(graft_to_host(y[k], out, sizeof(float) * (size_t)n[k]) == GRAFT_OK);
    CHECK_NEAR(out[n[k] - 3], sinf(3 * v[k][n[k] - 3]), 1e-6);
    graft_release(y[k]);
    free(v[k]);
  }
  graft_wait_compiles();
  CHECK(atomic_load(&quick_built) == 2); /* 600 and 700 through the compile thread */
  gates_remove();
}

/* A family of two sizes keeps specialised code and runs the compiler for its second size only
 * once it has run often enough to pay (an epoch's last partial batch runs once an epoch): size
 * 400 runs three times and is built; 500 runs twice, far from paying for a compiler run (its
 * first-tier runs cost microseconds): at most built from 400's kernels; its reason says so. A
 * third size makes the family size-generic: templates compiled at once. */
TEST(second_size_is_built_when_it_pays) {
  float *v[3], out[600];
  set_env("GRAFT_COMPILE", "async");
  graft_metrics_reset();
  const int64_t n[] = {400, 500, 600};
  const int runs[] = {3, 2, 1};
  uint64_t compiler_runs[3], native_runs[3];
  for (int k = 0; k < 3; k++) {
    for (int r = 0; r < runs[k]; r++) {
      graft_scope_begin();
      graft_tensor *y = queue_sized(n[k], &v[k]);
      CHECK(graft_to_host(y, out, sizeof(float) * (size_t)n[k]) == GRAFT_OK);
      CHECK_NEAR(out[n[k] - 3], sinf(3 * v[k][n[k] - 3]), 1e-6);
      free(v[k]);
      graft_scope_end();
    }
    tier_wait_idle();
    compiler_runs[k] = M().compiler_runs;
    native_runs[k] = M().compiled_executions;
  }
  CHECK(compiler_runs[0] >= 1 && compiler_runs[1] == compiler_runs[0]);
  CHECK(native_runs[2] == native_runs[1] + 1); /* the third size runs native code at once */
  char *rep = graft_metrics_report();
  CHECK(rep && strstr(rep, "a second size of a cached graph") && strstr(rep, "(size-generic)"));
  free(rep);
}

/* A second process on a warm disk cache: a graph seen for the first time whose kernels an
 * earlier process compiled is built from them (no compiler) and runs native code from its first
 * run (resnet18's first step had run on the first tier: 229 ms against 46 native). The earlier
 * process is this one before graft_shutdown (which empties the kernel library). */
TEST(warm_disk_cache_is_native_from_the_first_run) {
  char root[] = "/tmp/graft-tiers-warm-XXXXXX", cmd[128];
  CHECK(mkdtemp(root) != NULL);
  set_env("GRAFT_COMPILE", "async");
  set_env("GRAFT_DISK_CACHE", "1");
  set_env("XDG_CACHE_HOME", root);
  const int64_t n = 200000; /* enough work that its first-tier run costs more than the build */
  float *v = ramp(n, 0.5f), out[3][4];
  for (int proc = 0; proc < 3; proc++) { /* built and stored; warm; cold */
    graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
    graft_metrics_reset();
    uint64_t runs0 = M().compiler_runs; /* the backend's count, since the library's start */
    for (int r = 0; r < (proc ? 1 : 2); r++) {
      graft_scope_begin();
      graft_tensor *y = graft_add_scalar(graft_mul_scalar(graft_exp(x), 2), 3);
      const int64_t lo = 7, hi = 11, step = 1;
      CHECK(graft_to_host(graft_slice(y, &lo, &hi, &step), out[proc], sizeof out[proc]) == GRAFT_OK);
      graft_scope_end();
    }
    if (proc == 0) graft_wait_compiles();
    if (proc == 1)
      CHECK(M().compiled_executions == 1 && M().library_builds == 1 && M().compiler_runs == runs0);
    if (proc == 2) CHECK(M().compiled_executions == 0 && M().library_builds == 0);
    CHECK_NEAR(out[proc][0], expf(v[7]) * 2 + 3, 1e-5);
    graft_release(x);
    graft_shutdown(); /* a new process: the kernel library is empty */
    if (proc == 1) { /* the next process finds a cold disk cache */
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
      CHECK(system(cmd) == 0);
    }
  }
  free(v);
  set_env("GRAFT_DISK_CACHE", "0");
  unset_env("XDG_CACHE_HOME");
}

/* exp(x) * 2 + 3 (its kernel compiled first) and, when w is given, tanh(w + 1) (a new kernel
 * of another shape, little work); checks both values. */
static void known_and_new(graft_tensor *x, const float *v, graft_tensor *w, const float *u) {
  graft_scope_begin();
  graft_tensor *y[2] = {graft_add_scalar(graft_mul_scalar(graft_exp(x), 2), 3),
                        w ? graft_tanh(graft_add_scalar(w, 1)) : NULL};
  CHECK(graft_sync(y, w ? 2 : 1) == GRAFT_OK);
  float a[16], b[16];
  const int64_t lo = 0, hi = 16, step = 1;
  CHECK(graft_to_host(graft_slice(y[0], &lo, &hi, &step), a, sizeof a) == GRAFT_OK);
  CHECK_NEAR(a[9], expf(v[9]) * 2 + 3, 1e-5 * fabsf(a[9]));
  if (w) {
    CHECK(graft_to_host(graft_slice(y[1], &lo, &hi, &step), b, sizeof b) == GRAFT_OK);
    CHECK_NEAR(b[5], tanhf(u[5] + 1), 1e-6);
  }
  graft_scope_end();
}

/* A graph whose build is compiling runs its kernels compiled before (by another graph) as
 * native code and the new ones on the first tier's loops until they land, then all native
 * (the "switch each kernel as it lands"). The compiler here waits a second first, so
 * that steps run meanwhile. */
TEST(kernels_switch_to_native_as_they_land) {
  char root[] = "/tmp/graft-tiers-slowcc-XXXXXX", cc[200];
  CHECK(mkdtemp(root) != NULL);
  snprintf(cc, sizeof cc, "%s/slow-cc", root);
  FILE *f = fopen(cc, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("#!/bin/sh\nsleep 1\nexec cc \"$@\"\n", f);
  fclose(f);
  CHECK(chmod(cc, 0755) == 0);
  set_env("GRAFT_CC", cc);
  set_env("GRAFT_COMPILE", "async");
  const int64_t n = 200000, m = 1000;
  float *v = ramp(n, 0.00001f), *u = ramp(m, 0.001f);
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0), *w = graft_from_host(u, GRAFT_F32, 1, &m, 0);
  known_and_new(x, v, NULL, NULL);
  known_and_new(x, v, NULL, NULL);
  graft_wait_compiles(); /* exp(x) * 2 + 3's kernel is in the library */
  graft_metrics_reset();
  for (int r = 0; r < 2000 && !M().partial_executions; r++) known_and_new(x, v, w, u);
  CHECK(M().partial_executions > 0);
  graft_wait_compiles();
  uint64_t native = M().compiled_executions, partial = M().partial_executions;
  known_and_new(x, v, w, u);
  CHECK(M().compiled_executions > native && M().partial_executions == partial); /* all native */
  graft_release(x);
  graft_release(w);
  free(v);
  free(u);
  unset_env("GRAFT_CC");
  unlink(cc);
  rmdir(root);
}

/* A stand-in compiler that counts its library builds of graphs with a tanh. */
static int cached_tanh_tries;
static void *counting_cached(const exec_program *p, bool *full) {
  for (int i = 0; i < p->ninstr; i++)
    if (p->instr[i].op == IR_TANH) {
      cached_tanh_tries++;
      break;
    }
  return real_compiler->compile_cached(p, full);
}

/* A second process whose graph finds only part of its kernels on disk: the library build tried
 * at its first run loads what it finds and fails; its second run does not try again (nothing
 * landed since: it would fail the same, ~70 ms of mobilenet_v2's code generation on the
 * tracing thread), and queues its build. */
TEST(failed_library_build_is_not_retried) {
  char root[] = "/tmp/graft-tiers-retry-XXXXXX", cmd[128];
  CHECK(mkdtemp(root) != NULL);
  graft_shutdown(); /* a new process: the kernels earlier tests compiled are not in memory */
  set_env("GRAFT_COMPILE", "async");
  set_env("GRAFT_DISK_CACHE", "1");
  set_env("XDG_CACHE_HOME", root);
  const int64_t n = 200000, m = 1000;
  float *v = ramp(n, 0.00001f), *u = ramp(m, 0.001f);
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  known_and_new(x, v, NULL, NULL);
  known_and_new(x, v, NULL, NULL);
  graft_wait_compiles(); /* exp(x) * 2 + 3's kernel is on disk */
  graft_release(x);
  graft_shutdown(); /* a new process */
  real_compiler = backend_find("cpu", BACKEND_COMPILER);
  static backend counting;
  counting = *real_compiler;
  counting.compile_cached = counting_cached;
  backend_register("cpu", BACKEND_COMPILER, &counting);
  x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  graft_tensor *w = graft_from_host(u, GRAFT_F32, 1, &m, 0);
  cached_tanh_tries = 0;
  known_and_new(x, v, w, u); /* first run: tried (and the kernel found on disk loaded) */
  CHECK(cached_tanh_tries == 1);
  known_and_new(x, v, w, u); /* second: queued, not tried again */
  CHECK(cached_tanh_tries == 1);
  graft_wait_compiles();
  known_and_new(x, v, w, u);
  graft_release(x);
  graft_release(w);
  free(v);
  free(u);
  graft_shutdown(); /* entries made with the stand-in go before it is replaced */
  backend_register("cpu", BACKEND_COMPILER, real_compiler);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  CHECK(system(cmd) == 0);
  set_env("GRAFT_DISK_CACHE", "0");
  unset_env("XDG_CACHE_HOME");
}

/* A value read on another thread: graft_to_host holds graft's lock while its step is queued. */
typedef struct {
  graft_tensor *t;
  float out[1000];
  graft_status st;
} tiers_reader;
static void *tiers_read(void *arg) {
  tiers_reader *r = arg;
  r->st = graft_to_host(r->t, r->out, sizeof r->out);
  return NULL;
}

/* y = op(x * k) run once to the end, then queued again: its build is queued (or running). */
static graft_tensor *run_then_queue(graft_tensor *x, graft_tensor *(*op)(graft_tensor *)) {
  float out[1000];
  graft_scope_begin();
  CHECK(graft_to_host(op(graft_mul_scalar(x, 1)), out, sizeof out) == GRAFT_OK);
  graft_scope_end();
  graft_tensor *y = op(graft_mul_scalar(x, 2));
  CHECK(graft_sync(&y, 1) == GRAFT_OK);
  return y;
}

/* A thread that reads a value holds graft's lock while the steps queued before it run (a
 * training loop traced ahead, then loss.item()): the compile thread does not wait for that
 * lock between builds. Two graphs' builds are queued, a third graph's step holds the executor,
 * another thread reads that step's value; the first build is let go, and the second one still
 * runs while the reader waits (it had waited for the reader: a GPT LM on 4 lengths ran 150 of
 * its 200 steps on the first tier). Their results are recorded once the lock is free. */
TEST(builds_go_on_while_a_reader_holds_the_lock) {
  gates_install();
  float *v;
  graft_tensor *x = async_input(1, &v);
  graft_metrics_reset();
  atomic_store(&quick_open, 0);
  graft_tensor *a = run_then_queue(x, graft_sigmoid), *b = run_then_queue(x, graft_erf);
  atomic_store(&first_open, 0);
  atomic_store(&first_entered, 0);
  tiers_reader r = {.t = graft_atan(x)};
  CHECK(graft_sync(&r.t, 1) == GRAFT_OK);
  for (int i = 0; i < 10000 && !atomic_load(&first_entered); i++) usleep(1000);
  CHECK(atomic_load(&first_entered) >= 1); /* the executor holds a step on the first tier */
  pthread_t th;
  CHECK(pthread_create(&th, NULL, tiers_read, &r) == 0);
  bool held = false; /* until the reader holds graft's lock */
  for (int i = 0; i < 10000 && !held; i++) {
    held = !tensor_trylock();
    if (!held) tensor_unlock(), usleep(1000);
  }
  CHECK(held);
  atomic_store(&quick_open, 1);
  for (int i = 0; i < 60000 && atomic_load(&quick_built) < 2; i++) usleep(1000);
  CHECK(atomic_load(&quick_built) == 2); /* both builds ran while the reader waited */
  atomic_store(&first_open, 1);
  pthread_join(th, NULL);
  CHECK(r.st == GRAFT_OK);
  CHECK_NEAR(r.out[7], atanf(v[7]), 1e-6);
  float out[1000];
  CHECK(graft_to_host(a, out, sizeof out) == GRAFT_OK);
  CHECK_NEAR(out[7], 1 / (1 + expf(-2 * v[7])), 1e-6);
  CHECK(graft_to_host(b, out, sizeof out) == GRAFT_OK);
  CHECK_NEAR(out[7], erff(2 * v[7]), 1e-6);
  graft_wait_compiles(); /* records both quick builds, then builds every graph in full */
  CHECK(M().quick_compiles == 2);
  CHECK(M().native_compiles == 3); /* and the reader's graph, run once */
  graft_release(a);
  graft_release(b);
  graft_release(r.t);
  graft_release(x);
  free(v);
  gates_remove();
}

/* Reading the metrics does not wait for a build in progress: graft_metrics_get holds graft's
 * lock, so every traced op would wait with it (the compiler's counters were read under the
 * lock a build holds for its whole compile: graft.metrics() after a resnet18 step took 1.7 s).
 * many_kernels' graph compiles for seconds; the metrics are read once its compile has begun,
 * and before it ends. */
TEST(metrics_do_not_wait_for_a_build) {
  gates_install();
  float *v;
  graft_tensor *x = async_input(1, &v);
  int64_t n = 1000;
  double first = many_kernels(x, n);
  double second = many_kernels(x, n); /* run again: its build is queued */
  for (int i = 0; i < 60000 && !atomic_load(&quick_entered); i++) usleep(1000);
  CHECK(atomic_load(&quick_entered) == 1);
  usleep(100 * 1000); /* into the compile, which takes seconds */
  graft_metrics m;
  graft_metrics_get(&m);
  CHECK(atomic_load(&quick_built) == 0); /* returned while the build went on */
  graft_wait_compiles();
  CHECK(atomic_load(&quick_built) == 1);
  CHECK_NEAR(second, first, 1e-4);
  graft_release(x);
  free(v);
  gates_remove();
}

/* A forked child's own work: a graph run twice, then every build waited for; its values, and
 * (unless compiling is off) native code ran. Exit status 0 when all is right; an alarm turns a
 * hang into a failure. */
static int fork_child_work(graft_tensor *x, const float *v, const char *mode) {
  alarm(120);
#ifdef __SANITIZE_THREAD__
  /* ThreadSanitizer cannot follow threads a forked child starts (glibc gives them the dead
   * parent threads' ids: "dup thread with used id"): under it the child runs on its own thread,
   * while the parent's fork handlers are still checked; the AddressSanitizer run covers the
   * child's threads. */
  setenv("GRAFT_THREADS", "1", 1);
  setenv("GRAFT_ASYNC", "0", 1);
  if (!strcmp(mode, "async")) setenv("GRAFT_COMPILE", "sync", 1);
#endif
  float out[1000];
  graft_metrics_reset();
  for (int r = 0; r < 3; r++) {
    graft_scope_begin();
    graft_tensor *y = graft_tanh(graft_mul_scalar(x, 3.5));
    if (graft_to_host(y, out, sizeof out) != GRAFT_OK) return 2;
    graft_scope_end();
    if (fabsf(out[9] - tanhf(3.5f * v[9])) > 1e-5f) return 3;
#ifndef __SANITIZE_THREAD__ /* it starts a compile thread in the child */
    if (r == 1) graft_wait_compiles();
#endif
  }
  graft_metrics m;
  graft_metrics_get(&m);
  if (strcmp(mode, "off") && m.compiled_executions == 0) return 4;
  graft_shutdown();
  return 0;
}

/* fork() while graft's threads run (a DataLoader's workers): with a background build in
 * progress and a step queued, in each compile mode, the child compiles, runs and shuts down,
 * and the parent goes on (the queued step's value, its own builds). */
TEST(fork_during_build_and_queued_steps) {
  const char *modes[] = {"async", "sync", "off"};
  for (int k = 0; k < 3; k++) {
    float *v;
    graft_tensor *x = async_input(0.5f + (float)k, &v);
    set_env("GRAFT_COMPILE", modes[k]);
    graft_scope_begin();
    small_graph(x, 11 + k);
    small_graph(x, 11 + k); /* async: its build is queued now, and starts */
    graft_tensor *q = graft_sin(graft_mul_scalar(x, 1.25));
    CHECK(graft_step() == GRAFT_OK); /* async: queued, not run */
    pid_t pid = fork();
    if (pid == 0) _exit(fork_child_work(x, v, modes[k]));
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) fprintf(stderr, "  child (%s): status %d\n", modes[k], st);
    float out[1000];
    CHECK(graft_to_host(q, out, sizeof out) == GRAFT_OK);
    CHECK_NEAR(out[9], sinf(1.25f * v[9]), 1e-6);
    CHECK_NEAR(small_graph(x, 11 + k), 2 * expf(v[7]) + 11 + k, 1e-4);
    graft_wait_compiles();
    graft_scope_end();
    graft_release(x);
    free(v);
  }
}

int main(void) {
  setenv("GRAFT_DISK_CACHE", "0", 1); /* real compiles */
  RUN(compiled_when_run_again);
  RUN(wait_compiles_builds_graphs_seen_once);
  RUN(many_kernels_compile_in_parallel_objects);
  RUN(off_means_no_compile);
  RUN(unknown_mode_is_said_once);
  RUN(first_tier_matches_reference);
  RUN(first_tier_elementwise_equals_reference);
  RUN(first_tier_reductions_equal_reference);
  RUN(first_tier_copies_equal_reference);
  RUN(first_tier_big_reductions_equal_reference);
  RUN(first_tier_views_equal_reference);
  RUN(heavy_graph_compiles_before_first_run);
  RUN(compiler_supports_decides_what_compiles);
  RUN(queued_steps_wait_for_a_sooner_build);
  RUN(queued_steps_switch_to_native_code);
  RUN(builds_go_on_while_a_reader_holds_the_lock);
  RUN(metrics_do_not_wait_for_a_build);
  RUN(sizes_queued_behind_their_family_build_use_its_kernels);
  RUN(second_size_is_built_when_it_pays);
  RUN(fork_during_build_and_queued_steps);
  RUN(warm_disk_cache_is_native_from_the_first_run);
  RUN(kernels_switch_to_native_as_they_land);
  RUN(failed_library_build_is_not_retried);
  graft_shutdown();
  return CHECK_DONE();
}
