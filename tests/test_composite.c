/* Tests of the composite ops (src/api/composite.c) against plain C double loops computed here,
 * independently of graft, plus hand-checked values and error cases. Every test also checks that
 * it leaves no live tensor behind (the composites release their intermediates). The inputs are
 * made on cpu:GRAFT_TEST_DEVICE (default 0; the Makefile runs the suite on cpu:0 and cpu:1) and
 * every result read must be on that device. */
#include "graft.h"
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

/* ---- helpers ---- */

static int dev; /* the device of every input (GRAFT_TEST_DEVICE) */

static uint64_t lcg;
static void lcg_seed(uint64_t s) { lcg = s; }
static double urand(double lo, double hi) {
  lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
  return lo + (hi - lo) * ((double)(lcg >> 11) / 9007199254740992.0);
}
/* Random values that f32 holds exactly, so one reference serves both f32 and f64. */
static void fill(double *v, int64_t n, double lo, double hi) {
  for (int64_t i = 0; i < n; i++) v[i] = (float)urand(lo, hi);
}

static int64_t numel_of(int nd, const int64_t *sh) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= sh[i];
  return n;
}

/* A tensor of dtype dt from double values (converted on the host). */
static graft_tensor *mk(const double *v, graft_dtype dt, int nd, const int64_t *sh) {
  int64_t n = numel_of(nd, sh);
  size_t es = graft_dtype_size(dt);
  void *buf = malloc((size_t)(n ? n : 1) * es);
  for (int64_t i = 0; i < n; i++) {
    switch (dt) {
    case GRAFT_F32: ((float *)buf)[i] = (float)v[i]; break;
    case GRAFT_F64: ((double *)buf)[i] = v[i]; break;
    case GRAFT_I32: ((int32_t *)buf)[i] = (int32_t)v[i]; break;
    case GRAFT_I64: ((int64_t *)buf)[i] = (int64_t)v[i]; break;
    default: break;
    }
  }
  graft_tensor *t = graft_from_host(buf, dt, nd, sh, dev);
  free(buf);
  return t;
}

/* Reads t (f32/f64/i32/i64) into out[n] as doubles; false if t is NULL, the wrong size or fails. */
static bool get(graft_tensor *t, double *out, int64_t n) {
  if (!t || graft_numel(t) != n) return false;
  if (graft_device(t) != dev) {
    char a[32], b[32];
    fprintf(stderr, "  result on %s, inputs on %s\n", check_device_str(graft_device(t), a, sizeof a),
            check_device_str(dev, b, sizeof b));
    return false;
  }
  graft_dtype dt = graft_get_dtype(t);
  size_t es = graft_dtype_size(dt);
  void *buf = malloc((size_t)(n ? n : 1) * es);
  bool ok = graft_to_host(t, buf, (size_t)n * es) == GRAFT_OK;
  for (int64_t i = 0; ok && i < n; i++) {
    switch (dt) {
    case GRAFT_F32: out[i] = ((float *)buf)[i]; break;
    case GRAFT_F64: out[i] = ((double *)buf)[i]; break;
    case GRAFT_I32: out[i] = ((int32_t *)buf)[i]; break;
    case GRAFT_I64: out[i] = (double)((int64_t *)buf)[i]; break;
    default: ok = false; break;
    }
  }
  free(buf);
  return ok;
}

/* Checks t's shape. */
static bool shape_is(graft_tensor *t, int nd, const int64_t *sh) {
  int64_t s[GRAFT_MAX_DIMS];
  if (!t || graft_shape(t, s) != nd) return false;
  for (int i = 0; i < nd; i++)
    if (s[i] != sh[i]) return false;
  return true;
}

static uint64_t live(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  return m.live_tensors;
}

/* Every test runs between these: no tensor may outlive it. */
#define LIVE_BEGIN uint64_t live0_ = live()
#define LIVE_END CHECK(live() == live0_)

/* Compares t (n elements) with ref within tol. */
static void check_all(graft_tensor *t, const double *ref, int64_t n, double tol) {
  double *got = malloc((size_t)n * sizeof(double) + 1);
  bool ok = get(t, got, n);
  CHECK(ok);
  if (!ok) fprintf(stderr, "  (%s)\n", graft_last_error());
  for (int64_t i = 0; ok && i < n; i++) CHECK_NEAR(got[i], ref[i], tol);
  free(got);
}

/* An error of status st whose message names fn. */
static bool err_is(graft_status st, const char *fn) {
  bool ok = graft_last_status() == st && strstr(graft_last_error(), fn) != NULL;
  if (!ok)
    fprintf(stderr, "  expected status %d from %s, got %d: %s\n", (int)st, fn,
            (int)graft_last_status(), graft_last_error());
  graft_clear_error();
  return ok;
}

/* ---- relu / gelu ---- */

TEST(relu_values) {
  LIVE_BEGIN;
  double v[5] = {-1.5, 0.0, 2.5, -0.0, 7.0}, ref[5] = {0, 0, 2.5, 0, 7};
  int64_t sh[1] = {5};
  graft_tensor *x = mk(v, GRAFT_F32, 1, sh);
  graft_tensor *y = graft_relu(x);
  CHECK(shape_is(y, 1, sh) && graft_get_dtype(y) == GRAFT_F32);
  check_all(y, ref, 5, 0);
  graft_release(y);
  graft_release(x);

  /* integers too */
  double vi[4] = {-3, 4, 0, -7}, refi[4] = {0, 4, 0, 0};
  int64_t shi[2] = {2, 2};
  x = mk(vi, GRAFT_I32, 2, shi);
  y = graft_relu(x);
  CHECK(graft_get_dtype(y) == GRAFT_I32);
  check_all(y, refi, 4, 0);
  graft_release(y);
  graft_release(x);
  LIVE_END;
}

static double gelu_erf_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

