/* Engine behaviour: caching and recompiles, parameters vs constants, sync and step, auto-sync,
 * scopes and handles, metrics, dumps, deep graphs, devices. */
#define _DEFAULT_SOURCE
#include "check.h"
#include "graft.h"
#include "../src/graph/graph.h" /* capture_test_force_hash */
#include "buffer.h"
#include <dirent.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static graft_tensor *vec(const float *v, int64_t n) {
  return graft_from_host(v, GRAFT_F32, 1, &n, 0);
}

/* One training-like step: tanh(x * w + lr), returns host value 0. */
static float step_fn(graft_tensor *x, graft_tensor *w, double lr) {
  graft_scope_begin();
  graft_tensor *y = graft_add_scalar(graft_tanh(graft_add_scalar(graft_mul(x, w), lr)), 0);
  graft_keep(y);
  graft_scope_end();
  graft_step();
  float out[4];
  CHECK(graft_to_host(y, out, sizeof out) == GRAFT_OK);
  graft_release(y);
  return out[1];
}

TEST(loop_compiles_once) {
  graft_metrics_reset();
  float xv[4] = {1, 2, 3, 4}, wv[4] = {0.5f, 0.25f, -1, 2};
  graft_tensor *x = vec(xv, 4), *w = vec(wv, 4);
  for (int i = 0; i < 100; i++) {
    double lr = 0.01 * i; /* a changing scalar is a parameter: no recompile */
    float got = step_fn(x, w, lr);
    CHECK_NEAR(got, tanh(2 * 0.25 + lr), 1e-6);
  }
  graft_metrics m = M();
  CHECK(m.graphs_compiled == 1);
  CHECK(m.cache_hits == 99);
  CHECK(m.executions == 100);
  graft_release(x);
  graft_release(w);
}

TEST(shape_change_recompiles_and_dump_names_why) {
  char dir[] = "/tmp/graft_dump_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  setenv("GRAFT_DUMP_DIR", dir, 1);
  graft_metrics_reset();
  for (int b = 0; b < 2; b++) {
    int64_t shape[2] = {b ? 64 : 32, 8};
    graft_tensor *x = graft_ones(GRAFT_F32, 2, shape);
    float *zeros = calloc(64 * 8, sizeof(float));
    graft_tensor *d = graft_from_host(zeros, GRAFT_F32, 2, shape, 0);
    free(zeros);
    graft_tensor *y = graft_sum(graft_add(x, d), (int[]){1}, 1, false);
    double v;
    graft_tensor *first = graft_slice(y, (int64_t[]){0}, (int64_t[]){1}, NULL);
    CHECK(graft_item(first, &v) == GRAFT_OK);
    CHECK_NEAR(v, 8, 0);
    graft_release(first);
    graft_release(y);
    graft_release(d);
    graft_release(x);
  }
  CHECK(M().graphs_compiled == 2);
  const char *why = graft_last_compile_reason();
  CHECK(strstr(why, "[64,8]") && strstr(why, "[32,8]"));
  /* The dump folder holds each graph's IR text with its reason, and a Graphviz file. */
  DIR *dd = opendir(dir);
  int txt = 0, dot = 0, reason_found = 0;
  struct dirent *e;
  while (dd && (e = readdir(dd))) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (strstr(e->d_name, ".txt")) {
      txt++;
      FILE *f = fopen(path, "r");
      char buf[4096] = {0};
      size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
      (void)n;
      if (f) fclose(f);
      if (strstr(buf, "reason:") && strstr(buf, "[64,8]") && strstr(buf, "reduce_sum"))
        reason_found = 1;
    }
    if (strstr(e->d_name, ".dot")) dot++;
    if (e->d_name[0] != '.') unlink(path);
  }
  if (dd) closedir(dd);
  rmdir(dir);
  unsetenv("GRAFT_DUMP_DIR");
  CHECK(txt >= 2 && dot >= 2);
  CHECK(reason_found);
}

/* One step: an upload of x [rows,8], a slice of its first `keep` columns, a sum; each op traced
 * at its own line. Returns the step's value. */
static int loc_upload_line, loc_slice_line;
static double located_step(int64_t rows, int64_t keep) {
  int64_t shape[2] = {rows, 8};
  float host[64 * 8];
  for (int i = 0; i < 64 * 8; i++) host[i] = 1;
  graft_set_location(__FILE__, loc_upload_line = __LINE__);
  graft_tensor *x = graft_from_host(host, GRAFT_F32, 2, shape, 0);
  graft_set_location(__FILE__, loc_slice_line = __LINE__);
  graft_tensor *s = graft_slice(x, (int64_t[]){0, 0}, (int64_t[]){rows, keep}, NULL);
  graft_set_location(__FILE__, __LINE__);
  graft_tensor *y = graft_sum(s, (int[]){0, 1}, 2, false);
  graft_set_location(NULL, 0);
  double v = -1;
  CHECK(graft_item(y, &v) == GRAFT_OK);
  graft_release(y);
  graft_release(s);
  graft_release(x);
  return v;
}

