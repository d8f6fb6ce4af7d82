/* Gradient ops (conv2d input/weight, max_pool2d), flip, interior padding and argmin, against
 * direct loops written here from the definitions. Inputs are made on cpu:GRAFT_TEST_DEVICE
 * (default 0; the Makefile runs this on cpu:0 and cpu:1) and every result must be on it. */
#include "check.h"
#include "graft.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int dev; /* the device of every input (GRAFT_TEST_DEVICE) */

/* graft_to_host, after checking that t is on the inputs' device. */
static graft_status read_dev(graft_tensor *t, void *dst, size_t bytes) {
  if (t && graft_device(t) != dev) {
    char a[32], b[32];
    fprintf(stderr, "  result on %s, inputs on %s\n", check_device_str(graft_device(t), a, sizeof a),
            check_device_str(dev, b, sizeof b));
    return GRAFT_ERR_DEVICE;
  }
  return graft_to_host(t, dst, bytes);
}

static unsigned rng_state = 12345;
static float frand(void) {
  rng_state = rng_state * 1103515245u + 12345u;
  return (float)((rng_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}
static float *rand_buf(int64_t n) {
  float *v = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = frand();
  return v;
}
static graft_tensor *T(const float *v, int nd, const int64_t *s) {
  return graft_from_host(v, GRAFT_F32, nd, s, dev);
}

typedef struct { int N, C, H, W, O, K, s, p, d, g; } conv_case;

static void conv_case_run(conv_case c) {
  int OH = (c.H + 2 * c.p - c.d * (c.K - 1) - 1) / c.s + 1;
  int OW = (c.W + 2 * c.p - c.d * (c.K - 1) - 1) / c.s + 1;
  int Cg = c.C / c.g, Og = c.O / c.g;
  int64_t xs[4] = {c.N, c.C, c.H, c.W}, ws[4] = {c.O, Cg, c.K, c.K}, ys[4] = {c.N, c.O, OH, OW};
  int64_t nx = (int64_t)c.N * c.C * c.H * c.W, nw = (int64_t)c.O * Cg * c.K * c.K,
          ny = (int64_t)c.N * c.O * OH * OW;
  float *x = rand_buf(nx), *w = rand_buf(nw), *dy = rand_buf(ny);
  double *dx = calloc((size_t)nx, sizeof(double)), *dw = calloc((size_t)nw, sizeof(double));
  /* From y[n,o,oh,ow] = sum x[n,c,oh*s+kh*d-p,..] w[o,c',kh,kw]: scatter dy back. */
  for (int n = 0; n < c.N; n++)
    for (int o = 0; o < c.O; o++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++)
          for (int cc = 0; cc < Cg; cc++)
            for (int kh = 0; kh < c.K; kh++)
              for (int kw = 0; kw < c.K; kw++) {
                int h = oh * c.s + kh * c.d - c.p, ww = ow * c.s + kw * c.d - c.p;
                if (h < 0 || h >= c.H || ww < 0 || ww >= c.W) continue;
                int ci = (o / Og) * Cg + cc;
                size_t xi = (((size_t)n * c.C + ci) * c.H + h) * c.W + ww;
                size_t wi = (((size_t)o * Cg + cc) * c.K + kh) * c.K + kw;
                double g = dy[(((size_t)n * c.O + o) * OH + oh) * OW + ow];
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
  graft_scope_begin();
  int st[2] = {c.s, c.s}, pd[2] = {c.p, c.p}, dl[2] = {c.d, c.d};
  graft_tensor *tx = T(x, 4, xs), *tw = T(w, 4, ws), *tdy = T(dy, 4, ys);
  graft_tensor *gx = graft_conv2d_backward_input(tdy, tw, xs, st, pd, dl, c.g);
  graft_tensor *gw = graft_conv2d_backward_weight(tx, tdy, ws, st, pd, dl, c.g);
  float *ox = malloc(sizeof(float) * (size_t)nx), *ow_ = malloc(sizeof(float) * (size_t)nw);
  CHECK(read_dev(gx, ox, sizeof(float) * (size_t)nx) == GRAFT_OK);
  CHECK(read_dev(gw, ow_, sizeof(float) * (size_t)nw) == GRAFT_OK);
  double ex = 0, ew = 0;
  for (int64_t i = 0; i < nx; i++) ex = fmax(ex, fabs(ox[i] - dx[i]));
  for (int64_t i = 0; i < nw; i++) ew = fmax(ew, fabs(ow_[i] - dw[i]));
  if (ex > 1e-4 || ew > 1e-4)
    fprintf(stderr, "conv case N%d C%d H%d O%d K%d s%d p%d d%d g%d: dx err %g dw err %g\n", c.N,
            c.C, c.H, c.O, c.K, c.s, c.p, c.d, c.g, ex, ew);
  CHECK(ex <= 1e-4);
  CHECK(ew <= 1e-4);
  graft_scope_end();
  free(x), free(w), free(dy), free(dx), free(dw), free(ox), free(ow_);
}

TEST(conv2d_gradients) {
  conv_case cases[] = {
      {2, 3, 7, 7, 4, 3, 1, 1, 1, 1}, /* same padding */
      {2, 3, 8, 8, 4, 3, 2, 1, 1, 1}, /* strided */
      {1, 4, 9, 9, 6, 3, 2, 0, 1, 2}, /* groups, stride, odd remainder */
      {2, 2, 9, 9, 2, 3, 1, 2, 2, 1}, /* dilation */
      {1, 4, 6, 6, 4, 3, 1, 1, 1, 4}, /* depthwise */
      {2, 6, 9, 9, 6, 3, 2, 1, 1, 6}, /* depthwise, strided: dx convolves a dilated dy */
      {1, 3, 8, 8, 6, 3, 2, 2, 2, 3}, /* two outputs per group, stride and dilation */
      {3, 1, 5, 5, 2, 5, 1, 2, 1, 1}, /* kernel as big as the input */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) conv_case_run(cases[i]);
}

TEST(max_pool2d_gradient) {
  /* kernel, stride, padding; stride == kernel takes the non-overlapping path */
  int cases[][3] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 1}, {2, 1, 0}, {2, 2, 1}, {3, 3, 0}, {3, 3, 1}};
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    int K = cases[t][0], S = cases[t][1], P = cases[t][2], N = 2, C = 2, H = 7, W = 6;
    int OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    int64_t xs[4] = {N, C, H, W}, ys[4] = {N, C, OH, OW};
    int64_t nx = N * C * H * W, ny = N * C * OH * OW;
    float *x = rand_buf(nx), *dy = rand_buf(ny);
    for (int64_t i = 0; i < nx; i += 5) x[i] = 0.25f; /* ties: the first maximum wins */
    double *dx = calloc((size_t)nx, sizeof(double));
    for (int nc = 0; nc < N * C; nc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          int best = -1;
          float bv = -INFINITY;
          for (int kh = 0; kh < K; kh++)
            for (int kw = 0; kw < K; kw++) {
              int h = oh * S + kh - P, w = ow * S + kw - P;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              float v = x[(size_t)nc * H * W + h * W + w];
              if (best < 0 || v > bv) bv = v, best = h * W + w;
            }
          dx[(size_t)nc * H * W + best] += dy[((size_t)nc * OH + oh) * OW + ow];
        }
    graft_scope_begin();
    int k2[2] = {K, K}, s2[2] = {S, S}, p2[2] = {P, P};
    graft_tensor *g = graft_max_pool2d_backward(T(x, 4, xs), T(dy, 4, ys), k2, s2, p2);
    float *out = malloc(sizeof(float) * (size_t)nx);
    CHECK(read_dev(g, out, sizeof(float) * (size_t)nx) == GRAFT_OK);
    double err = 0;
    for (int64_t i = 0; i < nx; i++) err = fmax(err, fabs(out[i] - dx[i]));
    CHECK(err <= 1e-5);
    graft_scope_end();
    free(x), free(dy), free(dx), free(out);
  }
}

