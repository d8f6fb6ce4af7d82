/* Recurrent layers decomposed into primitives: an LSTM layer over a whole sequence and its
 * gradient (backpropagation through time), with PyTorch's nn.LSTM semantics (gates i,f,g,o).
 *
 * Why a whole-sequence composite: traced op by op (PyTorch's aten::lstm decomposition and its
 * autograd), a step costs ~45 ops per timestep, each through the dispatcher. Here the work that
 * does not depend on the recurrence is done once over the whole sequence: the input projection
 * is ONE [S*B,I]x[I,4H] GEMM; the backward's per-step coefficients (sigmoid/tanh derivatives)
 * are computed once over the whole sequence from the saved activations; dW_ih, dW_hh, db and dx
 * are whole-sequence GEMMs and a sum over the stacked per-step gate gradients. Per timestep only
 * the recurrence remains: the forward's [B,H]x[H,4H] GEMM and gate math (17 nodes), the
 * backward's dh GEMM and gate-gradient math (12 nodes). Rows
 * of the stacked [S*B, .] values are time-major: step t is rows t*B .. t*B+B-1, so a step's
 * slice is one node.
 *
 * Like composite.c it uses only the public API (and error.h through composite.h): each entry
 * checks its inputs, opens a scope for its intermediates and keeps only its results. */
#include "graft.h"
#include "composite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t s, b, i, h; /* sequence, batch, input size, hidden size */
  graft_dtype dt;
  int dev;
} rnn_dims;

/* "[d0,d1,...]" of t into buf. */
static const char *rnn_shape(const graft_tensor *t, char *buf, size_t cap) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = graft_shape(t, s);
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < nd && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ",%lld" : "%lld", (long long)s[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}
#define RNN_SHAPE(t) rnn_shape((t), (char[160]){0}, 160)

/* How graft's errors name a device: "cpu:1", "opencl:0" (the ordinal among its kind). */
static const char *rnn_dev(int id, char *buf, size_t cap) {
  const char *kind = graft_device_kind(id);
  int ord = 0;
  for (int k = 0; kind && k < id; k++) ord += !strcmp(graft_device_kind(k), kind);
  snprintf(buf, cap, "%s:%d", kind ? kind : "?", ord);
  return buf;
}
#define RNN_DEV(id) rnn_dev((id), (char[48]){0}, 48)

/* t has shape (nd, want), x's dtype and x's device; else the error names fn, t's name, what it
 * has and what it must be. An optional argument (may_be_null) may be NULL: absent, as
 * graft_linear's bias. */
static bool rnn_arg(const char *fn, const char *name, const graft_tensor *t, bool may_be_null,
                    const rnn_dims *d, int nd, const int64_t *want, const char *what) {
  if (!t && may_be_null) return true;
  if (comp_bad_input(fn, name, t)) return false;
  int64_t s[GRAFT_MAX_DIMS];
  bool ok = graft_shape(t, s) == nd;
  for (int k = 0; ok && k < nd; k++) ok = s[k] == want[k];
  if (!ok) return err_set(GRAFT_ERR_SHAPE, "%s: %s shape %s must be %s", fn, name, RNN_SHAPE(t), what), false;
  if (graft_get_dtype(t) != d->dt)
    return err_set(GRAFT_ERR_DTYPE, "%s: %s has dtype %s but x has dtype %s", fn, name,
                   graft_dtype_name(graft_get_dtype(t)), graft_dtype_name(d->dt)), false;
  if (graft_device(t) != d->dev)
    return err_set(GRAFT_ERR_DEVICE, "%s: %s is on %s but x on %s", fn, name,
                   RNN_DEV(graft_device(t)), RNN_DEV(d->dev)), false;
  return true;
}

/* Checks x [S,B,I] (batch_first: [B,S,I]), w_ih [4H,I], w_hh [4H,H], and the optional biases
 * [4H] and h0/c0 [B,H]; fills d. */
