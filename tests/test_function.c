/* Functions (graft_function_capture / graft_function_call): a traced computation called again
 * with other inputs gives what tracing it again gives, from the graph the cache already has;
 * constants stay alive; random draws get new seeds; bad calls are errors that name the input. */
#include "check.h"
#include "graft.h"
#include <stdlib.h>
#include <string.h>

static graft_tensor *mat(const float *v, int64_t r, int64_t c) {
  int64_t s[2] = {r, c};
  return graft_from_host(v, GRAFT_F32, 2, s, 0);
}

static void fill(float *v, int n, float a, float b) {
  for (int i = 0; i < n; i++) v[i] = a * (float)((i * 7) % 5) + b;
}

/* y = tanh(x w + c), s = sum(y): c a constant the function keeps. */
static void model(graft_tensor *x, graft_tensor *w, graft_tensor *c, graft_tensor **y,
                  graft_tensor **s) {
  *y = graft_tanh(graft_add(graft_matmul(x, w), c));
  *s = graft_sum(*y, NULL, 0, false);
}

TEST(a_call_gives_what_tracing_again_gives_from_the_cached_graph) {
  float xv[12], wv[6], cv[2] = {0.25f, -0.5f}, x2v[12], w2v[6];
  fill(xv, 12, 0.1f, -0.2f), fill(wv, 6, -0.3f, 0.4f), fill(x2v, 12, 0.2f, 0.1f), fill(w2v, 6, 0.15f, -0.1f);
  int64_t two = 2;
  graft_tensor *x = mat(xv, 4, 3), *w = mat(wv, 3, 2), *c = graft_from_host(cv, GRAFT_F32, 1, &two, 0);
  graft_tensor *y, *s;
  model(x, w, c, &y, &s);
  graft_tensor *in[2] = {x, w}, *out[2] = {y, s};
  graft_function *f = graft_function_capture(2, in, 2, out);
  CHECK(f && graft_function_inputs(f) == 2 && graft_function_outputs(f) == 2);
  CHECK(graft_is_pending(y)); /* capturing changes nothing */
  CHECK(graft_sync(out, 2) == GRAFT_OK);
  graft_tensor *x2 = mat(x2v, 4, 3), *w2 = mat(w2v, 3, 2), *ry, *rs;
  model(x2, w2, c, &ry, &rs); /* the reference: traced again */
  graft_tensor *ref[2] = {ry, rs};
  CHECK(graft_sync(ref, 2) == GRAFT_OK);
  graft_release(c); /* the function holds its constant */
  graft_metrics_reset();
  graft_tensor *in2[2] = {x2, w2}, *got[2] = {NULL, NULL};
  CHECK(graft_function_call(f, 2, in2, 2, got) == GRAFT_OK && got[0] && got[1]);
  CHECK(graft_sync(got, 2) == GRAFT_OK);
  graft_metrics m = M();
  CHECK(m.graphs_compiled == 0 && m.cache_hits == 1); /* the traced graph, found in the cache */
  float a[8], b[8];
  double sa = 0, sb = 0;
  CHECK(graft_to_host(got[0], a, sizeof a) == GRAFT_OK && graft_to_host(ry, b, sizeof b) == GRAFT_OK);
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK(graft_item(got[1], &sa) == GRAFT_OK && graft_item(rs, &sb) == GRAFT_OK && sa == sb);
  /* pending inputs: the call extends their graph */
  graft_tensor *xp = graft_mul_scalar(x2, 1.0), *in3[2] = {xp, w2}, *got3[2];
  CHECK(graft_function_call(f, 2, in3, 2, got3) == GRAFT_OK);
  CHECK(graft_to_host(got3[0], a, sizeof a) == GRAFT_OK);
  for (int i = 0; i < 8; i++) CHECK_NEAR(a[i], b[i], 1e-6);
  graft_release(got3[0]), graft_release(got3[1]), graft_release(xp);
  graft_release(got[0]), graft_release(got[1]), graft_release(ry), graft_release(rs);
  graft_release(x), graft_release(w), graft_release(x2), graft_release(w2);
  graft_release(y), graft_release(s);
  graft_function_free(f);
}

/* A random draw inside the function: every call draws anew (a dropout mask is not repeated),
 * and graft_manual_seed replays the sequence. */
