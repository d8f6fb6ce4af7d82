/* Primitive op tests, nn part: matmul, conv2d, gather, scatter_add, max/avg pooling, and one test
 * per error class (NULL, released, shape, dtype, device, axis, OOM, runtime index errors, host
 * transfers). Public API only; expectations are computed in plain C here, never by graft. */
#include "graft.h"
#include "check.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "ops_helpers.h"
#include <limits.h>

/* Test data: value i of a tensor of dt (small, exact in every dtype). */
static double val(graft_dtype dt, int64_t i) {
  if (dt == GRAFT_BOOL) return i % 3 == 0;
  if (dt == GRAFT_U8) return (double)((i * 7) % 5);
  return (double)((i * 7) % 5 - 2);
}
static graft_tensor *mkv(graft_dtype dt, int nd, const int64_t *shape, double *v, int salt) {
  int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; i++) v[i] = val(dt, i + salt);
  return mk(dt, nd, shape, v);
}

/* ================= matmul ================= */

/* Reference batched matmul: a [B,M,K] x b [B,K,N] with batch strides sa/sb (0 = broadcast). */
static void ref_mm(const double *a, const double *b, double *o, int64_t B, int64_t M, int64_t K,
                   int64_t N, int64_t sa, int64_t sb) {
  for (int64_t p = 0; p < B; p++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) s += a[p * sa + m * K + k] * b[p * sb + k * N + n];
        o[(p * M + m) * N + n] = s;
      }
}
static void wrap_all(graft_dtype dt, double *w, int64_t n) {
  if (!is_flt(dt))
    for (int64_t i = 0; i < n; i++) w[i] = (double)wrap_to(dt, (int64_t)w[i]);
}