static bool rnn_check(const char *fn, graft_tensor *x, graft_tensor *h0, graft_tensor *c0,
                      graft_tensor *w_ih, graft_tensor *w_hh, graft_tensor *b_ih,
                      graft_tensor *b_hh, bool batch_first, rnn_dims *d) {
  if (comp_bad_input(fn, "x", x) || comp_bad_input(fn, "w_ih", w_ih) ||
      comp_bad_input(fn, "w_hh", w_hh))
    return false;
  int64_t xs[GRAFT_MAX_DIMS];
  if (graft_shape(x, xs) != 3 || xs[0] < 1 || xs[1] < 1 || xs[2] < 1)
    return err_set(GRAFT_ERR_SHAPE, "%s: x shape %s must be %s with every dim >= 1", fn,
                   RNN_SHAPE(x), batch_first ? "[B,S,I] (batch_first)" : "[S,B,I]"), false;
  d->dt = graft_get_dtype(x);
  d->dev = graft_device(x);
  if (d->dt != GRAFT_F32 && d->dt != GRAFT_F64)
    return err_set(GRAFT_ERR_DTYPE, "%s: x has dtype %s; f32 or f64 is required", fn,
                   graft_dtype_name(d->dt)), false;
  d->s = batch_first ? xs[1] : xs[0];
  d->b = batch_first ? xs[0] : xs[1];
  d->i = xs[2];
  d->h = graft_ndim(w_hh) == 2 ? graft_dim(w_hh, 1) : -1;
  if (d->h < 1 || graft_dim(w_hh, 0) != 4 * d->h) /* H comes from w_hh: check it first */
    return err_set(GRAFT_ERR_SHAPE, "%s: w_hh shape %s must be [4H,H] with H >= 1", fn,
                   RNN_SHAPE(w_hh)), false;
  char what[4][96];
  snprintf(what[0], sizeof what[0], "[4H,I] = [%lld,%lld] (H from w_hh, I from x)",
           (long long)(4 * d->h), (long long)d->i);
  snprintf(what[1], sizeof what[1], "[4H,H] = [%lld,%lld]", (long long)(4 * d->h), (long long)d->h);
  snprintf(what[2], sizeof what[2], "[4H] = [%lld]", (long long)(4 * d->h));
  snprintf(what[3], sizeof what[3], "[B,H] = [%lld,%lld]", (long long)d->b, (long long)d->h);
  const int64_t wi[2] = {4 * d->h, d->i}, wh[2] = {4 * d->h, d->h}, bv[1] = {4 * d->h},
                st[2] = {d->b, d->h};
  return rnn_arg(fn, "w_ih", w_ih, false, d, 2, wi, what[0]) &&
         rnn_arg(fn, "w_hh", w_hh, false, d, 2, wh, what[1]) &&
         rnn_arg(fn, "b_ih", b_ih, true, d, 1, bv, what[2]) &&
         rnn_arg(fn, "b_hh", b_hh, true, d, 1, bv, what[2]) &&
         rnn_arg(fn, "h0", h0, true, d, 2, st, what[3]) &&
         rnn_arg(fn, "c0", c0, true, d, 2, st, what[3]);
}

/* Rows r0..r1 and columns c0..c1 of a 2-D tensor: one node. */
static graft_tensor *rnn_block(graft_tensor *a, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t lo[2] = {r0, c0}, hi[2] = {r1, c1};
  return graft_slice(a, lo, hi, NULL);
}

/* A sequence as time-major rows [S*B, n] (x [S,B,n], or [B,S,n] when batch_first). */
static graft_tensor *rnn_rows(graft_tensor *x, bool batch_first, const rnn_dims *d, int64_t n) {
  static const int swap01[3] = {1, 0, 2};
  const int64_t rows[2] = {d->s * d->b, n};
  return graft_reshape(batch_first ? graft_transpose(x, swap01) : x, 2, rows);
}

/* Time-major rows [S*B, n] back to the caller's layout. */
static graft_tensor *rnn_unrows(graft_tensor *r, bool batch_first, const rnn_dims *d, int64_t n) {
  static const int swap01[3] = {1, 0, 2};
  const int64_t seq[3] = {d->s, d->b, n};
  graft_tensor *y = graft_reshape(r, 3, seq);
  return batch_first ? graft_transpose(y, swap01) : y;
}

/* A constant of d's dtype and device: 0-d (broadcast by the binary ops) or [B,H] zeros. */
static graft_tensor *rnn_cst(double v, const rnn_dims *d) {
  return graft_full_on(v, d->dt, 0, NULL, d->dev);
}
static graft_tensor *rnn_zeros_bh(const rnn_dims *d) {
  const int64_t bh[2] = {d->b, d->h};
  return graft_zeros_on(d->dt, 2, bh, d->dev);
}

/* A failed entry's status; its error names fn (the primitive that raised it renamed). */
static graft_status rnn_fail(const char *fn) {
  if (!err_pending()) err_set(GRAFT_ERR_INTERNAL, "%s: failed", fn);
  err_rename(fn);
  return graft_last_status();
}

/* n [rows, cols] values stacked along the rows. A concat computes each element in the part it
 * lies in, found by a chain of comparisons, so one concat of S parts costs O(S) per element;
 * concats of at most RNN_FAN parts, nested, cost O(log S). */
