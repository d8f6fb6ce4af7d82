/* Collective benchmarks, run under mpirun by bench/dist_bench.sh.
 *
 *   bench_dist allreduce      graft's all_reduce (sum) of one 64 MB f32 tensor, synced, against
 *                             a bare in-place MPI_Allreduce of the same bytes, same run; medians
 *                             of 7 after 2 warm-ups; prints (rank 0)
 *                             BENCH dist_allreduce_64MB graft_ms= mpi_ms= of_mpi=
 *   bench_dist mlp BATCH      one SGD step of a 784-1024-1024-10 MLP (7.4 MB of f32 gradients)
 *                             on BATCH / world rows per rank, gradients averaged across ranks
 *                             (none in a world of one); prints (rank 0)
 *                             DIST mlp world= step_ms= allreduce_ms=  (medians of 15 steps) */
#define _POSIX_C_SOURCE 200809L
#include "graft.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

static void die(const char *what) {
  fprintf(stderr, "bench_dist: %s: %s\n", what, graft_last_error());
  graft_dist_abort(1);
}

static int bench_allreduce(void) {
  enum { N = 16 << 20, WARM = 2, REPS = 7 };
  float *h = malloc(sizeof(float) * N);
  for (int i = 0; i < N; i++) h[i] = (float)(i % 1000) * 1e-3f;
  int64_t shape[1] = {N};
  graft_tensor *x = graft_from_host(h, GRAFT_F32, 1, shape, 0);
  double tg[REPS], tm[REPS];
  for (int i = 0; i < WARM + REPS; i++) {
    graft_tensor *out;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    if (graft_dist_all_reduce(&x, 1, GRAFT_REDUCE_SUM, &out) || graft_sync(&out, 1)) die("all_reduce");
    if (i >= WARM) tg[i - WARM] = (MPI_Wtime() - t0) * 1e3;
    graft_release(out);
  }
  for (int i = 0; i < WARM + REPS; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, h, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (i >= WARM) tm[i - WARM] = (MPI_Wtime() - t0) * 1e3;
  }
  double g = median(tg, REPS), m = median(tm, REPS);
  if (graft_dist_rank() == 0)
    printf("BENCH dist_allreduce_64MB graft_ms=%.2f mpi_ms=%.2f of_mpi=%.3f\n", g, m, g / m);
  graft_release(x);
  free(h);
  return 0;
}

static uint64_t seed = 1;
static graft_tensor *param(int64_t rows, int64_t cols, float scale) {
  int64_t n = rows * (cols ? cols : 1), shape[2] = {rows, cols};
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    h[i] = scale * ((float)(seed >> 40) / 16777216.0f * 2 - 1);
  }
  graft_tensor *t = graft_from_host(h, GRAFT_F32, cols ? 2 : 1, shape, 0);
  free(h);
  return t;
}

enum { NL = 3 };
static const int64_t dims[NL + 1] = {784, 1024, 1024, 10};

/* Forward, backward (by hand), all_reduce(mean) of the gradients in a world > 1, SGD. */
static void mlp_step(graft_tensor **p, graft_tensor *x, graft_tensor *y1h, int64_t n) {
  graft_tensor *h[NL + 1], *pre[NL], *g[2 * NL], *red[2 * NL];
  int ax0[1] = {0};
  graft_scope_begin();
  h[0] = x;
  for (int l = 0; l < NL; l++) {
    pre[l] = graft_linear(h[l], p[2 * l], p[2 * l + 1]);
    h[l + 1] = l < NL - 1 ? graft_relu(pre[l]) : pre[l];
  }
  graft_tensor *d = graft_div_scalar(graft_sub(graft_softmax(h[NL], 1), y1h), (double)n);
  for (int l = NL - 1; l >= 0; l--) {
    g[2 * l] = graft_matmul(graft_t(d), h[l]);
    g[2 * l + 1] = graft_sum(d, ax0, 1, false);
    if (l) d = graft_where(graft_gt(pre[l - 1], graft_scalar(0, GRAFT_F32)),
                           graft_matmul(d, p[2 * l]), graft_scalar(0, GRAFT_F32));
  }
  if (graft_dist_world_size() > 1) {
    if (graft_dist_all_reduce(g, 2 * NL, GRAFT_REDUCE_MEAN, red)) die("all_reduce");
    memcpy(g, red, sizeof g);
  }
  for (int k = 0; k < 2 * NL; k++) {
    graft_tensor *np = graft_keep(graft_sub(p[k], graft_mul_scalar(g[k], 0.01)));
    graft_release(p[k]);
    p[k] = np;
  }
  graft_scope_end();
}

static int bench_mlp(int64_t batch) {
  enum { WARM = 5, REPS = 15 };
  int64_t n = batch / graft_dist_world_size(), xs[2] = {n, dims[0]}, ys[2] = {n, dims[NL]};
  graft_tensor *p[2 * NL];
  for (int l = 0; l < NL; l++) {
    p[2 * l] = param(dims[l + 1], dims[l], 0.05f);
    p[2 * l + 1] = param(dims[l + 1], 0, 0.05f);
  }
  float *hx = calloc((size_t)(n * dims[0]), sizeof(float)), *hy = calloc((size_t)(n * dims[NL]), sizeof(float));
  for (int64_t i = 0; i < n * dims[0]; i++) hx[i] = (float)((i * 7 + graft_dist_rank()) % 13) / 13.0f;
  for (int64_t i = 0; i < n; i++) hy[i * dims[NL] + i % dims[NL]] = 1;
  graft_tensor *x = graft_from_host(hx, GRAFT_F32, 2, xs, 0), *y = graft_from_host(hy, GRAFT_F32, 2, ys, 0);
  double t[REPS], ar[REPS];
  for (int i = 0; i < WARM + REPS; i++) {
    if (i == 2) graft_wait_compiles(); /* measure the compiled step */
    graft_metrics m0, m1;
    graft_metrics_get(&m0);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    mlp_step(p, x, y, n);
    if (graft_step()) die("step");
    graft_metrics_get(&m1);
    if (i >= WARM) {
      t[i - WARM] = (MPI_Wtime() - t0) * 1e3;
      ar[i - WARM] = m1.collective_ms - m0.collective_ms;
    }
  }
  if (graft_dist_rank() == 0)
    printf("DIST mlp world=%d step_ms=%.2f allreduce_ms=%.2f\n", graft_dist_world_size(),
           median(t, REPS), median(ar, REPS));
  for (int k = 0; k < 2 * NL; k++) graft_release(p[k]);
  graft_release(x), graft_release(y);
  free(hx), free(hy);
  return 0;
}

int main(int argc, char **argv) {
  if (graft_dist_init() != GRAFT_OK || !graft_dist_available()) {
    fprintf(stderr, "bench_dist: %s\n", graft_dist_available() ? graft_last_error()
                                                              : "graft was built without Open MPI");
    return 1;
  }
  int rc = 1;
  if (argc > 1 && !strcmp(argv[1], "allreduce")) rc = bench_allreduce();
  else if (argc > 2 && !strcmp(argv[1], "mlp")) rc = bench_mlp(atoll(argv[2]));
  else fprintf(stderr, "usage: bench_dist allreduce | mlp BATCH\n");
  graft_dist_finalize();
  graft_shutdown();
  return rc;
}
