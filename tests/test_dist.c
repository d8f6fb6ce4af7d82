/* Collectives (src/dist, src/api/collective.c).
 *
 *   test_dist                      world of one: API errors, shapes, the identity, passes
 *   mpirun -np 2 test_dist parity mlp|cnn
 *        data-parallel training (half the batch per rank, gradients and loss all-reduced in the
 *        step's one graph) against the same model trained on the whole batch in one process
 *        (rank 0 trains it first, without collectives): losses and parameters per step within
 *        1e-5 relative over 20 steps; the step is one cached graph with one MPI call per step
 *   mpirun -np 2 test_dist mismatch   rank 1 reduces another shape: both ranks get the error
 *   mpirun -np 2 test_dist dtypes     every dtype, reductions, broadcast and all_gather
 *   mpirun -np 2 test_dist stall      rank 1 stops answering: rank 0 fails naming it
 *   mpirun -np 2 test_dist kill       rank 1 is killed mid-training (tests/check_dist.sh checks
 *                                     the job ends in bounded time, naming the rank)
 *   mpirun -np 2 test_dist flood      16 MB all-reduces until stopped; tests/check_dist.sh stops
 *                                     rank 1 (SIGSTOP) at a random point, in either phase of a
 *                                     collective: the job must still end in bounded time
 *   mpirun -np 2 test_dist train      data-parallel MLP steps for up to 60 s, each rank's pid
 *                                     and host printed first: tests/check_dist_hosts.sh cuts the
 *                                     network between two hosts or kills a rank meanwhile
 *   mpirun -np 2 test_dist speed      all_reduce timings (4 B and 16 MB), printed by rank 0 */
#include "check.h"
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define STEPS 20
#define NDATA 256
#define BATCH 32 /* global batch: each of W ranks takes BATCH / W rows */
#define NIN 64   /* 8x8 images */
#define NCLS 10
#define LR 0.1

/* ---------------------------------------------------------------- world of one */

static graft_tensor *filled(graft_dtype dt, int nd, const int64_t *shape, double base) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  double *h = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = base + (double)i;
  graft_tensor *d = graft_from_host(h, GRAFT_F64, nd, shape, 0);
  graft_tensor *t = graft_convert(d, dt);
  graft_release(d);
  free(h);
  return t;
}

TEST(bad_timeout_is_refused) {
  setenv("GRAFT_DIST_TIMEOUT", "soon", 1);
  CHECK(graft_dist_init() == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "GRAFT_DIST_TIMEOUT=\"soon\" is not a number") != NULL);
  setenv("GRAFT_DIST_TIMEOUT", "-1", 1);
  CHECK(graft_dist_init() == GRAFT_ERR_ARG);
  unsetenv("GRAFT_DIST_TIMEOUT");
}

TEST(identity_in_a_world_of_one) {
  CHECK(graft_dist_init() == GRAFT_OK);
  CHECK(graft_dist_rank() == 0 && graft_dist_world_size() == 1);
  int64_t s1[2] = {2, 3}, s2[1] = {4}, s3[1] = {5};
  graft_tensor *in[3] = {filled(GRAFT_F32, 2, s1, 1), filled(GRAFT_I64, 1, s2, 10),
                         filled(GRAFT_F32, 1, s3, 100)}, *out[3];
  CHECK(graft_dist_all_reduce(in, 3, GRAFT_REDUCE_MAX, out) == GRAFT_OK);
  int64_t sh[GRAFT_MAX_DIMS];
  CHECK(graft_shape(out[0], sh) == 2 && sh[1] == 3 && graft_get_dtype(out[1]) == GRAFT_I64);
  float a[6], c[5];
  int64_t b[4];
  CHECK(graft_to_host(out[0], a, sizeof a) == GRAFT_OK);
  CHECK(graft_to_host(out[1], b, sizeof b) == GRAFT_OK);
  CHECK(graft_to_host(out[2], c, sizeof c) == GRAFT_OK);
  CHECK(a[5] == 6 && b[3] == 13 && c[0] == 100 && c[4] == 104);
  graft_tensor *g[1];
  CHECK(graft_dist_all_gather(in, 1, g) == GRAFT_OK);
  CHECK(graft_shape(g[0], sh) == 3 && sh[0] == 1 && sh[1] == 2 && sh[2] == 3);
  for (int i = 0; i < 3; i++) graft_release(in[i]), graft_release(out[i]);
  graft_release(g[0]);
}