TEST(gelu_both_forms) {
  LIVE_BEGIN;
  enum { N = 64 };
  double v[N], r1[N], r2[N];
  lcg_seed(1);
  fill(v, N, -5, 5);
  v[0] = 0;
  v[1] = 1;
  for (int i = 0; i < N; i++) r1[i] = gelu_erf_ref(v[i]), r2[i] = gelu_tanh_ref(v[i]);
  /* hand-checked: gelu(1) = 0.5*(1+erf(1/sqrt2)) = 0.841344746... */
  CHECK_NEAR(r1[1], 0.8413447460685429, 1e-15);
  int64_t sh[2] = {8, 8};
  graft_dtype dts[2] = {GRAFT_F64, GRAFT_F32};
  double tols[2] = {1e-12, 2e-6};
  for (int k = 0; k < 2; k++) {
    graft_tensor *x = mk(v, dts[k], 2, sh);
    graft_tensor *a = graft_gelu(x, false), *b = graft_gelu(x, true);
    CHECK(shape_is(a, 2, sh) && shape_is(b, 2, sh));
    CHECK(graft_get_dtype(a) == dts[k]);
    check_all(a, r1, N, tols[k]);
    check_all(b, r2, N, tols[k]);
    graft_release(a);
    graft_release(b);
    graft_release(x);
  }
  LIVE_END;
}

/* ---- softmax family ---- */

/* Reference (log_)softmax along axis of a [R,C] row-major matrix. */
static void softmax_ref(const double *x, double *y, int r, int c, int axis, bool log_form) {
  int outer = axis == 1 ? r : c, len = axis == 1 ? c : r;
  for (int o = 0; o < outer; o++) {
#define AT(i) (axis == 1 ? o * c + (i) : (i) * c + o)
    double m = -INFINITY, s = 0;
    for (int i = 0; i < len; i++) m = fmax(m, x[AT(i)]);
    for (int i = 0; i < len; i++) s += exp(x[AT(i)] - m);
    for (int i = 0; i < len; i++)
      y[AT(i)] = log_form ? x[AT(i)] - m - log(s) : exp(x[AT(i)] - m) / s;
#undef AT
  }
}

TEST(softmax_values) {
  LIVE_BEGIN;
  enum { R = 4, C = 7 };
  double v[R * C], ref[R * C], got[R * C];
  lcg_seed(2);
  fill(v, R * C, -3, 3);
  int64_t sh[2] = {R, C};
  graft_tensor *x = mk(v, GRAFT_F64, 2, sh);
  int axes[3] = {1, 0, -1};
  for (int k = 0; k < 3; k++) {
    int ax = axes[k] < 0 ? axes[k] + 2 : axes[k];
    softmax_ref(v, ref, R, C, ax, false);
    graft_tensor *y = graft_softmax(x, axes[k]);
    CHECK(shape_is(y, 2, sh));
    check_all(y, ref, R * C, 1e-12);
    graft_release(y);
  }
  /* rows sum to 1 */
  graft_tensor *y = graft_softmax(x, 1);
  CHECK(get(y, got, R * C));
  for (int i = 0; i < R; i++) {
    double s = 0;
    for (int j = 0; j < C; j++) s += got[i * C + j];
    CHECK_NEAR(s, 1.0, 1e-12);
  }
  graft_release(y);
  graft_release(x);

  /* hand-checked: softmax([1,2,3]) in f32 */
  double h[3] = {1, 2, 3}, href[3] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219};
  int64_t sh3[1] = {3};
  x = mk(h, GRAFT_F32, 1, sh3);
  y = graft_softmax(x, 0);
  check_all(y, href, 3, 1e-6);
  graft_release(y);
  graft_release(x);

  /* a 0-d tensor is one element: softmax 1, log_softmax 0 */
  double five = 5;
  x = mk(&five, GRAFT_F32, 0, sh3);
  y = graft_softmax(x, -1);
  graft_tensor *z = graft_log_softmax(x, 0);
  CHECK(graft_ndim(y) == 0 && graft_ndim(z) == 0);
  double one = 1, zero = 0;
  check_all(y, &one, 1, 1e-7);
  check_all(z, &zero, 1, 1e-7);
  graft_release(y);
  graft_release(z);
  graft_release(x);
  LIVE_END;
}

TEST(log_softmax_values) {
  LIVE_BEGIN;
  enum { R = 5, C = 6 };
  double v[R * C], ref[R * C];
  lcg_seed(3);
  fill(v, R * C, -4, 4);
  int64_t sh[2] = {R, C};
  graft_tensor *x = mk(v, GRAFT_F64, 2, sh);
  for (int ax = 0; ax < 2; ax++) {
    softmax_ref(v, ref, R, C, ax, true);
    graft_tensor *y = graft_log_softmax(x, ax);
    check_all(y, ref, R * C, 1e-12);
    graft_release(y);
  }
  graft_release(x);

  /* large inputs stay finite: exp(1000) overflows, the shifted form does not */
  double big[6] = {1000, 1001, 1002, -1000, -1001, -1002};
  double bref[6] = {-2.4076059644443806, -1.4076059644443804, -0.4076059644443804,
                    -0.4076059644443804, -1.4076059644443804, -2.4076059644443806};
  int64_t sh2[2] = {2, 3};
  graft_dtype dts[2] = {GRAFT_F32, GRAFT_F64};
  for (int k = 0; k < 2; k++) {
    x = mk(big, dts[k], 2, sh2);
    graft_tensor *y = graft_log_softmax(x, 1), *s = graft_softmax(x, 1);
    double got[6];
    CHECK(get(y, got, 6));
    for (int i = 0; i < 6; i++) CHECK(isfinite(got[i]));
    check_all(y, bref, 6, 1e-5);
    for (int i = 0; i < 6; i++) bref[i] = exp(bref[i]);
    check_all(s, bref, 6, 1e-6);
    for (int i = 0; i < 6; i++) bref[i] = log(bref[i]);
    graft_release(y);
    graft_release(s);
    graft_release(x);
  }
  LIVE_END;
}

/* ---- mean ---- */

