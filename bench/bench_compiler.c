/* Compiled CPU backend vs eager PyTorch vs the memory roofline, measured in one run:
 *   BENCH <name> graft_ms=<x> eager_ms=<y> speedup=<y/x> roofline_ms=<r> of_roofline=<x/r>
 * graft is measured through the public API (include/graft.h) in the default tiered mode: each
 * step builds the graph with graft_* ops and syncs it, so the figure includes capture, hashing,
 * the cache lookup, buffer binding and the buffer pool; steady state = after the first sync
 * and graft_wait_compiles() (the step then runs compiled code: checked, `compiled=1`).
 * overhead_ms = the per-step sync overhead outside execution (metrics sync_overhead_ms).
 * Eager figures come from bench/eager_peer.py (run through GRAFT_BENCH_PY, default the venv's
 * Python, at PyTorch's defaults; GRAFT_EAGER=0 skips it). Roofline = bytes that must move / copy
 * bandwidth measured here with the same thread count. blas_ms = a direct cblas_sgemm call. */
#include "graft.h"
#include "../src/backends/cpu/cpu.h"
#include "../src/backends/cpu/cpu_internal.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ---- copy bandwidth (2 threads, 256 MB moved per copy) ---- */
typedef struct { float *d; const float *s; size_t n; } cp_arg;
static void *cp_run(void *a) {
  cp_arg *c = a;
  memcpy(c->d, c->s, c->n * sizeof(float));
  return NULL;
}
static double copy_gbps(void) {
  size_t n = (size_t)32 << 20;
  float *s = aligned_alloc(64, n * 4), *d = aligned_alloc(64, n * 4);
  memset(s, 1, n * 4);
  memset(d, 0, n * 4);
  int nt = cpu_pool_threads();
  double best = 0;
  for (int r = 0; r < 7; r++) {
    pthread_t th[64];
    cp_arg args[64];
    double t0 = now_ms();
    for (int t = 0; t < nt; t++) {
      args[t] = (cp_arg){d + n * t / nt, s + n * t / nt, n * (t + 1) / nt - n * t / nt};
      pthread_create(&th[t], NULL, cp_run, &args[t]);
    }
    for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
    double gb = 2.0 * n * 4 / 1e9 / ((now_ms() - t0) / 1e3);
    if (gb > best) best = gb;
  }
  free(s);
  free(d);
  return best;
}

/* ---- graphs, through the public API ---- */
static graft_tensor *input(int nd, const int64_t *sh) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= sh[d];
  float *f = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 7919 % 10007) / 10007.0 * 4 - 2);
  graft_tensor *t = graft_from_host(f, GRAFT_F32, nd, sh, 0);
  free(f);
  if (!t) {
    fprintf(stderr, "graft_from_host: %s\n", graft_last_error());
    exit(1);
  }
  return t;
}

typedef graft_tensor *(*build_fn)(graft_tensor **in, double c);

/* One step: build the graph (inside a scope), sync it, wait for it to run (execution is
 * asynchronous), drop it. Returns the wall time. */
static double step(build_fn f, graft_tensor **in, double c) {
  double t0 = now_ms();
  graft_scope_begin();
  graft_tensor *y = f(in, c);
  graft_status st = y ? graft_sync(&y, 1) : graft_last_status();
  if (st == GRAFT_OK) st = graft_wait(); /* the sync only queued the graph */
  graft_scope_end();
  double t = now_ms() - t0;
  if (st != GRAFT_OK) {
    fprintf(stderr, "step failed: %s\n", graft_last_error());
    exit(1);
  }
  return t;
}

typedef struct { double ms, overhead_ms; int compiled; } result;

/* Steady state: one step (compiles in the background), wait for the compile, one warm-up
 * step, then the median of reps steps. */
static result steady(build_fn f, graft_tensor **in, int reps) {
  step(f, in, 0);
  graft_wait_compiles();
  step(f, in, 0);
  graft_metrics m0, m1;
  graft_metrics_get(&m0);
  double ts[64];
  for (int i = 0; i < reps; i++) ts[i] = step(f, in, 0);
  graft_metrics_get(&m1);
  qsort(ts, (size_t)reps, sizeof *ts, cmpd);
  result r = {ts[reps / 2], (m1.sync_overhead_ms - m0.sync_overhead_ms) / reps,
              m1.compiled_executions - m0.compiled_executions == (uint64_t)reps};
  return r;
}