TEST(bad_input_is_a_clear_error) {
  int64_t s[1] = {4};
  graft_tensor *f = filled(GRAFT_F32, 1, s, 0), *i = filled(GRAFT_I32, 1, s, 0);
  graft_tensor *h = graft_convert(f, GRAFT_F16), *out[2] = {f, f};
  CHECK(graft_dist_all_reduce(&i, 1, GRAFT_REDUCE_MEAN, out) == GRAFT_ERR_DTYPE);
  CHECK(strstr(graft_last_error(), "graft_dist_all_reduce: mean of i32") != NULL);
  CHECK(out[0] == NULL); /* outputs are cleared on error */
  CHECK(graft_dist_all_reduce(&h, 1, GRAFT_REDUCE_SUM, out) == GRAFT_OK); /* f16 is fine */
  graft_release(out[0]);
  graft_tensor *b = graft_convert(f, GRAFT_BOOL);
  CHECK(graft_dist_all_reduce(&b, 1, GRAFT_REDUCE_SUM, out) == GRAFT_ERR_DTYPE);
  CHECK(strstr(graft_last_error(), "sum of bool (use max or min)") != NULL);
  graft_release(b);
  CHECK(graft_dist_all_reduce(&f, 1, (graft_reduce_op)9, out) == GRAFT_ERR_ARG);
  CHECK(graft_dist_all_reduce(&f, 0, GRAFT_REDUCE_SUM, out) == GRAFT_ERR_ARG);
  CHECK(graft_dist_all_reduce(NULL, 1, GRAFT_REDUCE_SUM, out) == GRAFT_ERR_ARG);
  CHECK(graft_dist_broadcast(&f, 1, 1, out) == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "root 1 is not a rank") != NULL);
  graft_tensor *dead = graft_add(f, f);
  graft_release(dead);
  CHECK(graft_dist_all_reduce(&dead, 1, GRAFT_REDUCE_SUM, out) == GRAFT_ERR_RELEASED);
  graft_release(f), graft_release(i), graft_release(h);
}

/* Two reductions of the same tensor in one graph stay two (passes never merge collectives),
 * a collective's operands of two dtypes make two, a constant's is not folded away, and all of
 * it is one graph. */
TEST(collectives_are_never_merged) {
  int64_t s[1] = {8};
  graft_tensor *f = filled(GRAFT_F32, 1, s, 1), *l = filled(GRAFT_I64, 1, s, 1);
  graft_step();
  graft_metrics_reset();
  graft_tensor *x = graft_mul_scalar(f, 2), *in[3] = {x, l, x}, *o1[3], *o2[1];
  CHECK(graft_dist_all_reduce(in, 3, GRAFT_REDUCE_SUM, o1) == GRAFT_OK);
  CHECK(graft_dist_all_reduce(&x, 1, GRAFT_REDUCE_SUM, o2) == GRAFT_OK);
  /* nor folded: a collective of a constant still runs (another process may hold another) */
  int64_t one[1] = {1};
  graft_tensor *c = graft_full(7, GRAFT_F32, 1, one), *oc[1];
  CHECK(graft_dist_all_reduce(&c, 1, GRAFT_REDUCE_SUM, oc) == GRAFT_OK);
  graft_tensor *y = graft_add(o1[0], o2[0]);
  CHECK(graft_step() == GRAFT_OK);
  graft_metrics m;
  graft_metrics_get(&m);
  CHECK(m.executions == 1);
  CHECK(m.collectives == 4); /* f32 and i64 of the first call, f32 of the second, the constant */
  CHECK(m.collective_bytes == (8 + 8) * 4 + 8 * 8 + 8 * 4 + 4);
  graft_release(c), graft_release(oc[0]);
  float v[8];
  CHECK(graft_to_host(y, v, sizeof v) == GRAFT_OK && v[7] == 32);
  graft_release(y), graft_release(x), graft_release(f), graft_release(l), graft_release(o2[0]);
  for (int k = 0; k < 3; k++) graft_release(o1[k]);
}

/* Reading one output of a collective runs the whole pending step: the collective runs once,
 * and the other outputs are data afterwards (never a second run in a later graph). */