TEST(mean_values) {
  LIVE_BEGIN;
  enum { R = 3, C = 4 };
  double v[R * C];
  lcg_seed(4);
  fill(v, R * C, -2, 2);
  int64_t sh[2] = {R, C};
  graft_tensor *x = mk(v, GRAFT_F64, 2, sh);

  double rows[R], cols[C], all = 0;
  for (int i = 0; i < R; i++) {
    rows[i] = 0;
    for (int j = 0; j < C; j++) rows[i] += v[i * C + j] / C;
  }
  for (int j = 0; j < C; j++) {
    cols[j] = 0;
    for (int i = 0; i < R; i++) cols[j] += v[i * C + j] / R;
  }
  for (int i = 0; i < R * C; i++) all += v[i] / (R * C);

  int a1[1] = {1}, am1[1] = {-1}, a0[1] = {0}, a01[2] = {0, 1};
  int64_t s_r[1] = {R}, s_1c[2] = {1, C};
  graft_tensor *y = graft_mean(x, a1, 1, false);
  CHECK(shape_is(y, 1, s_r));
  check_all(y, rows, R, 1e-12);
  graft_release(y);
  y = graft_mean(x, am1, 1, false);
  check_all(y, rows, R, 1e-12);
  graft_release(y);
  y = graft_mean(x, a0, 1, true);
  CHECK(shape_is(y, 2, s_1c));
  check_all(y, cols, C, 1e-12);
  graft_release(y);
  y = graft_mean(x, NULL, 0, false);
  CHECK(graft_ndim(y) == 0);
  check_all(y, &all, 1, 1e-12);
  graft_release(y);
  y = graft_mean(x, a01, 2, false);
  check_all(y, &all, 1, 1e-12);
  graft_release(y);
  graft_release(x);

  /* hand-checked f32 */
  double h[4] = {1, 2, 3, 6}, hm = 3;
  int64_t sh4[1] = {4};
  x = mk(h, GRAFT_F32, 1, sh4);
  y = graft_mean(x, NULL, 0, false);
  check_all(y, &hm, 1, 0);
  graft_release(y);
  graft_release(x);
  LIVE_END;
}

/* ---- normalization ---- */

TEST(layer_norm_values) {
  LIVE_BEGIN;
  enum { R = 3, D = 5 };
  double v[R * D], w[D], b[D], ref[R * D], ref_plain[R * D];
  lcg_seed(5);
  fill(v, R * D, -3, 3);
  fill(w, D, 0.5, 1.5);
  fill(b, D, -1, 1);
  double eps = 1e-5;
  for (int i = 0; i < R; i++) {
    double mu = 0, var = 0;
    for (int j = 0; j < D; j++) mu += v[i * D + j] / D;
    for (int j = 0; j < D; j++) var += (v[i * D + j] - mu) * (v[i * D + j] - mu) / D;
    for (int j = 0; j < D; j++) {
      ref_plain[i * D + j] = (v[i * D + j] - mu) / sqrt(var + eps);
      ref[i * D + j] = ref_plain[i * D + j] * w[j] + b[j];
    }
  }
  int64_t sh[2] = {R, D}, shd[1] = {D};
  graft_dtype dts[2] = {GRAFT_F64, GRAFT_F32};
  double tols[2] = {1e-12, 1e-5};
  for (int k = 0; k < 2; k++) {
    graft_tensor *x = mk(v, dts[k], 2, sh), *tw = mk(w, dts[k], 1, shd), *tb = mk(b, dts[k], 1, shd);
    graft_tensor *y = graft_layer_norm(x, tw, tb, eps);
    CHECK(shape_is(y, 2, sh));
    check_all(y, ref, R * D, tols[k]);
    graft_release(y);
    y = graft_layer_norm(x, NULL, NULL, eps);
    check_all(y, ref_plain, R * D, tols[k]);
    graft_release(y);
    graft_release(x);
    graft_release(tw);
    graft_release(tb);
  }

  /* hand-checked: [1,3] -> mean 2, var 1 -> [-1,1]/sqrt(1+eps) */
  double h[2] = {1, 3}, href[2] = {-1 / sqrt(1 + eps), 1 / sqrt(1 + eps)};
  int64_t sh2[2] = {1, 2};
  graft_tensor *x = mk(h, GRAFT_F64, 2, sh2);
  graft_tensor *y = graft_layer_norm(x, NULL, NULL, eps);
  check_all(y, href, 2, 1e-12);
  graft_release(y);
  graft_release(x);
  LIVE_END;
}

TEST(batch_norm_train_and_eval) {
  LIVE_BEGIN;
  enum { N = 4, C = 3, H = 2, W = 2 };
  double v[N * C * H * W], w[C], b[C], rm[C], rv[C];
  double ref_tr[N * C * H * W], ref_ev[N * C * H * W], ref_tr_plain[N * C * H * W];
  lcg_seed(6);
  fill(v, N * C * H * W, -2, 3);
  fill(w, C, 0.5, 2);
  fill(b, C, -1, 1);
  fill(rm, C, -0.5, 0.5);
  fill(rv, C, 0.5, 2);
  double eps = 1e-5;
  for (int c = 0; c < C; c++) {
    double mu = 0, var = 0, cnt = N * H * W;
#define IDX(n, c, i) (((n) * C + (c)) * H * W + (i))
    for (int n = 0; n < N; n++)
      for (int i = 0; i < H * W; i++) mu += v[IDX(n, c, i)] / cnt;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < H * W; i++) var += (v[IDX(n, c, i)] - mu) * (v[IDX(n, c, i)] - mu) / cnt;
    for (int n = 0; n < N; n++)
      for (int i = 0; i < H * W; i++) {
        double xv = v[IDX(n, c, i)];
        ref_tr_plain[IDX(n, c, i)] = (xv - mu) / sqrt(var + eps);
        ref_tr[IDX(n, c, i)] = ref_tr_plain[IDX(n, c, i)] * w[c] + b[c];
        ref_ev[IDX(n, c, i)] = (xv - rm[c]) / sqrt(rv[c] + eps) * w[c] + b[c];
      }
#undef IDX
  }
  int64_t sh[4] = {N, C, H, W}, shc[1] = {C};
  graft_tensor *x = mk(v, GRAFT_F64, 4, sh), *tw = mk(w, GRAFT_F64, 1, shc),
               *tb = mk(b, GRAFT_F64, 1, shc), *trm = mk(rm, GRAFT_F64, 1, shc),
               *trv = mk(rv, GRAFT_F64, 1, shc);
  graft_tensor *y = graft_batch_norm(x, tw, tb, trm, trv, true, eps);
  CHECK(shape_is(y, 4, sh));
  check_all(y, ref_tr, N * C * H * W, 1e-12);
  graft_release(y);
  /* training needs no running statistics, nor weight/bias */
  y = graft_batch_norm(x, NULL, NULL, NULL, NULL, true, eps);
  check_all(y, ref_tr_plain, N * C * H * W, 1e-12);
  graft_release(y);
  y = graft_batch_norm(x, tw, tb, trm, trv, false, eps);
  CHECK(shape_is(y, 4, sh));
  check_all(y, ref_ev, N * C * H * W, 1e-12);
  graft_release(y);
  graft_release(x);

  /* [N,C] input in f32, training: per-column standardization */
  double v2[6] = {1, 10, 3, 20, 5, 60};
  double r2[6] = {-1.224744871391589, -0.9258200997725514, 0, -0.4629100498862757,
                  1.224744871391589, 1.3887301496588271};
  int64_t sh2[2] = {3, 2}, sh2c[1] = {2};
  double w2[2] = {1, 1}, b2[2] = {0, 0};
  graft_tensor *x2 = mk(v2, GRAFT_F32, 2, sh2), *w2t = mk(w2, GRAFT_F32, 1, sh2c),
               *b2t = mk(b2, GRAFT_F32, 1, sh2c);
  y = graft_batch_norm(x2, w2t, b2t, NULL, NULL, true, 0.0);
  check_all(y, r2, 6, 1e-5);
  graft_release(y);
  graft_release(x2);
  graft_release(w2t);
  graft_release(b2t);
  graft_release(tw);
  graft_release(tb);
  graft_release(trm);
  graft_release(trv);
  LIVE_END;
}