static graft_tensor *gelu_chain(graft_tensor **in, double c) {
  (void)c;
  graft_tensor *x = in[0];
  graft_tensor *x3 = graft_mul(graft_mul(x, x), x);
  graft_tensor *u = graft_add(x, graft_mul_scalar(x3, 0.044715));
  graft_tensor *t = graft_tanh(graft_mul_scalar(u, 0.7978845608028654));
  return graft_mul(graft_mul_scalar(x, 0.5), graft_add_scalar(t, 1.0));
}
static graft_tensor *softmax(graft_tensor **in, double c) {
  (void)c;
  return graft_softmax(in[0], -1);
}
static graft_tensor *layernorm(graft_tensor **in, double c) {
  (void)c;
  return graft_layer_norm(in[0], in[1], in[2], 1e-5);
}
static graft_tensor *matmul(graft_tensor **in, double c) {
  (void)c;
  return graft_matmul(in[0], in[1]);
}
static graft_tensor *matmul_bias_relu(graft_tensor **in, double c) {
  (void)c;
  return graft_relu(graft_add(graft_matmul(in[0], in[1]), in[2]));
}
/* ROUNDS rounds of ops with their scalar constants: ~100 IR nodes (bench/eager_peer.py runs
 * the same chain). */
#define ROUNDS 21
static graft_tensor *chain100(graft_tensor **in, double c) {
  (void)c;
  graft_tensor *t = in[0];
  for (int i = 0; i < ROUNDS; i++) {
    if (i % 3 == 0) t = graft_tanh(graft_add_scalar(graft_mul_scalar(t, 0.9), 0.1));
    else if (i % 3 == 1) t = graft_add_scalar(graft_mul_scalar(t, 1.01), -0.02);
    else t = graft_abs(t);
  }
  return t;
}

static char eager_names[16][64];
static double eager_ms[16];
static int neager;
static double eager(const char *name) {
  for (int i = 0; i < neager; i++)
    if (!strcmp(eager_names[i], name)) return eager_ms[i];
  return 0;
}

static void line(const char *name, double g, double bytes, double gbps, const char *extra) {
  double e = eager(name), roof = bytes / (gbps * 1e9) * 1e3;
  printf("BENCH %s graft_ms=%.3f eager_ms=%.3f speedup=%.2f roofline_ms=%.3f of_roofline=%.2f%s\n",
         name, g, e, e > 0 ? e / g : 0, roof, g / roof, extra ? extra : "");
  fflush(stdout);
}