TEST(test_matmul) {
  BEGIN();
  double a[64], b[64], w[64];
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    double tol = tol_of(dt);
    /* 2-D */
    const int64_t sa[2] = {2, 3}, sb[2] = {3, 4}, so[2] = {2, 4};
    graft_tensor *x = mkv(dt, 2, sa, a, 0), *y = mkv(dt, 2, sb, b, 5);
    ref_mm(a, b, w, 1, 2, 3, 4, 0, 0);
    wrap_all(dt, w, 8);
    CHECK(expect_d(graft_matmul(x, y), dt, 2, so, w, tol));
    /* batched [2,2,3] @ [2,3,2] */
    const int64_t ba[3] = {2, 2, 3}, bb[3] = {2, 3, 2}, bo[3] = {2, 2, 2};
    x = mkv(dt, 3, ba, a, 1), y = mkv(dt, 3, bb, b, 2);
    ref_mm(a, b, w, 2, 2, 3, 2, 6, 6);
    wrap_all(dt, w, 8);
    CHECK(expect_d(graft_matmul(x, y), dt, 3, bo, w, tol));
    /* broadcast batch: [2,1,2,3] @ [3,3,2] -> [2,3,2,2] */
    const int64_t ca[4] = {2, 1, 2, 3}, cb[3] = {3, 3, 2}, co[4] = {2, 3, 2, 2};
    x = mkv(dt, 4, ca, a, 3), y = mkv(dt, 3, cb, b, 4);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 3; j++) ref_mm(a + i * 6, b + j * 6, w + (i * 3 + j) * 4, 1, 2, 3, 2, 0, 0);
    wrap_all(dt, w, 24);
    CHECK(expect_d(graft_matmul(x, y), dt, 4, co, w, tol));
    /* 1-D operands as numpy: [3] @ [3,2] -> [2]; [2,3] @ [3] -> [2]; [3] @ [3] -> [] */
    const int64_t s3[1] = {3}, s32[2] = {3, 2}, s2[1] = {2};
    graft_tensor *v = mkv(dt, 1, s3, a, 0), *m = mkv(dt, 2, s32, b, 1);
    ref_mm(a, b, w, 1, 1, 3, 2, 0, 0);
    wrap_all(dt, w, 2);
    CHECK(expect_d(graft_matmul(v, m), dt, 1, s2, w, tol));
    graft_tensor *m2 = mkv(dt, 2, sa, b, 2);
    ref_mm(b, a, w, 1, 2, 3, 1, 0, 0);
    wrap_all(dt, w, 2);
    CHECK(expect_d(graft_matmul(m2, v), dt, 1, s2, w, tol));
    ref_mm(a, a, w, 1, 1, 3, 1, 0, 0);
    wrap_all(dt, w, 1);
    CHECK(expect_d(graft_matmul(v, v), dt, 0, NULL, w, tol));
    /* unbatched @ batched: [2,3] @ [3,3,2] -> [3,2,2] */
    const int64_t s332[3] = {3, 3, 2}, s322[3] = {3, 2, 2};
    double ua[6], ub[18];
    x = mkv(dt, 2, sa, ua, 2), y = mkv(dt, 3, s332, ub, 3);
    ref_mm(ua, ub, w, 3, 2, 3, 2, 0, 6);
    wrap_all(dt, w, 12);
    CHECK(expect_d(graft_matmul(x, y), dt, 3, s322, w, tol));
    /* batched @ 1-D: [2,2,3] @ [3] -> [2,2] */
    const int64_t b22[2] = {2, 2};
    x = mkv(dt, 3, ba, b, 1);
    ref_mm(b, a, w, 2, 2, 3, 1, 6, 0);
    wrap_all(dt, w, 4);
    CHECK(expect_d(graft_matmul(x, v), dt, 2, b22, w, tol));
  }
  /* identity and a hand-checked product */
  const int64_t s22[2] = {2, 2};
  const double p[4] = {1, 2, 3, 4}, r[4] = {5, 6, 7, 8}, pr[4] = {19, 22, 43, 50}, id[4] = {1, 0, 0, 1};
  CHECK(expect_d(graft_matmul(mk(GRAFT_F32, 2, s22, p), mk(GRAFT_F32, 2, s22, r)), GRAFT_F32, 2, s22, pr, 0));
  CHECK(expect_d(graft_matmul(mk(GRAFT_F64, 2, s22, p), mk(GRAFT_F64, 2, s22, id)), GRAFT_F64, 2, s22, p, 0));
  /* i32 accumulation wraps; u8 wraps */
  const int64_t big[4] = {65536, 0, 0, 65536}, bw[4] = {0, 0, 0, 0};
  CHECK(expect_i(graft_matmul(mk_i(GRAFT_I32, 2, s22, big), mk_i(GRAFT_I32, 2, s22, big)), GRAFT_I32, 2, s22, bw));
  const int64_t u[4] = {16, 16, 1, 1}, uw[4] = {16 * 16 + 16, 16 * 16 + 16, 17, 17};
  int64_t uww[4];
  for (int i = 0; i < 4; i++) uww[i] = wrap_to(GRAFT_U8, uw[i]);
  CHECK(expect_i(graft_matmul(mk_i(GRAFT_U8, 2, s22, u), mk_i(GRAFT_U8, 2, s22, u)), GRAFT_U8, 2, s22, uww));
  /* errors */
  CHECK(graft_matmul(mk(GRAFT_BOOL, 2, s22, p), mk(GRAFT_BOOL, 2, s22, p)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  const int64_t s23[2] = {2, 3}, s42[2] = {4, 2};
  CHECK(graft_matmul(mk(GRAFT_F32, 2, s23, a), mk(GRAFT_F32, 2, s42, b)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[4,2]"));
  const int64_t b1[3] = {2, 2, 3}, b2[3] = {3, 3, 2};
  CHECK(graft_matmul(mk(GRAFT_F32, 3, b1, a), mk(GRAFT_F32, 3, b2, b)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  CHECK(graft_matmul(graft_scalar_on(1, GRAFT_F32, dev), mk(GRAFT_F32, 2, s22, p)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  CHECK(graft_matmul(mk(GRAFT_F32, 2, s22, p), mk(GRAFT_F64, 2, s22, p)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f32", "f64"));
  END();
}

/* ================= conv2d ================= */

/* Direct convolution loop: x [N,C,H,W], w [O,C/g,KH,KW]. */
static void ref_conv(const double *x, const double *w, double *o, int N, int C, int H, int W,
                     int O, int KH, int KW, const int *st, const int *pd, const int *dl, int g,
                     int OH, int OW) {
  int CG = C / g, OG = O / g;
  for (int n = 0; n < N; n++)
    for (int oc = 0; oc < O; oc++)
      for (int oh = 0; oh < OH; oh++)
        for (int ow = 0; ow < OW; ow++) {
          double s = 0;
          for (int c = 0; c < CG; c++)
            for (int kh = 0; kh < KH; kh++)
              for (int kw = 0; kw < KW; kw++) {
                int ih = oh * st[0] - pd[0] + kh * dl[0], iw = ow * st[1] - pd[1] + kw * dl[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                int ic = (oc / OG) * CG + c;
                s += x[((n * C + ic) * H + ih) * W + iw] * w[((oc * CG + c) * KH + kh) * KW + kw];
              }
          o[((n * O + oc) * OH + oh) * OW + ow] = s;
        }
}

TEST(test_conv2d) {
  BEGIN();
  struct {
    int N, C, H, W, O, KH, KW, st[2], pd[2], dl[2], g;
  } cs[] = {
      {1, 1, 4, 4, 1, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1},
      {2, 3, 5, 6, 2, 3, 2, {1, 1}, {1, 1}, {1, 1}, 1},
      {1, 2, 7, 6, 3, 3, 3, {2, 3}, {0, 1}, {1, 1}, 1},
      {1, 2, 7, 7, 2, 2, 3, {1, 2}, {2, 1}, {2, 2}, 1},
      {2, 4, 5, 6, 4, 3, 2, {2, 1}, {1, 2}, {1, 2}, 2},
      {1, 4, 4, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 4}, /* depthwise */
      {1, 6, 8, 7, 6, 3, 3, {2, 1}, {1, 2}, {2, 1}, 6}, /* depthwise, strided, dilated */
      {2, 3, 6, 5, 6, 2, 3, {1, 2}, {0, 1}, {1, 1}, 3}, /* two outputs per group */
  };
  static double x[512], wt[512], w[1024];
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    int OH = (cs[c].H + 2 * cs[c].pd[0] - cs[c].dl[0] * (cs[c].KH - 1) - 1) / cs[c].st[0] + 1;
    int OW = (cs[c].W + 2 * cs[c].pd[1] - cs[c].dl[1] * (cs[c].KW - 1) - 1) / cs[c].st[1] + 1;
    const int64_t xs[4] = {cs[c].N, cs[c].C, cs[c].H, cs[c].W};
    const int64_t ws[4] = {cs[c].O, cs[c].C / cs[c].g, cs[c].KH, cs[c].KW};
    const int64_t os[4] = {cs[c].N, cs[c].O, OH, OW};
    for (int d = 0; d < 4; d++) {
      graft_dtype dt = FLOAT_DT[d];
      graft_tensor *xt = mkv(dt, 4, xs, x, (int)c), *wtt = mkv(dt, 4, ws, wt, 3);
      ref_conv(x, wt, w, cs[c].N, cs[c].C, cs[c].H, cs[c].W, cs[c].O, cs[c].KH, cs[c].KW, cs[c].st,
               cs[c].pd, cs[c].dl, cs[c].g, OH, OW);
      int ok = expect_d(graft_conv2d(xt, wtt, cs[c].st, cs[c].pd, cs[c].dl, cs[c].g), dt, 4, os, w,
                        tol_of(dt));
      if (!ok) fprintf(stderr, "  conv case %zu dtype %s\n", c, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  /* NULL stride/padding/dilation mean 1/0/1 */
  const int64_t xs[4] = {1, 1, 3, 3}, ws[4] = {1, 1, 2, 2}, os[4] = {1, 1, 2, 2};
  const double xv[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, wv[4] = {1, 0, 0, -1}, ov[4] = {-4, -4, -4, -4};
  CHECK(expect_d(graft_conv2d(mk(GRAFT_F32, 4, xs, xv), mk(GRAFT_F32, 4, ws, wv), NULL, NULL, NULL, 1),
                 GRAFT_F32, 4, os, ov, 0));
  /* errors: integer dtypes, channel mismatch, groups not dividing */
  for (int d = 0; d < 3; d++) {
    CHECK(graft_conv2d(mk(INT_DT[d], 4, xs, xv), mk(INT_DT[d], 4, ws, wv), NULL, NULL, NULL, 1) == NULL);
    CHECK(expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(INT_DT[d]), NULL));
  }
  const int64_t ws2[4] = {1, 2, 2, 2};
  CHECK(graft_conv2d(mk(GRAFT_F32, 4, xs, xv), mk(GRAFT_F32, 4, ws2, x), NULL, NULL, NULL, 1) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1,1,3,3]", "[1,2,2,2]"));
  CHECK(graft_conv2d(mk(GRAFT_F32, 4, xs, xv), mk(GRAFT_F32, 4, ws, wv), NULL, NULL, NULL, 2) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

/* ================= gather / scatter_add ================= */

TEST(test_gather) {
  BEGIN();
  const int64_t s[2] = {3, 4}, is0[2] = {2, 4}, is1[2] = {3, 2};
  const int64_t i0[8] = {2, 0, 1, 2, 0, 0, 2, 1}; /* along axis 0: out[i][j] = a[idx[i][j]][j] */
  const int64_t i1[6] = {3, 0, 1, 1, 0, 2};       /* along axis 1: out[i][j] = a[i][idx[i][j]] */
  double v[12], w[12];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s, v, 1);
    for (int ix = 0; ix < 2; ix++) {
      graft_dtype it = ix ? GRAFT_I64 : GRAFT_I32;
      for (int i = 0; i < 8; i++) w[i] = v[i0[i] * 4 + i % 4];
      CHECK(expect_d(graft_gather(a, 0, mk_i(it, 2, is0, i0)), dt, 2, is0, w, 0));
      for (int i = 0; i < 6; i++) w[i] = v[(i / 2) * 4 + i1[i]];
      CHECK(expect_d(graft_gather(a, 1, mk_i(it, 2, is1, i1)), dt, 2, is1, w, 0));
      CHECK(expect_d(graft_gather(a, -1, mk_i(it, 2, is1, i1)), dt, 2, is1, w, 0));
    }
  }
  graft_tensor *a = mkv(GRAFT_F32, 2, s, v, 0);
  CHECK(graft_gather(a, 0, mk(GRAFT_F32, 2, is0, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f32", NULL));
  CHECK(graft_gather(a, 2, mk_i(GRAFT_I32, 2, is0, i0)) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  const int64_t sbig[2] = {4, 5};
  int64_t zeros[20] = {0};
  CHECK(graft_gather(a, 0, mk_i(GRAFT_I32, 2, sbig, zeros)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

TEST(test_scatter_add) {
  BEGIN();
  const int64_t s[2] = {3, 4}, is[2] = {2, 4};
  const int64_t idx[8] = {0, 2, 2, 1, 0, 2, 1, 1}; /* duplicates in column 1 and 3 */
  double base[12], src[8], w[12];
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    graft_tensor *a = mkv(dt, 2, s, base, 0), *sr = mkv(dt, 2, is, src, 4);
    for (int ix = 0; ix < 2; ix++) {
      graft_dtype it = ix ? GRAFT_I64 : GRAFT_I32;
      /* axis 0: out[idx[i][j]][j] += src[i][j] */
      for (int i = 0; i < 12; i++) w[i] = base[i];
      for (int i = 0; i < 8; i++) w[idx[i] * 4 + i % 4] += src[i];
      wrap_all(dt, w, 12);
      CHECK(expect_d(graft_scatter_add(a, 0, mk_i(it, 2, is, idx), sr), dt, 2, s, w, tol_of(dt)));
      /* axis 1 with a [3,2] index: out[i][idx[i][j]] += src[i][j] */
      const int64_t is1[2] = {3, 2}, idx1[6] = {3, 3, 0, 1, 2, 0};
      double src1[6];
      graft_tensor *sr1 = mkv(dt, 2, is1, src1, 2);
      for (int i = 0; i < 12; i++) w[i] = base[i];
      for (int i = 0; i < 6; i++) w[(i / 2) * 4 + idx1[i]] += src1[i];
      wrap_all(dt, w, 12);
      CHECK(expect_d(graft_scatter_add(a, 1, mk_i(it, 2, is1, idx1), sr1), dt, 2, s, w, tol_of(dt)));
    }
  }
  /* property: gather after scatter_add into zeros at distinct indices returns src */
  const int64_t perm[4] = {2, 0, 1, 3}, s4[1] = {4};
  const double sv[4] = {5, 6, 7, 8};
  graft_tensor *ix = mk_i(GRAFT_I64, 1, s4, perm);
  graft_tensor *z4 = graft_zeros_on(GRAFT_F32, 1, s4, dev);
  graft_tensor *sc = graft_scatter_add(z4, 0, ix, mk1(GRAFT_F32, 4, sv));
  CHECK(expect1_d(graft_gather(sc, 0, ix), GRAFT_F32, 4, sv, 0));
  /* errors */
  CHECK(graft_scatter_add(mk(GRAFT_BOOL, 2, s, base), 0, mk_i(GRAFT_I32, 2, is, idx), mk(GRAFT_BOOL, 2, is, src)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  CHECK(graft_scatter_add(mk(GRAFT_F32, 2, s, base), 0, mk_i(GRAFT_I32, 2, is, idx), mk(GRAFT_F64, 2, is, src)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f64", NULL));
  END();
}

/* ================= pooling ================= */

static void ref_pool(int avg, const double *x, double *o, int NC, int H, int W, const int *k,
                     const int *st, const int *pd, int OH, int OW) {
  for (int p = 0; p < NC; p++)
    for (int oh = 0; oh < OH; oh++)
      for (int ow = 0; ow < OW; ow++) {
        double m = -INFINITY, s = 0;
        for (int i = 0; i < k[0]; i++)
          for (int j = 0; j < k[1]; j++) {
            int h = oh * st[0] - pd[0] + i, ww = ow * st[1] - pd[1] + j;
            if (h < 0 || h >= H || ww < 0 || ww >= W) continue; /* padding never wins, adds 0 */
            double v = x[(p * H + h) * W + ww];
            m = v > m ? v : m;
            s += v;
          }
        o[(p * OH + oh) * OW + ow] = avg ? s / (k[0] * k[1]) : m;
      }
}

TEST(test_pool2d) {
  BEGIN();
  struct { int k[2], st[2], pd[2]; } cs[] = {
      {{2, 2}, {2, 2}, {0, 0}}, {{2, 3}, {2, 2}, {1, 1}}, {{3, 3}, {1, 1}, {1, 1}}, {{3, 2}, {2, 1}, {1, 0}}};
  const int64_t xs[4] = {2, 2, 4, 5};
  double x[80], w[400];
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    int OH = (4 + 2 * cs[c].pd[0] - cs[c].k[0]) / cs[c].st[0] + 1;
    int OW = (5 + 2 * cs[c].pd[1] - cs[c].k[1]) / cs[c].st[1] + 1;
    const int64_t os[4] = {2, 2, OH, OW};
    for (int d = 0; d < 7; d++) {
      graft_dtype dt = NUM_DT[d];
      /* all-negative input (signed dtypes) so a padding 0 would wrongly win the max */
      for (int i = 0; i < 80; i++) x[i] = dt == GRAFT_U8 ? (i * 7) % 11 : -1 - (i * 7) % 11;
      if (is_flt(dt)) x[5] = -0.5;
      graft_tensor *xt = mk(dt, 4, xs, x);
      ref_pool(0, x, w, 4, 4, 5, cs[c].k, cs[c].st, cs[c].pd, OH, OW);
      int ok = expect_d(graft_max_pool2d(xt, cs[c].k, cs[c].st, cs[c].pd), dt, 4, os, w, 0);
      if (!ok) fprintf(stderr, "  max_pool case %zu dtype %s\n", c, graft_dtype_name(dt));
      CHECK(ok);
      if (!is_flt(dt)) continue;
      ref_pool(1, x, w, 4, 4, 5, cs[c].k, cs[c].st, cs[c].pd, OH, OW);
      ok = expect_d(graft_avg_pool2d(xt, cs[c].k, cs[c].st, cs[c].pd), dt, 4, os, w, tol_of(dt));
      if (!ok) fprintf(stderr, "  avg_pool case %zu dtype %s\n", c, graft_dtype_name(dt));
      CHECK(ok);
    }
  }
  /* stride NULL = kernel, padding NULL = 0 */
  const int64_t s44[4] = {1, 1, 4, 4}, s22[4] = {1, 1, 2, 2};
  double v[16];
  for (int i = 0; i < 16; i++) v[i] = i;
  const int k2[2] = {2, 2};
  const double mw[4] = {5, 7, 13, 15}, aw[4] = {2.5, 4.5, 10.5, 12.5};
  CHECK(expect_d(graft_max_pool2d(mk(GRAFT_F32, 4, s44, v), k2, NULL, NULL), GRAFT_F32, 4, s22, mw, 0));
  CHECK(expect_d(graft_avg_pool2d(mk(GRAFT_F32, 4, s44, v), k2, NULL, NULL), GRAFT_F32, 4, s22, aw, 0));
  /* errors */
  for (int d = 0; d < 3; d++) {
    CHECK(graft_avg_pool2d(mk(INT_DT[d], 4, s44, v), k2, NULL, NULL) == NULL);
    CHECK(expect_err(GRAFT_ERR_DTYPE, graft_dtype_name(INT_DT[d]), NULL));
  }
  CHECK(graft_max_pool2d(mk(GRAFT_BOOL, 4, s44, v), k2, NULL, NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  const int k5[2] = {5, 5};
  CHECK(graft_max_pool2d(mk(GRAFT_F32, 4, s44, v), k5, NULL, NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  CHECK(graft_max_pool2d(mk(GRAFT_F32, 4, s44, v), NULL, NULL, NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, NULL, NULL));
  END();
}

/* ================= error classes ================= */

TEST(test_err_null) {
  BEGIN();
  graft_clear_error();
  CHECK(graft_exp(NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, "graft_exp", NULL));
  CHECK(sane());
  /* a chain of 5 ops on NULL keeps the first error (the one naming graft_add) */
  const double v[3] = {1, 2, 3};
  graft_tensor *x = mk1(GRAFT_F32, 3, v);
  graft_tensor *t = graft_add(NULL, x);
  t = graft_exp(t);
  t = graft_mul(t, x);
  t = graft_sum(t, NULL, 0, false);
  t = graft_neg(t);
  CHECK(t == NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, "graft_add", NULL));
  /* a shape error at the head of a chain is the one reported */
  const int64_t s4[1] = {4};
  t = graft_add(x, graft_zeros_on(GRAFT_F32, 1, s4, dev));
  t = graft_tanh(graft_sqrt(graft_matmul(t, x)));
  t = graft_reshape(t, 1, s4);
  CHECK(t == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[3]", "[4]"));
  /* NULL pointer arguments other than tensors */
  CHECK(graft_from_host(NULL, GRAFT_F32, 1, s4, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, NULL, NULL));
  CHECK(graft_item(x, NULL) != GRAFT_OK);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[3]", NULL));
  double d;
  CHECK(graft_item(NULL, &d) == GRAFT_ERR_NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, NULL, NULL));
  CHECK(graft_to_host(NULL, &d, 8) == GRAFT_ERR_NULL);
  CHECK(expect_err(GRAFT_ERR_NULL, NULL, NULL));
  END();
  CHECK(sane());
}

TEST(test_err_released) {
  const double v[3] = {1, 2, 3};
  graft_tensor *x = mk1(GRAFT_F32, 3, v); /* outside any scope: released by hand */
  graft_release(x);
  CHECK(graft_exp(x) == NULL);
  CHECK(expect_err(GRAFT_ERR_RELEASED, "released", NULL));
  CHECK(graft_numel(x) == -1);
  CHECK(expect_err(GRAFT_ERR_RELEASED, NULL, NULL));
  double d;
  CHECK(graft_item(x, &d) == GRAFT_ERR_RELEASED);
  CHECK(expect_err(GRAFT_ERR_RELEASED, NULL, NULL));
  graft_release(x); /* double release */
  CHECK(expect_err(GRAFT_ERR_RELEASED, NULL, NULL));
  CHECK(sane());
}

TEST(test_err_shape) {
  BEGIN();
  double v[12] = {0};
  const int64_t s23[2] = {2, 3}, s4[1] = {4}, s42[2] = {4, 2}, s32[2] = {3, 2};
  graft_tensor *a = mk(GRAFT_F32, 2, s23, v);
  CHECK(graft_add(a, mk(GRAFT_F32, 1, s4, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[4]"));
  CHECK(graft_matmul(a, mk(GRAFT_F32, 2, s42, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[4,2]"));
  graft_tensor *ts[2] = {a, mk(GRAFT_F32, 2, s32, v)};
  CHECK(graft_concat(ts, 2, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[3,2]"));
  CHECK(graft_reshape(a, 1, s4) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[4]"));
  END();
  CHECK(sane());
}

TEST(test_err_dtype) {
  BEGIN();
  const double v[3] = {1, 2, 3};
  CHECK(graft_add(mk1(GRAFT_F32, 3, v), mk1(GRAFT_I32, 3, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f32", "i32"));
  CHECK(graft_exp(mk1(GRAFT_I32, 3, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "i32", NULL));
  CHECK(graft_logical_and(mk1(GRAFT_F32, 3, v), mk1(GRAFT_F32, 3, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f32", NULL));
  CHECK(graft_add(mk1(GRAFT_BOOL, 3, v), mk1(GRAFT_BOOL, 3, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  CHECK(graft_from_host(v, (graft_dtype)42, 1, (const int64_t[]){3}, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, NULL, NULL));
  CHECK(graft_convert(mk1(GRAFT_F32, 3, v), (graft_dtype)42) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, NULL, NULL));
  END();
  CHECK(sane());
}

TEST(test_err_device) {
  BEGIN();
  const double v[3] = {1, 2, 3};
  const int64_t s3[1] = {3};
  const int other = dev ? 0 : 1;
  char d0[32], d1[32], past_msg[32];
  check_device_str(dev, d0, sizeof d0);
  check_device_str(other, d1, sizeof d1);
  graft_tensor *a = mk_dev(GRAFT_F32, 1, s3, v, dev), *b = mk_dev(GRAFT_F32, 1, s3, v, other);
  CHECK(a && b && graft_device(a) == dev && graft_device(b) == other);
  CHECK(graft_add(a, b) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, d0, d1));
  CHECK(graft_matmul(a, b) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, NULL, NULL));
  graft_tensor *ts[2] = {a, b};
  CHECK(graft_concat(ts, 2, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, NULL, NULL));
  const int past = graft_device_count() + 2; /* an id past the last device */
  snprintf(past_msg, sizeof past_msg, "no device %d", past);
  CHECK(graft_from_host(v, GRAFT_F32, 1, s3, past) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, past_msg, NULL));
  CHECK(graft_from_host(v, GRAFT_F32, 1, s3, -1) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, "no device -1", NULL));
  /* moving b to a's device makes the op valid */
  const double w[3] = {2, 4, 6};
  CHECK(expect1_d(graft_add(a, graft_to_device(b, dev)), GRAFT_F32, 3, w, 0));
  END();
  CHECK(sane());
}

TEST(test_err_axis) {
  BEGIN();
  double v[6] = {0};
  const int64_t s23[2] = {2, 3};
  graft_tensor *a = mk(GRAFT_F32, 2, s23, v);
  const int ax5[1] = {5}, rep[2] = {0, 0}, prm[2] = {1, 1};
  CHECK(graft_sum(a, ax5, 1, false) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, "5", NULL));
  CHECK(graft_max(a, rep, 2, true) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, "repeated", NULL));
  CHECK(graft_argmax(a, -3, false) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, "-3", NULL));
  graft_tensor *ts[2] = {a, a};
  CHECK(graft_concat(ts, 2, 2) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  CHECK(graft_transpose(a, prm) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  CHECK(graft_dim(a, 2) == -1);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  CHECK(graft_dim(a, -1) == 3);
  END();
  CHECK(sane());
}

TEST(test_err_oom) {
  BEGIN();
  const int64_t n = 4 << 20; /* 4M floats = 16 MiB */
  graft_tensor *t = graft_full_on(1.5, GRAFT_F32, 1, &n, dev);
  CHECK(t != NULL);
  float *buf = malloc((size_t)n * sizeof *buf);
  graft_set_memory_limit(1 << 20);
  CHECK(graft_to_host(t, buf, (size_t)n * sizeof *buf) == GRAFT_ERR_OOM);
  CHECK(expect_err(GRAFT_ERR_OOM, "memory", NULL));
  CHECK(graft_is_pending(t));
  CHECK(sane()); /* small work still fits under the limit */
  graft_set_memory_limit(0);
  CHECK(graft_to_host(t, buf, (size_t)n * sizeof *buf) == GRAFT_OK);
  int all = 1;
  for (int64_t i = 0; i < n; i++) all &= buf[i] == 1.5f;
  CHECK(all);
  free(buf);
  END();
  CHECK(sane());
}

TEST(test_err_gather_oob) {
  BEGIN();
  const double v[4] = {10, 20, 30, 40};
  const int64_t bad[3] = {0, 4, 1}, neg[2] = {-1, 0}, good[3] = {3, 0, 1};
  graft_tensor *a = mk1(GRAFT_F32, 4, v);
  graft_tensor *g = graft_gather(a, 0, mk1_i(GRAFT_I64, 3, bad));
  CHECK(g != NULL); /* recorded lazily; fails at sync */
  float out[3];
  CHECK(graft_to_host(g, out, sizeof out) == GRAFT_ERR_ARG);
  CHECK(expect_err(GRAFT_ERR_ARG, "4", NULL));
  CHECK(graft_to_host(graft_gather(a, 0, mk1_i(GRAFT_I32, 2, neg)), out, 2 * sizeof *out) == GRAFT_ERR_ARG);
  CHECK(expect_err(GRAFT_ERR_ARG, "-1", NULL));
  /* the input and the failed tensor stay usable */
  CHECK(graft_numel(g) == 3 && graft_get_dtype(g) == GRAFT_F32);
  const double w[3] = {40, 10, 20}, s[1] = {100};
  CHECK(expect1_d(graft_gather(a, 0, mk1_i(GRAFT_I64, 3, good)), GRAFT_F32, 3, w, 0));
  CHECK(expect_d(graft_sum(a, NULL, 0, false), GRAFT_F32, 0, NULL, s, 0));
  /* scatter_add out of range fails the same way */
  CHECK(graft_to_host(graft_scatter_add(a, 0, mk1_i(GRAFT_I64, 3, bad), mk1(GRAFT_F32, 3, v)), out, 0) != GRAFT_OK);
  CHECK(expect_err(GRAFT_ERR_ARG, NULL, NULL));
  END();
  CHECK(sane());
}

TEST(test_err_to_host_and_item) {
  BEGIN();
  const int64_t s23[2] = {2, 3};
  double v[6] = {1, 2, 3, 4, 5, 6}, d;
  graft_tensor *a = mk(GRAFT_F32, 2, s23, v);
  float out[6];
  CHECK(graft_to_host(a, out, 5 * sizeof(float)) == GRAFT_ERR_ARG);
  CHECK(expect_err(GRAFT_ERR_ARG, "[2,3]", "24"));
  CHECK(graft_item(a, &d) == GRAFT_ERR_SHAPE);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", NULL));
  CHECK(graft_to_host(a, out, sizeof out) == GRAFT_OK && out[5] == 6);
  END();
  CHECK(sane());
}

/* conv2d and pooling sizes past int64 are GRAFT_ERR_SHAPE errors, never signed overflow. */
TEST(test_err_huge_sizes) {
  BEGIN();
  const int64_t xs[4] = {1, 1, INT64_C(1) << 40, 1}, k1[4] = {1, 1, 1, 1};
  const int64_t kbig[4] = {1, 1, INT64_C(1) << 34, 1}, p64k[4] = {1, 1, 65536, 65536};
  graft_tensor *x = graft_full_on(1, GRAFT_F32, 4, xs, dev);
  CHECK(graft_conv2d_ex(x, graft_full_on(1, GRAFT_F32, 4, k1, dev), NULL, NULL, NULL, NULL,
                        (int[]){INT_MAX, 1}, 1) == NULL); /* lhs dilation */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1,1,1099511627776,1]", "lhs dilation 2147483647"));
  CHECK(graft_conv2d_ex(x, graft_full_on(1, GRAFT_F32, 4, kbig, dev), NULL, NULL, NULL,
                        (int[]){INT_MAX, 1}, NULL, 1) == NULL); /* dilation * (kernel - 1) */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1,1,17179869184,1]", "dilation 2147483647"));
  const int64_t xw[4] = {1, 1, 4294967299, 1}; /* dilated by INT_MAX: INT64_MAX rows */
  graft_tensor *x_w = graft_full_on(1, GRAFT_F32, 4, xw, dev);
  CHECK(graft_conv2d_ex(x_w, graft_full_on(1, GRAFT_F32, 4, k1, dev), NULL, (int[]){1, 0}, NULL,
                        NULL, (int[]){INT_MAX, 1}, 1) == NULL); /* + pad */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1,1,4294967299,1]", "padding 1/0"));
  graft_tensor *p = graft_full_on(1, GRAFT_F32, 4, p64k, dev);
  const int k[2] = {65536, 65536};
  CHECK(graft_max_pool2d_backward(p, p, k, NULL, NULL) == NULL); /* dy not the pooled shape */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1,1,65536,65536]", "pooled shape"));
  END();
  CHECK(sane());
}

int main(void) {
  if (ops_device_init("test_ops_nn")) return 2;
  RUN(test_matmul);
  RUN(test_conv2d);
  RUN(test_gather);
  RUN(test_scatter_add);
  RUN(test_pool2d);
  RUN(test_err_null);
  RUN(test_err_released);
  RUN(test_err_shape);
  RUN(test_err_huge_sizes);
  RUN(test_err_dtype);
  RUN(test_err_device);
  RUN(test_err_axis);
  RUN(test_err_oom);
  RUN(test_err_gather_oob);
  RUN(test_err_to_host_and_item);
  RUN(test_no_live_tensors);
  graft_shutdown();
  return CHECK_DONE();
}
