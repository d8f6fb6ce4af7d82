/* Asynchronous execution: a sync queues its graph and returns; reads wait. Results equal the
 * synchronous mode's bit for bit; a failing step's error surfaces at the next sync (or
 * graft_wait) naming the step, reading its outputs gives that error, later steps that need
 * them fail without running, and everything else keeps working. */
#define _DEFAULT_SOURCE
#include "check.h"
#include "graft.h"
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static graft_tensor *mat(const float *v, int64_t r, int64_t c) {
  int64_t s[2] = {r, c};
  return graft_from_host(v, GRAFT_F32, 2, s, 0);
}

/* Trains a linear model a few steps (forward, backward by hand, SGD update) and returns the
 * weights and every step's loss, in the mode GRAFT_ASYNC says. */
/* setenv races with the executor's and the compiler's getenv: only with both idle. */
static void set_async(const char *v) {
  graft_wait();
  graft_wait_compiles();
  if (v) setenv("GRAFT_ASYNC", v, 1);
  else unsetenv("GRAFT_ASYNC");
}

static void train(const char *async, float *w_out, float *loss_out, int steps) {
  set_async(async);
  float xv[8 * 4], yv[8], wv[4] = {0.1f, -0.2f, 0.3f, 0.05f};
  for (int i = 0; i < 32; i++) xv[i] = (float)((i * 37) % 11) / 11.0f - 0.4f;
  for (int i = 0; i < 8; i++) yv[i] = (float)(i % 3) - 1.0f;
  graft_tensor *x = mat(xv, 8, 4), *y = mat(yv, 8, 1), *w = mat(wv, 4, 1);
  graft_tensor *losses[16];
  for (int s = 0; s < steps; s++) {
    graft_scope_begin();
    graft_tensor *err = graft_sub(graft_matmul(x, w), y);                    /* [8,1] */
    graft_tensor *loss = graft_keep(graft_mean(graft_mul(err, err), NULL, 0, false));
    graft_tensor *grad = graft_mul_scalar(graft_matmul(graft_t(x), err), 2.0 / 8);
    graft_tensor *nw = graft_keep(graft_sub(w, graft_mul_scalar(graft_tanh(grad), 0.5)));
    graft_scope_end();
    graft_release(w);
    w = nw;
    losses[s] = loss;
    CHECK(graft_step() == GRAFT_OK);
  }
  CHECK(graft_to_host(w, w_out, 4 * sizeof(float)) == GRAFT_OK);
  for (int s = 0; s < steps; s++) {
    double l = 0;
    CHECK(graft_item(losses[s], &l) == GRAFT_OK);
    loss_out[s] = (float)l;
    graft_release(losses[s]);
  }
  graft_release(x), graft_release(y), graft_release(w);
  set_async(NULL);
}

TEST(results_equal_the_synchronous_modes) {
  float ws[4], wa[4], ls[12], la[12];
  train("0", ws, ls, 12);
  graft_metrics_reset();
  train("1", wa, la, 12);
  graft_metrics m = M();
  CHECK(m.async_steps == 12);       /* every step was queued */
  CHECK(m.executions == 12);
  /* Bit for bit on one tier; under GRAFT_COMPILE=async a step may run on the first tier in one
   * mode and natively in the other (the compiles land at other times), which rounds apart. */
  const char *c = getenv("GRAFT_COMPILE");
  if (c && (!strcmp(c, "off") || !strcmp(c, "sync"))) {
    CHECK(memcmp(ws, wa, sizeof ws) == 0);
    CHECK(memcmp(ls, la, sizeof ls) == 0);
  }
  for (int i = 0; i < 4; i++) CHECK_NEAR(wa[i], ws[i], 1e-5);
  for (int i = 0; i < 12; i++) CHECK_NEAR(la[i], ls[i], 1e-5);
  CHECK(ls[11] < ls[0]);            /* it trained */
}