TEST(recompile_reason_names_the_line) {
  graft_metrics_reset();
  CHECK_NEAR(located_step(32, 4), 128, 0);
  CHECK_NEAR(located_step(32, 4), 128, 0);
  CHECK(M().graphs_compiled == 1);
  char want[256];
  /* an intermediate shape differs (inputs the same): the slice's line is named */
  CHECK_NEAR(located_step(32, 5), 160, 0);
  CHECK(M().graphs_compiled == 2);
  const char *why = graft_last_compile_reason();
  snprintf(want, sizeof want, "%s:%d", __FILE__, loc_slice_line);
  if (!strstr(why, want)) fprintf(stderr, "  reason: %s\n", why);
  CHECK(strstr(why, want) != NULL);
  CHECK(strstr(why, "[32,5]") && strstr(why, "[32,4]"));
  /* an input's shape differs: the line that uploaded it */
  CHECK_NEAR(located_step(16, 5), 80, 0);
  CHECK(M().graphs_compiled == 3);
  why = graft_last_compile_reason();
  snprintf(want, sizeof want, "%s:%d", __FILE__, loc_upload_line);
  if (!strstr(why, want)) fprintf(stderr, "  reason: %s\n", why);
  CHECK(strstr(why, want) != NULL && strstr(why, "input 0 at"));
  CHECK_NEAR(located_step(16, 6), 96, 0);
  /* the report lists the lines with the most recompiles */
  char *rep = graft_metrics_report();
  snprintf(want, sizeof want, "%s:%d (2)", __FILE__, loc_slice_line);
  const char *top = strstr(rep, "top recompile sites: ");
  if (!top || !strstr(top, want)) fprintf(stderr, "%s", rep);
  CHECK(top && strstr(top, want) != NULL);
  free(rep);
  /* locations are not hashed: the same graph traced at other lines is a cache hit */
  uint64_t before = M().graphs_compiled;
  graft_tensor *x = graft_ones(GRAFT_F32, 2, (int64_t[]){16, 8});
  graft_release(x);
  CHECK_NEAR(located_step(16, 6), 96, 0);
  CHECK(M().graphs_compiled == before);
}

/* out = 10 * a + b over f32; ctx counts the calls (made on the executor thread). */
static int ten_a_plus_b(void *ctx, int nin, const graft_host_tensor *in, graft_host_tensor *out,
                        char *err, size_t errlen) {
  __atomic_fetch_add((int *)ctx, 1, __ATOMIC_RELAXED);
  if (nin != 2 || out->dtype != GRAFT_F32) return snprintf(err, errlen, "ten_a_plus_b: bad call"), 1;
  for (int64_t i = 0; i < out->numel; i++)
    ((float *)out->data)[i] = 10 * ((const float *)in[0].data)[i] + ((const float *)in[1].data)[i];
  return 0;
}

static int refuses(void *ctx, int nin, const graft_host_tensor *in, graft_host_tensor *out,
                   char *err, size_t errlen) {
  (void)ctx, (void)nin, (void)in, (void)out;
  snprintf(err, errlen, "refuses: this input is not accepted");
  return 1;
}

static graft_status host_step(float base, int *calls, double *sum) {
  float xv[3] = {base, base + 1, base + 2};
  int64_t n = 3;
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 1, &n, 0);
  graft_tensor *one = graft_ones(GRAFT_F32, 1, &n);
  graft_tensor *x1 = graft_add(x, one);
  graft_tensor *in[2] = {x1, one};
  graft_tensor *h = graft_host_call(ten_a_plus_b, calls, 0x74656e61ull, 2, in, GRAFT_F32, 1, &n);
  graft_tensor *two = graft_scalar(2.0, GRAFT_F32), *h2 = graft_mul(h, two);
  graft_tensor *y = graft_sum(h2, (int[]){0}, 1, false);
  graft_status st = graft_item(y, sum);
  graft_release(y);
  graft_release(h2);
  graft_release(two);
  graft_release(h);
  graft_release(x1);
  graft_release(one);
  graft_release(x);
  return st;
}

TEST(host_call_runs_inside_the_graph) {
  graft_metrics_reset();
  int calls = 0;
  double sum = 0;
  CHECK(host_step(1, &calls, &sum) == GRAFT_OK);
  CHECK_NEAR(sum, 2 * (10 * (2 + 3 + 4) + 3), 0); /* ((x + 1) * 10 + 1) * 2, summed */
  CHECK(host_step(5, &calls, &sum) == GRAFT_OK);  /* the cached graph, new operands */
  CHECK_NEAR(sum, 2 * (10 * (6 + 7 + 8) + 3), 0);
  CHECK(M().graphs_compiled == 1 && M().executions == 2); /* one graph a step: no cut */
  CHECK(calls == 2);
  /* a failing function fails the sync with its message */
  int64_t n = 2;
  graft_tensor *x = graft_ones(GRAFT_F32, 1, &n);
  graft_tensor *r = graft_host_call(refuses, NULL, 0x726566ull, 1, &x, GRAFT_F32, 1, &n);
  double v;
  graft_tensor *rs = graft_sum(r, (int[]){0}, 1, false);
  CHECK(graft_item(rs, &v) != GRAFT_OK);
  graft_release(rs);
  CHECK(strstr(graft_last_error(), "refuses: this input is not accepted") != NULL);
  graft_clear_error();
  /* bad calls: no operand; a key that names another function */
  CHECK(graft_host_call(refuses, NULL, 1, 0, &x, GRAFT_F32, 1, &n) == NULL);
  CHECK(graft_last_status() == GRAFT_ERR_ARG);
  CHECK(graft_host_call(ten_a_plus_b, NULL, 0x726566ull, 1, &x, GRAFT_F32, 1, &n) == NULL);
  CHECK(strstr(graft_last_error(), "already names another function") != NULL);
  graft_clear_error();
  graft_release(r);
  graft_release(x);
}