/* ---- linear ---- */

TEST(linear_values) {
  LIVE_BEGIN;
  enum { B = 2, M = 5, K = 4, O = 3 };
  double v[B * M * K], w[O * K], b[O], ref[B * M * O], refnb[B * M * O];
  lcg_seed(7);
  fill(v, B * M * K, -1, 1);
  fill(w, O * K, -1, 1);
  fill(b, O, -1, 1);
  for (int r = 0; r < B * M; r++)
    for (int o = 0; o < O; o++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += v[r * K + k] * w[o * K + k];
      refnb[r * O + o] = s;
      ref[r * O + o] = s + b[o];
    }
  int64_t sw[2] = {O, K}, sb[1] = {O}, sx2[2] = {M, K}, sx3[3] = {B, M, K}, so2[2] = {M, O},
          so3[3] = {B, M, O}, sx1[1] = {K}, so1[1] = {O};
  graft_dtype dts[2] = {GRAFT_F64, GRAFT_F32};
  double tols[2] = {1e-12, 1e-5};
  for (int k = 0; k < 2; k++) {
    graft_tensor *tw = mk(w, dts[k], 2, sw), *tb = mk(b, dts[k], 1, sb);
    graft_tensor *x2 = mk(v, dts[k], 2, sx2), *x3 = mk(v, dts[k], 3, sx3), *x1 = mk(v, dts[k], 1, sx1);
    graft_tensor *y = graft_linear(x2, tw, tb);
    CHECK(shape_is(y, 2, so2));
    check_all(y, ref, M * O, tols[k]);
    graft_release(y);
    y = graft_linear(x2, tw, NULL);
    check_all(y, refnb, M * O, tols[k]);
    graft_release(y);
    y = graft_linear(x3, tw, tb);
    CHECK(shape_is(y, 3, so3));
    check_all(y, ref, B * M * O, tols[k]);
    graft_release(y);
    y = graft_linear(x1, tw, tb);
    CHECK(shape_is(y, 1, so1));
    check_all(y, ref, O, tols[k]);
    graft_release(y);
    graft_release(x1);
    graft_release(x2);
    graft_release(x3);
    graft_release(tw);
    graft_release(tb);
  }
  LIVE_END;
}

/* ---- cross entropy ---- */

TEST(cross_entropy_values) {
  LIVE_BEGIN;
  enum { N = 4, C = 10 };
  double l[N * C], t[N] = {3, 0, 9, 3}, ref = 0;
  lcg_seed(8);
  fill(l, N * C, -3, 3);
  for (int n = 0; n < N; n++) {
    double m = -INFINITY, s = 0;
    for (int c = 0; c < C; c++) m = fmax(m, l[n * C + c]);
    for (int c = 0; c < C; c++) s += exp(l[n * C + c] - m);
    ref += (m + log(s) - l[n * C + (int)t[n]]) / N;
  }
  int64_t sl[2] = {N, C}, st[1] = {N};
  graft_dtype ldt[2] = {GRAFT_F64, GRAFT_F32}, tdt[2] = {GRAFT_I64, GRAFT_I32};
  double tols[2] = {1e-12, 1e-5};
  for (int k = 0; k < 2; k++) {
    graft_tensor *tl = mk(l, ldt[k], 2, sl), *tt = mk(t, tdt[k], 1, st);
    graft_tensor *y = graft_cross_entropy(tl, tt);
    CHECK(y && graft_ndim(y) == 0 && graft_get_dtype(y) == ldt[k]);
    double got;
    CHECK(graft_item(y, &got) == GRAFT_OK);
    CHECK_NEAR(got, ref, tols[k]);
    graft_release(y);
    graft_release(tl);
    graft_release(tt);
  }

  /* hand-checked: uniform logits over 2 classes -> log 2; confident right answer -> ~0 */
  double h[4] = {0, 0, 20, 0}, ht[2] = {1, 0};
  double href = (log(2.0) + log(1 + exp(-20.0))) / 2;
  int64_t sh[2] = {2, 2}, sht[1] = {2};
  graft_tensor *tl = mk(h, GRAFT_F64, 2, sh), *tt = mk(ht, GRAFT_I32, 1, sht);
  graft_tensor *y = graft_cross_entropy(tl, tt);
  check_all(y, &href, 1, 1e-12);
  graft_release(y);
  graft_release(tl);
  graft_release(tt);
  LIVE_END;
}

/* ---- dropout ---- */

TEST(dropout_identity) {
  LIVE_BEGIN;
  double v[6] = {1, -2, 3, -4, 5, 0};
  int64_t sh[2] = {2, 3};
  graft_tensor *x = mk(v, GRAFT_F32, 2, sh);
  graft_tensor *a = graft_dropout(x, 0.0, true), *b = graft_dropout(x, 0.5, false);
  CHECK(shape_is(a, 2, sh) && shape_is(b, 2, sh));
  check_all(a, v, 6, 0);
  check_all(b, v, 6, 0);
  graft_release(a);
  graft_release(b);
  graft_release(x);
  LIVE_END;
}

/* Counts zeros in a dropout of 3.0s and checks the rest are exactly 3/(1-p). */
static int dropout_count(graft_tensor *x, double p, int n, double *out) {
  graft_tensor *y = graft_dropout(x, p, true);
  CHECK(y && graft_get_dtype(y) == GRAFT_F32);
  CHECK(get(y, out, n));
  graft_release(y);
  int zeros = 0;
  float kept = (float)(3.0 * (float)(1.0 / (1.0 - p)));
  for (int i = 0; i < n; i++) {
    if (out[i] == 0) zeros++;
    else if (out[i] != kept) {
      CHECK(out[i] == kept);
      break;
    }
  }
  return zeros;
}