/* A gather whose index is out of range fails inside the queued step. */
TEST(an_error_surfaces_at_the_next_sync_and_training_continues) {
  float v[3] = {1, 2, 3};
  int64_t bad[2] = {0, 5}, good[2] = {2, 0}, n2 = 2, n3 = 3;
  graft_tensor *a = graft_from_host(v, GRAFT_F32, 1, &n3, 0);
  graft_tensor *ib = graft_from_host(bad, GRAFT_I64, 1, &n2, 0);
  graft_tensor *g = graft_gather(a, 0, ib);
  graft_clear_error();
  graft_status st = graft_step();   /* queued: OK, or the failure if it already ran */
  CHECK(st == GRAFT_OK || st == GRAFT_ERR_ARG);
  if (st == GRAFT_OK) st = graft_wait();
  CHECK(st == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "step ") && strstr(graft_last_error(), "out of range"));
  graft_clear_error();
  CHECK(graft_wait() == GRAFT_OK);  /* reported once */
  float out[2];
  CHECK(graft_to_host(g, out, sizeof out) == GRAFT_ERR_ARG); /* its output is lost */
  CHECK(strstr(graft_last_error(), "graft_to_host") && strstr(graft_last_error(), "out of range"));
  graft_clear_error();
  graft_tensor *h = graft_add_scalar(g, 1); /* a later step that needs it does not run */
  graft_step();
  graft_wait();
  CHECK(graft_to_host(h, out, sizeof out) == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "did not run"));
  graft_clear_error();
  graft_release(g), graft_release(h);
  /* everything else works: the input, and new steps */
  graft_tensor *ig = graft_from_host(good, GRAFT_I64, 1, &n2, 0);
  graft_tensor *g2 = graft_mul_scalar(graft_gather(a, 0, ig), 2);
  CHECK(graft_step() == GRAFT_OK);
  CHECK(graft_to_host(g2, out, sizeof out) == GRAFT_OK && out[0] == 6 && out[1] == 2);
  CHECK(graft_wait() == GRAFT_OK);
  graft_release(a), graft_release(ib), graft_release(ig), graft_release(g2);
}

/* A failure a read has already raised (directly, or through a later step that needed the lost
 * value) is not raised again by the next sync or wait: a program that caught it carries on. */
TEST(a_failure_a_read_reported_is_not_raised_again) {
  float v[3] = {1, 2, 3}, out[2];
  int64_t bad[2] = {0, 5}, n2 = 2, n3 = 3;
  for (int derived = 0; derived < 2; derived++) {
    graft_tensor *a = graft_from_host(v, GRAFT_F32, 1, &n3, 0);
    graft_tensor *ib = graft_from_host(bad, GRAFT_I64, 1, &n2, 0);
    graft_tensor *g = graft_gather(a, 0, ib);
    graft_step();
    graft_tensor *h = derived ? graft_add_scalar(g, 1) : NULL; /* a step that cannot run */
    if (h) graft_step();
    CHECK(graft_to_host(h ? h : g, out, sizeof out) == GRAFT_ERR_ARG);
    CHECK(strstr(graft_last_error(), "out of range"));
    graft_clear_error();
    CHECK(graft_wait() == GRAFT_OK);
    CHECK(graft_step() == GRAFT_OK);
    graft_release(a), graft_release(ib), graft_release(g), graft_release(h);
  }
}

/* A read waits for the step that computes it; the wait is counted. */
TEST(a_read_waits_for_its_step) {
  graft_metrics_reset();
  int64_t n = 1 << 16;
  graft_tensor *x = graft_full(1.5, GRAFT_F32, 1, &n);
  graft_tensor *y = graft_sum(graft_exp(graft_sin(x)), NULL, 0, false);
  CHECK(graft_step() == GRAFT_OK);
  CHECK(!graft_is_pending(y)); /* a data leaf now, its buffer being filled */
  double v = 0;
  CHECK(graft_item(y, &v) == GRAFT_OK);
  CHECK_NEAR(v, (double)n * exp(sin(1.5)), 1e-4);
  graft_metrics m = M();
  CHECK(m.async_steps >= 1 && m.executions == m.async_steps);
  graft_release(x), graft_release(y);
}

/* Shutdown with steps queued runs them first; graft works again afterwards. */
TEST(shutdown_runs_what_is_queued) {
  int64_t n = 1 << 14;
  for (int i = 0; i < 4; i++) {
    graft_tensor *x = graft_full(i, GRAFT_F32, 1, &n);
    graft_tensor *y = graft_mul(x, x);
    CHECK(graft_step() == GRAFT_OK);
    graft_release(x);
    (void)y; /* dropped by shutdown */
  }
  graft_shutdown();
  graft_tensor *z = graft_full(2, GRAFT_F32, 1, &n);
  double v = 0;
  CHECK(graft_item(graft_sum(z, NULL, 0, false), &v) == GRAFT_OK && v == 2.0 * n);
  graft_release(z);
}

/* A host function that holds its step until the test opens the gate (at most 10 s), then
 * records whether the gate was open: whether the test got in while the step was running. */
static atomic_int gate_open, gate_fails, gate_max_ms = 10000;
static int gate_held(void *ctx, int nin, const graft_host_tensor *in, graft_host_tensor *out,
                     char *err, size_t errlen) {
  (void)nin;
  for (int i = 0; i < atomic_load(&gate_max_ms) && !atomic_load(&gate_open); i++) usleep(1000);
  *(atomic_int *)ctx = atomic_load(&gate_open);
  if (atomic_load(&gate_fails)) {
    snprintf(err, errlen, "the gate's step fails after its loss");
    return 1;
  }
  memcpy(out->data, in[0].data, (size_t)in[0].numel * sizeof(float));
  return 0;
}

