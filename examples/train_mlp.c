/* train_mlp.c: training a classifier from C with graft: gradients (graft_grad), an optimizer
 * (graft_adam / graft_sgd) and the weights saved to a file and read back (graft_save_tensors).
 *
 *   3 interleaved spirals of 2-D points (generated, no download)
 *   -> linear 2x64 + relu -> linear 64x64 + relu -> linear 64x3 -> cross-entropy
 *
 * Each step's forward pass, gradients and Adam update are one graph: the first step compiles it,
 * every later step runs the compiled code. Usage:
 *
 *   train_mlp [--epochs N] [--lr X] [--sgd] [--device N] [--save FILE]   train, report, save
 *   train_mlp --eval FILE [--device N]                                    load and evaluate
 *   train_mlp --dump FILE      the initial weights and the data, for a peer (bench/train_mlp_peer.py)
 *   train_mlp --init FILE --data FILE --steps N [--lr X] [--sgd]          the parity test's run:
 *       initial weights and one batch (x, y) from tensor files, the loss of each step printed
 */
#include "graft.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 2, HID = 64, CLASSES = 3, NPARAM = 6, PER_CLASS = 500, BATCH = 100 };
static const char *const names[NPARAM] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                          "fc3.weight", "fc3.bias"};

typedef struct {
  float *x;   /* [n, 2] */
  int64_t *y; /* [n] */
  int n;
} dataset;

/* A fixed-seed LCG, so every run sees the same points. */
static uint64_t seed = 2026;
static double urand(void) {
  seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(seed >> 11) / 9007199254740992.0;
}

/* Class c's points lie along a spiral arm turned by 2 pi c / 3, with noise. */
static dataset spirals(int per_class) {
  dataset d = {malloc(sizeof(float) * 2 * CLASSES * per_class), malloc(sizeof(int64_t) * CLASSES * per_class),
               CLASSES * per_class};
  for (int i = 0; i < d.n; i++) {
    int c = i % CLASSES;
    double r = urand(), t = 4.0 * r + 2.0943951 * c + 0.25 * (urand() - 0.5);
    d.x[2 * i] = (float)(r * __builtin_sin(t));
    d.x[2 * i + 1] = (float)(r * __builtin_cos(t));
    d.y[i] = c;
  }
  return d;
}

static int die(const char *what) {
  fprintf(stderr, "train_mlp: %s: %s\n", what, graft_last_error());
  return 1;
}

/* logits of x [n, 2] */
static graft_tensor *forward(graft_tensor *x, graft_tensor *const *p) {
  graft_tensor *h = graft_relu(graft_linear(x, p[0], p[1]));
  h = graft_relu(graft_linear(h, p[2], p[3]));
  return graft_linear(h, p[4], p[5]);
}

/* PyTorch's nn.Linear init: kaiming-uniform weights (a = sqrt(5)), biases in +-1/sqrt(fan_in). */
static int init_params(graft_tensor **p, int dev) {
  const int64_t shapes[NPARAM][2] = {{HID, IN}, {HID}, {HID, HID}, {HID}, {CLASSES, HID}, {CLASSES}};
  graft_manual_seed(7);
  for (int l = 0; l < 3; l++) {
    const int64_t *ws = shapes[2 * l];
    double bound = 1.0 / __builtin_sqrt((double)ws[1]);
    p[2 * l] = graft_init_kaiming_uniform(GRAFT_F32, 2, ws, 2.2360679774997896, dev);
    p[2 * l + 1] = graft_init_uniform(GRAFT_F32, 1, shapes[2 * l + 1], -bound, bound, dev);
    if (!p[2 * l] || !p[2 * l + 1]) return die("init");
  }
  return 0;
}