TEST(flip_pad_interior_argmin) {
  graft_scope_begin();
  int32_t v[6] = {1, 2, 3, 4, 5, 6};
  graft_tensor *a = graft_from_host(v, GRAFT_I32, 2, (int64_t[]){2, 3}, dev);
  int32_t f[6];
  CHECK(read_dev(graft_flip(a, (int[]){-1}, 1), f, sizeof f) == GRAFT_OK);
  CHECK(f[0] == 3 && f[2] == 1 && f[3] == 6 && f[5] == 4);
  CHECK(read_dev(graft_flip(a, (int[]){0, 1}, 2), f, sizeof f) == GRAFT_OK);
  CHECK(f[0] == 6 && f[5] == 1);
  CHECK(graft_flip(a, (int[]){2}, 1) == NULL && graft_last_status() == GRAFT_ERR_AXIS);
  graft_clear_error();
  /* [1,2,3] with lo 1, hi 2, interior 2 -> [0,1,0,0,2,0,0,3,0,0] */
  int32_t r[10];
  graft_tensor *row = graft_slice(a, (int64_t[]){0, 0}, (int64_t[]){1, 3}, NULL);
  graft_tensor *p = graft_pad_ex(graft_reshape(row, 1, (int64_t[]){3}), (int64_t[]){1},
                                 (int64_t[]){2}, (int64_t[]){2}, 0);
  CHECK(graft_numel(p) == 10);
  CHECK(read_dev(p, r, sizeof r) == GRAFT_OK);
  int32_t want[10] = {0, 1, 0, 0, 2, 0, 0, 3, 0, 0};
  CHECK(!memcmp(r, want, sizeof r));
  float m[6] = {3, -1, -1, 2, 7, 0.5f};
  graft_tensor *mt = graft_from_host(m, GRAFT_F32, 2, (int64_t[]){2, 3}, dev);
  int64_t idx[2];
  CHECK(read_dev(graft_argmin(mt, 1, false), idx, sizeof idx) == GRAFT_OK);
  CHECK(idx[0] == 1 && idx[1] == 2); /* first minimum */
  uint8_t u[4] = {200, 3, 255, 3};
  graft_tensor *ut = graft_from_host(u, GRAFT_U8, 1, (int64_t[]){4}, dev);
  CHECK(read_dev(graft_argmin(ut, 0, false), idx, sizeof idx[0]) == GRAFT_OK);
  CHECK(idx[0] == 1);
  graft_scope_end();
}