TEST(constant_value_is_part_of_the_graph) {
  graft_metrics_reset();
  for (int i = 0; i < 3; i++) {
    graft_tensor *c = graft_full(i % 2 ? 2.0 : 1.0, GRAFT_F32, 1, (int64_t[]){3});
    graft_tensor *y = graft_exp(c);
    double v;
    graft_tensor *s = graft_sum(y, NULL, 0, false);
    CHECK(graft_item(s, &v) == GRAFT_OK);
    CHECK_NEAR(v, 3 * exp(i % 2 ? 2.0 : 1.0), 1e-6);
    graft_release(s);
    graft_release(y);
    graft_release(c);
  }
  /* Two distinct constants: two graphs, the third run hits the cache. */
  CHECK(M().graphs_compiled == 2);
  CHECK(M().cache_hits == 1);
}

TEST(shared_vs_distinct_inputs_bind_correctly) {
  /* x+x and x+y have the same node hashes; the graph hash must tell them apart. */
  float a[2] = {1, 2}, b[2] = {10, 20};
  graft_tensor *x = vec(a, 2), *y = vec(b, 2);
  float out[2];
  graft_tensor *s1 = graft_add(x, x);
  CHECK(graft_to_host(s1, out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 2 && out[1] == 4);
  graft_tensor *s2 = graft_add(x, y);
  CHECK(graft_to_host(s2, out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 11 && out[1] == 22);
  graft_tensor *s3 = graft_add(y, x);
  CHECK(graft_to_host(s3, out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 11 && out[1] == 22);
  graft_release(s1);
  graft_release(s2);
  graft_release(s3);
  graft_release(x);
  graft_release(y);
}

/* Reads t (a sync) into out[2]; false on error. */
static bool read2(graft_tensor *t, float out[2]) {
  bool ok = graft_to_host(t, out, 2 * sizeof(float)) == GRAFT_OK;
  graft_release(t);
  return ok;
}

TEST(hash_collision_compiles_its_own_graph) {
  /* Every capture reports one hash: graphs that differ in an op, in their wiring or in a
   * constant collide in the cache. Each must get a program of its own, and a graph seen again
   * must find its own. */
  float a[2] = {1, 2}, b[2] = {10, 20}, o[2];
  graft_tensor *x = vec(a, 2), *y = vec(b, 2);
  graft_metrics_reset();
  capture_test_force_hash(0x0123456789abcdefull);
  CHECK(read2(graft_add(x, y), o) && o[0] == 11 && o[1] == 22);
  CHECK(M().cache_collisions == 0); /* nothing cached under that hash yet */
  CHECK(read2(graft_mul(x, y), o) && o[0] == 10 && o[1] == 40);            /* another op */
  CHECK(strstr(graft_last_compile_reason(), "collision") != NULL);
  /* (x+y)-x and (x+y)-y: the same nodes, wired differently (sub(y,x) would not do: capture
   * numbers y first there, so it is the same graph as sub(x,y) with its inputs swapped) */
  graft_tensor *s = graft_add(x, y);
  CHECK(read2(graft_sub(s, x), o) && o[0] == 10 && o[1] == 20);
  CHECK(read2(graft_sub(s, y), o) && o[0] == 1 && o[1] == 2);              /* other wiring */
  graft_release(s);
  graft_tensor *c1 = graft_full(1.0, GRAFT_F32, 1, (int64_t[]){2});
  graft_tensor *c2 = graft_full(2.0, GRAFT_F32, 1, (int64_t[]){2});
  CHECK(read2(graft_add(x, c1), o) && o[0] == 2 && o[1] == 3);
  CHECK(read2(graft_add(x, c2), o) && o[0] == 3 && o[1] == 4);             /* another constant */
  CHECK(M().graphs_compiled == 6 && M().cache_hits == 0);
  CHECK(read2(graft_add(x, y), o) && o[0] == 11 && o[1] == 22);            /* its own entry */
  CHECK(read2(graft_mul(x, y), o) && o[0] == 10 && o[1] == 40);
  graft_metrics m = M();
  CHECK(m.graphs_compiled == 6 && m.cache_hits == 2);
  CHECK(m.cache_collisions == 7); /* every lookup after the first met another graph's entry */
  char *rep = graft_metrics_report();
  CHECK(rep && strstr(rep, "hash collisions") != NULL);
  free(rep);
  capture_test_force_hash(0);
  graft_release(c1);
  graft_release(c2);
  graft_release(x);
  graft_release(y);
}

TEST(step_materializes_every_live_tensor) {
  graft_metrics_reset();
  graft_tensor *a = graft_iota(GRAFT_I32, 1, (int64_t[]){5}, 0);
  graft_tensor *b = graft_mul(a, a);
  graft_tensor *c = graft_sum(b, NULL, 0, false);
  CHECK(graft_is_pending(a) && graft_is_pending(b) && graft_is_pending(c));
  CHECK(graft_step() == GRAFT_OK);
  CHECK(!graft_is_pending(a) && !graft_is_pending(b) && !graft_is_pending(c));
  CHECK(M().executions == 1); /* one graph for all three */
  double v;
  CHECK(graft_item(c, &v) == GRAFT_OK && v == 30);
  CHECK(M().executions == 1); /* reading a materialized tensor runs nothing */
  graft_release(a);
  graft_release(b);
  graft_release(c);
}

TEST(sync_chosen_tensors_only) {
  graft_tensor *a = graft_iota(GRAFT_F32, 1, (int64_t[]){4}, 0);
  graft_tensor *b = graft_add_scalar(a, 1);
  graft_tensor *c = graft_mul_scalar(a, 2);
  CHECK(graft_sync(&b, 1) == GRAFT_OK);
  CHECK(!graft_is_pending(b));
  CHECK(graft_is_pending(c));
  CHECK(graft_sync((graft_tensor *[]){c, c}, 2) == GRAFT_OK); /* a repeated tensor is fine */
  float out[4];
  CHECK(graft_to_host(c, out, sizeof out) == GRAFT_OK && out[3] == 6);
  graft_release(a);
  graft_release(b);
  graft_release(c);
}

TEST(pending_limit_syncs_automatically) {
  graft_metrics_reset();
  graft_set_max_pending_nodes(50);
  graft_tensor *x = graft_zeros(GRAFT_F32, 1, (int64_t[]){3});
  for (int i = 0; i < 500; i++) {
    graft_tensor *y = graft_add_scalar(x, 1);
    graft_release(x);
    x = y;
    graft_metrics m = M();
    CHECK(m.pending_nodes <= 52);
  }
  float out[3];
  CHECK(graft_to_host(x, out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 500 && out[2] == 500);
  graft_metrics m = M();
  CHECK(m.auto_syncs >= 9);
  CHECK(m.max_graph_nodes <= 90); /* ~50 pending nodes plus their data leaves */
  graft_release(x);
  graft_set_max_pending_nodes(100000);
}

TEST(deep_chain_no_recursion) {
  /* 200k pending nodes: capture and release must not recurse per node. */
  graft_set_max_pending_nodes(1000000);
  graft_tensor *x = graft_zeros(GRAFT_F64, 0, NULL);
  for (int i = 0; i < 200000; i++) {
    graft_tensor *y = graft_add_scalar(x, 1);
    graft_release(x);
    x = y;
  }
  double v;
  CHECK(graft_item(x, &v) == GRAFT_OK && v == 200000);
  graft_release(x);
  graft_tensor *z = graft_zeros(GRAFT_F32, 0, NULL);
  for (int i = 0; i < 200000; i++) {
    graft_tensor *y = graft_neg(z);
    graft_release(z);
    z = y;
  }
  graft_release(z); /* released while pending: iterative free */
  CHECK(M().pending_nodes == 0);
  graft_set_max_pending_nodes(100000);
}

TEST(scopes_release_all_but_kept) {
  int64_t live0 = (int64_t)M().live_tensors;
  graft_tensor *kept;
  graft_scope_begin();
  graft_tensor *a = graft_ones(GRAFT_F32, 1, (int64_t[]){4});
  graft_scope_begin();
  graft_tensor *b = graft_add(a, a);
  kept = graft_keep(graft_mul(b, a)); /* moves to the outer scope */
  graft_scope_end();
  CHECK((int64_t)M().live_tensors == live0 + 2); /* a and kept */
  graft_keep(kept);                              /* and out of the outer one */
  graft_scope_end();
  CHECK((int64_t)M().live_tensors == live0 + 1);
  float out[4];
  CHECK(graft_to_host(kept, out, sizeof out) == GRAFT_OK && out[2] == 2);
  graft_release(kept);
  CHECK((int64_t)M().live_tensors == live0);
  graft_clear_error();
  graft_scope_end(); /* no open scope: an error, not a crash */
  CHECK(graft_last_status() == GRAFT_ERR_ARG);
  graft_clear_error();
}

TEST(handles_refcount_and_release) {
  graft_tensor *a = graft_ones(GRAFT_F32, 1, (int64_t[]){2});
  CHECK(graft_retain(a) == a);
  graft_release(a);
  CHECK(graft_ndim(a) == 1); /* still one reference */
  graft_release(a);
  graft_clear_error();
  CHECK(graft_ndim(a) == -1);
  CHECK(graft_last_status() == GRAFT_ERR_RELEASED);
  CHECK(strstr(graft_last_error(), "released") != NULL);
  graft_clear_error();
  graft_release(a); /* double release: an error, never a crash */
  CHECK(graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  graft_release(NULL); /* NULL is ignored */
  CHECK(graft_last_status() == GRAFT_OK);
}

/* A released handle's slot is reused at once; the stale handle must not reach the new tensor. */
TEST(stale_handle_never_acts_on_a_new_tensor) {
  graft_tensor *a = graft_ones(GRAFT_F32, 1, (int64_t[]){2});
  graft_release(a);
  graft_tensor *b = graft_ones(GRAFT_F32, 1, (int64_t[]){3});
  graft_clear_error();
  CHECK(graft_ndim(a) == -1 && graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  graft_release(a); /* must not release b */
  CHECK(graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  CHECK(graft_numel(b) == 3 && graft_retain(a) == NULL);
  graft_release(b);
  graft_clear_error();
  CHECK(graft_ndim((graft_tensor *)&b) == -1); /* a stack address is not a tensor */
  CHECK(graft_last_status() == GRAFT_ERR_ARG || graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
}

/* A scope remembers handles, not addresses: tensors released inside it and their slots reused
 * by later tensors never make scope_end release a kept tensor. */
TEST(scope_keeps_after_many_releases) {
  int64_t live0 = (int64_t)M().live_tensors;
  graft_scope_begin();
  for (int i = 0; i < 6000; i++) graft_release(graft_ones(GRAFT_F32, 1, (int64_t[]){1}));
  graft_tensor *kept = graft_keep(graft_ones(GRAFT_F32, 1, (int64_t[]){5}));
  graft_tensor *dropped = graft_ones(GRAFT_F32, 1, (int64_t[]){2});
  graft_scope_end();
  graft_clear_error();
  CHECK(graft_numel(kept) == 5);
  CHECK(graft_ndim(dropped) == -1 && graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  graft_release(kept);
  CHECK((int64_t)M().live_tensors == live0);
}

typedef struct {
  pthread_barrier_t *bar;
  graft_tensor *made_elsewhere;
} scope_thread_ctx;

/* Opens a scope, makes and releases a tensor, lets the main thread reuse its slot, then ends
 * the scope. */
static void *scope_thread(void *arg) {
  scope_thread_ctx *c = arg;
  graft_scope_begin();
  graft_release(graft_ones(GRAFT_F32, 1, (int64_t[]){1}));
  pthread_barrier_wait(c->bar); /* main makes its tensor now */
  pthread_barrier_wait(c->bar);
  graft_scope_end();
  return NULL;
}

TEST(one_threads_scope_never_releases_anothers_tensor) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  scope_thread_ctx c = {&bar, NULL};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, scope_thread, &c) == 0);
  pthread_barrier_wait(&bar);
  graft_tensor *mine = graft_ones(GRAFT_F32, 1, (int64_t[]){7}); /* reuses the freed slot */
  pthread_barrier_wait(&bar);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&bar);
  graft_clear_error();
  CHECK(graft_numel(mine) == 7);
  graft_release(mine);
}

TEST(memory_metrics_follow_data) {
  graft_metrics m0 = M();
  float *buf = calloc(1 << 20, sizeof(float));
  graft_tensor *a = graft_from_host(buf, GRAFT_F32, 1, (int64_t[]){1 << 20}, 0);
  free(buf);
  graft_metrics m1 = M();
  CHECK(m1.bytes_in_use == m0.bytes_in_use + (4u << 20));
  CHECK(m1.bytes_peak >= m1.bytes_in_use);
  CHECK(m1.transfers_to_device == m0.transfers_to_device + 1);
  CHECK(m1.bytes_to_device == m0.bytes_to_device + (4u << 20));
  CHECK(m1.live_tensors == m0.live_tensors + 1);
  graft_release(a);
  CHECK(M().bytes_in_use == m0.bytes_in_use);
  char *r = graft_metrics_report();
  CHECK(r && strstr(r, "graphs compiled") && strstr(r, "bytes in use"));
  free(r);
}

TEST(released_blocks_are_pooled_and_reused) {
  graft_empty_cache();
  int64_t n = 1 << 20;
  graft_tensor *a = graft_full(1, GRAFT_F32, 1, &n);
  CHECK(graft_sync(&a, 1) == GRAFT_OK);
  graft_release(a);
  graft_metrics m = M();
  CHECK(m.bytes_pooled >= (4u << 20)); /* kept for the next step, not returned */
  graft_tensor *b = graft_full(2, GRAFT_F32, 1, &n);
  CHECK(graft_sync(&b, 1) == GRAFT_OK);
  CHECK(M().bytes_pooled + (4u << 20) <= m.bytes_pooled); /* the same block came back */
  float v;
  graft_tensor *one = graft_slice(b, (int64_t[]){n - 1}, (int64_t[]){n}, NULL);
  CHECK(graft_to_host(one, &v, sizeof v) == GRAFT_OK && v == 2);
  graft_release(one);
  graft_release(b);
  graft_empty_cache();
  CHECK(M().bytes_pooled == 0);
}

/* Debug builds (the sanitizer flavours define GRAFT_DEBUG) hand out every block nobody asked
 * zeroed as NaN, fresh or back from the pool after a kernel wrote it: a kernel that reads
 * memory it did not write fails loudly. */
TEST(debug_blocks_read_as_nan) {
#if defined(GRAFT_DEBUG) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const size_t big = 1u << 20;
  graft_empty_cache();
  for (int round = 0; round < 2; round++) { /* fresh, then the block round 0 wrote and released */
    size_t pooled = buffer_pool_bytes();
    exec_buffer *b = buffer_new(big, 0, 0, "test");
    const float *f = b->ptr;
    CHECK(isnan(f[0]) && isnan(f[big / 4 - 1]));
    CHECK(round == 0 || buffer_pool_bytes() + big == pooled); /* it came from the pool */
    memset(b->ptr, 0, big);
    buffer_release(b);
  }
  exec_buffer *s = buffer_new(24, 0, 0, "test"), *z = buffer_new(big, 0, 1, "test");
  CHECK(isnan(((const double *)s->ptr)[2]));
  CHECK(((const float *)z->ptr)[0] == 0 && ((const float *)z->ptr)[big / 4 - 1] == 0);
  buffer_release(s);
  buffer_release(z);
  graft_empty_cache();
#endif
}

/* Blocks of a page multiple from 64 KB up go back to the pool whole pages; smaller ones (a
 * scalar parameter, a bias) go back to malloc, sized in cache lines rather than pages. */
TEST(small_blocks_skip_the_pool) {
  graft_empty_cache();
  exec_buffer *s = buffer_new(4, 0, 0, "test"), *b = buffer_new((64u << 10) + 1, 0, 0, "test");
  CHECK(s && b && ((uintptr_t)s->ptr & 63) == 0 && ((uintptr_t)b->ptr & 63) == 0);
  buffer_release(s);
  CHECK(buffer_pool_bytes() == 0);
  buffer_release(b);
  CHECK(buffer_pool_bytes() == (64u << 10) + 4096); /* rounded up to whole pages */
  graft_empty_cache();
}

/* Three optimizer-like updates p = p * 0.5 + 1 on 1M floats; with hold, the user keeps each old
 * value alive (so nothing may be donated). Returns the peak bytes above the start. */
static uint64_t update_steps(bool hold, uint64_t *donated, float *last2) {
  graft_empty_cache();
  int64_t n = 1 << 20;
  float *host = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) host[i] = (float)(i % 100);
  graft_tensor *p = graft_from_host(host, GRAFT_F32, 1, &n, 0), *old[3];
  free(host);
  graft_metrics_reset();
  uint64_t in_use0 = M().bytes_in_use;
  for (int step = 0; step < 3; step++) {
    graft_scope_begin();
    graft_tensor *next = graft_keep(graft_add_scalar(graft_mul_scalar(p, 0.5), 1));
    graft_scope_end(); /* drops the intermediate handle: only the graph holds it now */
    old[step] = p;
    if (!hold) graft_release(p);
    p = next;
    CHECK(graft_step() == GRAFT_OK);
  }
  graft_metrics m = M();
  *donated = m.donated_buffers;
  graft_tensor *two = graft_slice(p, (int64_t[]){98}, (int64_t[]){100}, NULL);
  CHECK(graft_to_host(two, last2, 2 * sizeof(float)) == GRAFT_OK);
  graft_release(two);
  graft_release(p);
  for (int step = 0; hold && step < 3; step++) graft_release(old[step]);
  CHECK(!hold || m.bytes_in_use >= in_use0 + (12u << 20)); /* the held values */
  CHECK(hold || m.bytes_in_use == in_use0);                /* one parameter's worth */
  return m.bytes_peak - in_use0;
}

TEST(an_input_only_the_graph_holds_is_donated) {
  uint64_t donated, donated_held;
  float a[2], b[2];
  uint64_t peak = update_steps(false, &donated, a);
  uint64_t peak_held = update_steps(true, &donated_held, b);
  CHECK(donated == 3 && donated_held == 0);
  /* each step's output reused its input's memory (1 KB of slack: the scalars 0.5 and 1 are
   * data leaves too, alive at slightly different moments when steps run asynchronously) */
  CHECK(peak + (4u << 20) <= peak_held + 1024);
  /* A gather whose index is checked in range beforehand still lets inputs be donated: an
   * input index, or one computed from inputs, constants and iotas by sums and differences
   * (graft_flip's, n-1 - iota); one whose range the executor cannot bound (a product) does
   * not. */
  for (int computed = 0; computed < 3; computed++) {
    int64_t n = 1 << 20, idx[4] = {0, 5, 7, 1};
    float *host = calloc((size_t)n, sizeof(float));
    graft_tensor *p = graft_from_host(host, GRAFT_F32, 1, &n, 0);
    graft_tensor *ix = graft_from_host(idx, GRAFT_I64, 1, (int64_t[]){4}, 0);
    free(host);
    graft_scope_begin();
    graft_tensor *index = computed == 2 ? graft_mul_scalar(ix, 1) : computed ? graft_add_scalar(ix, 0) : ix;
    graft_tensor *g = graft_keep(graft_gather(graft_add_scalar(p, 3), 0, index));
    graft_scope_end();
    graft_release(p);
    graft_metrics_reset();
    float out[4];
    CHECK(graft_to_host(g, out, sizeof out) == GRAFT_OK && out[2] == 3);
    CHECK(M().donated_buffers == (computed == 2 ? 0u : 1u));
    graft_release(g);
    graft_release(ix);
  }
  { /* a flipped input (a gather by n-1 - iota) is donated */
    int64_t n = 1 << 20;
    float *host = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) host[i] = (float)i;
    graft_tensor *p = graft_from_host(host, GRAFT_F32, 1, &n, 0);
    graft_scope_begin();
    graft_tensor *f = graft_keep(graft_add_scalar(graft_flip(p, (int[]){0}, 1), 1));
    graft_scope_end();
    graft_release(p);
    graft_metrics_reset();
    CHECK(graft_to_host(f, host, (size_t)n * sizeof(float)) == GRAFT_OK);
    CHECK(host[0] == (float)n && host[n - 1] == 1);
    CHECK(M().donated_buffers == 1);
    graft_release(f);
    free(host);
  }
  /* Under a memory limit running out is a recoverable error, so nothing is donated. */
  graft_set_memory_limit((size_t)1 << 30);
  float c[2];
  update_steps(false, &donated, c);
  CHECK(donated == 0 && c[1] == 14.125f);
  graft_set_memory_limit(0);
  /* 98 -> 50 -> 26 -> 14 and 99 -> 50.5 -> 26.25 -> 14.125, either way */
  CHECK(a[0] == 14 && a[1] == 14.125f && b[0] == 14 && b[1] == 14.125f);
}

TEST(oom_is_an_error_and_state_survives) {
  graft_set_memory_limit(1 << 20);
  graft_tensor *big = graft_full(1, GRAFT_F32, 1, (int64_t[]){1 << 20});
  float *out = malloc(4u << 20);
  graft_clear_error();
  CHECK(graft_to_host(big, out, 4u << 20) == GRAFT_ERR_OOM);
  /* what could not be had: the op, its shape, dtype, device and size, and the limit */
  const char *e = graft_last_error();
  CHECK(strstr(e, "out of memory") && strstr(e, "[1048576] f32 on cpu:0") &&
        strstr(e, "4194304 bytes") && strstr(e, "limit 1048576"));
  CHECK(graft_is_pending(big));
  graft_set_memory_limit(0);
  graft_clear_error();
  CHECK(graft_to_host(big, out, 4u << 20) == GRAFT_OK);
  CHECK(out[12345] == 1);
  free(out);
  graft_release(big);
}

TEST(devices_are_separate) {
  float v[2] = {1, 2};
  graft_tensor *a = graft_from_host(v, GRAFT_F32, 1, (int64_t[]){2}, 0);
  graft_tensor *b = graft_from_host(v, GRAFT_F32, 1, (int64_t[]){2}, 1);
  graft_clear_error();
  CHECK(graft_add(a, b) == NULL);
  CHECK(graft_last_status() == GRAFT_ERR_DEVICE);
  graft_clear_error();
  graft_tensor *b0 = graft_to_device(b, 0);
  CHECK(graft_device(b0) == 0);
  graft_tensor *s0 = graft_add(a, b0);
  graft_tensor *s1 = graft_mul(b, b); /* a graph on device 1 */
  graft_metrics_reset();
  CHECK(graft_sync((graft_tensor *[]){s0, s1}, 2) == GRAFT_OK);
  CHECK(M().executions == 2); /* one graph per device */
  float out[2];
  CHECK(graft_to_host(s1, out, sizeof out) == GRAFT_OK && out[1] == 4);
  CHECK(graft_device(s1) == 1);
  graft_release(a);
  graft_release(b);
  graft_release(b0);
  graft_release(s0);
  graft_release(s1);
}

/* Synchronous execution (GRAFT_ASYNC=0): a failed sync leaves its tensors pending. The
 * asynchronous behaviour is in test_async.c. */
TEST(failed_sync_leaves_tensors_pending) {
  setenv("GRAFT_ASYNC", "0", 1);
  float v[3] = {1, 2, 3};
  int64_t idx[2] = {0, 5};
  graft_tensor *a = vec(v, 3);
  graft_tensor *i = graft_from_host(idx, GRAFT_I64, 1, (int64_t[]){2}, 0);
  graft_tensor *g = graft_gather(a, 0, i);
  graft_clear_error();
  CHECK(graft_step() == GRAFT_ERR_ARG);
  CHECK(strstr(graft_last_error(), "out of range") != NULL);
  CHECK(graft_is_pending(g));
  graft_release(g);
  graft_clear_error();
  graft_tensor *ok = graft_add(a, a);
  float out[3];
  CHECK(graft_to_host(ok, out, sizeof out) == GRAFT_OK && out[2] == 6);
  graft_release(ok);
  graft_release(i);
  graft_release(a);
  unsetenv("GRAFT_ASYNC");
}

/* Handles kept past graft_shutdown read as released, also once graft is used again. */
TEST(handles_after_shutdown_read_as_released) {
  graft_tensor *old = graft_ones(GRAFT_F32, 1, (int64_t[]){4});
  graft_tensor *kept = graft_retain(old);
  graft_shutdown();
  graft_clear_error();
  CHECK(graft_ndim(old) == -1 && graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  graft_release(kept);
  CHECK(graft_last_status() == GRAFT_ERR_RELEASED);
  graft_tensor *fresh = graft_ones(GRAFT_F32, 1, (int64_t[]){3}); /* graft works again */
  graft_clear_error();
  CHECK(graft_numel(fresh) == 3 && graft_numel(old) == -1);
  CHECK(graft_last_status() == GRAFT_ERR_RELEASED);
  graft_clear_error();
  graft_release(fresh);
}

/* A host view shares the tensor's bytes without a copy and keeps them, unchanged, after the
 * tensor is gone and later graphs ran (a buffer with another holder is never donated). */
TEST(host_view_outlives_its_tensor) {
  int64_t n = 4096;
  float *h = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = (float)i;
  graft_tensor *x = graft_from_host(h, GRAFT_F32, 1, &n, 0), *y = graft_mul_scalar(x, 2.0);
  graft_release(x);
  graft_host_ref *ref = NULL;
  int shared = -1;
  const float *v = graft_host_view(y, &ref, &shared);
  CHECK(v && ref && shared == 0 && v[3] == 6.0f && v[4095] == 8190.0f);
  int64_t n2[2] = {64, 64};
  graft_tensor *r = graft_reshape(y, 2, n2); /* compiled, another value over y's buffer */
  graft_host_ref *ref2 = NULL;
  const float *rv = graft_host_view(r, &ref2, &shared);
  CHECK(rv != NULL && shared == (rv == v)); /* shared exactly when the bytes are y's */
  graft_host_ref_release(ref2);
  graft_release(r);
  graft_tensor *z = graft_add_scalar(y, 1.0); /* y's only other reader: may not take its buffer */
  graft_release(y);
  CHECK(graft_sync(&z, 1) == GRAFT_OK && graft_wait() == GRAFT_OK);
  float back[4096];
  CHECK(graft_to_host(z, back, sizeof back) == GRAFT_OK && back[4095] == 8191.0f);
  CHECK(v[3] == 6.0f && v[4095] == 8190.0f);
  graft_host_ref_release(ref);
  graft_release(z);
  CHECK(graft_host_view(NULL, &ref, NULL) == NULL && ref == NULL);
  CHECK(graft_host_view(z, NULL, NULL) == NULL && graft_last_status() == GRAFT_ERR_NULL);
  free(h);
}

static int borrowed_releases;
static void borrowed_release(void *ctx) {
  borrowed_releases++;
  CHECK(ctx == &borrowed_releases);
}

/* graft_from_host_borrowed: the caller's memory is read in place, never written, even where
 * the same graph over a copy donates the input's buffer to its output (the copied twin below
 * shows the donation happens); release comes once, after the last reader; a host view of it is
 * a copy; bad calls take nothing. */
TEST(borrowed_host_memory_is_read_in_place_and_never_written) {
  int64_t n = 1 << 18;
  float *h = aligned_alloc(64, sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 1000);
  for (int copied = 0; copied < 2; copied++) {
    borrowed_releases = 0;
    graft_tensor *x = copied ? graft_from_host(h, GRAFT_F32, 1, &n, 0)
                             : graft_from_host_borrowed(h, GRAFT_F32, 1, &n, 0, borrowed_release,
                                                        &borrowed_releases);
    CHECK(x != NULL);
    graft_scope_begin();
    graft_tensor *y = graft_keep(graft_add_scalar(graft_mul_scalar(x, 2.0), 1.0));
    graft_scope_end();
    graft_release(x); /* only the graph holds x now: a donation candidate */
    graft_metrics_reset();
    CHECK(graft_sync(&y, 1) == GRAFT_OK && graft_wait() == GRAFT_OK);
    CHECK(M().donated_buffers == (copied ? 1u : 0u));
    float back[4];
    graft_tensor *tail = graft_slice(y, (int64_t[]){n - 4}, (int64_t[]){n}, NULL);
    CHECK(graft_to_host(tail, back, sizeof back) == GRAFT_OK);
    CHECK(back[3] == 2.0f * (float)((n - 1) % 1000) + 1.0f);
    graft_release(tail);
    graft_release(y);
    CHECK(graft_wait() == GRAFT_OK);
    CHECK(borrowed_releases == (copied ? 0 : 1));
    for (int64_t i = 0; i < n; i++)
      if (h[i] != (float)(i % 1000)) {
        CHECK(h[i] == (float)(i % 1000));
        break;
      }
  }
  /* a host view of borrowed memory is flagged shared (the bridge copies it) */
  borrowed_releases = 0;
  graft_tensor *x = graft_from_host_borrowed(h, GRAFT_F32, 1, &n, 0, borrowed_release, &borrowed_releases);
  graft_host_ref *ref = NULL;
  int shared = 0;
  const float *v = graft_host_view(x, &ref, &shared);
  CHECK(v == h && shared == 1);
  graft_release(x);
  CHECK(borrowed_releases == 0); /* the view still holds it */
  graft_host_ref_release(ref);
  CHECK(borrowed_releases == 1);
  /* bad calls: an error that names the problem, and release never called */
  borrowed_releases = 0;
  CHECK(graft_from_host_borrowed(h + 1, GRAFT_F32, 1, (int64_t[]){4}, 0, borrowed_release, &borrowed_releases) == NULL &&
        graft_last_status() == GRAFT_ERR_ARG && strstr(graft_last_error(), "64-byte aligned"));
  CHECK(graft_from_host_borrowed(h, GRAFT_F32, 1, &n, 0, NULL, NULL) == NULL &&
        graft_last_status() == GRAFT_ERR_NULL);
  CHECK(graft_from_host_borrowed(NULL, GRAFT_F32, 1, &n, 0, borrowed_release, &borrowed_releases) == NULL &&
        graft_last_status() == GRAFT_ERR_NULL);
  CHECK(graft_from_host_borrowed(h, GRAFT_F32, 1, (int64_t[]){-1}, 0, borrowed_release, &borrowed_releases) == NULL &&
        graft_last_status() == GRAFT_ERR_SHAPE);
  CHECK(borrowed_releases == 0);
  free(h);
}

int main(void) {
  RUN(loop_compiles_once);
  RUN(borrowed_host_memory_is_read_in_place_and_never_written);
  RUN(host_view_outlives_its_tensor);
  RUN(shape_change_recompiles_and_dump_names_why);
  RUN(recompile_reason_names_the_line);
  RUN(host_call_runs_inside_the_graph);
  RUN(constant_value_is_part_of_the_graph);
  RUN(shared_vs_distinct_inputs_bind_correctly);
  RUN(hash_collision_compiles_its_own_graph);
  RUN(step_materializes_every_live_tensor);
  RUN(sync_chosen_tensors_only);
  RUN(pending_limit_syncs_automatically);
  RUN(deep_chain_no_recursion);
  RUN(scopes_release_all_but_kept);
  RUN(handles_refcount_and_release);
  RUN(stale_handle_never_acts_on_a_new_tensor);
  RUN(scope_keeps_after_many_releases);
  RUN(one_threads_scope_never_releases_anothers_tensor);
  RUN(memory_metrics_follow_data);
  RUN(released_blocks_are_pooled_and_reused);
  RUN(debug_blocks_read_as_nan);
  RUN(small_blocks_skip_the_pool);
  RUN(an_input_only_the_graph_holds_is_donated);
  RUN(oom_is_an_error_and_state_survives);
  RUN(devices_are_separate);
  RUN(failed_sync_leaves_tensors_pending);
  RUN(handles_after_shutdown_read_as_released);
  graft_shutdown();
  return CHECK_DONE();
}