/* Accuracy of the model on d, in one graph. */
static double accuracy(graft_tensor *const *p, const dataset *d, int dev) {
  graft_scope_begin();
  int64_t xs[2] = {d->n, IN};
  graft_tensor *x = graft_from_host(d->x, GRAFT_F32, 2, xs, dev);
  graft_tensor *pred = graft_argmax(forward(x, p), 1, false);
  int64_t *got = malloc(sizeof(int64_t) * (size_t)d->n);
  double acc = -1;
  if (pred && graft_to_host(pred, got, sizeof(int64_t) * (size_t)d->n) == GRAFT_OK) {
    int ok = 0;
    for (int i = 0; i < d->n; i++) ok += got[i] == d->y[i];
    acc = (double)ok / d->n;
  }
  free(got);
  graft_scope_end();
  return acc;
}

/* One training step on (x, y): forward, gradients, update; the loss (synced with the step). */
static int train_step(graft_optimizer *opt, graft_tensor *const *p, graft_tensor *x,
                      graft_tensor *y, float *loss_out) {
  graft_scope_begin();
  graft_tensor *loss = graft_cross_entropy(forward(x, p), y), *g[NPARAM];
  int rc = !loss || graft_grad(loss, NPARAM, p, g) || graft_optimizer_step(opt, g) ||
           graft_step() || graft_to_host(loss, loss_out, sizeof *loss_out);
  graft_scope_end();
  return rc ? die("step") : 0;
}

