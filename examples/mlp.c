/* mlp.c: a small multi-layer perceptron forward pass with graft.
 *
 *   x [32,64] -> linear+relu -> [32,128] -> linear+relu -> [32,128] -> linear -> log_softmax [32,10]
 *
 * It shows the three things a graft program does: copy data in (graft_from_host), call ops that
 * only record a graph, and sync (graft_to_host, graft_step) so the graph is compiled once and then
 * served from the cache. The result is checked against a plain C forward pass.
 */
#include "graft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { BATCH = 32, IN = 64, HID = 128, OUT = 10, NLAYERS = 3 };
static const int dims[NLAYERS + 1] = {IN, HID, HID, OUT};

/* A fixed-seed LCG, so every run sees the same data. */
static uint64_t seed = 12345;
static float frand(float scale) {
  seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  return scale * (2.0f * (float)(seed >> 40) / 16777216.0f - 1.0f); /* uniform in [-scale, scale) */
}

/* The graft forward pass. A scope frees every intermediate; graft_keep hands back the result. */
static graft_tensor *forward(graft_tensor *x, graft_tensor **w, graft_tensor **b) {
  graft_scope_begin();
  graft_tensor *h = x;
  for (int l = 0; l < NLAYERS; l++) {
    h = graft_linear(h, w[l], b[l]);      /* h @ w^T + b: only records IR */
    if (l < NLAYERS - 1) h = graft_relu(h);
  }
  graft_tensor *y = graft_log_softmax(h, -1);
  graft_tensor *out = y ? graft_keep(y) : NULL; /* NULL means an op failed: see graft_last_error */
  graft_scope_end();
  return out;
}

/* The same forward pass in plain C, in double, to check graft's answer. */
static void forward_ref(const float *x, float **w, float **b, double *out) {
  double *h = malloc(sizeof(double) * BATCH * HID), *t = malloc(sizeof(double) * BATCH * HID);
  for (int i = 0; i < BATCH * IN; i++) h[i] = x[i];
  for (int l = 0; l < NLAYERS; l++) {
    int in = dims[l], on = dims[l + 1];
    for (int n = 0; n < BATCH; n++)
      for (int o = 0; o < on; o++) {
        double s = b[l][o];
        for (int k = 0; k < in; k++) s += h[n * in + k] * w[l][o * in + k];
        t[n * on + o] = (l < NLAYERS - 1 && s < 0) ? 0 : s;
      }
    double *tmp = h; h = t; t = tmp;
  }
  for (int n = 0; n < BATCH; n++) { /* log_softmax of each row */
    double m = -INFINITY, s = 0;
    for (int o = 0; o < OUT; o++) m = fmax(m, h[n * OUT + o]);
    for (int o = 0; o < OUT; o++) s += exp(h[n * OUT + o] - m);
    for (int o = 0; o < OUT; o++) out[n * OUT + o] = h[n * OUT + o] - m - log(s);
  }
  free(h);
  free(t);
}

int main(int argc, char **argv) {
  /* 0. The device: cpu:0, or the first device of the kind named on the command line
   *    (build/examples/mlp opencl). */
  int dev = argc > 1 ? graft_device_find(argv[1], 0) : 0;
  if (dev < 0) {
    fprintf(stderr, "graft error: %s\n", graft_last_error());
    return 1;
  }
  if (argc > 1) printf("device %d: %s\n", dev, graft_device_name(dev));
  /* 1. Host data: the input batch and the weights of each layer (w [out,in], b [out]). */
  float *hx = malloc(sizeof(float) * BATCH * IN), *hw[NLAYERS], *hb[NLAYERS];
  for (int i = 0; i < BATCH * IN; i++) hx[i] = frand(1.0f);
  for (int l = 0; l < NLAYERS; l++) {
    hw[l] = malloc(sizeof(float) * dims[l + 1] * dims[l]);
    hb[l] = malloc(sizeof(float) * dims[l + 1]);
    float scale = 1.0f / sqrtf((float)dims[l]);
    for (int i = 0; i < dims[l + 1] * dims[l]; i++) hw[l][i] = frand(scale);
    for (int i = 0; i < dims[l + 1]; i++) hb[l][i] = frand(scale);
  }

  /* 2. Copy them to the device. These are graph parameters: new values never recompile. */
  int64_t xs[2] = {BATCH, IN};
  graft_tensor *x = graft_from_host(hx, GRAFT_F32, 2, xs, dev), *w[NLAYERS], *b[NLAYERS];
  for (int l = 0; l < NLAYERS; l++) {
    int64_t ws[2] = {dims[l + 1], dims[l]}, bs[1] = {dims[l + 1]};
    w[l] = graft_from_host(hw[l], GRAFT_F32, 2, ws, dev);
    b[l] = graft_from_host(hb[l], GRAFT_F32, 1, bs, dev);
  }

  /* 3. Forward, then read the result: graft_to_host is a sync, it compiles and runs the graph. */
  int status = 0;
  float got[BATCH * OUT];
  double want[BATCH * OUT];
  graft_tensor *y = forward(x, w, b);
  if (!y || graft_to_host(y, got, sizeof got) != GRAFT_OK) {
    fprintf(stderr, "graft error: %s\n", graft_last_error());
    status = 1;
  } else {
    forward_ref(hx, hw, hb, want);
    double maxdiff = 0;
    for (int i = 0; i < BATCH * OUT; i++) maxdiff = fmax(maxdiff, fabs(got[i] - want[i]));
    int ok = maxdiff <= 1e-4;
    printf("result check: max abs diff = %.3g %s\n", maxdiff, ok ? "OK" : "FAILED");
    if (!ok) status = 1;
  }
  graft_release(y);

  /* 4. A loop of steps: the same graph each time, so the cache serves it (no new compile). */
  for (int it = 0; it < 10 && status == 0; it++) {
    graft_tensor *out = forward(x, w, b);
    graft_step(); /* materializes every pending tensor: here, out */
    graft_release(out);
  }
  graft_metrics m;
  graft_metrics_get(&m);
  printf("graphs compiled: %llu, cache hits: %llu, executions: %llu\n",
         (unsigned long long)m.graphs_compiled, (unsigned long long)m.cache_hits,
         (unsigned long long)m.executions);
  char *report = graft_metrics_report();
  if (report) printf("%s", report);
  free(report);

  /* 5. Free everything: tensors, then graft's caches, then host buffers. */
  graft_release(x);
  for (int l = 0; l < NLAYERS; l++) {
    graft_release(w[l]);
    graft_release(b[l]);
    free(hw[l]);
    free(hb[l]);
  }
  free(hx);
  graft_shutdown();
  return status;
}
