/* Tests of the recurrent layers (src/api/rnn.c): graft_lstm against a plain C double LSTM written
 * here from PyTorch's equations (gates i,f,g,o), and graft_lstm_backward against central finite
 * differences of that reference, so the gradient check shares no code with what it checks.
 * f64 runs are held to ~1e-10, f32 to float rounding. Every test leaves no live tensor behind.
 * Inputs are made on GRAFT_TEST_DEVICE (default cpu:0; the Makefile runs the suite on cpu:1 too). */
#include "graft.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

static int dev;

static uint64_t lcg;
static double urand(double lo, double hi) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * ((double)(lcg >> 11) / 9007199254740992.0);
}
/* Values f32 holds exactly, so one reference serves f32 and f64. */
static void fill(double *v, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) v[i] = (float)urand(lo, hi);
}

static uint64_t live(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  return m.live_tensors;
}
#define LIVE_BEGIN uint64_t live0_ = live()
#define LIVE_END CHECK(live() == live0_)

static graft_tensor *mk(const double *v, graft_dtype dt, int nd, const int64_t *sh) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= sh[i];
  void *buf = malloc((size_t)n * 8 + 8);
  for (int64_t i = 0; i < n; i++) {
    if (dt == GRAFT_F32) ((float *)buf)[i] = (float)v[i];
    else ((double *)buf)[i] = v[i];
  }
  graft_tensor *t = graft_from_host(buf, dt, nd, sh, dev);
  free(buf);
  return t;
}

/* Compares t (n elements, f32/f64, on dev) with ref: |got-ref| <= tol*(1+|ref|). */
static void check_all(graft_tensor *t, const double *ref, int64_t n, double tol, const char *what) {
  if (!t || graft_numel(t) != n || graft_device(t) != dev) {
    fprintf(stderr, "  %s: missing or wrong size/device (%s)\n", what, graft_last_error());
    CHECK(0);
    return;
  }
  graft_dtype dt = graft_get_dtype(t);
  void *buf = malloc((size_t)n * 8 + 8);
  CHECK(graft_to_host(t, buf, (size_t)n * graft_dtype_size(dt)) == GRAFT_OK);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    double g = dt == GRAFT_F32 ? ((float *)buf)[i] : ((double *)buf)[i];
    if (!(fabs(g - ref[i]) <= tol * (1 + fabs(ref[i]))) && bad++ < 3)
      fprintf(stderr, "  %s[%lld] = %.9g, reference %.9g\n", what, (long long)i, g, ref[i]);
  }
  CHECK(bad == 0);
  free(buf);
}

/* ---- the reference: one LSTM layer in double, time-major [S,B,*] or batch-first [B,S,*] ---- */

typedef struct {
  int s, b, in, h;
  bool batch_first, bias, init; /* biases given; h0/c0 given */
  double *x, *w_ih, *w_hh, *b_ih, *b_hh, *h0, *c0; /* the inputs */
  double *y, *hn, *cn;                              /* the reference's outputs */
} lstm_case;

static double sigm(double v) { return 1 / (1 + exp(-v)); }

/* Index of (t, n, k) in a sequence tensor of last dim w. */
static int64_t seq_at(const lstm_case *c, int t, int n, int k, int w) {
  return c->batch_first ? ((int64_t)n * c->s + t) * w + k : ((int64_t)t * c->b + n) * w + k;
}

static void ref_forward(lstm_case *c) {
  int H = c->h;
  double *h = calloc((size_t)(c->b * H), sizeof *h), *cs = calloc((size_t)(c->b * H), sizeof *cs);
  double *gt = malloc(sizeof *gt * (size_t)(4 * H));
  if (c->init)
    for (int k = 0; k < c->b * H; k++) h[k] = c->h0[k], cs[k] = c->c0[k];
  for (int t = 0; t < c->s; t++) {
    double *hn = malloc(sizeof *hn * (size_t)(c->b * H));
    for (int n = 0; n < c->b; n++) {
      for (int r = 0; r < 4 * H; r++) {
        double a = c->bias ? c->b_ih[r] + c->b_hh[r] : 0;
        for (int k = 0; k < c->in; k++) a += c->w_ih[r * c->in + k] * c->x[seq_at(c, t, n, k, c->in)];
        for (int k = 0; k < H; k++) a += c->w_hh[r * H + k] * h[n * H + k];
        gt[r] = a;
      }
      for (int k = 0; k < H; k++) {
        double i = sigm(gt[k]), f = sigm(gt[H + k]), g = tanh(gt[2 * H + k]), o = sigm(gt[3 * H + k]);
        cs[n * H + k] = f * cs[n * H + k] + i * g;
        hn[n * H + k] = o * tanh(cs[n * H + k]);
        c->y[seq_at(c, t, n, k, H)] = hn[n * H + k];
      }
    }
    memcpy(h, hn, sizeof *h * (size_t)(c->b * H));
    free(hn);
  }
  memcpy(c->hn, h, sizeof *h * (size_t)(c->b * H));
  memcpy(c->cn, cs, sizeof *h * (size_t)(c->b * H));
  free(h), free(cs), free(gt);
}