TEST(a_read_runs_the_collective_once) {
  int64_t s[1] = {4};
  graft_tensor *a = filled(GRAFT_F32, 1, s, 1), *b = filled(GRAFT_F32, 1, s, 5), *in[2] = {a, b}, *o[2];
  graft_step();
  graft_metrics_reset();
  CHECK(graft_dist_all_reduce(in, 2, GRAFT_REDUCE_SUM, o) == GRAFT_OK);
  graft_tensor *other = graft_mul_scalar(a, 3); /* unrelated pending work joins the step */
  float v[4];
  CHECK(graft_to_host(o[0], v, sizeof v) == GRAFT_OK && v[3] == 4);
  CHECK(!graft_is_pending(o[1]) && !graft_is_pending(other));
  CHECK(graft_to_host(o[1], v, sizeof v) == GRAFT_OK && v[0] == 5);
  graft_metrics m;
  graft_metrics_get(&m);
  CHECK(m.collectives == 1 && m.executions == 1);
  graft_release(a), graft_release(b), graft_release(o[0]), graft_release(o[1]), graft_release(other);
}

/* ---------------------------------------------------------------- training */

typedef struct {
  int np;
  graft_tensor *p[4];
} dist_model;

static uint64_t lcg = 42;
static float urand(void) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)(lcg >> 40) / 16777216.0f * 2 - 1;
}

static graft_tensor *param(int nd, const int64_t *shape, float scale) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = scale * urand();
  graft_tensor *t = graft_from_host(h, GRAFT_F32, nd, shape, 0);
  free(h);
  return t;
}

static void model_init(dist_model *m, bool cnn) {
  lcg = 42; /* the same initial weights on every rank and for the reference */
  if (cnn) { /* conv 1->8 3x3 pad 1, relu, maxpool 2, linear 128->10 */
    int64_t w[4] = {8, 1, 3, 3}, b[1] = {8}, fw[2] = {NCLS, 128}, fb[1] = {NCLS};
    m->p[0] = param(4, w, 0.3f), m->p[1] = param(1, b, 0.1f);
    m->p[2] = param(2, fw, 0.09f), m->p[3] = param(1, fb, 0.05f);
  } else { /* linear 64->32, relu, linear 32->10 */
    int64_t w1[2] = {32, NIN}, b1[1] = {32}, w2[2] = {NCLS, 32}, b2[1] = {NCLS};
    m->p[0] = param(2, w1, 0.125f), m->p[1] = param(1, b1, 0.1f);
    m->p[2] = param(2, w2, 0.18f), m->p[3] = param(1, b2, 0.05f);
  }
  m->np = 4;
}

/* Mean cross-entropy of logits against one-hot rows, and d(loss)/d(logits). */
static graft_tensor *ce_loss(graft_tensor *logits, graft_tensor *y1h, int64_t n, graft_tensor **dl) {
  int ax[2] = {0, 1};
  graft_tensor *lsm = graft_log_softmax(logits, 1);
  graft_tensor *loss = graft_mul_scalar(graft_sum(graft_mul(lsm, y1h), ax, 2, false), -1.0 / n);
  *dl = graft_div_scalar(graft_sub(graft_softmax(logits, 1), y1h), (double)n);
  return loss;
}

/* Linear layer backward: dW = dy^T x, db = sum(dy, 0), dx = dy W. */
static void linear_back(graft_tensor *x, graft_tensor *w, graft_tensor *dy, graft_tensor **dw,
                        graft_tensor **db, graft_tensor **dx) {
  int ax0[1] = {0};
  *dw = graft_matmul(graft_t(dy), x);
  *db = graft_sum(dy, ax0, 1, false);
  if (dx) *dx = graft_matmul(dy, w);
}

static graft_tensor *mlp_grads(dist_model *m, graft_tensor *x, graft_tensor *y, int64_t n,
                               graft_tensor **g) {
  graft_tensor *pre = graft_linear(x, m->p[0], m->p[1]), *h = graft_relu(pre);
  graft_tensor *dl, *loss = ce_loss(graft_linear(h, m->p[2], m->p[3]), y, n, &dl), *dh;
  linear_back(h, m->p[2], dl, &g[2], &g[3], &dh);
  graft_tensor *dpre = graft_where(graft_gt(pre, graft_scalar(0, GRAFT_F32)), dh,
                                   graft_scalar(0, GRAFT_F32));
  linear_back(x, m->p[0], dpre, &g[0], &g[1], NULL);
  return loss;
}