/* The initial weights and both datasets in one tensor file. */
static int dump_all(const char *path, graft_tensor *const *p, const dataset *train,
                    const dataset *test, int dev) {
  graft_scope_begin();
  graft_tensor *t[NPARAM + 4];
  const char *nm[NPARAM + 4] = {0};
  for (int i = 0; i < NPARAM; i++) t[i] = p[i], nm[i] = names[i];
  const dataset *d[2] = {train, test};
  static const char *const dn[4] = {"x_train", "y_train", "x_test", "y_test"};
  for (int k = 0; k < 2; k++) {
    int64_t xs[2] = {d[k]->n, IN}, ys[1] = {d[k]->n};
    t[NPARAM + 2 * k] = graft_from_host(d[k]->x, GRAFT_F32, 2, xs, dev);
    t[NPARAM + 2 * k + 1] = graft_from_host(d[k]->y, GRAFT_I64, 1, ys, dev);
    nm[NPARAM + 2 * k] = dn[2 * k], nm[NPARAM + 2 * k + 1] = dn[2 * k + 1];
  }
  int rc = graft_save_tensors(path, NPARAM + 4, nm, t) ? die(path) : 0;
  graft_scope_end();
  return rc;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static graft_optimizer *make_opt(graft_tensor *const *p, double lr, int sgd) {
  if (sgd) return graft_sgd(NPARAM, p, (graft_sgd_options){.lr = lr, .momentum = 0.9});
  return graft_adam(NPARAM, p, (graft_adam_options){.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8});
}

/* --init/--data/--steps: the loss of each step, for a comparison with PyTorch. */
static int parity_run(const char *init, const char *data, int steps, double lr, int sgd, int dev) {
  graft_tensor *p[NPARAM], *xy[2];
  static const char *const xy_names[2] = {"x", "y"};
  if (graft_load_tensors(init, dev, NPARAM, names, p)) return die(init);
  if (graft_load_tensors(data, dev, 2, xy_names, xy)) return die(data);
  graft_optimizer *opt = make_opt(p, lr, sgd);
  if (!opt) return die("optimizer");
  int rc = 0;
  for (int s = 0; s < steps && !rc; s++) {
    float loss;
    rc = train_step(opt, p, xy[0], xy[1], &loss);
    if (!rc) printf("step %d loss %.9g\n", s, loss);
  }
  graft_metrics m;
  graft_metrics_get(&m);
  printf("graphs compiled %llu\n", (unsigned long long)m.graphs_compiled);
  graft_optimizer_free(opt);
  for (int i = 0; i < NPARAM; i++) graft_release(p[i]);
  graft_release(xy[0]), graft_release(xy[1]);
  return rc;
}

int main(int argc, char **argv) {
  int epochs = 20, dev = 0, steps = 0, sgd = 0;
  double lr = 1e-2;
  const char *save = NULL, *eval = NULL, *init = NULL, *data = NULL, *dump = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--sgd")) { sgd = 1; continue; }
    if (!v) { fprintf(stderr, "train_mlp: %s needs a value (see the usage atop train_mlp.c)\n", a); return 2; }
    if (!strcmp(a, "--epochs")) epochs = atoi(v);
    else if (!strcmp(a, "--lr")) lr = atof(v);
    else if (!strcmp(a, "--device")) dev = atoi(v);
    else if (!strcmp(a, "--save")) save = v;
    else if (!strcmp(a, "--eval")) eval = v;
    else if (!strcmp(a, "--init")) init = v;
    else if (!strcmp(a, "--data")) data = v;
    else if (!strcmp(a, "--steps")) steps = atoi(v);
    else if (!strcmp(a, "--dump")) dump = v;
    else { fprintf(stderr, "train_mlp: unknown option %s\n", a); return 2; }
    i++;
  }
  int rc = 0;
  if (init || data) {
    rc = init && data && steps > 0 ? parity_run(init, data, steps, lr, sgd, dev)
                                   : (fprintf(stderr, "train_mlp: --init, --data and --steps go together\n"), 2);
    graft_shutdown();
    return rc;
  }
  dataset train = spirals(PER_CLASS), test = spirals(PER_CLASS / 5);
  graft_tensor *p[NPARAM] = {0};
  if (eval) {
    if (graft_load_tensors(eval, dev, NPARAM, names, p)) rc = die(eval);
    else printf("loaded %s: test accuracy %.3f\n", eval, accuracy(p, &test, dev));
  } else if (dump) {
    rc = init_params(p, dev) || dump_all(dump, p, &train, &test, dev);
  } else if (!(rc = init_params(p, dev))) {
    graft_optimizer *opt = make_opt(p, lr, sgd);
    if (!opt) rc = die("optimizer");
    int64_t xs[2] = {BATCH, IN}, ys[1] = {BATCH};
    int *perm = malloc(sizeof(int) * (size_t)train.n);
    float *bx = malloc(sizeof(float) * BATCH * IN);
    int64_t *by = malloc(sizeof(int64_t) * BATCH);
    for (int i = 0; i < train.n; i++) perm[i] = i;
    for (int e = 0; e < epochs && !rc; e++) {
      for (int i = train.n - 1; i > 0; i--) { /* a new order each epoch */
        int j = (int)(urand() * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
      }
      double t0 = now(), sum = 0;
      int nb = 0;
      for (int b = 0; b + BATCH <= train.n && !rc; b += BATCH, nb++) {
        for (int k = 0; k < BATCH; k++) {
          memcpy(bx + IN * k, train.x + IN * perm[b + k], sizeof(float) * IN);
          by[k] = train.y[perm[b + k]];
        }
        graft_scope_begin();
        float loss = 0;
        rc = train_step(opt, p, graft_from_host(bx, GRAFT_F32, 2, xs, dev),
                        graft_from_host(by, GRAFT_I64, 1, ys, dev), &loss);
        graft_scope_end();
        sum += loss;
      }
      double ms = (now() - t0) * 1e3; /* the epoch's steps, their last sync included */
      if (!rc)
        printf("epoch %2d  loss %.4f  train accuracy %.3f  %.1f ms\n", e + 1, sum / nb,
               accuracy(p, &train, dev), ms);
    }
    if (!rc) printf("test accuracy %.3f\n", accuracy(p, &test, dev));
    if (!rc && save) {
      if (graft_save_tensors(save, NPARAM, names, p)) rc = die(save);
      else printf("saved %s\n", save);
    }
    graft_metrics m;
    graft_metrics_get(&m);
    if (getenv("TRAIN_MLP_REPORT")) { char *r = graft_metrics_report(); fputs(r, stdout); free(r); }
    if (!rc) printf("graphs compiled %llu, executions %llu\n", (unsigned long long)m.graphs_compiled,
                    (unsigned long long)m.executions);
    free(perm), free(bx), free(by);
    graft_optimizer_free(opt);
  }
  for (int i = 0; i < NPARAM; i++) graft_release(p[i]);
  free(train.x), free(train.y), free(test.x), free(test.y);
  graft_shutdown();
  return rc;
}