int main(void) {
  const char *ge = getenv("GRAFT_EAGER");
  if (!ge || strcmp(ge, "0")) {
    /* The venv's Python (make bench passes it): Debian's python3 has no torch, so the eager
     * figures were missing (its error went to /dev/null). */
    const char *py = getenv("GRAFT_BENCH_PY");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench/eager_peer.py 2>/dev/null", py && *py ? py : ".venv/bin/python");
    FILE *f = popen(cmd, "r");
    char ln[256];
    while (f && fgets(ln, sizeof ln, f) && neager < 16)
      if (sscanf(ln, "EAGER %63s %lf", eager_names[neager], &eager_ms[neager]) == 2) neager++;
    if (f) pclose(f);
  }
  unsetenv("GRAFT_COMPILE"); /* the default: tiered */
  double bw = copy_gbps();
  printf("# copy bandwidth %.1f GB/s, %d threads, eager results %d\n", bw, cpu_pool_threads(), neager);
  char ex[256];
  {
    int64_t sh[1] = {16 << 20};
    graft_tensor *in[1] = {input(1, sh)};
    result r = steady(gelu_chain, in, 9);
    snprintf(ex, sizeof ex, " overhead_ms=%.3f compiled=%d", r.overhead_ms, r.compiled);
    line("gelu_chain_16M", r.ms, 2.0 * sh[0] * 4, bw, ex);
    graft_release(in[0]);
  }
  {
    int64_t sh[2] = {4096, 4096};
    graft_tensor *in[1] = {input(2, sh)};
    result r = steady(softmax, in, 9);
    snprintf(ex, sizeof ex, " overhead_ms=%.3f compiled=%d", r.overhead_ms, r.compiled);
    line("softmax_4096x4096", r.ms, 2.0 * 4096 * 4096 * 4, bw, ex);
    graft_release(in[0]);
  }
  {
    int64_t sh[2] = {8192, 1024}, c[1] = {1024};
    graft_tensor *in[3] = {input(2, sh), input(1, c), input(1, c)};
    result r = steady(layernorm, in, 9);
    snprintf(ex, sizeof ex, " overhead_ms=%.3f compiled=%d", r.overhead_ms, r.compiled);
    line("layernorm_8192x1024", r.ms, 2.0 * 8192 * 1024 * 4, bw, ex);
    for (int k = 0; k < 3; k++) graft_release(in[k]);
  }
  {
    int64_t sh[2] = {2048, 2048}, bsh[1] = {2048};
    graft_tensor *in[3] = {input(2, sh), input(2, sh), input(1, bsh)};
    result r = steady(matmul, in, 5);
    double mm_ms = r.ms;
    /* the same product by a direct cblas_sgemm call */
    const cpu_blas_fns *bl = cpu_blas();
    size_t nb = (size_t)2048 * 2048 * 4;
    float *A = malloc(nb), *B = malloc(nb), *C = aligned_alloc(64, nb);
    if (graft_to_host(in[0], A, nb) || graft_to_host(in[1], B, nb)) {
      fprintf(stderr, "to_host: %s\n", graft_last_error());
      return 1;
    }
    double ts[6], blas = 0;
    if (bl->sgemm) {
      for (int i = 0; i < 6; i++) {
        double t0 = now_ms();
        bl->sgemm(101, 111, 111, 2048, 2048, 2048, 1, A, 2048, B, 2048, 0, C, 2048);
        if (i) ts[i - 1] = now_ms() - t0;
      }
      qsort(ts, 5, sizeof *ts, cmpd);
      blas = ts[2];
    }
    free(A);
    free(B);
    free(C);
    snprintf(ex, sizeof ex, " blas_ms=%.3f of_blas=%.2f gflops=%.1f overhead_ms=%.3f compiled=%d",
             blas, blas / r.ms, 2.0 * 2048 * 2048 * 2048 / (r.ms * 1e6), r.overhead_ms, r.compiled);
    line("matmul_2048", r.ms, 3.0 * 2048 * 2048 * 4, bw, ex);
    r = steady(matmul_bias_relu, in, 5);
    snprintf(ex, sizeof ex, " vs_matmul=%.3f overhead_ms=%.3f compiled=%d", r.ms / mm_ms,
             r.overhead_ms, r.compiled);
    line("matmul_bias_relu_2048", r.ms, 3.0 * 2048 * 2048 * 4, bw, ex);
    for (int k = 0; k < 3; k++) graft_release(in[k]);
  }
  {
    /* The same ~100-node chain on two shapes of equal size: two new graphs. */
    int64_t sh[2] = {512, 512}, sh2[2] = {256, 1024};
    graft_tensor *in[1] = {input(2, sh)}, *in2[1] = {input(2, sh2)};
    setenv("GRAFT_DISK_CACHE", "0", 1); /* a real compile */
    /* Tiered: the first step runs on the reference backend while the graph compiles in the
     * background; then the time until compiled code is ready, and a compiled step. */
    graft_metrics m0, m1, m2;
    graft_metrics_get(&m0);
    graft_empty_cache(); /* both first runs start with no pooled buffers (fresh pages) */
    double t0 = now_ms();
    double first = step(chain100, in, 0);
    graft_wait_compiles();
    double ready = now_ms() - t0;
    graft_metrics_get(&m1);
    double second = step(chain100, in, 0);
    graft_metrics_get(&m2);
    /* The reference path alone on the other new graph (compiles off). */
    setenv("GRAFT_COMPILE", "off", 1);
    graft_empty_cache();
    double ref_ms = step(chain100, in2, 0);
    unsetenv("GRAFT_COMPILE");
    unsetenv("GRAFT_DISK_CACHE");
    snprintf(ex, sizeof ex,
             " compile_ms=%.1f compiled_ready_ms=%.1f compiled_run_ms=%.3f ref_first_run_ms=%.3f "
             "nodes=%llu compiled=%d",
             m1.native_compile_ms - m0.native_compile_ms, ready, second, ref_ms,
             (unsigned long long)m1.last_graph_nodes,
             m2.compiled_executions - m1.compiled_executions == 1);
    line("first_run_100_nodes", first, 2.0 * 512 * 512 * 4, bw, ex);
    graft_release(in[0]);
    graft_release(in2[0]);
  }
  graft_shutdown();
  return 0;
}