static graft_tensor *cnn_grads(dist_model *m, graft_tensor *x, graft_tensor *y, int64_t n,
                               graft_tensor **g) {
  int one[2] = {1, 1}, pad[2] = {1, 1}, k2[2] = {2, 2}, z[2] = {0, 0}, ax[3] = {0, 2, 3};
  int64_t img[4] = {n, 1, 8, 8}, flat[2] = {n, 128}, fm[4] = {n, 8, 4, 4}, ws[4] = {8, 1, 3, 3},
          bs[4] = {1, 8, 1, 1};
  graft_tensor *xi = graft_reshape(x, 4, img);
  graft_tensor *pre = graft_add(graft_conv2d(xi, m->p[0], one, pad, one, 1),
                                graft_reshape(m->p[1], 4, bs));
  graft_tensor *r = graft_relu(pre), *pool = graft_max_pool2d(r, k2, k2, z);
  graft_tensor *f = graft_reshape(pool, 2, flat), *dl, *df;
  graft_tensor *loss = ce_loss(graft_linear(f, m->p[2], m->p[3]), y, n, &dl);
  linear_back(f, m->p[2], dl, &g[2], &g[3], &df);
  graft_tensor *dr = graft_max_pool2d_backward(r, graft_reshape(df, 4, fm), k2, k2, z);
  graft_tensor *dpre = graft_where(graft_gt(pre, graft_scalar(0, GRAFT_F32)), dr,
                                   graft_scalar(0, GRAFT_F32));
  g[0] = graft_conv2d_backward_weight(xi, dpre, ws, one, pad, one, 1);
  g[1] = graft_sum(dpre, ax, 3, false);
  return loss;
}

/* A synthetic digits-like set: 8x8 inputs, labels from a fixed random teacher. */
static float data_x[NDATA][NIN], data_y[NDATA][NCLS];
static void make_data(void) {
  lcg = 7;
  float teacher[NCLS][NIN];
  for (int c = 0; c < NCLS; c++)
    for (int k = 0; k < NIN; k++) teacher[c][k] = urand();
  for (int i = 0; i < NDATA; i++) {
    int best = 0;
    float bv = -1e30f;
    for (int k = 0; k < NIN; k++) data_x[i][k] = urand();
    for (int c = 0; c < NCLS; c++) {
      float s = 0;
      for (int k = 0; k < NIN; k++) s += teacher[c][k] * data_x[i][k];
      if (s > bv) bv = s, best = c;
    }
    memset(data_y[i], 0, sizeof data_y[i]);
    data_y[i][best] = 1;
  }
}

typedef struct {
  float loss[STEPS];
  float *params[STEPS][4]; /* host copies after each step */
  int64_t numel[4];
  uint64_t graphs_after[STEPS], collectives_after[STEPS];
  int status;
  char err[1024];
} dist_run;

/* One SGD step: loss and gradients, all-reduced (mean) in one call when dp, the update; then
 * one graft_step for all of it. Returns the new loss tensor; m's parameters are replaced. */
static graft_tensor *train_step(dist_model *m, bool cnn, bool dp, graft_tensor *x, graft_tensor *y,
                                int64_t n) {
  graft_tensor *g[4], *red[5], *next[4], *loss;
  graft_scope_begin();
  loss = (cnn ? cnn_grads : mlp_grads)(m, x, y, n, g);
  graft_tensor *all[5] = {loss, g[0], g[1], g[2], g[3]};
  if (dp && graft_dist_all_reduce(all, 5, GRAFT_REDUCE_MEAN, red) == GRAFT_OK)
    for (int k = 0; k < 5; k++) all[k] = red[k]; /* the scope frees them */
  for (int k = 0; k < 4; k++)
    next[k] = graft_keep(graft_sub(m->p[k], graft_mul_scalar(all[k + 1], LR)));
  loss = graft_keep(all[0]);
  graft_scope_end();
  for (int k = 0; k < 4; k++) graft_release(m->p[k]), m->p[k] = next[k];
  return loss;
}


