/* Training from C beyond gradients: graft_assign, the optimizers against torch.optim's formulas
 * written here in double (SGD with momentum, dampening, Nesterov and weight decay; Adam; AdamW),
 * a learning rate changed mid-run without a recompile, bad options refused, and named tensors
 * in a file (graft_save_tensors / graft_load_tensors): values and names round-trip, a missing
 * name lists the names there, a corrupted file is refused. Inputs on cpu:GRAFT_TEST_DEVICE. */
#include "check.h"
#include "graft.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int dev;
enum { N = 5, STEPS = 4 };
static const double p0[N] = {0.5, -1.25, 2.0, 0.1, -0.7};

static graft_tensor *vec(const double *v) {
  int64_t s[1] = {N};
  return graft_from_host(v, GRAFT_F64, 1, s, dev);
}

/* The loss sum(c * p^2) with c = 1..N: its gradient 2 c p, taken by graft_grad. */
static void grad_of(graft_tensor *p, graft_tensor **g) {
  double c[N];
  for (int i = 0; i < N; i++) c[i] = i + 1;
  graft_tensor *loss = graft_sum(graft_mul(vec(c), graft_mul(p, p)), NULL, 0, false);
  CHECK(graft_grad(loss, 1, &p, g) == GRAFT_OK);
}

/* Runs STEPS steps of opt on p (lr halved before the last) and compares with want[STEPS][N]. */
static void run_against(graft_optimizer *opt, graft_tensor *p, double want[STEPS][N], const char *what) {
  graft_metrics m0, m1;
  for (int s = 0; s < STEPS; s++) {
    if (s == STEPS - 1) graft_metrics_get(&m0);
    graft_scope_begin();
    graft_tensor *g;
    grad_of(p, &g);
    CHECK(graft_optimizer_step(opt, &g) == GRAFT_OK);
    graft_scope_end();
    CHECK(graft_step() == GRAFT_OK); /* the parameter and the state: one graph a step */
    double got[N];
    CHECK(graft_to_host(p, got, sizeof got) == GRAFT_OK);
    for (int i = 0; i < N; i++)
      if (fabs(got[i] - want[s][i]) > 1e-12 * (1 + fabs(want[s][i]))) {
        fprintf(stderr, "  %s step %d p[%d] = %.15g, want %.15g\n", what, s, i, got[i], want[s][i]);
        check_failed_in_test = 1;
      }
    if (s == STEPS - 2) CHECK(graft_optimizer_set_lr(opt, 0.05) == GRAFT_OK);
  }
  graft_metrics_get(&m1);
  CHECK(m1.graphs_compiled == m0.graphs_compiled); /* a new lr is a new value, not a new graph */
}

static double lr_at(int s) { return s == STEPS - 1 ? 0.05 : 0.1; }

TEST(sgd_matches_torch_formulas) {
  const struct { double mom, damp, wd; bool nest; } cfg[] = {{0, 0, 0, false}, {0.9, 0, 0, false},
                                                             {0.9, 0.1, 0.01, false}, {0.8, 0, 0.05, true}};
  for (int k = 0; k < 4; k++) {
    double p[N], buf[N], want[STEPS][N];
    memcpy(p, p0, sizeof p);
    for (int s = 0; s < STEPS; s++)
      for (int i = 0; i < N; i++) {
        double g = 2 * (i + 1) * p[i] + cfg[k].wd * p[i];
        if (cfg[k].mom) {
          buf[i] = s ? cfg[k].mom * buf[i] + (1 - cfg[k].damp) * g : g;
          g = cfg[k].nest ? g + cfg[k].mom * buf[i] : buf[i];
        }
        want[s][i] = p[i] = p[i] - lr_at(s) * g;
      }
    graft_tensor *t = vec(p0);
    graft_optimizer *o = graft_sgd(1, &t, (graft_sgd_options){0.1, cfg[k].mom, cfg[k].damp, cfg[k].wd, cfg[k].nest});
    CHECK(o != NULL);
    if (o) run_against(o, t, want, "sgd");
    graft_optimizer_free(o);
    graft_release(t);
  }
}