TEST(dropout_mask) {
  LIVE_BEGIN;
  enum { N = 10000 };
  double *v = malloc(N * sizeof(double)), *o1 = malloc(N * sizeof(double)),
         *o2 = malloc(N * sizeof(double)), *o3 = malloc(N * sizeof(double));
  for (int i = 0; i < N; i++) v[i] = 3.0;
  int64_t sh[2] = {100, 100};
  graft_tensor *x = mk(v, GRAFT_F32, 2, sh);

  /* p = 0.5: about half zeros (6 sigma), the rest exactly 2x */
  graft_manual_seed(42);
  int z1 = dropout_count(x, 0.5, N, o1);
  CHECK(z1 > N / 2 - 300 && z1 < N / 2 + 300);
  /* the same seed gives the same mask */
  graft_manual_seed(42);
  int z2 = dropout_count(x, 0.5, N, o2);
  CHECK(z1 == z2 && memcmp(o1, o2, N * sizeof(double)) == 0);
  /* another seed another mask */
  graft_manual_seed(7);
  dropout_count(x, 0.5, N, o3);
  CHECK(memcmp(o1, o3, N * sizeof(double)) != 0);

  /* p is a parameter: another p reuses the compiled graph */
  graft_metrics m0, m1;
  graft_metrics_get(&m0);
  int z3 = dropout_count(x, 0.25, N, o3);
  graft_metrics_get(&m1);
  CHECK(z3 > N / 4 - 300 && z3 < N / 4 + 300);
  CHECK(m1.graphs_compiled == m0.graphs_compiled);
  if (m1.graphs_compiled != m0.graphs_compiled)
    fprintf(stderr, "  recompiled for a new p: %s\n", graft_last_compile_reason());

  graft_release(x);
  free(v);
  free(o1);
  free(o2);
  free(o3);
  LIVE_END;
}

/* ---- embedding ---- */

TEST(embedding_values) {
  LIVE_BEGIN;
  enum { V = 5, D = 3 };
  double w[V * D];
  lcg_seed(9);
  fill(w, V * D, -1, 1);
  int64_t sw[2] = {V, D};
  graft_tensor *tw = mk(w, GRAFT_F32, 2, sw);

  /* [2,2] i32 index -> [2,2,3] */
  double idx[4] = {4, 0, 2, 2}, ref[4 * D];
  for (int i = 0; i < 4; i++)
    for (int d = 0; d < D; d++) ref[i * D + d] = w[(int)idx[i] * D + d];
  int64_t si[2] = {2, 2}, so[3] = {2, 2, D};
  graft_tensor *ti = mk(idx, GRAFT_I32, 2, si);
  graft_tensor *y = graft_embedding(tw, ti);
  CHECK(shape_is(y, 3, so) && graft_get_dtype(y) == GRAFT_F32);
  check_all(y, ref, 4 * D, 0);
  graft_release(y);
  graft_release(ti);

  /* [3] i64 index -> [3,3] */
  double idx1[3] = {1, 3, 1}, ref1[3 * D];
  for (int i = 0; i < 3; i++)
    for (int d = 0; d < D; d++) ref1[i * D + d] = w[(int)idx1[i] * D + d];
  int64_t si1[1] = {3}, so1[2] = {3, D};
  ti = mk(idx1, GRAFT_I64, 1, si1);
  y = graft_embedding(tw, ti);
  CHECK(shape_is(y, 2, so1));
  check_all(y, ref1, 3 * D, 0);
  graft_release(y);
  graft_release(ti);

  /* 0-d index -> [D] */
  double i0 = 2;
  int64_t sd[1] = {D};
  ti = mk(&i0, GRAFT_I64, 0, sd);
  y = graft_embedding(tw, ti);
  CHECK(shape_is(y, 1, sd));
  check_all(y, w + 2 * D, D, 0);
  graft_release(y);
  graft_release(ti);
  graft_release(tw);
  LIVE_END;
}

/* ---- composites inside a user scope ---- */

TEST(inside_scope) {
  LIVE_BEGIN;
  double v[4] = {1, 2, 3, 4};
  int64_t sh[2] = {2, 2};
  graft_scope_begin();
  graft_tensor *x = mk(v, GRAFT_F32, 2, sh);
  graft_tensor *y = graft_softmax(graft_relu(graft_gelu(x, false)), -1);
  graft_tensor *z = graft_layer_norm(y, NULL, NULL, 1e-5);
  graft_tensor *d = graft_dropout(z, 0.0, true);
  CHECK(d != NULL);
  double got[4];
  CHECK(get(d, got, 4));
  graft_scope_end(); /* releases x, y, z, d and everything between */
  LIVE_END;
}

/* ---- errors ---- */