/* The loss the gradient tests differentiate: sum(y*ry) + sum(hn*rh) + sum(cn*rc) with fixed
 * random weights (a NULL weight drops its term, as a NULL dy/dh_n/dc_n does in graft). */
static double ref_loss(lstm_case *c, const double *ry, const double *rh, const double *rc) {
  ref_forward(c);
  double l = 0;
  int64_t ny = (int64_t)c->s * c->b * c->h, nh = (int64_t)c->b * c->h;
  for (int64_t k = 0; ry && k < ny; k++) l += c->y[k] * ry[k];
  for (int64_t k = 0; rh && k < nh; k++) l += c->hn[k] * rh[k];
  for (int64_t k = 0; rc && k < nh; k++) l += c->cn[k] * rc[k];
  return l;
}

/* d loss / d v[k] for every k by central differences (the reference is double: step 1e-6). */
static void ref_fd(lstm_case *c, double *v, int64_t n, const double *ry, const double *rh,
                   const double *rc, double *out) {
  const double eps = 1e-6;
  for (int64_t k = 0; k < n; k++) {
    double keep = v[k];
    v[k] = keep + eps;
    double lp = ref_loss(c, ry, rh, rc);
    v[k] = keep - eps;
    double lm = ref_loss(c, ry, rh, rc);
    v[k] = keep;
    out[k] = (lp - lm) / (2 * eps);
  }
}

