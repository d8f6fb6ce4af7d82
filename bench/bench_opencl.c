/* The compiler benchmarks of bench_compiler.c (same graphs, same shapes) on the OpenCL device
 * against graft's CPU backend (cpu:0), measured in one run:
 *   BENCH opencl_<name> ocl_ms=<o> cpu_ms=<c> vs_cpu_backend=<o/c> up_bytes_per_iter=<u>
 *         down_bytes_per_iter=<d> ...
 * Each device gets its own copy of the inputs, uploaded once before any timing. Both run in the
 * default tiered mode after a first step, graft_wait_compiles() and WARM warm-up iterations.
 * Then ROUNDS rounds, each one block of iterations on either device, in ABBA order (the machine
 * is noisy: neighbouring blocks see the same load). A block builds and syncs the graph `iters`
 * times and ends in graft_wait(), so asynchronous execution hides no work; its time / iters is
 * one sample. ocl_ms and cpu_ms are the medians of the samples; vs_cpu_backend is the median of
 * the rounds' paired ratios (lower is better). up/down_bytes_per_iter: the metrics
 * device_upload_bytes / device_download_bytes over the OpenCL blocks per iteration (0 when the
 * data stays on the device); cpu_bytes_per_iter the same over the CPU blocks (0: cpu:0 has no
 * device memory). compiled = the share of timed executions that ran compiled code.
 * Without an OpenCL device: one line `BENCH opencl skipped: <graft's message>`, exit 0. */
#include "graft.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 6 /* three ABBA pairs */
#define WARM 2

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
static double median(const double *v, int n) {
  double s[ROUNDS];
  for (int i = 0; i < n; i++) s[i] = v[i];
  qsort(s, (size_t)n, sizeof *s, cmpd);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
static void die(const char *what) {
  fprintf(stderr, "bench_opencl: %s: %s\n", what, graft_last_error());
  exit(1);
}

/* ---- the graphs of bench_compiler.c ---- */
typedef graft_tensor *(*build_fn)(graft_tensor **in);

static graft_tensor *gelu_chain(graft_tensor **in) {
  graft_tensor *x = in[0];
  graft_tensor *x3 = graft_mul(graft_mul(x, x), x);
  graft_tensor *u = graft_add(x, graft_mul_scalar(x3, 0.044715));
  graft_tensor *t = graft_tanh(graft_mul_scalar(u, 0.7978845608028654));
  return graft_mul(graft_mul_scalar(x, 0.5), graft_add_scalar(t, 1.0));
}
static graft_tensor *softmax(graft_tensor **in) { return graft_softmax(in[0], -1); }
static graft_tensor *layernorm(graft_tensor **in) {
  return graft_layer_norm(in[0], in[1], in[2], 1e-5);
}
static graft_tensor *matmul(graft_tensor **in) { return graft_matmul(in[0], in[1]); }

typedef struct {
  const char *name;
  build_fn f;
  int nin, ndim[3];
  int64_t shape[3][2];
  int iters; /* per block */
  double target; /* vs_cpu_backend target; 0: a figure only */
} bench_case;

/* ---- one device's side ---- */
typedef struct {
  int dev;
  graft_tensor *in[3];
  double ms[ROUNDS];
  uint64_t up, down, compiled, execs;
} side;

static graft_tensor *input(int nd, const int64_t *sh, int dev) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= sh[d];
  float *f = malloc((size_t)n * sizeof *f);
  if (!f) exit(1);
  for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 7919 % 10007) / 10007.0 * 4 - 2);
  graft_tensor *t = graft_from_host(f, GRAFT_F32, nd, sh, dev);
  free(f);
  if (!t) die("graft_from_host");
  return t;
}

/* iters steps (build, sync, drop), then graft_wait(): the time per step. */
static double block(build_fn f, graft_tensor **in, int iters) {
  double t0 = now_ms();
  for (int i = 0; i < iters; i++) {
    graft_scope_begin();
    graft_tensor *y = f(in);
    graft_status st = y ? graft_sync(&y, 1) : graft_last_status();
    graft_scope_end();
    if (st != GRAFT_OK) die("sync");
  }
  if (graft_wait() != GRAFT_OK) die("graft_wait");
  return (now_ms() - t0) / iters;
}

