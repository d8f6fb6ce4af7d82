/* Compiled CPU backend vs eager PyTorch vs the memory roofline, measured in one run:
 *   BENCH <name> graft_ms=<x> eager_ms=<y> speedup=<y/x> roofline_ms=<r> of_roofline=<x/r>
 * Eager figures come from bench/eager_peer.py (run through /usr/bin/python3 with
 * OMP_WAIT_POLICY=PASSIVE; GRAFT_EAGER=0 skips it). Roofline = bytes that must move / copy
 * bandwidth measured here with the same thread count. */
#include "graft.h"
#include "ir.h"
#include "buffer.h"
#include "dtype.h"
#include "program.h"
#include "../src/graph/graph.h"
#include "../src/backends/ref/ref.h"
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

/* ---- graphs ---- */
static ir_node *keepn[1024];
static int nkeep;
static ir_node *K(ir_node *n) { keepn[nkeep++] = n; return n; }
static void release_all(void) { while (nkeep) ir_release(keepn[--nkeep]); }
static ir_node *data(int nd, const int64_t *sh) {
  int64_t n = ir_numel(nd, sh);
  exec_buffer *b = buffer_new((size_t)n * 4, 0, 0, "bench");
  float *f = b->ptr;
  for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 7919 % 10007) / 10007.0 * 4 - 2);
  ir_node *x = ir_make_data(b, GRAFT_F32, nd, sh, 0);
  buffer_release(b);
  return K(x);
}
static ir_node *u1(ir_op op, ir_node *a) { ir_attrs z = {0}; return K(ir_make(op, 1, &a, &z, a->dtype, 0, NULL)); }
static ir_node *b2(ir_op op, ir_node *a, ir_node *b) {
  ir_attrs z = {0};
  ir_node *in[2] = {a, b};
  return K(ir_make(op, 2, in, &z, a->dtype, 0, NULL));
}
static ir_node *cst(ir_node *like, double v) {
  ir_attrs at = {0};
  at.f = v;
  return K(ir_make(IR_CONSTANT, 0, NULL, &at, like->dtype, like->ndim, like->shape));
}
static ir_node *bc(ir_node *a, ir_node *like) {
  ir_attrs z = {0};
  return K(ir_make(IR_BROADCAST, 1, &a, &z, a->dtype, like->ndim, like->shape));
}
static ir_node *red(ir_op op, ir_node *a) {
  ir_attrs at = {0};
  at.a[0] = (int64_t)1 << (a->ndim - 1);
  at.a[1] = 1;
  return K(ir_make(op, 1, &a, &at, a->dtype, 0, NULL));
}

static graph_capture cap;

typedef struct { double run_ms, compile_ms, ref_ms; } result;