TEST(error_shapes_and_dtypes) {
  LIVE_BEGIN;
  graft_clear_error();
  double v[64] = {0};
  int64_t s410[2] = {4, 10}, s3[1] = {3}, s4[1] = {4}, s54[2] = {5, 4}, s34[2] = {3, 4},
          s33[2] = {3, 3}, s5[1] = {5}, s2[1] = {2};
  graft_tensor *logits = mk(v, GRAFT_F32, 2, s410), *t3 = mk(v, GRAFT_I64, 1, s3),
               *t4 = mk(v, GRAFT_I64, 1, s4), *t4f = mk(v, GRAFT_F32, 1, s4),
               *li = mk(v, GRAFT_I32, 2, s410), *x = mk(v, GRAFT_F32, 2, s54),
               *w = mk(v, GRAFT_F32, 2, s34), *wbad = mk(v, GRAFT_F32, 2, s33),
               *b3 = mk(v, GRAFT_F32, 1, s3), *b5 = mk(v, GRAFT_F32, 1, s5),
               *w64 = mk(v, GRAFT_F64, 2, s34), *i4 = mk(v, GRAFT_I32, 1, s4),
               *v2 = mk(v, GRAFT_F32, 1, s2);

  /* cross_entropy */
  CHECK(graft_cross_entropy(logits, t3) == NULL);
  CHECK(graft_last_status() == GRAFT_ERR_SHAPE);
  CHECK(strcmp(graft_last_error(),
               "graft_cross_entropy: target shape [3] does not match logits [4,10] batch") == 0);
  graft_clear_error();
  CHECK(graft_cross_entropy(logits, t4f) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_cross_entropy"));
  CHECK(graft_cross_entropy(li, t4) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_cross_entropy"));
  CHECK(graft_cross_entropy(t4f, t4) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_cross_entropy"));

  /* linear: in-dim mismatch, w not 2-D, bias size, dtype mismatch */
  CHECK(graft_linear(x, wbad, NULL) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_linear"));
  CHECK(graft_linear(x, b3, NULL) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_linear"));
  CHECK(graft_linear(x, w, b5) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_linear"));
  CHECK(graft_linear(x, w64, NULL) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_linear"));

  /* layer_norm: only one of weight/bias, wrong weight size, integer input */
  CHECK(graft_layer_norm(x, b3, NULL, 1e-5) == NULL && err_is(GRAFT_ERR_ARG, "graft_layer_norm"));
  CHECK(graft_layer_norm(x, NULL, b3, 1e-5) == NULL && err_is(GRAFT_ERR_ARG, "graft_layer_norm"));
  CHECK(graft_layer_norm(x, b3, b3, 1e-5) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_layer_norm"));
  CHECK(graft_layer_norm(i4, NULL, NULL, 1e-5) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_layer_norm"));

  /* batch_norm: 1-D input, eval without running stats, wrong channel count */
  CHECK(graft_batch_norm(b3, NULL, NULL, NULL, NULL, true, 1e-5) == NULL &&
        err_is(GRAFT_ERR_SHAPE, "graft_batch_norm"));
  CHECK(graft_batch_norm(x, NULL, NULL, NULL, NULL, false, 1e-5) == NULL &&
        err_is(GRAFT_ERR_NULL, "graft_batch_norm"));
  CHECK(graft_batch_norm(x, b3, NULL, NULL, NULL, true, 1e-5) == NULL &&
        err_is(GRAFT_ERR_SHAPE, "graft_batch_norm"));

  /* softmax / log_softmax / mean / gelu / dropout / embedding */
  CHECK(graft_softmax(x, 2) == NULL && err_is(GRAFT_ERR_AXIS, "graft_softmax"));
  CHECK(graft_log_softmax(x, -3) == NULL && err_is(GRAFT_ERR_AXIS, "graft_log_softmax"));
  CHECK(graft_softmax(i4, 0) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_softmax"));
  CHECK(graft_mean(i4, NULL, 0, false) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_mean"));
  CHECK(graft_gelu(i4, true) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_gelu"));
  CHECK(graft_dropout(x, 1.0, true) == NULL && err_is(GRAFT_ERR_ARG, "graft_dropout"));
  CHECK(graft_dropout(x, -0.1, true) == NULL && err_is(GRAFT_ERR_ARG, "graft_dropout"));
  CHECK(graft_dropout(x, NAN, false) == NULL && err_is(GRAFT_ERR_ARG, "graft_dropout"));
  CHECK(graft_dropout(i4, 0.5, true) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_dropout"));
  CHECK(graft_embedding(w, t4f) == NULL && err_is(GRAFT_ERR_DTYPE, "graft_embedding"));
  CHECK(graft_embedding(b3, t4) == NULL && err_is(GRAFT_ERR_SHAPE, "graft_embedding"));

  /* a failed composite leaves the library usable */
  graft_tensor *ok = graft_relu(v2);
  CHECK(ok != NULL && graft_last_status() == GRAFT_OK);
  graft_release(ok);

  graft_tensor *all[] = {logits, t3, t4, t4f, li, x, w, wbad, b3, b5, w64, i4, v2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) graft_release(all[i]);
  LIVE_END;
}

TEST(error_null_propagation) {
  LIVE_BEGIN;
  double v[8] = {0};
  int64_t s2[1] = {2}, s3[1] = {3}, s22[2] = {2, 2};
  graft_tensor *a = mk(v, GRAFT_F32, 1, s2), *b = mk(v, GRAFT_F32, 1, s3),
               *m = mk(v, GRAFT_F32, 2, s22), *t = mk(v, GRAFT_I64, 1, s2);

  /* a NULL input with no error pending reports GRAFT_ERR_NULL naming the composite */
  graft_clear_error();
  CHECK(graft_relu(NULL) == NULL && err_is(GRAFT_ERR_NULL, "graft_relu"));
  CHECK(graft_linear(m, NULL, NULL) == NULL && err_is(GRAFT_ERR_NULL, "graft_linear"));
  CHECK(graft_embedding(m, NULL) == NULL && err_is(GRAFT_ERR_NULL, "graft_embedding"));

  /* after a failed op, every composite fed its NULL keeps the first error */
  graft_tensor *bad = graft_add(a, b); /* [2] + [3]: a shape error */
  CHECK(bad == NULL && graft_last_status() == GRAFT_ERR_SHAPE);
  char first[512];
  snprintf(first, sizeof first, "%s", graft_last_error());
  CHECK(graft_relu(bad) == NULL);
  CHECK(graft_gelu(bad, false) == NULL);
  CHECK(graft_softmax(bad, 0) == NULL);
  CHECK(graft_log_softmax(bad, 0) == NULL);
  CHECK(graft_mean(bad, NULL, 0, false) == NULL);
  CHECK(graft_layer_norm(bad, NULL, NULL, 1e-5) == NULL);
  CHECK(graft_layer_norm(m, bad, a, 1e-5) == NULL); /* weight lost upstream: not an ARG error */
  CHECK(graft_batch_norm(bad, NULL, NULL, NULL, NULL, true, 1e-5) == NULL);
  CHECK(graft_batch_norm(m, NULL, NULL, bad, a, false, 1e-5) == NULL);
  CHECK(graft_linear(bad, m, NULL) == NULL);
  CHECK(graft_cross_entropy(m, bad) == NULL);
  CHECK(graft_dropout(bad, 0.5, true) == NULL);
  CHECK(graft_embedding(bad, t) == NULL);
  CHECK(graft_softmax(graft_relu(graft_add(a, b)), 0) == NULL); /* a chain checked once */
  CHECK(graft_last_status() == GRAFT_ERR_SHAPE && strcmp(graft_last_error(), first) == 0);
  graft_clear_error();

  graft_release(a);
  graft_release(b);
  graft_release(m);
  graft_release(t);
  LIVE_END;
}

/* The error starts with "fn: " and names no helper the composite called. */
static bool names_only(const char *fn, graft_status st) {
  const char *m = graft_last_error();
  size_t n = strlen(fn);
  bool ok = graft_last_status() == st && !strncmp(m, fn, n) && !strncmp(m + n, ": ", 2) &&
            !strstr(m + n, "graft_");
  if (!ok) fprintf(stderr, "  want %s: (status %d), got %d: %s\n", fn, (int)st,
                   (int)graft_last_status(), m);
  graft_clear_error();
  return ok;
}

/* An error names the function the user called, not the query (graft_ndim, graft_shape) or the
 * primitive (graft_sum, graft_max_pool2d) the composite called; a NULL input still keeps the
 * first error. */
TEST(errors_name_the_composite_called) {
  LIVE_BEGIN;
  const double v[16] = {0};
  graft_tensor *dead = mk(v, GRAFT_F32, 2, (int64_t[]){2, 2});
  graft_tensor *x = mk(v, GRAFT_F32, 2, (int64_t[]){2, 2});
  graft_tensor *x4 = mk(v, GRAFT_F32, 4, (int64_t[]){1, 1, 4, 4});
  graft_release(dead);
  CHECK(graft_softmax(dead, 0) == NULL && names_only("graft_softmax", GRAFT_ERR_RELEASED));
  CHECK(graft_relu(dead) == NULL && names_only("graft_relu", GRAFT_ERR_RELEASED));
  CHECK(graft_flip(dead, (int[]){0}, 1) == NULL && names_only("graft_flip", GRAFT_ERR_RELEASED));
  CHECK(graft_conv2d_backward_input(dead, x4, (int64_t[]){1, 1, 4, 4}, NULL, NULL, NULL, 1) ==
            NULL && names_only("graft_conv2d_backward_input", GRAFT_ERR_RELEASED));
  CHECK(graft_max_pool2d_backward(x4, dead, (int[]){2, 2}, NULL, NULL) == NULL &&
        names_only("graft_max_pool2d_backward", GRAFT_ERR_RELEASED));
  CHECK(graft_mean(x, (int[]){5}, 1, false) == NULL && names_only("graft_mean", GRAFT_ERR_AXIS));
  CHECK(graft_max_pool2d_backward(x4, x4, (int[]){5, 5}, NULL, NULL) == NULL &&
        names_only("graft_max_pool2d_backward", GRAFT_ERR_SHAPE));
  /* an upstream failure passed in as NULL keeps its own name */
  CHECK(graft_softmax(graft_mean(x, (int[]){5}, 1, false), 0) == NULL &&
        names_only("graft_mean", GRAFT_ERR_AXIS));
  graft_release(x);
  graft_release(x4);
  LIVE_END;
}

/* ---- devices ---- */

/* The _on creators make their tensors on the device given, reject a device that does not exist
 * naming the function and the device, and combine with tensors of that device only. */
TEST(creators_on_devices) {
  LIVE_BEGIN;
  graft_scope_begin();
  int64_t sh[2] = {2, 3};
  const graft_dtype F = GRAFT_F32;
  graft_tensor *t[7] = {graft_full_on(2, F, 2, sh, dev),       graft_zeros_on(F, 2, sh, dev),
                        graft_ones_on(F, 2, sh, dev),          graft_iota_on(F, 2, sh, 1, dev),
                        graft_rand_uniform_on(F, 2, sh, dev),  graft_rand_normal_on(F, 2, sh, dev),
                        graft_scalar_on(5, F, dev)};
  for (int i = 0; i < 7; i++) CHECK(t[i] && graft_device(t[i]) == dev);
  double got[6];
  CHECK(get(graft_add(t[3], t[6]), got, 6)); /* iota + 5 */
  for (int i = 0; i < 6; i++) CHECK(got[i] == 5 + i % 3);
  /* the plain creators stay on cpu:0 */
  graft_tensor *z = graft_zeros(GRAFT_F32, 2, sh);
  CHECK(z && graft_device(z) == 0);
  const graft_status D = GRAFT_ERR_DEVICE;
  CHECK(!graft_full_on(1, F, 2, sh, GRAFT_MAX_DEVICES) && err_is(D, "graft_full_on"));
  CHECK(!graft_scalar_on(1, F, -1) && err_is(D, "graft_scalar_on"));
  CHECK(!graft_iota_on(F, 2, sh, 0, 9) && strstr(graft_last_error(), "no device 9") &&
        err_is(D, "graft_iota_on"));
  CHECK(!graft_rand_uniform_on(F, 2, sh, GRAFT_MAX_DEVICES - 1) && err_is(D, "graft_rand_uniform_on"));
  graft_scope_end();
  LIVE_END;
}

/* Every composite (and avg_pool2d, whose divisor is a constant) gives, on another device, bit for
 * bit what it gives on cpu:0. */
static graft_tensor *on(int d, const double *v, graft_dtype dt, int nd, const int64_t *sh) {
  int keep = dev;
  dev = d;
  graft_tensor *t = mk(v, dt, nd, sh);
  dev = keep;
  return t;
}

enum { NCOMP = 17 };
static void composites_on(int d, graft_tensor **out) {
  double xv[24], wv[4], bv[4], rm[3] = {0.5, -1, 2}, rv[3] = {1, 2, 0.5};
  double tv[6] = {0, 3, 1, 2, 3, 0}, iv[5] = {2, 0, 1, 1, 2};
  graft_scope_begin();
  lcg_seed(77);
  fill(xv, 24, -2, 2);
  fill(wv, 4, 0.5, 1.5);
  fill(bv, 4, -1, 1);
  int64_t s64[2] = {6, 4}, s4[1] = {4}, s6[1] = {6}, s1234[4] = {1, 2, 3, 4}, s3[1] = {3},
          s5[1] = {5}, s34[2] = {3, 4}, s1212[4] = {1, 2, 1, 2}, s1223[4] = {1, 2, 2, 3};
  graft_tensor *x = on(d, xv, GRAFT_F32, 2, s64), *w = on(d, wv, GRAFT_F32, 1, s4),
               *b = on(d, bv, GRAFT_F32, 1, s4), *x4 = on(d, xv, GRAFT_F32, 4, s1234),
               *c = on(d, wv, GRAFT_F32, 1, (int64_t[]){2}), *rmt = on(d, rm, GRAFT_F32, 1, s3),
               *rvt = on(d, rv, GRAFT_F32, 1, s3), *tgt = on(d, tv, GRAFT_I32, 1, s6),
               *idx = on(d, iv, GRAFT_I64, 1, s5), *emb = on(d, xv, GRAFT_F32, 2, s34),
               *dy = on(d, xv, GRAFT_F32, 4, s1212),
               *dy1 = on(d, xv, GRAFT_F32, 4, s1223);
  graft_tensor *x3 = graft_reshape(x, 3, (int64_t[]){2, 3, 4});
  graft_manual_seed(5);
  out[0] = graft_relu(x);
  out[1] = graft_gelu(x, false);
  out[2] = graft_gelu(x, true);
  out[3] = graft_softmax(x, 1);
  out[4] = graft_log_softmax(x, 0);
  out[5] = graft_mean(x, (int[]){0}, 1, false);
  out[6] = graft_layer_norm(x, w, b, 1e-5);
  out[7] = graft_batch_norm(x4, c, c, NULL, NULL, true, 1e-5);
  out[8] = graft_batch_norm(x3, NULL, NULL, rmt, rvt, false, 1e-5);
  out[9] = graft_linear(x, emb, graft_slice(b, (int64_t[]){0}, (int64_t[]){3}, NULL));
  out[10] = graft_cross_entropy(x, tgt);
  out[11] = graft_dropout(x, 0.5, true);
  out[12] = graft_embedding(emb, idx);
  out[13] = graft_max_pool2d_backward(x4, dy, (int[]){2, 2}, NULL, NULL);
  out[14] = graft_flip(x, (int[]){0, 1}, 2);
  /* overlapping windows: the other path */
  out[15] = graft_max_pool2d_backward(x4, dy1, (int[]){2, 2}, (int[]){1, 1}, NULL);
  out[16] = graft_avg_pool2d(x4, (int[]){2, 2}, NULL, NULL); /* a primitive making a constant */
  for (int i = 0; i < NCOMP; i++) out[i] = out[i] ? graft_keep(out[i]) : NULL;
  graft_scope_end(); /* releases the inputs and views */
}

TEST(composites_match_cpu0) {
  LIVE_BEGIN;
  int other = dev ? dev : 2; /* on cpu:0 runs, compare with cpu:2 */
  graft_tensor *a[NCOMP], *b[NCOMP];
  composites_on(0, a);
  composites_on(other, b);
  for (int i = 0; i < NCOMP; i++) {
    bool ok = a[i] && b[i] && graft_device(a[i]) == 0 && graft_device(b[i]) == other &&
              graft_numel(a[i]) == graft_numel(b[i]);
    if (!ok) fprintf(stderr, "  composite %d: %s\n", i, graft_last_error());
    CHECK(ok);
    int64_t n = ok ? graft_numel(a[i]) : 0;
    float *ha = malloc((size_t)n * 4 + 4), *hb = malloc((size_t)n * 4 + 4);
    if (ok) {
      CHECK(graft_to_host(a[i], ha, (size_t)n * 4) == GRAFT_OK);
      CHECK(graft_to_host(b[i], hb, (size_t)n * 4) == GRAFT_OK);
      /* another CPU device runs the same code: bit for bit; another backend (OpenCL) rounds
       * its own way (sums in another order or width): to a few float ulps */
      bool same_kind = !strcmp(graft_device_kind(other), "cpu");
      for (int64_t e = 0; e < n; e++) {
        float tol = same_kind ? 0 : 4e-6f * (1 + fabsf(ha[e]));
        bool eq = same_kind ? !memcmp(&ha[e], &hb[e], 4) : fabsf(ha[e] - hb[e]) <= tol;
        if (!eq) {
          char dname[32];
          fprintf(stderr, "  composite %d differs between cpu:0 and %s at %lld: %.9g vs %.9g\n", i,
                  check_device_str(other, dname, sizeof dname), (long long)e, ha[e], hb[e]);
          CHECK(false);
          break;
        }
      }
    }
    free(ha), free(hb);
    graft_release(a[i]), graft_release(b[i]);
  }
  graft_clear_error();
  LIVE_END;
}

/* Mixing devices still fails, naming the composite and both devices. */
TEST(mixed_devices_fail) {
  LIVE_BEGIN;
  graft_scope_begin();
  int other = dev ? 0 : 1;
  double v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ix[2] = {1, 0};
  int64_t s24[2] = {2, 4}, s4[1] = {4}, s2[1] = {2};
  graft_tensor *x = mk(v, GRAFT_F32, 2, s24), *w = on(other, v, GRAFT_F32, 1, s4),
               *b = mk(v, GRAFT_F32, 1, s4), *t = on(other, ix, GRAFT_I64, 1, s2);
  char d0[32], d1[32];
  check_device_str(dev, d0, sizeof d0);
  check_device_str(other, d1, sizeof d1);
  CHECK(!graft_layer_norm(x, w, b, 1e-5) && strstr(graft_last_error(), d0) &&
        strstr(graft_last_error(), d1) && err_is(GRAFT_ERR_DEVICE, "graft_layer_norm"));
  CHECK(!graft_cross_entropy(x, t) && strstr(graft_last_error(), d0) &&
        strstr(graft_last_error(), d1) && err_is(GRAFT_ERR_DEVICE, "graft_cross_entropy"));
  CHECK(!graft_add(x, w) && strstr(graft_last_error(), d0) && strstr(graft_last_error(), d1) &&
        err_is(GRAFT_ERR_DEVICE, "different devices"));
  graft_clear_error();
  graft_scope_end();
  LIVE_END;
}

int main(void) {
  dev = check_test_device_for("test_composite");
  if (dev < 0) return 2;
  RUN(relu_values);
  RUN(gelu_both_forms);
  RUN(softmax_values);
  RUN(log_softmax_values);
  RUN(mean_values);
  RUN(layer_norm_values);
  RUN(batch_norm_train_and_eval);
  RUN(linear_values);
  RUN(cross_entropy_values);
  RUN(dropout_identity);
  RUN(dropout_mask);
  RUN(embedding_values);
  RUN(inside_scope);
  RUN(error_shapes_and_dtypes);
  RUN(error_null_propagation);
  RUN(errors_name_the_composite_called);
  RUN(creators_on_devices);
  RUN(composites_match_cpu0);
  RUN(mixed_devices_fail);
  graft_shutdown();
  return CHECK_DONE();
}