#define RNN_FAN 8
static graft_tensor *rnn_stack(graft_tensor **parts, int64_t n) {
  if (n <= RNN_FAN) return graft_concat(parts, (int)n, 0);
  int64_t per = RNN_FAN;
  while (per * RNN_FAN < n) per *= RNN_FAN; /* parts per group: the groups number <= RNN_FAN */
  graft_tensor *groups[RNN_FAN];
  int ng = 0;
  for (int64_t k = 0; k < n; k += per) groups[ng++] = rnn_stack(parts + k, n - k < per ? n - k : per);
  return graft_concat(groups, ng, 0);
}

/* One forward step from the gate pre-activations; updates *h and *c and returns the activated
 * gates [B,4H] (i,f,g,o). They are one value read by the step's math and by the stacked state
 * (so the backward computes no activation again): the fusion plan gives such a shared value a
 * buffer, where separate slices of a sigmoid would each be recomputed by every reader. */
static graft_tensor *lstm_cell(graft_tensor *gates, graft_tensor **h, graft_tensor **c,
                               const rnn_dims *d) {
  int64_t b = d->b, H = d->h;
  graft_tensor *sig = graft_sigmoid(gates);
  graft_tensor *parts[3] = {rnn_block(sig, 0, b, 0, 2 * H),
                            graft_tanh(rnn_block(gates, 0, b, 2 * H, 3 * H)),
                            rnn_block(sig, 0, b, 3 * H, 4 * H)};
  graft_tensor *act = graft_concat(parts, 3, 1);
  graft_tensor *i = rnn_block(act, 0, b, 0, H), *f = rnn_block(act, 0, b, H, 2 * H);
  graft_tensor *g = rnn_block(act, 0, b, 2 * H, 3 * H), *o = rnn_block(act, 0, b, 3 * H, 4 * H);
  graft_tensor *ig = graft_mul(i, g);
  *c = *c ? graft_add(graft_mul(f, *c), ig) : ig;
  *h = graft_mul(o, graft_tanh(*c));
  return act;
}

/* The forward's body, inside the caller's scope; out[0..3] as graft_lstm's, scope-owned. */
static bool lstm_forward_body(graft_tensor *x, graft_tensor *h, graft_tensor *c, graft_tensor *w_ih,
                              graft_tensor *w_hh, graft_tensor *b_ih, graft_tensor *b_hh,
                              bool batch_first, const rnn_dims *d, graft_tensor **out) {
  int64_t S = d->s, B = d->b, H = d->h;
  graft_tensor **hs = calloc((size_t)(3 * S), sizeof *hs), **cs = hs + S, **acts = hs + 2 * S;
  if (!hs) return err_set(GRAFT_ERR_OOM, "out of memory"), false;
  /* The input projection of every step at once, biases included. */
  graft_tensor *xp = graft_matmul(rnn_rows(x, batch_first, d, d->i), graft_t(w_ih));
  if (b_ih) xp = graft_add(xp, b_ih);
  if (b_hh) xp = graft_add(xp, b_hh);
  graft_tensor *whh_t = graft_t(w_hh);
  for (int64_t t = 0; t < S; t++) {
    graft_tensor *gates = rnn_block(xp, t * B, (t + 1) * B, 0, 4 * H);
    if (h) gates = graft_add(gates, graft_matmul(h, whh_t)); /* no h0: h_{-1} = 0 */
    acts[t] = lstm_cell(gates, &h, &c, d);
    hs[t] = h, cs[t] = c;
  }
  out[0] = rnn_unrows(rnn_stack(hs, S), batch_first, d, H);
  out[1] = h;
  out[2] = c;
  /* The state: every step's activated gates and cell state. */
  graft_tensor *parts[2] = {rnn_stack(acts, S), rnn_stack(cs, S)};
  const int64_t sh[3] = {S, B, 5 * H};
  out[3] = graft_reshape(graft_concat(parts, 2, 1), 3, sh);
  free(hs);
  return out[0] && out[1] && out[2] && out[3];
}

/* Ends the scope a public function opened: keeps its n results, or (on failure) lets the scope
 * release the partial ones and returns the error. */
static graft_status rnn_finish(const char *fn, bool ok, graft_tensor **out, int n) {
  for (int k = 0; ok && k < n; k++) out[k] = graft_keep(out[k]);
  graft_scope_end();
  if (ok) return GRAFT_OK;
  for (int k = 0; k < n; k++) out[k] = NULL;
  return rnn_fail(fn);
}