TEST(adam_and_adamw_match_torch_formulas) {
  for (int decoupled = 0; decoupled < 2; decoupled++) {
    const double b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    double p[N], m[N] = {0}, v[N] = {0}, want[STEPS][N];
    memcpy(p, p0, sizeof p);
    for (int s = 0; s < STEPS; s++)
      for (int i = 0; i < N; i++) {
        double g = 2 * (i + 1) * p[i], lr = lr_at(s);
        if (decoupled) p[i] *= 1 - lr * wd;
        else g += wd * p[i];
        m[i] += (1 - b1) * (g - m[i]);
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        double t = s + 1, step = lr / (1 - pow(b1, t)), bc2 = sqrt(1 - pow(b2, t));
        want[s][i] = p[i] = p[i] - step * (m[i] / (sqrt(v[i]) / bc2 + eps));
      }
    graft_tensor *t = vec(p0);
    graft_optimizer *o = graft_adam(1, &t, (graft_adam_options){0.1, b1, b2, eps, wd, decoupled});
    CHECK(o != NULL);
    if (o) run_against(o, t, want, decoupled ? "adamw" : "adam");
    graft_optimizer_free(o);
    graft_release(t);
  }
}

/* torch.optim counts steps per parameter: one that had no gradient so far gets a first step's
 * bias corrections when it first has one. */
TEST(adam_counts_steps_per_parameter) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = 0.1;
  graft_tensor *p[2] = {vec(p0), vec(p0)}, *g[2];
  graft_optimizer *o = graft_adam(2, p, (graft_adam_options){lr, b1, b2, eps, 0, false});
  for (int s = 0; s < 3; s++) {
    graft_scope_begin();
    grad_of(p[0], &g[0]);
    grad_of(p[1], &g[1]);
    if (s < 2) g[1] = NULL; /* p[1] first has a gradient at the third step */
    CHECK(graft_optimizer_step(o, g) == GRAFT_OK);
    graft_scope_end();
  }
  double got[N];
  CHECK(graft_to_host(p[1], got, sizeof got) == GRAFT_OK);
  for (int i = 0; i < N; i++) { /* t = 1: m = (1-b1) g, v = (1-b2) g^2 */
    double gi = 2 * (i + 1) * p0[i], m = (1 - b1) * gi, v = (1 - b2) * gi * gi;
    double want = p0[i] - lr / (1 - b1) * (m / (sqrt(v) / sqrt(1 - b2) + eps));
    CHECK_NEAR(got[i], want, 1e-12);
  }
  graft_optimizer_free(o);
  graft_release(p[0]), graft_release(p[1]);
}

TEST(bad_options_and_gradients_are_refused) {
  graft_tensor *t = vec(p0), *w = graft_zeros_on(GRAFT_F64, 1, (int64_t[]){3}, dev);
  CHECK(!graft_sgd(1, &t, (graft_sgd_options){.lr = -1}) && graft_last_status() == GRAFT_ERR_ARG);
  CHECK(!graft_sgd(1, &t, (graft_sgd_options){.lr = 0.1, .nesterov = true}));
  CHECK(strstr(graft_last_error(), "Nesterov") != NULL);
  CHECK(!graft_adam(1, &t, (graft_adam_options){.lr = 0.1, .beta1 = 1.0}));
  graft_tensor *ix = graft_zeros_on(GRAFT_I64, 1, (int64_t[]){N}, dev);
  CHECK(!graft_adam(1, &ix, (graft_adam_options){.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99}));
  CHECK(graft_last_status() == GRAFT_ERR_DTYPE);
  graft_optimizer *o = graft_sgd(1, &t, (graft_sgd_options){.lr = 0.1});
  CHECK(graft_optimizer_step(o, &w) == GRAFT_ERR_SHAPE); /* the wrong gradient: nothing changes */
  double got[N];
  CHECK(graft_to_host(t, got, sizeof got) == GRAFT_OK && !memcmp(got, p0, sizeof got));
  graft_tensor *none = NULL; /* no gradient: the parameter stays */
  CHECK(graft_optimizer_step(o, &none) == GRAFT_OK);
  CHECK(graft_to_host(t, got, sizeof got) == GRAFT_OK && !memcmp(got, p0, sizeof got));
  CHECK(graft_assign(t, w) == GRAFT_ERR_SHAPE);
  CHECK(strstr(graft_last_error(), "[5]") && strstr(graft_last_error(), "[3]"));
  graft_optimizer_free(o);
  graft_release(t), graft_release(w), graft_release(ix);
}