static lstm_case case_new(int s, int b, int in, int h, bool batch_first, bool bias, bool init,
                          uint64_t seed) {
  lstm_case c = {s, b, in, h, batch_first, bias, init, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  lcg = seed;
  int64_t nx = (int64_t)s * b * in, nh = (int64_t)b * h;
  c.x = malloc(sizeof(double) * (size_t)nx);
  c.w_ih = malloc(sizeof(double) * (size_t)(4 * h * in));
  c.w_hh = malloc(sizeof(double) * (size_t)(4 * h * h));
  c.b_ih = malloc(sizeof(double) * (size_t)(4 * h));
  c.b_hh = malloc(sizeof(double) * (size_t)(4 * h));
  c.h0 = malloc(sizeof(double) * (size_t)nh);
  c.c0 = malloc(sizeof(double) * (size_t)nh);
  c.y = malloc(sizeof(double) * (size_t)(s * b * h));
  c.hn = malloc(sizeof(double) * (size_t)nh);
  c.cn = malloc(sizeof(double) * (size_t)nh);
  fill(c.x, nx, -1, 1);
  fill(c.w_ih, 4 * h * in, -0.6, 0.6);
  fill(c.w_hh, 4 * h * h, -0.6, 0.6);
  fill(c.b_ih, 4 * h, -0.5, 0.5);
  fill(c.b_hh, 4 * h, -0.5, 0.5);
  fill(c.h0, nh, -0.8, 0.8);
  fill(c.c0, nh, -1.5, 1.5);
  return c;
}

static void case_free(lstm_case *c) {
  double *p[] = {c->x, c->w_ih, c->w_hh, c->b_ih, c->b_hh, c->h0, c->c0, c->y, c->hn, c->cn};
  for (size_t k = 0; k < sizeof p / sizeof *p; k++) free(p[k]);
}

/* The case's inputs as graft tensors: x, h0, c0, w_ih, w_hh, b_ih, b_hh (NULL when absent). */
static void case_tensors(const lstm_case *c, graft_dtype dt, graft_tensor **t) {
  int64_t xs[3] = {c->batch_first ? c->b : c->s, c->batch_first ? c->s : c->b, c->in};
  int64_t bh[2] = {c->b, c->h}, wi[2] = {4 * c->h, c->in}, wh[2] = {4 * c->h, c->h}, bv[1] = {4 * c->h};
  t[0] = mk(c->x, dt, 3, xs);
  t[1] = c->init ? mk(c->h0, dt, 2, bh) : NULL;
  t[2] = c->init ? mk(c->c0, dt, 2, bh) : NULL;
  t[3] = mk(c->w_ih, dt, 2, wi);
  t[4] = mk(c->w_hh, dt, 2, wh);
  t[5] = c->bias ? mk(c->b_ih, dt, 1, bv) : NULL;
  t[6] = c->bias ? mk(c->b_hh, dt, 1, bv) : NULL;
}

static void release_all(graft_tensor **t, int n) {
  for (int k = 0; k < n; k++) graft_release(t[k]);
}

/* ---- forward ---- */

static void forward_case(int s, int b, int in, int h, bool bf, bool bias, bool init) {
  lstm_case c = case_new(s, b, in, h, bf, bias, init, 7 + (uint64_t)(s * 131 + b * 17 + bf * 3 + bias + init * 2));
  ref_forward(&c);
  graft_dtype dts[2] = {GRAFT_F64, GRAFT_F32};
  double tols[2] = {1e-12, 2e-6};
  for (int k = 0; k < 2; k++) {
    graft_tensor *t[7], *out[4];
    case_tensors(&c, dts[k], t);
    CHECK(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], bf, out) == GRAFT_OK);
    int64_t ys[3] = {bf ? b : s, bf ? s : b, h}, ss[3] = {s, b, 5 * h};
    int64_t got[GRAFT_MAX_DIMS];
    CHECK(graft_shape(out[0], got) == 3 && got[0] == ys[0] && got[1] == ys[1] && got[2] == ys[2]);
    CHECK(graft_shape(out[3], got) == 3 && got[0] == ss[0] && got[1] == ss[1] && got[2] == ss[2]);
    CHECK(graft_get_dtype(out[0]) == dts[k]);
    check_all(out[0], c.y, (int64_t)s * b * h, tols[k], "y");
    check_all(out[1], c.hn, (int64_t)b * h, tols[k], "h_n");
    check_all(out[2], c.cn, (int64_t)b * h, tols[k], "c_n");
    release_all(out, 4);
    release_all(t, 7);
  }
  case_free(&c);
}

TEST(lstm_forward_matches_reference) {
  LIVE_BEGIN;
  for (int v = 0; v < 8; v++) forward_case(5, 3, 4, 3, v & 1, (v >> 1) & 1, (v >> 2) & 1);
  forward_case(1, 1, 1, 1, false, true, true); /* one step, one of everything */
  forward_case(7, 2, 5, 6, true, true, false);
  forward_case(20, 2, 3, 4, false, true, true); /* stacked through nested concats of 8 */
  forward_case(70, 1, 2, 2, true, true, true);  /* two levels: groups of 64 */
  LIVE_END;
}

/* ---- backward against finite differences ---- */

/* Checks graft_lstm_backward (dtype dt) against the reference's finite differences; which
 * selects the terms of the loss: 1 dy, 2 dh_n, 4 dc_n. */