/* NULL, with status st and a message holding every non-NULL string. */
static bool fails_with(graft_tensor *t, graft_status st, const char *s1, const char *s2,
                       const char *s3) {
  const char *m = graft_last_error();
  bool ok = !t && graft_last_status() == st && strstr(m, s1) && (!s2 || strstr(m, s2)) &&
            (!s3 || strstr(m, s3));
  if (!ok) fprintf(stderr, "  got %s, status %d: %s\n", t ? "a tensor" : "NULL",
                   (int)graft_last_status(), m);
  graft_clear_error();
  return ok;
}

/* Backward calls with groups 1, dilation 1 and one stride / padding for both dims. */
static graft_tensor *bw_in(graft_tensor *dy, graft_tensor *w, const int64_t *xs, int s, int p) {
  return graft_conv2d_backward_input(dy, w, xs, (int[]){s, s}, (int[]){p, p}, NULL, 1);
}
static graft_tensor *bw_w(graft_tensor *x, graft_tensor *dy, const int64_t *ws, int groups) {
  return graft_conv2d_backward_weight(x, dy, ws, NULL, NULL, NULL, groups);
}

/* x_shape / w_shape must be the shapes the forward convolution had: positive dims, channels
 * that match w (or dy) and groups, and dy's size as the output the forward computes. */