TEST(named_tensors_round_trip_through_a_file) {
  char dir[] = "/tmp/graft-optim-XXXXXX", path[128], bad[160];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/w.graft", dir);
  snprintf(bad, sizeof bad, "%s/bad.graft", dir);
  float a[6] = {1, 2, 3, 4, 5, 6};
  int64_t ix[3] = {7, -8, 9};
  graft_tensor *t[2] = {graft_from_host(a, GRAFT_F32, 2, (int64_t[]){2, 3}, dev),
                        graft_from_host(ix, GRAFT_I64, 1, (int64_t[]){3}, dev)};
  graft_tensor *orig = t[0];
  t[0] = graft_mul_scalar(orig, 2.0); /* a pending value is saved as its value */
  graft_release(orig);
  const char *names[2] = {"layer.weight", "counts"};
  CHECK(graft_save_tensors(path, 2, names, t) == GRAFT_OK);
  graft_tensor *back[3];
  const char *want[3] = {"counts", "layer.weight", "counts"};
  CHECK(graft_load_tensors(path, dev, 3, want, back) == GRAFT_OK);
  float fa[6];
  int64_t fi[3];
  CHECK(graft_to_host(back[1], fa, sizeof fa) == GRAFT_OK && fa[5] == 12 && graft_device(back[1]) == dev);
  CHECK(graft_to_host(back[0], fi, sizeof fi) == GRAFT_OK && fi[1] == -8);
  CHECK(back[0] != back[2] && graft_to_host(back[2], fi, sizeof fi) == GRAFT_OK && fi[2] == 9);
  for (int i = 0; i < 3; i++) graft_release(back[i]);
  const char *missing[1] = {"layer.bias"};
  CHECK(graft_load_tensors(path, dev, 1, missing, back) == GRAFT_ERR_FILE && back[0] == NULL);
  CHECK(strstr(graft_last_error(), "'layer.bias' (it has: layer.weight, counts)") != NULL);
  const char *twice[2] = {"x", "x"}, *empty[2] = {"x", ""};
  CHECK(graft_save_tensors(path, 2, twice, t) == GRAFT_ERR_ARG);
  CHECK(graft_save_tensors(path, 2, empty, t) == GRAFT_ERR_ARG);
  FILE *fp = fopen(path, "rb"), *out = fopen(bad, "wb"); /* its last byte (a constant's) flipped */
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp), k = 0;
  fseek(fp, 0, SEEK_SET);
  for (int c; (c = fgetc(fp)) != EOF; k++) fputc(k == size - 1 ? c ^ 1 : c, out);
  fclose(fp), fclose(out);
  CHECK(graft_load_tensors(bad, dev, 1, names, back) == GRAFT_ERR_FILE);
  CHECK(strstr(graft_last_error(), "checksum") != NULL);
  remove(path), remove(bad), rmdir(dir);
  graft_release(t[0]), graft_release(t[1]);
}

int main(void) {
  dev = check_test_device();
  if (dev < 0) {
    fprintf(stderr, "no such test device\n");
    return 1;
  }
  RUN(sgd_matches_torch_formulas);
  RUN(adam_and_adamw_match_torch_formulas);
  RUN(adam_counts_steps_per_parameter);
  RUN(bad_options_and_gradients_are_refused);
  RUN(named_tensors_round_trip_through_a_file);
  graft_shutdown();
  printf("%d passed, %d failed\n", check_passed, check_failed);
  return check_failed ? 1 : 0;
}
