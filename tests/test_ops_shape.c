/* Primitive op tests, shape part: broadcast_to, reshape, transpose, t, slice, concat, pad,
 * reductions (sum/max/min/prod, argmax), to_device, to_host and item, every accepted dtype.
 * Public API only; expectations are computed in plain C here, never by graft. */
#include "graft.h"
#include "check.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "ops_helpers.h"

/* Test data: value i of a tensor of dt (small, exact in every dtype). */
static double val(graft_dtype dt, int64_t i) {
  if (dt == GRAFT_BOOL) return i % 3 == 0;
  if (dt == GRAFT_U8) return (double)((i * 7) % 5);
  return (double)((i * 7) % 5 - 2);
}
static graft_tensor *mkv(graft_dtype dt, int nd, const int64_t *shape, double *v) {
  int64_t n = numel_of(nd, shape);
  for (int64_t i = 0; i < n; i++) v[i] = val(dt, i);
  return mk(dt, nd, shape, v);
}
static void unravel(int64_t i, int nd, const int64_t *shape, int64_t *c) {
  for (int d = nd - 1; d >= 0; d--) c[d] = i % shape[d], i /= shape[d];
}
static int64_t ravel(int nd, const int64_t *shape, const int64_t *c) {
  int64_t i = 0;
  for (int d = 0; d < nd; d++) i = i * shape[d] + c[d];
  return i;
}

/* ================= movement ================= */

TEST(test_broadcast_to) {
  BEGIN();
  const int64_t s3[1] = {3}, s23[2] = {2, 3}, s21[2] = {2, 1}, s223[3] = {2, 2, 3};
  double v[6], w[12];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 1, s3, v);
    for (int i = 0; i < 6; i++) w[i] = v[i % 3];
    CHECK(expect_d(graft_broadcast_to(a, 2, s23), dt, 2, s23, w, 0));
    graft_tensor *b = mkv(dt, 2, s21, v);
    for (int i = 0; i < 12; i++) w[i] = v[(i / 3) % 2];
    CHECK(expect_d(graft_broadcast_to(b, 3, s223), dt, 3, s223, w, 0));
    graft_tensor *c = graft_scalar_on(dt == GRAFT_BOOL ? 1 : 5, dt, dev);
    for (int i = 0; i < 6; i++) w[i] = dt == GRAFT_BOOL ? 1 : 5;
    CHECK(expect_d(graft_broadcast_to(c, 2, s23), dt, 2, s23, w, 0));
  }
  const int64_t s24[2] = {2, 4};
  CHECK(graft_broadcast_to(mk(GRAFT_F32, 1, s3, v), 2, s24) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[3]", "[2,4]"));
  CHECK(graft_broadcast_to(mk(GRAFT_F32, 2, s23, v), 1, s3) == NULL); /* fewer dims */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[3]"));
  END();
}