/* 20 steps; rank r of W takes rows [r*B/W, (r+1)*B/W) of each global batch (dp), or all. */
static void train(bool cnn, bool dp, dist_run *out, int stall_at, int kill_at) {
  int w = dp ? graft_dist_world_size() : 1, r = dp ? graft_dist_rank() : 0;
  int64_t n = BATCH / w;
  dist_model m;
  model_init(&m, cnn);
  for (int s = 0; s < STEPS && !out->status; s++) {
    if (s == stall_at) sleep(600);   /* alive but gone: the others must time out */
    if (s == kill_at) raise(SIGKILL); /* dead: the launcher must end the job */
    int64_t first = (s * BATCH) % NDATA + r * n, ys[2] = {n, NCLS};
    int64_t xs[2] = {n, NIN};
    graft_tensor *x = graft_from_host(data_x + first, GRAFT_F32, 2, xs, 0);
    graft_tensor *y = graft_from_host(data_y + first, GRAFT_F32, 2, ys, 0);
    graft_tensor *loss = train_step(&m, cnn, dp, x, y, n);
    if (graft_step() != GRAFT_OK || graft_to_host(loss, &out->loss[s], sizeof(float))) {
      out->status = graft_last_status();
      snprintf(out->err, sizeof out->err, "%s", graft_last_error());
    }
    for (int k = 0; k < 4 && !out->status; k++) {
      out->numel[k] = graft_numel(m.p[k]);
      out->params[s][k] = malloc(sizeof(float) * (size_t)out->numel[k]);
      graft_to_host(m.p[k], out->params[s][k], sizeof(float) * (size_t)out->numel[k]);
    }
    graft_metrics mt;
    graft_metrics_get(&mt);
    out->graphs_after[s] = mt.graphs_compiled;
    out->collectives_after[s] = mt.collectives;
    graft_release(x), graft_release(y), graft_release(loss);
  }
  for (int k = 0; k < 4; k++) graft_release(m.p[k]);
}

static void run_free(dist_run *r) {
  for (int s = 0; s < STEPS; s++)
    for (int k = 0; k < 4; k++) free(r->params[s][k]);
}

/* max |a - b| / max |b| over a tensor: relative to the tensor's scale, as elements near 0 have
 * no meaningful relative error of their own. */
static double rel_err(const float *a, const float *b, int64_t n) {
  double d = 0, s = 1e-30;
  for (int64_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    s = fmax(s, fabs((double)b[i]));
  }
  return d / s;
}