graft_status graft_lstm(graft_tensor *x, graft_tensor *h0, graft_tensor *c0, graft_tensor *w_ih,
                        graft_tensor *w_hh, graft_tensor *b_ih, graft_tensor *b_hh,
                        bool batch_first, graft_tensor **out) {
  static const char fn[] = "graft_lstm";
  if (!out) return err_set(GRAFT_ERR_NULL, "%s: out is NULL", fn), GRAFT_ERR_NULL;
  for (int k = 0; k < 4; k++) out[k] = NULL;
  rnn_dims d;
  if (!rnn_check(fn, x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, &d)) return rnn_fail(fn);
  graft_scope_begin();
  bool ok = lstm_forward_body(x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, &d, out);
  return rnn_finish(fn, ok, out, 4);
}

/* The backward's per-step coefficients over the whole sequence: dc_t += dh_t * A; the
 * gate-gradient of step t is [dc,dc,dc,dh] * K (columns i,f,g,o); dc_{t-1} = dc_t * F. From the
 * saved state [S,B,5H] (activated gates i,f,g,o and c per step). */
typedef struct {
  graft_tensor *a, *k, *f;
} lstm_coef;

static lstm_coef lstm_coefs(graft_tensor *state, graft_tensor *c0, const rnn_dims *d) {
  int64_t S = d->s, B = d->b, H = d->h, n = S * B;
  const int64_t rows[2] = {n, 5 * H};
  graft_tensor *st = graft_reshape(state, 2, rows);
  graft_tensor *i = rnn_block(st, 0, n, 0, H), *f = rnn_block(st, 0, n, H, 2 * H);
  graft_tensor *g = rnn_block(st, 0, n, 2 * H, 3 * H), *o = rnn_block(st, 0, n, 3 * H, 4 * H);
  graft_tensor *c = rnn_block(st, 0, n, 4 * H, 5 * H);
  graft_tensor *c_prev = c0 ? c0 : rnn_zeros_bh(d); /* c_{t-1}: c0, then c_0 .. c_{S-2} */
  if (S > 1) {
    graft_tensor *pc[2] = {c_prev, rnn_block(c, 0, n - B, 0, H)};
    c_prev = graft_concat(pc, 2, 0);
  }
  graft_tensor *one = rnn_cst(1.0, d), *tc = graft_tanh(c);
  /* derivatives of the activations, from their values: sigmoid' = s(1-s), tanh' = 1-t^2 */
  graft_tensor *di = graft_mul(i, graft_sub(one, i)), *df = graft_mul(f, graft_sub(one, f));
  graft_tensor *dout = graft_mul(o, graft_sub(one, o));
  graft_tensor *dg = graft_sub(one, graft_mul(g, g));
  graft_tensor *k[4] = {graft_mul(g, di), graft_mul(c_prev, df), graft_mul(i, dg),
                        graft_mul(tc, dout)};
  /* Joined as [n,4,H] on the middle axis, not [n,4H] on the last: the part is then fixed for
   * a whole inner loop (which vectorizes) instead of chosen per element. */
  const int64_t n1h[3] = {n, 1, H}, n4h[2] = {n, 4 * H};
  for (int q = 0; q < 4; q++) k[q] = graft_reshape(k[q], 3, n1h);
  lstm_coef r = {graft_mul(o, graft_sub(one, graft_mul(tc, tc))),
                 graft_reshape(graft_concat(k, 4, 1), 2, n4h), f};
  return r;
}

/* dh and dc flowing into step t from above (dy_t, the next step's dh/dc, or dh_n/dc_n); the
 * gate-gradient of step t; then dh/dc flowing to step t-1. */
static graft_tensor *lstm_step_back(graft_tensor **dh, graft_tensor **dc, graft_tensor *dy_rows,
                                    const lstm_coef *cf, graft_tensor *w_hh, const rnn_dims *d,
                                    int64_t t) {
  int64_t B = d->b, H = d->h, r0 = t * B, r1 = r0 + B;
  if (dy_rows) {
    graft_tensor *dy = rnn_block(dy_rows, r0, r1, 0, H);
    *dh = *dh ? graft_add(*dh, dy) : dy;
  }
  if (!*dh) *dh = rnn_zeros_bh(d); /* nothing flows into the last step's h */
  graft_tensor *dcs = graft_mul(*dh, rnn_block(cf->a, r0, r1, 0, H));
  *dc = *dc ? graft_add(*dc, dcs) : dcs;
  graft_tensor *m[4] = {*dc, *dc, *dc, *dh};
  graft_tensor *dgates = graft_mul(graft_concat(m, 4, 1), rnn_block(cf->k, r0, r1, 0, 4 * H));
  *dc = graft_mul(*dc, rnn_block(cf->f, r0, r1, 0, H));
  *dh = graft_matmul(dgates, w_hh);
  return dgates;
}