TEST(test_reshape) {
  BEGIN();
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s6[1] = {6}, s161[3] = {1, 6, 1};
  const int64_t m1[1] = {-1}, s3m[2] = {3, -1}, sm1[3] = {1, -1, 1};
  double v[6];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s23, v);
    CHECK(expect_d(graft_reshape(a, 2, s32), dt, 2, s32, v, 0));
    CHECK(expect_d(graft_reshape(a, 1, m1), dt, 1, s6, v, 0));
    CHECK(expect_d(graft_reshape(a, 2, s3m), dt, 2, s32, v, 0));
    CHECK(expect_d(graft_reshape(a, 3, sm1), dt, 3, s161, v, 0));
    CHECK(expect_d(graft_reshape(graft_reshape(a, 1, s6), 2, s23), dt, 2, s23, v, 0));
    graft_tensor *one = graft_reshape(mk(dt, 1, (const int64_t[]){1}, v), 0, NULL);
    CHECK(expect_d(one, dt, 0, NULL, v, 0));
  }
  graft_tensor *a = mk(GRAFT_F32, 2, s23, v);
  const int64_t s4[1] = {4}, mm[2] = {-1, -1}, s4m[2] = {4, -1}, neg[2] = {-2, -3};
  CHECK(graft_reshape(a, 1, s4) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[4]"));
  CHECK(graft_reshape(a, 2, mm) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", NULL));
  CHECK(graft_reshape(a, 2, s4m) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", NULL));
  CHECK(graft_reshape(a, 2, neg) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

TEST(test_transpose) {
  BEGIN();
  const int64_t s[3] = {2, 3, 4};
  const int perm[3] = {2, 0, 1}, inv[3] = {1, 2, 0}, negp[3] = {-1, 0, -2};
  const int64_t ts[3] = {4, 2, 3};
  double v[24], w[24];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 3, s, v);
    for (int64_t o = 0; o < 24; o++) { /* out[c] = a[c'] with c'[perm[i]] = c[i] */
      int64_t c[3], ci[3];
      unravel(o, 3, ts, c);
      for (int i = 0; i < 3; i++) ci[perm[i]] = c[i];
      w[o] = v[ravel(3, s, ci)];
    }
    graft_tensor *t = graft_transpose(a, perm);
    CHECK(expect_d(t, dt, 3, ts, w, 0));
    CHECK(expect_d(graft_transpose(a, negp), dt, 3, ts, w, 0));
    CHECK(expect_d(graft_transpose(t, inv), dt, 3, s, v, 0)); /* back to the original */
    const int id[3] = {0, 1, 2};
    CHECK(expect_d(graft_transpose(a, id), dt, 3, s, v, 0));
  }
  graft_tensor *a = mk(GRAFT_F32, 3, s, v);
  const int rep[3] = {0, 0, 1}, oor[3] = {0, 1, 3};
  CHECK(graft_transpose(a, rep) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, "[2,3,4]", NULL));
  CHECK(graft_transpose(a, oor) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  END();
}

TEST(test_t) {
  BEGIN();
  const int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s234[3] = {2, 3, 4}, s243[3] = {2, 4, 3};
  double v[24], w[24];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s23, v);
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++) w[i * 2 + j] = v[j * 3 + i];
    CHECK(expect_d(graft_t(a), dt, 2, s32, w, 0));
    CHECK(expect_d(graft_t(graft_t(a)), dt, 2, s23, v, 0));
    graft_tensor *b = mkv(dt, 3, s234, v);
    for (int p = 0; p < 2; p++)
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) w[p * 12 + i * 3 + j] = v[p * 12 + j * 4 + i];
    CHECK(expect_d(graft_t(b), dt, 3, s243, w, 0));
  }
  CHECK(graft_t(mk1(GRAFT_F32, 3, v)) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

TEST(test_slice) {
  BEGIN();
  const int64_t s[2] = {4, 5};
  double v[20], w[20];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s, v);
    /* rows 1..4 step 2, cols 0..5 step 2 -> [2,3] */
    const int64_t st[2] = {1, 0}, li[2] = {4, 5}, sd[2] = {2, 2}, o1[2] = {2, 3};
    int k = 0;
    for (int i = 1; i < 4; i += 2)
      for (int j = 0; j < 5; j += 2) w[k++] = v[i * 5 + j];
    CHECK(expect_d(graft_slice(a, st, li, sd), dt, 2, o1, w, 0));
    /* stride NULL: rows 2..4, cols 1..3 */
    const int64_t st2[2] = {2, 1}, li2[2] = {4, 3}, o2[2] = {2, 2};
    k = 0;
    for (int i = 2; i < 4; i++)
      for (int j = 1; j < 3; j++) w[k++] = v[i * 5 + j];
    CHECK(expect_d(graft_slice(a, st2, li2, NULL), dt, 2, o2, w, 0));
    /* stride 3 on cols: 0,3 ; empty slice */
    const int64_t st3[2] = {0, 0}, li3[2] = {1, 5}, sd3[2] = {1, 3}, o3[2] = {1, 2};
    w[0] = v[0], w[1] = v[3];
    CHECK(expect_d(graft_slice(a, st3, li3, sd3), dt, 2, o3, w, 0));
    const int64_t st4[2] = {2, 2}, li4[2] = {2, 5}, o4[2] = {0, 3};
    CHECK(expect_d(graft_slice(a, st4, li4, NULL), dt, 2, o4, w, 0));
  }
  graft_tensor *a = mk(GRAFT_F32, 2, s, v);
  const int64_t z[2] = {0, 0}, big[2] = {5, 5}, ok[2] = {4, 5}, zs[2] = {1, 0}, back[2] = {3, 2}, bl[2] = {2, 5};
  CHECK(graft_slice(a, z, big, NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[4,5]", NULL));
  CHECK(graft_slice(a, z, ok, zs) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[4,5]", NULL));
  CHECK(graft_slice(a, back, bl, NULL) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

TEST(test_concat) {
  BEGIN();
  const int64_t sa[2] = {2, 1}, sb[2] = {2, 2}, sc[2] = {2, 3}, so[2] = {2, 6};
  const int64_t ra[2] = {1, 3}, rb[2] = {2, 3}, rc[2] = {3, 3}, ro[2] = {6, 3};
  double va[6], vb[6], vc[9], w[18];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    /* along axis 1 (and -1): rows are [a | b | c] */
    for (int i = 0; i < 6; i++) va[i] = val(dt, i + 1), vb[i] = val(dt, i + 7);
    for (int i = 0; i < 9; i++) vc[i] = val(dt, i + 13);
    graft_tensor *ts[3] = {mk(dt, 2, sa, va), mk(dt, 2, sb, vb), mk(dt, 2, sc, vc)};
    for (int r = 0; r < 2; r++) {
      double *o = w + r * 6;
      o[0] = va[r];
      o[1] = vb[r * 2], o[2] = vb[r * 2 + 1];
      o[3] = vc[r * 3], o[4] = vc[r * 3 + 1], o[5] = vc[r * 3 + 2];
    }
    graft_tensor *cat = graft_concat(ts, 3, 1);
    CHECK(expect_d(cat, dt, 2, so, w, 0));
    CHECK(expect_d(graft_concat(ts, 3, -1), dt, 2, so, w, 0));
    /* concat then slice gives the pieces back */
    const int64_t s0[2] = {0, 0}, l0[2] = {2, 1}, s1[2] = {0, 1}, l1[2] = {2, 3}, s2[2] = {0, 3}, l2[2] = {2, 6};
    CHECK(expect_d(graft_slice(cat, s0, l0, NULL), dt, 2, sa, va, 0));
    CHECK(expect_d(graft_slice(cat, s1, l1, NULL), dt, 2, sb, vb, 0));
    CHECK(expect_d(graft_slice(cat, s2, l2, NULL), dt, 2, sc, vc, 0));
    /* along axis 0: rows stack */
    graft_tensor *us[3] = {mk(dt, 2, ra, va), mk(dt, 2, rb, vb), mk(dt, 2, rc, vc)};
    for (int i = 0; i < 3; i++) w[i] = va[i];
    for (int i = 0; i < 6; i++) w[3 + i] = vb[i];
    for (int i = 0; i < 9; i++) w[9 + i] = vc[i];
    CHECK(expect_d(graft_concat(us, 3, 0), dt, 2, ro, w, 0));
    CHECK(expect_d(graft_concat(us, 1, 0), dt, 2, ra, va, 0));
  }
  /* errors: shapes off the axis, dtypes, axis */
  graft_tensor *x = mk(GRAFT_F32, 2, sb, va), *y = mk(GRAFT_F32, 2, ra, va);
  graft_tensor *bad[2] = {x, y};
  CHECK(graft_concat(bad, 2, 1) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,2]", "[1,3]"));
  graft_tensor *mixed[2] = {x, mk(GRAFT_I32, 2, sb, va)};
  CHECK(graft_concat(mixed, 2, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "f32", "i32"));
  graft_tensor *same[2] = {x, x};
  CHECK(graft_concat(same, 2, 2) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  CHECK(graft_concat(same, 0, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_ARG, NULL, NULL));
  /* many operands (past any small fixed-size buffer) */
  graft_tensor *many[20];
  double mv[20];
  const int64_t one[1] = {1};
  for (int i = 0; i < 20; i++) mv[i] = i, many[i] = graft_full_on(i, GRAFT_I32, 1, one, dev);
  CHECK(expect1_d(graft_concat(many, 20, 0), GRAFT_I32, 20, mv, 0));
  END();
}

TEST(test_pad) {
  BEGIN();
  const int64_t s[2] = {2, 3}, so[2] = {3, 5}, lo[2] = {1, 0}, hi[2] = {0, 2};
  double v[6], w[15];
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    double fill = dt == GRAFT_BOOL ? 1 : 9;
    graft_tensor *a = mkv(dt, 2, s, v);
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 5; j++) w[i * 5 + j] = (i >= 1 && j < 3) ? v[(i - 1) * 3 + j] : fill;
    CHECK(expect_d(graft_pad(a, lo, hi, fill), dt, 2, so, w, 0));
    /* pad then slice = original */
    const int64_t st[2] = {1, 0}, li[2] = {3, 3};
    CHECK(expect_d(graft_slice(graft_pad(a, lo, hi, fill), st, li, NULL), dt, 2, s, v, 0));
  }
  const int64_t neg[2] = {-1, 0};
  CHECK(graft_pad(mk(GRAFT_F32, 2, s, v), neg, hi, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

/* ================= reductions ================= */

enum { R_SUM, R_MAX, R_MIN, R_PROD };
typedef graft_tensor *(*reduce_fn)(graft_tensor *, const int *, int, bool);
static const reduce_fn RFN[4] = {graft_sum, graft_max, graft_min, graft_prod};
static const char *RNAME[4] = {"sum", "max", "min", "prod"};

/* Reference reduction over the axes in mask of a row-major [nd] tensor; returns output count. */
static int64_t ref_reduce(int op, graft_dtype dt, int nd, const int64_t *shape, const double *v,
                          unsigned mask, double *out) {
  int64_t os[GRAFT_MAX_DIMS];
  int ond = 0;
  for (int d = 0; d < nd; d++)
    if (!(mask >> d & 1)) os[ond++] = shape[d];
  int64_t on = numel_of(ond, os), n = numel_of(nd, shape);
  int64_t *iacc = calloc((size_t)on + 1, sizeof *iacc);
  for (int64_t o = 0; o < on; o++) {
    out[o] = op == R_SUM ? 0 : op == R_PROD ? 1 : op == R_MAX ? -INFINITY : INFINITY;
    iacc[o] = op == R_PROD ? 1 : op == R_SUM ? 0 : op == R_MAX ? INT64_MIN : INT64_MAX;
  }
  for (int64_t i = 0; i < n; i++) {
    int64_t c[GRAFT_MAX_DIMS], oc[GRAFT_MAX_DIMS];
    unravel(i, nd, shape, c);
    int k = 0;
    for (int d = 0; d < nd; d++)
      if (!(mask >> d & 1)) oc[k++] = c[d];
    int64_t o = ravel(ond, os, oc);
    double x = v[i];
    int64_t xi = (int64_t)x;
    switch (op) {
    case R_SUM: out[o] += x; iacc[o] = (int64_t)((uint64_t)iacc[o] + (uint64_t)xi); break;
    case R_PROD: out[o] *= x; iacc[o] = (int64_t)((uint64_t)iacc[o] * (uint64_t)xi); break;
    case R_MAX: out[o] = isnan(out[o]) || isnan(x) ? NAN : x > out[o] ? x : out[o]; if (xi > iacc[o]) iacc[o] = xi; break;
    default: out[o] = isnan(out[o]) || isnan(x) ? NAN : x < out[o] ? x : out[o]; if (xi < iacc[o]) iacc[o] = xi; break;
    }
  }
  if (!is_flt(dt))
    for (int64_t o = 0; o < on; o++) out[o] = (double)wrap_to(dt, iacc[o]);
  free(iacc);
  return on;
}

TEST(test_reductions) {
  BEGIN();
  const int64_t s[3] = {2, 3, 4};
  double v[24], w[24];
  struct { int axes[3], naxes; unsigned mask; } cases[] = {
      {{1}, 1, 2}, {{0}, 1, 1}, {{-1}, 1, 4}, {{0, 2}, 2, 5}, {{2, -3}, 2, 5}, {{1, 2}, 2, 6},
      {{0, 1, 2}, 3, 7}, {{0}, 0, 7} /* NULL, 0: every axis */};
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    graft_tensor *a = mkv(dt, 3, s, v);
    for (int op = 0; op < 4; op++)
      for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int keep = 0; keep < 2; keep++) {
          ref_reduce(op, dt, 3, s, v, cases[c].mask, w);
          int64_t os[3];
          int ond = 0;
          for (int k = 0; k < 3; k++) {
            if (!(cases[c].mask >> k & 1)) os[ond++] = s[k];
            else if (keep) os[ond++] = 1;
          }
          graft_tensor *r = RFN[op](a, cases[c].naxes ? cases[c].axes : NULL, cases[c].naxes, keep);
          int ok = expect_d(r, dt, ond, os, w, tol_of(dt));
          if (!ok) fprintf(stderr, "  %s case %zu keepdim %d dtype %s\n", RNAME[op], c, keep, graft_dtype_name(dt));
          CHECK(ok);
        }
  }
  /* hand-checked: prod, integer wraparound in sum/prod, NaN in max/min */
  const double p4[4] = {1, 2, 3, 4};
  double r = 0;
  for (int d = 0; d < 7; d++) {
    CHECK(graft_item(graft_prod(mk1(NUM_DT[d], 4, p4), NULL, 0, false), &r) == GRAFT_OK && r == 24);
    CHECK(graft_item(graft_sum(mk1(NUM_DT[d], 4, p4), NULL, 0, false), &r) == GRAFT_OK && r == 10);
  }
  const int64_t u[3] = {200, 100, 1}, uw[1] = {45}, pu[4] = {3, 5, 7, 11}, puw[1] = {131};
  CHECK(expect_i(graft_sum(mk1_i(GRAFT_U8, 3, u), NULL, 0, false), GRAFT_U8, 0, NULL, uw));
  CHECK(expect_i(graft_prod(mk1_i(GRAFT_U8, 4, pu), NULL, 0, false), GRAFT_U8, 0, NULL, puw));
  const int64_t i2[2] = {INT32_MAX, 1}, i2w[1] = {INT32_MIN}, m2[2] = {INT32_MIN, -5}, m2w[1] = {INT32_MIN};
  CHECK(expect_i(graft_sum(mk1_i(GRAFT_I32, 2, i2), NULL, 0, false), GRAFT_I32, 0, NULL, i2w));
  CHECK(expect_i(graft_min(mk1_i(GRAFT_I32, 2, m2), NULL, 0, false), GRAFT_I32, 0, NULL, m2w));
  const int64_t l2[2] = {INT64_MAX, INT64_MAX - 1}, l2w[1] = {INT64_MAX};
  CHECK(expect_i(graft_max(mk1_i(GRAFT_I64, 2, l2), NULL, 0, false), GRAFT_I64, 0, NULL, l2w));
  const double nv[3] = {1, NAN, 3}, nn[1] = {NAN};
  for (int d = 0; d < 4; d++) {
    CHECK(expect_d(graft_max(mk1(FLOAT_DT[d], 3, nv), NULL, 0, false), FLOAT_DT[d], 0, NULL, nn, 0));
    CHECK(expect_d(graft_min(mk1(FLOAT_DT[d], 3, nv), NULL, 0, false), FLOAT_DT[d], 0, NULL, nn, 0));
  }
  /* reduce a 0-d tensor over all axes: itself */
  graft_tensor *sc = graft_scalar_on(2.5, GRAFT_F32, dev);
  CHECK(graft_item(graft_sum(sc, NULL, 0, false), &r) == GRAFT_OK && r == 2.5);
  END();
}

TEST(test_reduction_errors) {
  BEGIN();
  const int64_t s[2] = {2, 3};
  double v[6];
  graft_tensor *a = mkv(GRAFT_F32, 2, s, v);
  for (int op = 0; op < 4; op++) {
    const int oor[1] = {2}, rep[2] = {1, 1}, rep2[2] = {1, -1}, neg[1] = {-3};
    CHECK(RFN[op](a, oor, 1, false) == NULL);
    CHECK(expect_err(GRAFT_ERR_AXIS, "2", NULL));
    CHECK(RFN[op](a, neg, 1, true) == NULL);
    CHECK(expect_err(GRAFT_ERR_AXIS, "-3", NULL));
    CHECK(RFN[op](a, rep, 2, false) == NULL);
    CHECK(expect_err(GRAFT_ERR_AXIS, "repeated", NULL));
    CHECK(RFN[op](a, rep2, 2, false) == NULL);
    CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
    CHECK(RFN[op](mkv(GRAFT_BOOL, 2, s, v), NULL, 0, false) == NULL);
    CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
    const int one[1] = {0};
    CHECK(RFN[op](a, one, -1, false) == NULL);
    CHECK(expect_err(GRAFT_ERR_ARG, NULL, NULL));
  }
  END();
  CHECK(sane());
}

TEST(test_argmax) {
  BEGIN();
  const int64_t s[2] = {3, 4}, s3[1] = {3}, s4[1] = {4}, s31[2] = {3, 1}, s14[2] = {1, 4};
  /* ties: the first maximum wins */
  const double v[12] = {3, 1, 3, 2,   0, 0, 0, 0,   1, 4, 2, 4};
  const int64_t w1[3] = {0, 0, 1}, w0[4] = {0, 2, 0, 2};
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    graft_tensor *a = mk(dt, 2, s, v);
    CHECK(expect_i(graft_argmax(a, 1, false), GRAFT_I64, 1, s3, w1));
    CHECK(expect_i(graft_argmax(a, -1, true), GRAFT_I64, 2, s31, w1));
    CHECK(expect_i(graft_argmax(a, 0, false), GRAFT_I64, 1, s4, w0));
    CHECK(expect_i(graft_argmax(a, 0, true), GRAFT_I64, 2, s14, w0));
  }
  /* NaN counts as the maximum; the first NaN wins */
  const double n[8] = {1, NAN, 5, NAN,  7, 2, 9, NAN};
  const int64_t s24[2] = {2, 4}, s2[1] = {2}, nw[2] = {1, 3};
  for (int d = 0; d < 4; d++)
    CHECK(expect_i(graft_argmax(mk(FLOAT_DT[d], 2, s24, n), 1, false), GRAFT_I64, 1, s2, nw));
  /* u8 compares unsigned, i64 exactly */
  const int64_t u[3] = {100, 255, 128}, uw[1] = {1};
  CHECK(expect_i(graft_argmax(mk1_i(GRAFT_U8, 3, u), 0, false), GRAFT_I64, 0, NULL, uw));
  const int64_t l[3] = {INT64_C(1) << 53, (INT64_C(1) << 53) + 1, INT64_C(1) << 53}, lw[1] = {1};
  CHECK(expect_i(graft_argmax(mk1_i(GRAFT_I64, 3, l), 0, false), GRAFT_I64, 0, NULL, lw));
  CHECK(graft_argmax(mk(GRAFT_BOOL, 2, s, v), 0, false) == NULL);
  CHECK(expect_err(GRAFT_ERR_DTYPE, "bool", NULL));
  CHECK(graft_argmax(mk(GRAFT_F32, 2, s, v), 2, false) == NULL);
  CHECK(expect_err(GRAFT_ERR_AXIS, NULL, NULL));
  const int64_t s30[2] = {3, 0};
  CHECK(graft_argmax(graft_zeros_on(GRAFT_F32, 2, s30, dev), 1, false) == NULL); /* empty axis */
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

/* ================= devices and host transfers ================= */

/* expect_d for a result on device d rather than the test device. */
static int expect_d_on(int d, graft_tensor *t, graft_dtype dt, int nd, const int64_t *shape,
                       const double *want, double tol) {
  int keep = dev;
  dev = d;
  int ok = expect_d(t, dt, nd, shape, want, tol);
  dev = keep;
  return ok;
}

/* Copies between the test device and two CPU devices other than it (on an accelerator: its
 * uploads and downloads). */
TEST(test_to_device) {
  BEGIN();
  const int64_t s[2] = {2, 3};
  double v[6], w[6];
  const int o1 = dev == 2 ? 1 : 2, o2 = dev == 3 ? 1 : 3;
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s, v);
    graft_tensor *b = graft_to_device(a, o1);
    CHECK(b && graft_device(b) == o1 && graft_device(a) == dev);
    CHECK(expect_d_on(o1, b, dt, 2, s, v, 0));
    graft_tensor *back = graft_to_device(b, dev);
    CHECK(back && graft_device(back) == dev);
    CHECK(expect_d(back, dt, 2, s, v, 0));
  }
  for (int d = 0; d < 7; d++) {
    graft_dtype dt = NUM_DT[d];
    graft_tensor *a = mkv(dt, 2, s, v);
    /* a pending tensor is synced first; ops on device o2 stay on o2 */
    graft_tensor *b = graft_to_device(graft_add(a, a), o2);
    CHECK(b && graft_device(b) == o2 && !graft_is_pending(b));
    graft_tensor *c = graft_add(b, b);
    CHECK(c && graft_device(c) == o2);
    for (int i = 0; i < 6; i++) w[i] = (double)wrap_to(dt, (int64_t)(4 * v[i]));
    CHECK(expect_d_on(o2, c, dt, 2, s, w, tol_of(dt)));
    graft_tensor *e = mk_dev(dt, 2, s, v, o1);
    CHECK(graft_device(e) == o1 && graft_device(graft_neg(e)) == o1);
  }
  /* an id past the last device, and a negative one */
  const int past = graft_device_count() + 2;
  char msg[32];
  snprintf(msg, sizeof msg, "no device %d", past);
  CHECK(graft_to_device(mkv(GRAFT_F32, 2, s, v), past) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, msg, NULL));
  CHECK(graft_to_device(mkv(GRAFT_F32, 2, s, v), -1) == NULL);
  CHECK(expect_err(GRAFT_ERR_DEVICE, "no device -1", NULL));
  END();
}