static void backward_case(lstm_case *c, graft_dtype dt, int which, double tol) {
  int64_t ny = (int64_t)c->s * c->b * c->h, nh = (int64_t)c->b * c->h;
  double *ry = malloc(sizeof(double) * (size_t)ny), *rh = malloc(sizeof(double) * (size_t)nh),
         *rc = malloc(sizeof(double) * (size_t)nh);
  fill(ry, ny, -1, 1), fill(rh, nh, -1, 1), fill(rc, nh, -1, 1);
  const double *wy = which & 1 ? ry : NULL, *wh = which & 2 ? rh : NULL, *wc = which & 4 ? rc : NULL;

  graft_tensor *t[7], *fw[4], *bw[6];
  case_tensors(c, dt, t);
  CHECK(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], c->batch_first, fw) == GRAFT_OK);
  int64_t ys[3] = {c->batch_first ? c->b : c->s, c->batch_first ? c->s : c->b, c->h}, bh[2] = {c->b, c->h};
  graft_tensor *g[3] = {wy ? mk(wy, dt, 3, ys) : NULL, wh ? mk(wh, dt, 2, bh) : NULL,
                        wc ? mk(wc, dt, 2, bh) : NULL};
  CHECK(graft_lstm_backward(t[0], t[1], t[2], t[3], t[4], fw[0], fw[3], g[0], g[1], g[2],
                            c->batch_first, bw) == GRAFT_OK);

  /* each input's finite differences against its graft gradient */
  double *vs[6] = {c->x, c->h0, c->c0, c->w_ih, c->w_hh, c->b_ih};
  int64_t ns[6] = {(int64_t)c->s * c->b * c->in, nh, nh, 4 * c->h * c->in, 4 * c->h * c->h, 4 * c->h};
  static const char *names[6] = {"dx", "dh0", "dc0", "dw_ih", "dw_hh", "db"};
  for (int k = 0; k < 6; k++) {
    if ((k == 1 || k == 2) && !c->init) continue; /* no h0/c0: nothing to perturb */
    if (k == 5 && !c->bias) continue;
    double *fd = malloc(sizeof(double) * (size_t)ns[k]);
    ref_fd(c, vs[k], ns[k], wy, wh, wc, fd);
    check_all(bw[k], fd, ns[k], tol, names[k]);
    free(fd);
  }
  release_all(bw, 6);
  release_all(g, 3);
  release_all(fw, 4);
  release_all(t, 7);
  free(ry), free(rh), free(rc);
}

TEST(lstm_backward_matches_finite_differences) {
  LIVE_BEGIN;
  for (int v = 0; v < 8; v++) {
    lstm_case c = case_new(4, 3, 3, 2, v & 1, (v >> 1) & 1, (v >> 2) & 1, 100 + (uint64_t)v);
    backward_case(&c, GRAFT_F64, 7, 1e-7);
    case_free(&c);
  }
  LIVE_END;
}

TEST(lstm_backward_partial_gradients) {
  LIVE_BEGIN;
  lstm_case c = case_new(3, 2, 3, 3, false, true, true, 55);
  for (int which = 1; which < 7; which++) backward_case(&c, GRAFT_F64, which, 1e-7);
  case_free(&c);
  lstm_case long_seq = case_new(11, 1, 2, 2, false, true, true, 57); /* stacked in groups */
  backward_case(&long_seq, GRAFT_F64, 7, 1e-7);
  case_free(&long_seq);
  lstm_case one = case_new(1, 2, 2, 2, true, true, true, 56); /* a single step */
  backward_case(&one, GRAFT_F64, 7, 1e-7);
  backward_case(&one, GRAFT_F64, 4, 1e-7);
  case_free(&one);
  LIVE_END;
}

TEST(lstm_backward_f32) {
  LIVE_BEGIN;
  lstm_case c = case_new(6, 3, 4, 5, true, true, true, 77);
  backward_case(&c, GRAFT_F32, 7, 2e-4); /* float32 rounding against double differences */
  case_free(&c);
  LIVE_END;
}

/* No gradient flows in at all: every gradient is zero (and defined). */
TEST(lstm_backward_no_incoming_gradient) {
  LIVE_BEGIN;
  lstm_case c = case_new(3, 2, 2, 2, false, false, false, 9);
  graft_tensor *t[7], *fw[4], *bw[6];
  case_tensors(&c, GRAFT_F64, t);
  CHECK(graft_lstm(t[0], NULL, NULL, t[3], t[4], NULL, NULL, false, fw) == GRAFT_OK);
  CHECK(graft_lstm_backward(t[0], NULL, NULL, t[3], t[4], fw[0], fw[3], NULL, NULL, NULL, false, bw) == GRAFT_OK);
  double zeros[64] = {0};
  check_all(bw[0], zeros, 12, 0, "dx");
  check_all(bw[4], zeros, 16, 0, "dw_hh");
  release_all(bw, 6);
  release_all(fw, 4);
  release_all(t, 7);
  case_free(&c);
  LIVE_END;
}

/* ---- errors ---- */

static bool err_is(graft_status got, graft_status st, const char *fn, const char *part) {
  bool ok = got == st && graft_last_status() == st && strstr(graft_last_error(), fn) &&
            (!part || strstr(graft_last_error(), part));
  if (!ok)
    fprintf(stderr, "  expected status %d from %s naming '%s', got %d: %s\n", (int)st, fn,
            part ? part : "", (int)graft_last_status(), graft_last_error());
  graft_clear_error();
  return ok;
}