/* The backward's body inside the caller's scope; out[0..5] as graft_lstm_backward's. */
static bool lstm_backward_body(graft_tensor *x, graft_tensor *h0, graft_tensor *c0,
                               graft_tensor *w_ih, graft_tensor *w_hh, graft_tensor *y,
                               graft_tensor *state, graft_tensor *dy, graft_tensor *dh_n,
                               graft_tensor *dc_n, bool batch_first, const rnn_dims *d,
                               graft_tensor **out) {
  int64_t S = d->s, B = d->b, H = d->h, n = S * B;
  graft_tensor **dgs = calloc((size_t)S, sizeof *dgs);
  if (!dgs) return err_set(GRAFT_ERR_OOM, "out of memory"), false;
  graft_tensor *h_prev = h0 ? h0 : rnn_zeros_bh(d); /* h_{t-1}: h0, then y_0 .. y_{S-2} */
  if (S > 1) {
    graft_tensor *ph[2] = {h_prev, rnn_block(rnn_rows(y, batch_first, d, H), 0, n - B, 0, H)};
    h_prev = graft_concat(ph, 2, 0);
  }
  lstm_coef cf = lstm_coefs(state, c0, d);
  graft_tensor *dy_rows = dy ? rnn_rows(dy, batch_first, d, H) : NULL;
  graft_tensor *dh = dh_n, *dc = dc_n;
  for (int64_t t = S - 1; t >= 0; t--) dgs[t] = lstm_step_back(&dh, &dc, dy_rows, &cf, w_hh, d, t);
  graft_tensor *dgt = rnn_stack(dgs, S); /* [S*B,4H] */
  free(dgs);
  graft_tensor *dgt_t = graft_t(dgt);
  static const int rows_axis[1] = {0};
  out[0] = rnn_unrows(graft_matmul(dgt, w_ih), batch_first, d, d->i);
  out[1] = dh;
  out[2] = dc;
  out[3] = graft_matmul(dgt_t, rnn_rows(x, batch_first, d, d->i));
  out[4] = graft_matmul(dgt_t, h_prev);
  out[5] = graft_sum(dgt, rows_axis, 1, false);
  bool ok = true;
  for (int k = 0; k < 6; k++) ok = ok && out[k];
  return ok;
}

graft_status graft_lstm_backward(graft_tensor *x, graft_tensor *h0, graft_tensor *c0,
                                 graft_tensor *w_ih, graft_tensor *w_hh, graft_tensor *y,
                                 graft_tensor *state, graft_tensor *dy, graft_tensor *dh_n,
                                 graft_tensor *dc_n, bool batch_first, graft_tensor **out) {
  static const char fn[] = "graft_lstm_backward";
  if (!out) return err_set(GRAFT_ERR_NULL, "%s: out is NULL", fn), GRAFT_ERR_NULL;
  for (int k = 0; k < 6; k++) out[k] = NULL;
  rnn_dims d;
  if (!rnn_check(fn, x, h0, c0, w_ih, w_hh, NULL, NULL, batch_first, &d)) return rnn_fail(fn);
  int64_t seq[3] = {batch_first ? d.b : d.s, batch_first ? d.s : d.b, d.h};
  int64_t sst[3] = {d.s, d.b, 5 * d.h}, bh[2] = {d.b, d.h};
  char ys[96], ss[96], hs[96];
  snprintf(ys, sizeof ys, "[%lld,%lld,%lld] (graft_lstm's y)", (long long)seq[0],
           (long long)seq[1], (long long)seq[2]);
  snprintf(ss, sizeof ss, "[S,B,5H] = [%lld,%lld,%lld] (graft_lstm's state)", (long long)sst[0],
           (long long)sst[1], (long long)sst[2]);
  snprintf(hs, sizeof hs, "[B,H] = [%lld,%lld]", (long long)bh[0], (long long)bh[1]);
  if (!rnn_arg(fn, "y", y, false, &d, 3, seq, ys) || !rnn_arg(fn, "state", state, false, &d, 3, sst, ss) ||
      !rnn_arg(fn, "dy", dy, true, &d, 3, seq, ys) || !rnn_arg(fn, "dh_n", dh_n, true, &d, 2, bh, hs) ||
      !rnn_arg(fn, "dc_n", dc_n, true, &d, 2, bh, hs))
    return rnn_fail(fn);
  graft_scope_begin();
  bool ok = lstm_backward_body(x, h0, c0, w_ih, w_hh, y, state, dy, dh_n, dc_n, batch_first, &d, out);
  return rnn_finish(fn, ok, out, 6);
}