TEST(test_to_host_and_item) {
  BEGIN();
  const int64_t s[2] = {2, 3};
  double v[6], x = 0;
  for (int d = 0; d < 8; d++) {
    graft_dtype dt = ALL_DT[d];
    graft_tensor *a = mkv(dt, 2, s, v);
    size_t es = graft_dtype_size(dt);
    unsigned char buf[64];
    CHECK(graft_to_host(a, buf, 6 * es) == GRAFT_OK);
    CHECK(graft_to_host(a, buf, 6 * es + 1) == GRAFT_ERR_ARG);
    CHECK(expect_err(GRAFT_ERR_ARG, "[2,3]", NULL));
    CHECK(graft_to_host(a, buf, 6 * es - 1) == GRAFT_ERR_ARG);
    CHECK(expect_err(GRAFT_ERR_ARG, "[2,3]", NULL));
    CHECK(graft_item(a, &x) == GRAFT_ERR_SHAPE);
    CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", NULL));
    /* a pending tensor: still readable after the errors */
    const int64_t st[2] = {1, 2}, li[2] = {2, 3};
    CHECK(graft_item(graft_slice(a, st, li, NULL), &x) == GRAFT_OK && x == v[5]);
  }
  graft_tensor *z = graft_zeros_on(GRAFT_F32, 1, (const int64_t[]){0}, dev);
  CHECK(z && graft_numel(z) == 0 && graft_to_host(z, NULL, 0) == GRAFT_OK);
  CHECK(graft_item(z, &x) == GRAFT_ERR_SHAPE);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[0]", NULL));
  END();
  CHECK(sane());
}