TEST(lstm_errors) {
  LIVE_BEGIN;
  lstm_case c = case_new(3, 2, 4, 3, false, true, true, 11);
  graft_tensor *t[7], *out[6];
  case_tensors(&c, GRAFT_F32, t);
  const char *fn = "graft_lstm";
  /* swapped weights: w_ih [12,4] given as w_hh */
  CHECK(err_is(graft_lstm(t[0], t[1], t[2], t[4], t[3], t[5], t[6], false, out), GRAFT_ERR_SHAPE, fn,
               "w_hh shape [12,4] must be [4H,H]"));
  CHECK(out[0] == NULL && out[3] == NULL);
  /* x read as batch_first: B = 3, but h0 is [2,3] */
  CHECK(err_is(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], true, out), GRAFT_ERR_SHAPE, fn, "h0 shape [2,3]"));
  /* a bias of the wrong length */
  CHECK(err_is(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[2], t[6], false, out), GRAFT_ERR_SHAPE, fn, "b_ih"));
  /* NULL x, NULL out */
  CHECK(err_is(graft_lstm(NULL, t[1], t[2], t[3], t[4], t[5], t[6], false, out), GRAFT_ERR_NULL, fn, "x"));
  CHECK(err_is(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], false, NULL), GRAFT_ERR_NULL, fn, "out"));
  /* a 2-D x */
  int64_t sh2[2] = {3, 4};
  graft_tensor *x2 = mk(c.x, GRAFT_F32, 2, sh2);
  CHECK(err_is(graft_lstm(x2, NULL, NULL, t[3], t[4], NULL, NULL, false, out), GRAFT_ERR_SHAPE, fn, "x shape [3,4]"));
  graft_release(x2);
  /* dtypes: f64 weights with f32 x; an integer x */
  int64_t wh[2] = {12, 3};
  graft_tensor *w64 = mk(c.w_hh, GRAFT_F64, 2, wh);
  CHECK(err_is(graft_lstm(t[0], NULL, NULL, t[3], w64, NULL, NULL, false, out), GRAFT_ERR_DTYPE, fn, "w_hh has dtype f64"));
  graft_release(w64);
  int64_t xs[3] = {3, 2, 4};
  graft_tensor *xi = graft_zeros_on(GRAFT_I32, 3, xs, dev);
  CHECK(err_is(graft_lstm(xi, NULL, NULL, t[3], t[4], NULL, NULL, false, out), GRAFT_ERR_DTYPE, fn, "i32"));
  graft_release(xi);
  /* another device */
  int other = dev == 0 ? 1 : 0;
  graft_tensor *wo = graft_to_device(t[4], other);
  CHECK(err_is(graft_lstm(t[0], NULL, NULL, t[3], wo, NULL, NULL, false, out), GRAFT_ERR_DEVICE, fn, "w_hh is on"));
  graft_release(wo);
  /* backward: a state that is not graft_lstm's */
  graft_tensor *fw[4];
  CHECK(graft_lstm(t[0], t[1], t[2], t[3], t[4], t[5], t[6], false, fw) == GRAFT_OK);
  CHECK(err_is(graft_lstm_backward(t[0], t[1], t[2], t[3], t[4], fw[0], fw[0], NULL, fw[1], NULL, false, out),
               GRAFT_ERR_SHAPE, "graft_lstm_backward", "state shape [3,2,3]"));
  CHECK(err_is(graft_lstm_backward(t[0], t[1], t[2], t[3], t[4], fw[0], fw[3], fw[3], NULL, NULL, false, out),
               GRAFT_ERR_SHAPE, "graft_lstm_backward", "dy"));
  release_all(fw, 4);
  release_all(t, 7);
  case_free(&c);
  LIVE_END;
}

int main(void) {
  dev = check_test_device_for("test_rnn");
  if (dev < 0) return 2;
  RUN(lstm_forward_matches_reference);
  RUN(lstm_backward_matches_finite_differences);
  RUN(lstm_backward_partial_gradients);
  RUN(lstm_backward_f32);
  RUN(lstm_backward_no_incoming_gradient);
  RUN(lstm_errors);
  graft_shutdown();
  return CHECK_DONE();
}