TEST(random_draws_get_new_seeds_at_each_call) {
  int64_t n = 64;
  float v[64];
  fill(v, 64, 1.0f, 0.5f);
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  graft_tensor *y = graft_mul(x, graft_rand_uniform(GRAFT_F32, 1, &n));
  graft_function *f = graft_function_capture(1, &x, 1, &y);
  CHECK(f != NULL);
  float a[64], b[64], c[64];
  graft_tensor *r1, *r2, *r3;
  graft_manual_seed(7);
  CHECK(graft_function_call(f, 1, &x, 1, &r1) == GRAFT_OK);
  CHECK(graft_function_call(f, 1, &x, 1, &r2) == GRAFT_OK);
  graft_manual_seed(7);
  CHECK(graft_function_call(f, 1, &x, 1, &r3) == GRAFT_OK);
  CHECK(graft_to_host(r1, a, sizeof a) == GRAFT_OK && graft_to_host(r2, b, sizeof b) == GRAFT_OK &&
        graft_to_host(r3, c, sizeof c) == GRAFT_OK);
  CHECK(memcmp(a, b, sizeof a) != 0 && memcmp(a, c, sizeof a) == 0);
  for (int i = 0; i < 64; i++) CHECK(a[i] >= 0 && a[i] <= v[i]);
  graft_release(r1), graft_release(r2), graft_release(r3), graft_release(x), graft_release(y);
  graft_function_free(f);
}

TEST(bad_calls_are_errors_that_name_the_input) {
  float xv[12] = {0}, wv[6] = {0};
  graft_tensor *x = mat(xv, 4, 3), *w = mat(wv, 3, 2), *w5 = mat(xv, 3, 4);
  graft_tensor *y = graft_matmul(x, w), *in[2] = {x, w};
  CHECK(graft_function_capture(2, in, 0, &y) == NULL && graft_last_status() == GRAFT_ERR_ARG);
  graft_tensor *pend = graft_add_scalar(x, 1), *z = graft_matmul(pend, w), *pin[2] = {pend, w};
  CHECK(graft_function_capture(2, pin, 1, &z) == NULL && strstr(graft_last_error(), "input 0 is pending"));
  graft_tensor *dup[2] = {x, x}, *xx = graft_mul(x, x), *yy, *two[2] = {x, w5};
  graft_function *g = graft_function_capture(2, dup, 1, &xx); /* an input given twice */
  CHECK(g && graft_function_call(g, 2, dup, 1, &yy) == GRAFT_OK);
  graft_release(yy);
  CHECK(graft_function_call(g, 2, two, 1, &yy) == GRAFT_ERR_SHAPE);
  graft_tensor *x2 = mat(xv, 4, 3), *other[2] = {x, x2};
  CHECK(graft_function_call(g, 2, other, 1, &yy) == GRAFT_ERR_ARG && strstr(graft_last_error(), "were the same tensor"));
  graft_function_free(g);
  /* two synced tensors of one buffer under two shapes (an output and its reshape) are two
   * inputs, not one */
  int64_t flat = 12;
  graft_tensor *e = graft_exp(x), *ef = graft_reshape(e, 1, &flat), *pair[2] = {e, ef};
  CHECK(graft_sync(pair, 2) == GRAFT_OK);
  graft_tensor *uses = graft_add(graft_sum(e, NULL, 0, false), graft_sum(ef, NULL, 0, false)), *r;
  graft_function *h = graft_function_capture(2, pair, 1, &uses);
  graft_tensor *x3 = mat(xv, 4, 3), *f3 = graft_reshape(x2, 1, &flat), *pair2[2] = {x3, f3};
  CHECK(h && graft_function_call(h, 2, pair2, 1, &r) == GRAFT_OK);
  double got = -1;
  CHECK(graft_item(r, &got) == GRAFT_OK && got == 0); /* zeros: x3 and x2 hold xv = 0 */
  graft_function_free(h);
  graft_release(e), graft_release(ef), graft_release(uses), graft_release(r);
  graft_release(x3), graft_release(f3);
  graft_release(xx), graft_release(x2);
  graft_function *f = graft_function_capture(2, in, 1, &y);
  CHECK(f != NULL);
  graft_tensor *out = (graft_tensor *)1, *bad[2] = {x, w5};
  CHECK(graft_function_call(f, 2, bad, 1, &out) == GRAFT_ERR_SHAPE && out == NULL);
  CHECK(strstr(graft_last_error(), "input 1 is f32 [3,4]") && strstr(graft_last_error(), "[3,2]"));
  CHECK(graft_function_call(f, 1, in, 1, &out) == GRAFT_ERR_ARG);
  CHECK(graft_function_call(NULL, 2, in, 1, &out) == GRAFT_ERR_NULL);
  graft_release(w); /* a released input is an error, not a crash */
  CHECK(graft_function_call(f, 2, in, 1, &out) != GRAFT_OK && out == NULL);
  graft_clear_error();
  graft_function_free(f);
  graft_function_free(NULL);
  graft_release(x), graft_release(w5), graft_release(y), graft_release(pend), graft_release(z);
}

int main(void) {
  RUN(a_call_gives_what_tracing_again_gives_from_the_cached_graph);
  RUN(random_draws_get_new_seeds_at_each_call);
  RUN(bad_calls_are_errors_that_name_the_input);
  graft_shutdown();
  return CHECK_DONE();
}