/* Sizes past int64 are GRAFT_ERR_SHAPE errors naming the op and operands, never signed
 * overflow (this program runs under UBSan with -fno-sanitize-recover). */
TEST(test_huge_sizes) {
  BEGIN();
  const int64_t M = INT64_MAX, s23[2] = {2, 3}, z[2] = {0, 0}, e56[1] = {INT64_C(1) << 56};
  graft_tensor *a = graft_full_on(1, GRAFT_F32, 2, s23, dev);
  CHECK(graft_pad(a, (int64_t[]){M, 0}, (int64_t[]){M, 0}, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "9223372036854775807"));
  CHECK(graft_pad_ex(a, z, z, (int64_t[]){0, M}, 0) == NULL); /* 2 gaps of M */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "pad", "interior 9223372036854775807"));
  CHECK(graft_pad(a, (int64_t[]){INT64_C(1) << 60, 0}, z, 0) == NULL); /* fits int64, not numel */
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[1152921504606846978,3]", "[2,3]"));
  /* a huge stride takes one element: [2,1] */
  graft_tensor *sl = graft_slice(a, z, s23, (int64_t[]){M, M});
  CHECK(sl && graft_dim(sl, 0) == 1 && graft_dim(sl, 1) == 1);
  graft_tensor *h = graft_full_on(0, GRAFT_F32, 1, e56, dev), *ts[200];
  for (int i = 0; i < 200; i++) ts[i] = h;
  CHECK(graft_concat(ts, 200, 0) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "concat", "[72057594037927936]"));
  CHECK(graft_reshape(a, 3, (int64_t[]){-1, INT64_C(1) << 40, INT64_C(1) << 40}) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", "[-1,1099511627776,1099511627776]"));
  CHECK(graft_reshape(a, 3, (int64_t[]){M, M, 0}) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, "[2,3]", NULL));
  CHECK(graft_full_on(0, GRAFT_F32, 2, (int64_t[]){M, M}, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  CHECK(graft_iota_on(GRAFT_I64, 2, (int64_t[]){M, 2}, 0, dev) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  CHECK(graft_broadcast_to(a, 3, (int64_t[]){M, 2, 3}) == NULL);
  CHECK(expect_err(GRAFT_ERR_SHAPE, NULL, NULL));
  END();
}

/* The error starts with "fn: ", the function the user called (not an IR op such as "dot:",
 * "select:", "reduce_window:"), and an earlier error a NULL operand carries keeps its name. */
static int starts_with_fn(const char *fn, graft_status st) {
  const char *m = graft_last_error();
  size_t n = strlen(fn);
  int ok = graft_last_status() == st && !strncmp(m, fn, n) && !strncmp(m + n, ": ", 2);
  if (!ok) fprintf(stderr, "  want \"%s: \" (status %d), got %d: %s\n", fn, (int)st,
                   (int)graft_last_status(), m);
  graft_clear_error();
  return ok;
}

TEST(test_errors_name_the_function_called) {
  BEGIN();
  const int64_t s23[2] = {2, 3}, s4[1] = {4}, z[2] = {0, 0}, neg[2] = {-1, 0};
  graft_tensor *a = graft_full_on(1, GRAFT_F32, 2, s23, dev);
  graft_tensor *ai = graft_full_on(1, GRAFT_I32, 2, s23, dev);
  graft_tensor *a64 = graft_full_on(1, GRAFT_F64, 2, (int64_t[]){3, 2}, dev);
  CHECK(!graft_exp(ai) && starts_with_fn("graft_exp", GRAFT_ERR_DTYPE));
  CHECK(!graft_add(a, ai) && starts_with_fn("graft_add", GRAFT_ERR_DTYPE));
  CHECK(!graft_matmul(a, a64) && starts_with_fn("graft_matmul", GRAFT_ERR_DTYPE));
  CHECK(!graft_where(a, a, a) && starts_with_fn("graft_where", GRAFT_ERR_DTYPE));
  CHECK(!graft_reshape(a, 1, s4) && starts_with_fn("graft_reshape", GRAFT_ERR_SHAPE));
  CHECK(!graft_pad(a, neg, z, 0) && starts_with_fn("graft_pad", GRAFT_ERR_SHAPE));
  CHECK(!graft_pad_ex(a, neg, z, z, 0) && starts_with_fn("graft_pad_ex", GRAFT_ERR_SHAPE));
  CHECK(!graft_zeros_on(GRAFT_F32, 1, (int64_t[]){-1}, dev) && starts_with_fn("graft_zeros_on",
                                                                     GRAFT_ERR_SHAPE));
  CHECK(!graft_sum(graft_full_on(0, GRAFT_BOOL, 1, s4, dev), NULL, 0, false) &&
        starts_with_fn("graft_sum", GRAFT_ERR_DTYPE));
  CHECK(!graft_max_pool2d(graft_full_on(0, GRAFT_F32, 2, s23, dev), (int[]){3, 3}, NULL, NULL) &&
        starts_with_fn("graft_max_pool2d", GRAFT_ERR_SHAPE));
  CHECK(!graft_conv2d(graft_full_on(0, GRAFT_F32, 4, (int64_t[]){1, 1, 2, 2}, dev),
                      graft_full_on(0, GRAFT_F32, 4, (int64_t[]){1, 1, 3, 3}, dev), NULL, NULL,
                      NULL, 1) &&
        starts_with_fn("graft_conv2d", GRAFT_ERR_SHAPE));
  /* the first error survives a chain; a new error after an old one names its own call */
  CHECK(!graft_exp(graft_neg(graft_add(a, ai))) && starts_with_fn("graft_add", GRAFT_ERR_DTYPE));
  CHECK(!graft_exp(ai));
  CHECK(!graft_reshape(a, 1, s4) && starts_with_fn("graft_reshape", GRAFT_ERR_SHAPE));
  END();
}

int main(void) {
  if (ops_device_init("test_ops_shape")) return 2;
  RUN(test_broadcast_to);
  RUN(test_reshape);
  RUN(test_transpose);
  RUN(test_t);
  RUN(test_slice);
  RUN(test_concat);
  RUN(test_pad);
  RUN(test_huge_sizes);
  RUN(test_errors_name_the_function_called);
  RUN(test_reductions);
  RUN(test_reduction_errors);
  RUN(test_argmax);
  RUN(test_to_device);
  RUN(test_to_host_and_item);
  RUN(test_no_live_tensors);
  graft_shutdown();
  return CHECK_DONE();
}