static const char *host_name(void) {
  static char host[256];
  if (!host[0] && gethostname(host, sizeof host - 1)) snprintf(host, sizeof host, "?");
  return host;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int parity(bool cnn) {
  static dist_run ref, dp;
  int rank = graft_dist_rank(), fails = 0;
  train(cnn, false, &ref, -1, -1); /* the whole batch in this process, no collectives */
  graft_metrics_reset();
  train(cnn, true, &dp, -1, -1);
  if (ref.status || dp.status) {
    fprintf(stderr, "rank %d: training failed: %s%s\n", rank, ref.err, dp.err);
    return 1;
  }
  double worst = 0;
  for (int s = 0; s < STEPS; s++) {
    double e = fabs(dp.loss[s] - ref.loss[s]) / fabs(ref.loss[s]);
    for (int k = 0; k < 4; k++) e = fmax(e, rel_err(dp.params[s][k], ref.params[s][k], ref.numel[k]));
    worst = fmax(worst, e);
    if (e > 1e-5) {
      fprintf(stderr, "rank %d step %d: loss %.9g vs %.9g whole-batch: rel err %.3g > 1e-5\n",
              rank, s, dp.loss[s], ref.loss[s], e);
      fails++;
    }
  }
  /* One graph, compiled by step 3 at the latest; then one MPI call per step (f32 only). */
  if (dp.graphs_after[STEPS - 1] != dp.graphs_after[2]) {
    fprintf(stderr, "rank %d: graphs compiled after step 3: %llu -> %llu (want none)\n", rank,
            (unsigned long long)dp.graphs_after[2], (unsigned long long)dp.graphs_after[STEPS - 1]);
    fails++;
  }
  for (int s = 1; s < STEPS; s++)
    if (dp.collectives_after[s] - dp.collectives_after[s - 1] != 1) {
      fprintf(stderr, "rank %d step %d: %llu MPI collectives (want 1)\n", rank, s,
              (unsigned long long)(dp.collectives_after[s] - dp.collectives_after[s - 1]));
      fails++;
    }
  if (ref.loss[STEPS - 1] >= ref.loss[0]) {
    fprintf(stderr, "rank %d: loss did not fall (%g -> %g)\n", rank, ref.loss[0], ref.loss[STEPS - 1]);
    fails++;
  }
  printf("rank %d/%d on %s parity %s: loss %.4f -> %.4f, worst rel err %.2g, %llu graphs, "
         "%llu collectives\n", rank, graft_dist_world_size(), host_name(),
         cnn ? "cnn" : "mlp", dp.loss[0], dp.loss[STEPS - 1], worst,
         (unsigned long long)dp.graphs_after[STEPS - 1],
         (unsigned long long)dp.collectives_after[STEPS - 1]);
  run_free(&ref);
  run_free(&dp);
  return fails != 0;
}

/* Rank 1 reduces a [5] where rank 0 reduces a [4]: both must fail, naming both sides, and
 * the job must stay usable (the check ran before any data moved). */
static int mismatch(void) {
  int rank = graft_dist_rank(), bad = 0;
  int64_t s[1] = {rank == 1 ? 5 : 4}, s4[1] = {4};
  graft_tensor *t = filled(GRAFT_F32, 1, s, 1), *o[1];
  graft_status st = graft_dist_all_reduce(&t, 1, GRAFT_REDUCE_SUM, o);
  if (!st) st = graft_step();
  if (st != GRAFT_ERR_DIST || !strstr(graft_last_error(), "ranks disagree")) {
    fprintf(stderr, "rank %d: want a disagreement error, got status %d: %s\n", rank, (int)st,
            graft_last_error());
    bad = 1;
  } else {
    printf("rank %d: expected error: %s\n", rank, graft_last_error());
  }
  graft_release(o[0]), graft_release(t);
  t = filled(GRAFT_F32, 1, s4, rank);
  float v[4] = {0};
  if (graft_dist_all_reduce(&t, 1, GRAFT_REDUCE_SUM, o) || graft_to_host(o[0], v, sizeof v) ||
      v[3] != 7) { /* (0+3) + (1+3) */
    fprintf(stderr, "rank %d: collective after the error: %g (%s)\n", rank, v[3], graft_last_error());
    bad = 1;
  }
  graft_release(o[0]), graft_release(t);
  return bad;
}

/* Element i of t as a double (a sync). */
static double val(graft_tensor *t, int64_t i) {
  graft_tensor *d = graft_convert(t, GRAFT_F64);
  int64_t n = graft_numel(d);
  double *h = calloc((size_t)(n > 0 ? n : 1), sizeof(double)), v = NAN;
  if (d && graft_to_host(d, h, sizeof(double) * (size_t)n) == GRAFT_OK && i < n) v = h[i];
  free(h);
  graft_release(d);
  return v;
}

/* Every dtype through MPI on 2 ranks (f16/bf16 through graft's own MPI ops), several per
 * call, and broadcast and all_gather. Rank r holds values made from r. */
static int dtypes(void) {
  int r = graft_dist_rank();
  int64_t s3[1] = {3}, s2[2] = {2, 1};
  graft_tensor *f32 = filled(GRAFT_F32, 1, s3, r + 1), *f16 = filled(GRAFT_F16, 1, s3, r + 0.5);
  graft_tensor *bf = filled(GRAFT_BF16, 2, s2, 2 * r), *i64 = filled(GRAFT_I64, 1, s3, 10 * r);
  graft_tensor *bl = graft_convert(filled(GRAFT_I32, 1, s3, r - 1), GRAFT_BOOL); /* r=0: 1,0,1 */
  graft_tensor *sum_in[3] = {f32, f16, i64}, *sum[3], *mx[2], *mn[1], *mean[1], *bc[2], *ga[2];
  graft_tensor *mx_in[2] = {bf, bl}, *bc_in[2] = {i64, f32}, *ga_in[2] = {f16, bf};
  int bad = graft_dist_all_reduce(sum_in, 3, GRAFT_REDUCE_SUM, sum) ||
            graft_dist_all_reduce(mx_in, 2, GRAFT_REDUCE_MAX, mx) ||
            graft_dist_all_reduce(&bl, 1, GRAFT_REDUCE_MIN, mn) ||
            graft_dist_all_reduce(&f16, 1, GRAFT_REDUCE_MEAN, mean) ||
            graft_dist_broadcast(bc_in, 2, 1, bc) || graft_dist_all_gather(ga_in, 2, ga);
  if (bad) {
    fprintf(stderr, "rank %d: dtypes: %s\n", r, graft_last_error());
    return 1;
  }
  struct { const char *what; double got, want; } c[] = {
    {"f32 sum", val(sum[0], 2), 1 + 2 + 2 + 2},      {"f16 sum", val(sum[1], 1), 1.5 + 2.5},
    {"i64 sum", val(sum[2], 2), 2 + 12},             {"bf16 max", val(mx[0], 1), 3},
    {"bool max", val(mx[1], 1), 1},                  {"bool min", val(mn[0], 0), 0},
    {"f16 mean", val(mean[0], 0), 1},                {"i64 broadcast", val(bc[0], 0), 10},
    {"f32 broadcast", val(bc[1], 2), 4},             {"f16 gather [1,2]", val(ga[0], 5), 3.5},
    {"bf16 gather shape", (double)graft_dim(ga[1], 0) * 10 + graft_ndim(ga[1]), 23},
    {"bf16 gather [1,1,0]", val(ga[1], 3), 3}};
  for (size_t k = 0; k < sizeof c / sizeof c[0]; k++)
    if (c[k].got != c[k].want) {
      fprintf(stderr, "rank %d: %s = %g, want %g\n", r, c[k].what, c[k].got, c[k].want);
      bad = 1;
    }
  graft_metrics m;
  graft_metrics_get(&m);
  if (!bad) printf("rank %d: dtypes ok (%llu collectives)\n", r, (unsigned long long)m.collectives);
  return bad;
}

/* Fault runs: the surviving rank reports its error and ends the job (graft_dist_finalize
 * aborts after a failed collective). */
static int fault(bool stall) {
  static dist_run r;
  int rank = graft_dist_rank();
  train(false, true, &r, stall && rank == 1 ? 5 : -1, !stall && rank == 1 ? 5 : -1);
  if (r.status) fprintf(stderr, "rank %d: training failed (status %d): %s\n", rank, r.status, r.err);
  run_free(&r);
  return r.status ? 3 : 0;
}

/* Prints this rank's pid for the script, then all-reduces 16 MB until an error. */
static int flood(void) {
  int64_t n = 4 << 20;
  float *h = calloc((size_t)n, sizeof(float));
  graft_tensor *x = graft_from_host(h, GRAFT_F32, 1, &n, 0);
  printf("rank %d pid %d\n", graft_dist_rank(), (int)getpid());
  fflush(stdout);
  int rc = 0;
  for (int i = 0; i < 100000 && !rc; i++) {
    graft_tensor *o = NULL;
    rc = graft_dist_all_reduce(&x, 1, GRAFT_REDUCE_SUM, &o) || graft_sync(&o, 1);
    graft_release(o);
  }
  if (rc) fprintf(stderr, "rank %d: flood failed: %s\n", graft_dist_rank(), graft_last_error());
  graft_release(x);
  free(h);
  return rc ? 3 : 0;
}

/* Prints this rank's pid and host for the script, then trains until a step fails or 60 s
 * pass. Every 50 steps the ranks agree (all_reduce max) on whether time is up, so all of them
 * run the same collectives. */
static int train_until_stopped(void) {
  int rank = graft_dist_rank(), w = graft_dist_world_size(), s = 0, rc = 0;
  printf("rank %d pid %d on %s\n", rank, (int)getpid(), host_name());
  fflush(stdout);
  int64_t n = BATCH / w, xs[2] = {n, NIN}, ys[2] = {n, NCLS}, one[1] = {1};
  dist_model m;
  model_init(&m, false);
  double end = now_s() + 150; /* past check_dist_hosts.sh's wait for this rank's first line */
  for (bool done = false; !done && !rc; s++) {
    int64_t first = (s * BATCH) % NDATA + rank * n;
    graft_tensor *x = graft_from_host(data_x + first, GRAFT_F32, 2, xs, 0);
    graft_tensor *y = graft_from_host(data_y + first, GRAFT_F32, 2, ys, 0);
    graft_tensor *loss = train_step(&m, false, true, x, y, n);
    float l = 0;
    rc = graft_step() || graft_to_host(loss, &l, sizeof l);
    graft_release(x), graft_release(y), graft_release(loss);
    if (!rc && s % 50 == 49) {
      graft_tensor *late = graft_full(now_s() > end, GRAFT_F32, 1, one), *any = NULL;
      rc = graft_dist_all_reduce(&late, 1, GRAFT_REDUCE_MAX, &any) ||
           graft_to_host(any, &l, sizeof l);
      done = l > 0;
      graft_release(late), graft_release(any);
    }
  }
  if (rc)
    fprintf(stderr, "rank %d on %s: training failed at step %d: %s\n", rank, host_name(), s,
            graft_last_error());
  else
    printf("rank %d: %d steps, never stopped\n", rank, s);
  for (int k = 0; k < 4; k++) graft_release(m.p[k]);
  return rc ? 3 : 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median time of graft's all_reduce(sum), synced, of 4 B (latency) and 16 MB (bandwidth). */
static int speed(void) {
  enum { REPS = 41 };
  const int64_t sizes[2] = {1, 4 << 20};
  const int reps[2] = {REPS, 11};
  for (int k = 0; k < 2; k++) {
    int64_t n = sizes[k];
    float *h = calloc((size_t)n, sizeof(float));
    graft_tensor *x = graft_from_host(h, GRAFT_F32, 1, &n, 0); /* data: only the collective runs */
    free(h);
    double t[REPS];
    int rc = 0;
    for (int i = -2; i < reps[k] && !rc; i++) { /* two warm-ups */
      graft_tensor *o = NULL;
      double t0 = now_s();
      rc = graft_dist_all_reduce(&x, 1, GRAFT_REDUCE_SUM, &o) || graft_sync(&o, 1);
      if (i >= 0) t[i] = now_s() - t0;
      graft_release(o);
    }
    graft_release(x);
    if (rc) {
      fprintf(stderr, "rank %d: speed: %s\n", graft_dist_rank(), graft_last_error());
      return 3;
    }
    qsort(t, (size_t)reps[k], sizeof t[0], cmp_double);
    double med = t[reps[k] / 2], mb = (double)n * 4 / 1e6;
    if (graft_dist_rank() == 0 && n == 1)
      printf("speed: all_reduce(sum) of 4 B over %d ranks: %.3f ms (median of %d)\n",
             graft_dist_world_size(), med * 1e3, reps[k]);
    else if (graft_dist_rank() == 0)
      printf("speed: all_reduce(sum) of %.1f MB over %d ranks: %.1f ms, %.0f MB/s (median of %d)\n",
             mb, graft_dist_world_size(), med * 1e3, mb / med, reps[k]);
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  make_data();
  if (!*mode) {
    RUN(bad_timeout_is_refused);
    RUN(identity_in_a_world_of_one);
    RUN(bad_input_is_a_clear_error);
    RUN(collectives_are_never_merged);
    RUN(a_read_runs_the_collective_once);
    graft_dist_finalize();
    graft_shutdown();
    return CHECK_DONE();
  }
  if (graft_dist_init() != GRAFT_OK) {
    fprintf(stderr, "graft_dist_init: %s\n", graft_last_error());
    return 2;
  }
  int rc = 2;
  if (!strcmp(mode, "parity")) rc = parity(argc > 2 && !strcmp(argv[2], "cnn"));
  else if (!strcmp(mode, "mismatch")) rc = mismatch();
  else if (!strcmp(mode, "stall")) rc = fault(true);
  else if (!strcmp(mode, "kill")) rc = fault(false);
  else if (!strcmp(mode, "flood")) rc = flood();
  else if (!strcmp(mode, "dtypes")) rc = dtypes();
  else if (!strcmp(mode, "train")) rc = train_until_stopped();
  else if (!strcmp(mode, "speed")) rc = speed();
  else fprintf(stderr, "test_dist: unknown mode %s\n", mode);
  graft_dist_finalize();
  graft_shutdown();
  return rc;
}