/* Compiles root's graph on cpu and times `reps` executions (median). ref_ms: one ref run. */
static result run(ir_node *root, int reps, int with_ref) {
  result r = {0, 0, 0};
  capture_run(&cap, &root, 1);
  exec_program *p = capture_lower(&cap);
  exec_buffer *params[64], *out[4];
  for (int k = 0; k < p->nparams; k++) params[k] = cap.params[k]->data;
  if (with_ref) {
    double t0 = now_ms();
    ref_backend.execute(NULL, p, params, out);
    r.ref_ms = now_ms() - t0;
    buffer_release(out[0]);
  }
  double t0 = now_ms();
  void *exe = cpu_backend.compile(p);
  r.compile_ms = now_ms() - t0;
  if (getenv("GRAFT_BENCH_SRC")) fprintf(stderr, "%s\n", cpu_last_source());
  if (!exe) {
    fprintf(stderr, "compile failed: %s\n", graft_last_error());
    exit(1);
  }
  double ts[64];
  for (int i = 0; i < reps + 1; i++) {
    double t1 = now_ms();
    cpu_backend.execute(exe, p, params, out);
    double t = now_ms() - t1;
    buffer_release(out[0]);
    if (i) ts[i - 1] = t;
  }
  qsort(ts, (size_t)reps, sizeof *ts, cmpd);
  r.run_ms = ts[reps / 2];
  cpu_backend.free_exe(exe);
  program_free(p);
  return r;
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
    FILE *f = popen("OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/eager_peer.py 2>/dev/null", "r");
    char ln[256];
    while (f && fgets(ln, sizeof ln, f) && neager < 16)
      if (sscanf(ln, "EAGER %63s %lf", eager_names[neager], &eager_ms[neager]) == 2) neager++;
    if (f) pclose(f);
  }
  double bw = copy_gbps();
  printf("# copy bandwidth %.1f GB/s, %d threads, eager results %d\n", bw, cpu_pool_threads(), neager);
  {
    int64_t sh[1] = {16 << 20};
    ir_node *x = data(1, sh);
    ir_node *x3 = b2(IR_MUL, b2(IR_MUL, x, x), x);
    ir_node *in = b2(IR_ADD, x, b2(IR_MUL, cst(x, 0.044715), x3));
    ir_node *t = u1(IR_TANH, b2(IR_MUL, cst(x, 0.7978845608028654), in));
    ir_node *y = b2(IR_MUL, b2(IR_MUL, cst(x, 0.5), x), b2(IR_ADD, cst(x, 1.0), t));
    result r = run(y, 9, 0);
    line("gelu_chain_16M", r.run_ms, 2.0 * sh[0] * 4, bw, NULL);
    release_all();
  }
  {
    int64_t sh[2] = {4096, 4096};
    ir_node *x = data(2, sh);
    ir_node *m = red(IR_REDUCE_MAX, x);
    ir_node *e = u1(IR_EXP, b2(IR_SUB, x, bc(m, x)));
    ir_node *s = red(IR_REDUCE_SUM, e);
    ir_node *y = b2(IR_DIV, e, bc(s, x));
    result r = run(y, 9, 0);
    line("softmax_4096x4096", r.run_ms, 2.0 * 4096 * 4096 * 4, bw, NULL);
    release_all();
  }
  {
    int64_t sh[2] = {8192, 1024}, c[1] = {1024};
    ir_node *x = data(2, sh), *g = data(1, c), *b = data(1, c);
    ir_node *s = red(IR_REDUCE_SUM, x);
    ir_node *mu = b2(IR_DIV, s, cst(s, 1024));
    ir_node *xc = b2(IR_SUB, x, bc(mu, x));
    ir_node *v = b2(IR_DIV, red(IR_REDUCE_SUM, b2(IR_MUL, xc, xc)), cst(s, 1024));
    ir_node *rs = u1(IR_RSQRT, b2(IR_ADD, v, cst(v, 1e-5)));
    ir_node *y = b2(IR_ADD, b2(IR_MUL, b2(IR_MUL, xc, bc(rs, x)), bc(g, x)), bc(b, x));
    result r = run(y, 9, 0);
    line("layernorm_8192x1024", r.run_ms, 2.0 * 8192 * 1024 * 4, bw, NULL);
    release_all();
  }
  double mm_ms = 0;
  {
    int64_t sh[2] = {2048, 2048}, bsh[1] = {2048};
    ir_node *A = data(2, sh), *B = data(2, sh);
    ir_node *in[2] = {A, B};
    ir_attrs z = {0};
    ir_node *C = K(ir_make(IR_DOT, 2, in, &z, GRAFT_F32, 0, NULL));
    result r = run(C, 5, 0);
    mm_ms = r.run_ms;
    const cpu_blas_fns *bl = cpu_blas();
    double ts[5];
    float *c = aligned_alloc(64, (size_t)2048 * 2048 * 4);
    for (int i = 0; i < 6; i++) {
      double t0 = now_ms();
      bl->sgemm(101, 111, 111, 2048, 2048, 2048, 1, A->data->ptr, 2048, B->data->ptr, 2048, 0, c, 2048);
      if (i) ts[i - 1] = now_ms() - t0;
    }
    free(c);
    qsort(ts, 5, sizeof *ts, cmpd);
    char ex[128];
    snprintf(ex, sizeof ex, " blas_ms=%.3f of_blas=%.2f gflops=%.1f", ts[2], ts[2] / r.run_ms,
             2.0 * 2048 * 2048 * 2048 / (r.run_ms * 1e6));
    line("matmul_2048", r.run_ms, 3.0 * 2048 * 2048 * 4, bw, ex);
    ir_node *bias = data(1, bsh);
    ir_node *y = b2(IR_MAX, b2(IR_ADD, C, bc(bias, C)), cst(C, 0));
    r = run(y, 5, 0);
    snprintf(ex, sizeof ex, " vs_matmul=%.3f", r.run_ms / mm_ms);
    line("matmul_bias_relu_2048", r.run_ms, 3.0 * 2048 * 2048 * 4, bw, ex);
    release_all();
  }
  {
    int64_t sh[2] = {512, 512};
    ir_node *t = data(2, sh);
    for (int i = 0; i < 33; i++) {
      if (i % 3 == 0) t = u1(IR_TANH, b2(IR_ADD, b2(IR_MUL, t, cst(t, 0.9)), cst(t, 0.1)));
      else if (i % 3 == 1) t = b2(IR_SUB, b2(IR_MUL, t, cst(t, 1.01)), cst(t, 0.02));
      else t = u1(IR_ABS, t);
    }
    setenv("GRAFT_DISK_CACHE", "0", 1); /* a new graph: measure a real compile */
    result r = run(t, 5, 1);
    unsetenv("GRAFT_DISK_CACHE");
    char ex[160];
    snprintf(ex, sizeof ex, " compile_ms=%.1f compiled_run_ms=%.3f ref_first_run_ms=%.3f",
             r.compile_ms, r.run_ms, r.ref_ms);
    /* graft_ms: the first execution with tiered execution = the reference path */
    line("first_run_100_nodes", r.ref_ms, 2.0 * 512 * 512 * 4, bw, ex);
    release_all();
  }
  capture_free(&cap);
  cpu_pool_shutdown();
  return 0;
}