/* A small output (a loss) is readable as soon as its value is final, while the rest of its
 * step still runs (the compiled CPU backend reports it; the reference backend does not). The
 * loss is traced first, so it is computed before the held host call; the read must return
 * while the host function is still waiting, else the host function sees the gate closed.
 * A step that fails after its loss was read still reports the failure at the next wait. */
TEST(a_small_output_is_readable_while_its_step_runs) {
  const char *c = getenv("GRAFT_COMPILE");
  if (c && !strcmp(c, "off")) return;
  int64_t n = 4096;
  float v[4096];
  for (int i = 0; i < n; i++) v[i] = (float)(i % 7) * 0.25f;
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  atomic_int seen_open = 0;
  for (int run = 0; run < 4; run++) { /* two runs to reach native code, then held ones */
    atomic_store(&gate_open, run < 2);
    atomic_store(&gate_fails, run == 3);
    graft_tensor *loss = graft_sum(graft_mul(x, x), NULL, 0, false);
    graft_tensor *e = graft_exp(x);
    graft_tensor *held = graft_host_call(gate_held, &seen_open, 0x67617465ull, 1, &e, GRAFT_F32, 1, &n);
    CHECK(held && graft_step() == GRAFT_OK);
    double l = 0, want = 0;
    CHECK(graft_item(loss, &l) == GRAFT_OK);
    atomic_store(&gate_open, 1);
    for (int i = 0; i < n; i++) want += (double)v[i] * v[i];
    CHECK_NEAR(l, want, 1e-6 * want);
    float h[4096];
    if (run < 3) {
      CHECK(graft_to_host(held, h, sizeof h) == GRAFT_OK && h[5] == expf(v[5]));
    } else { /* the loss was good; the step's failure still surfaces, once */
      CHECK(graft_wait() != GRAFT_OK && strstr(graft_last_error(), "after its loss"));
      CHECK(graft_to_host(held, h, sizeof h) != GRAFT_OK);
      graft_clear_error();
      CHECK(graft_wait() == GRAFT_OK);
    }
    CHECK(atomic_load(&seen_open) == 1); /* the loss came back before the step ended */
    graft_release(loss), graft_release(e), graft_release(held);
    if (run == 0) graft_wait_compiles();
  }
  graft_release(x);
}

/* A read of a small graph whose inputs are computed runs it on the reading thread at once,
 * while a queued step still runs (held here by a host function: a graph with one always
 * queues). A failure is the read's own error; the tensor then holds it (reading it again says
 * its value was lost), no later step runs its graph again, and no wait raises it again. */
TEST(a_read_of_a_small_graph_of_computed_inputs_does_not_wait_for_the_queue) {
  int64_t n = 4096, n2 = 2, n3 = 3, bad[2] = {0, 5};
  float v[4096], w[3] = {1, 2, 3}, out2[2];
  for (int i = 0; i < n; i++) v[i] = (float)(i % 5);
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  graft_tensor *a = graft_from_host(w, GRAFT_F32, 1, &n3, 0);
  graft_tensor *ib = graft_from_host(bad, GRAFT_I64, 1, &n2, 0);
  static atomic_int seen_open; /* the key's ctx: valid for the process */
  atomic_store(&seen_open, -1);
  atomic_store(&gate_open, 0);
  atomic_store(&gate_fails, 0);
  atomic_store(&gate_max_ms, 120000); /* native compiles of the reads may run meanwhile */
  graft_metrics_reset();
  graft_tensor *held = graft_host_call(gate_held, &seen_open, 0x67617466ull, 1, &x, GRAFT_F32, 1, &n);
  CHECK(held && graft_step() == GRAFT_OK); /* queued (M() would wait for it: not read here) */
  double s = 0, want = 0;
  for (int i = 0; i < n; i++) want += 3.0 * v[i];
  graft_tensor *sum = graft_sum(graft_mul_scalar(x, 3), NULL, 0, false);
  CHECK(graft_item(sum, &s) == GRAFT_OK && s == want);
  graft_tensor *g = graft_gather(a, 0, ib);
  CHECK(graft_to_host(g, out2, sizeof out2) == GRAFT_ERR_ARG && strstr(graft_last_error(), "out of range"));
  graft_clear_error();
  CHECK(atomic_load(&seen_open) == -1); /* both returned while the step was held */
  atomic_store(&gate_open, 1);
  graft_metrics m = M(); /* reading the metrics drains the queue: after the gate opens */
  CHECK(m.inline_runs == 2 && m.async_steps == 1);
  CHECK(atomic_load(&seen_open) == 1);
  CHECK(graft_wait() == GRAFT_OK); /* the gather's failure was its read's */
  CHECK(graft_to_host(g, out2, sizeof out2) == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "value was lost") && strstr(graft_last_error(), "out of range"));
  graft_clear_error();
  graft_tensor *y = graft_add_scalar(x, 1); /* a step goes on: the failed gather is not in it */
  CHECK(graft_step() == GRAFT_OK && graft_wait() == GRAFT_OK);
  float h[4096];
  CHECK(graft_to_host(held, h, sizeof h) == GRAFT_OK && h[7] == v[7]);
  CHECK(graft_to_host(y, h, sizeof h) == GRAFT_OK && h[7] == v[7] + 1);
  graft_wait_compiles(); /* setenv races only with the compile thread's getenv: idle now */
  setenv("GRAFT_INLINE", "0", 1); /* the A/B switch: the same read queues */
  graft_metrics_reset();
  graft_tensor *sum2 = graft_sum(graft_mul_scalar(x, 3), NULL, 0, false);
  CHECK(graft_item(sum2, &s) == GRAFT_OK && s == want);
  m = M();
  CHECK(m.inline_runs == 0 && m.async_steps == 1);
  unsetenv("GRAFT_INLINE");
  atomic_store(&gate_max_ms, 10000);
  graft_release(x), graft_release(a), graft_release(ib), graft_release(held);
  graft_release(sum), graft_release(g), graft_release(y), graft_release(sum2);
}