/* A timed block on one side, its transfers and compiled executions counted. */
static void timed_block(const bench_case *c, side *s, int round) {
  graft_metrics m0, m1;
  graft_metrics_get(&m0);
  s->ms[round] = block(c->f, s->in, c->iters);
  graft_metrics_get(&m1);
  s->up += m1.device_upload_bytes - m0.device_upload_bytes;
  s->down += m1.device_download_bytes - m0.device_download_bytes;
  s->compiled += m1.compiled_executions - m0.compiled_executions;
  s->execs += (uint64_t)c->iters;
}

static void setup(const bench_case *c, side *s) {
  for (int k = 0; k < c->nin; k++) s->in[k] = input(c->ndim[k], c->shape[k], s->dev);
  if (graft_wait() != GRAFT_OK) die("upload");
}

static void warm_up(const bench_case *c, side *a, side *b) {
  block(c->f, a->in, 1);
  block(c->f, b->in, 1);
  graft_wait_compiles();
  block(c->f, a->in, WARM);
  block(c->f, b->in, WARM);
}

static void report(const bench_case *c, const side *o, const side *p) {
  double ratio[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) ratio[r] = o->ms[r] / p->ms[r];
  double n = (double)o->execs;
  printf("BENCH opencl_%s ocl_ms=%.3f cpu_ms=%.3f vs_cpu_backend=%.2f", c->name,
         median(o->ms, ROUNDS), median(p->ms, ROUNDS), median(ratio, ROUNDS));
  if (c->target > 0) printf(" target=%.1f", c->target);
  printf(" up_bytes_per_iter=%.0f down_bytes_per_iter=%.0f cpu_bytes_per_iter=%.0f"
         " compiled=%.2f/%.2f\n",
         o->up / n, o->down / n, (p->up + p->down) / (double)p->execs, o->compiled / n,
         p->compiled / (double)p->execs);
  fflush(stdout);
}

static void run_case(const bench_case *c, int ocl) {
  side o = {.dev = ocl}, p = {.dev = 0};
  setup(c, &o);
  setup(c, &p);
  warm_up(c, &o, &p);
  for (int r = 0; r < ROUNDS; r++) { /* ABBA: o p, p o, o p, ... */
    side *first = r % 2 ? &p : &o, *second = r % 2 ? &o : &p;
    timed_block(c, first, r);
    timed_block(c, second, r);
  }
  report(c, &o, &p);
  for (int k = 0; k < c->nin; k++) {
    graft_release(o.in[k]);
    graft_release(p.in[k]);
  }
}

static const bench_case cases[] = {
    {"gelu_chain_16M", gelu_chain, 1, {1}, {{16 << 20}}, 4, 1.5},
    {"softmax_4096x4096", softmax, 1, {2}, {{4096, 4096}}, 4, 1.5},
    {"layernorm_8192x1024", layernorm, 3, {2, 1, 1}, {{8192, 1024}, {1024}, {1024}}, 4, 1.5},
    {"matmul_2048", matmul, 2, {2, 2}, {{2048, 2048}, {2048, 2048}}, 2, 0},
};

int main(void) {
  unsetenv("GRAFT_COMPILE"); /* the default: tiered */
  int ocl = graft_device_find("opencl", 0);
  if (ocl < 0) {
    printf("BENCH opencl skipped: %s\n", graft_last_error());
    return 0;
  }
  printf("# opencl device %d (%s: %s) vs cpu:0 (%s); %d rounds ABBA, %d warm-up steps\n", ocl,
         graft_device_kind(ocl), graft_device_name(ocl), graft_device_name(0), ROUNDS, WARM);
  fflush(stdout);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i], ocl);
  graft_shutdown();
  return 0;
}