TEST(conv2d_backward_shape_checks) {
  graft_scope_begin();
  const char *fi = "graft_conv2d_backward_input", *fw = "graft_conv2d_backward_weight";
  const graft_status S = GRAFT_ERR_SHAPE;
  int64_t ys[4] = {2, 4, 5, 5}, ws[4] = {4, 3, 3, 3}, xs[4] = {2, 3, 7, 7};
  graft_tensor *dy = graft_full_on(1, GRAFT_F32, 4, ys, dev),
               *w = graft_full_on(1, GRAFT_F32, 4, ws, dev), *x = graft_full_on(1, GRAFT_F32, 4, xs, dev);
  graft_tensor *ok = bw_in(dy, w, xs, 1, 0);
  CHECK(ok && graft_dim(ok, 2) == 7);
  ok = bw_w(x, dy, ws, 1);
  CHECK(ok && graft_dim(ok, 2) == 3);
  /* backward_input: batch, spatial size, negative dim, channels, a size past int64 */
  CHECK(fails_with(bw_in(dy, w, (int64_t[]){3, 3, 7, 7}, 1, 0), S, fi, "[3,3,7,7]", "[2,4,5,5]"));
  CHECK(fails_with(bw_in(dy, w, (int64_t[]){2, 3, 9, 7}, 1, 0), S, fi, "[2,3,9,7]", "[2,4,5,5]"));
  CHECK(fails_with(bw_in(dy, w, (int64_t[]){2, 3, -7, 7}, 1, 0), S, fi, "x_shape [2,3,-7,7]",
                   NULL));
  CHECK(fails_with(bw_in(dy, w, (int64_t[]){2, 6, 7, 7}, 1, 0), S, fi, "[2,6,7,7]", "[4,3,3,3]"));
  CHECK(fails_with(bw_in(dy, w, (int64_t[]){2, 3, INT64_MAX, 7}, 1, 1), S, fi,
                   "9223372036854775807", "int64"));
  /* stride 2: H 10 and 9 both give 4 rows; 11 gives 5 */
  graft_tensor *dy4 = graft_full_on(1, GRAFT_F32, 4, (int64_t[]){2, 4, 4, 4}, dev);
  ok = bw_in(dy4, w, (int64_t[]){2, 3, 10, 9}, 2, 0);
  CHECK(ok && graft_dim(ok, 2) == 10 && graft_dim(ok, 3) == 9);
  CHECK(fails_with(bw_in(dy4, w, (int64_t[]){2, 3, 11, 9}, 2, 0), S, fi, "[2,3,11,9]",
                   "[2,4,4,4]"));
  /* backward_weight: kernel size, a zero or negative dim, channels per groups */
  CHECK(fails_with(bw_w(x, dy, (int64_t[]){4, 3, 2, 2}, 1), S, fw, "[4,3,2,2]", "[2,4,5,5]"));
  CHECK(fails_with(bw_w(x, dy, (int64_t[]){4, 3, 3, 0}, 1), S, fw, "w_shape [4,3,3,0]", NULL));
  CHECK(fails_with(bw_w(x, dy, (int64_t[]){4, -3, 3, 3}, 1), S, fw, "w_shape [4,-3,3,3]", NULL));
  CHECK(fails_with(bw_w(x, dy, (int64_t[]){4, 1, 3, 3}, 3), S, fw, "[4,1,3,3]", "groups 3"));
  graft_scope_end();
}

/* The gradient helpers with an operand on another device fail naming both devices. */
TEST(mixed_devices_fail) {
  graft_scope_begin();
  int other = dev ? 0 : 1;
  int64_t xs[4] = {1, 2, 4, 4}, ws[4] = {3, 2, 3, 3}, ys[4] = {1, 3, 2, 2}, ps[4] = {1, 2, 2, 2};
  graft_tensor *x = graft_full_on(1, GRAFT_F32, 4, xs, dev),
               *w = graft_full_on(1, GRAFT_F32, 4, ws, other),
               *dy = graft_full_on(1, GRAFT_F32, 4, ys, dev),
               *pdy = graft_full_on(1, GRAFT_F32, 4, ps, other);
  char d0[32], d1[32];
  check_device_str(dev, d0, sizeof d0);
  check_device_str(other, d1, sizeof d1);
  CHECK(fails_with(graft_conv2d_backward_input(dy, w, xs, NULL, NULL, NULL, 1), GRAFT_ERR_DEVICE,
                   d0, d1, "graft_conv2d_backward_input"));
  CHECK(fails_with(graft_max_pool2d_backward(x, pdy, (int[]){2, 2}, NULL, NULL),
                   GRAFT_ERR_DEVICE, d0, d1, "graft_max_pool2d_backward"));
  graft_scope_end();
}

int main(void) {
  dev = check_test_device_for("test_grad");
  if (dev < 0) return 2;
  RUN(conv2d_gradients);
  RUN(max_pool2d_gradient);
  RUN(flip_pad_interior_argmin);
  RUN(conv2d_backward_shape_checks);
  RUN(mixed_devices_fail);
  graft_shutdown();
  return CHECK_DONE();
}