/* A loop that reads its loss every step and never marks one (unmodified PyTorch code): the
 * read also syncs the live values that share its work (the new weights, computed from the
 * forward's values), so each step is one graph of one size; a live value that shares nothing
 * with the read stays pending. The weights and losses equal the marked loop's. */
TEST(a_read_syncs_the_live_values_that_share_its_work) {
  float w_marked[4], l_marked[6];
  train(NULL, w_marked, l_marked, 6);
  float xv[8 * 4], yv[8], wv[4] = {0.1f, -0.2f, 0.3f, 0.05f}, w_out[4];
  for (int i = 0; i < 32; i++) xv[i] = (float)((i * 37) % 11) / 11.0f - 0.4f;
  for (int i = 0; i < 8; i++) yv[i] = (float)(i % 3) - 1.0f;
  graft_tensor *x = mat(xv, 8, 4), *y = mat(yv, 8, 1), *w = mat(wv, 4, 1);
  graft_metrics_reset();
  uint64_t nodes[6];
  for (int s = 0; s < 6; s++) {
    graft_scope_begin();
    graft_tensor *err = graft_sub(graft_matmul(x, w), y);
    graft_tensor *loss = graft_mean(graft_mul(err, err), NULL, 0, false);
    graft_tensor *grad = graft_mul_scalar(graft_matmul(graft_t(x), err), 2.0 / 8);
    graft_tensor *nw = graft_keep(graft_sub(w, graft_mul_scalar(graft_tanh(grad), 0.5)));
    graft_tensor *apart = graft_keep(graft_add_scalar(y, 1)); /* live, shares nothing */
    double l = 0;
    CHECK(graft_item(loss, &l) == GRAFT_OK);
    CHECK_NEAR(l, l_marked[s], 1e-6);
    CHECK(!graft_is_pending(nw) && graft_is_pending(apart));
    graft_scope_end();
    graft_release(apart);
    graft_release(w);
    w = nw;
    nodes[s] = M().last_graph_nodes;
  }
  CHECK(nodes[5] == nodes[2] && M().graphs_compiled <= 2);
  CHECK(graft_to_host(w, w_out, sizeof w_out) == GRAFT_OK);
  for (int i = 0; i < 4; i++) CHECK_NEAR(w_out[i], w_marked[i], 1e-6);
  graft_release(x), graft_release(y), graft_release(w);
}

int main(void) {
  RUN(results_equal_the_synchronous_modes);
  RUN(an_error_surfaces_at_the_next_sync_and_training_continues);
  RUN(a_failure_a_read_reported_is_not_raised_again);
  RUN(a_read_waits_for_its_step);
  RUN(shutdown_runs_what_is_queued);
  RUN(a_small_output_is_readable_while_its_step_runs);
  RUN(a_read_of_a_small_graph_of_computed_inputs_does_not_wait_for_the_queue);
  RUN(a_read_syncs_the_live_values_that_share_its_work);
  graft_shutdown();
  return CHECK_DONE();
}
