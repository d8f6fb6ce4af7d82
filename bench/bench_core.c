/* Core engine benchmarks: tracing cost per recorded op, and the overhead of a cached step on a
 * 1,000-node graph (capture + hash + lookup + bind, excluding kernel time).
 * Prints: BENCH trace_per_op ns=<x>, BENCH trace_per_op_located ns=<x> (a source line set per
 * op) and BENCH cached_step_1000_nodes us=<x> (medians). */
#define _POSIX_C_SOURCE 200809L
#include "graft.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return v[n / 2];
}

/* A chain of n binary ops over small tensors; the inputs stay live, each result replaces x.
 * located: each op's source line is set first, as a wrapper recording locations would. */
static graft_tensor *chain_at(graft_tensor *x, graft_tensor *y, int n, bool located) {
  graft_tensor *cur = graft_retain(x);
  for (int i = 0; i < n; i++) {
    if (located) graft_set_location(__FILE__, __LINE__ + (i & 7));
    graft_tensor *next = (i & 1) ? graft_mul(cur, y) : graft_add(cur, y);
    graft_release(cur);
    cur = next;
  }
  if (located) graft_set_location(NULL, 0);
  return cur;
}

static graft_tensor *chain(graft_tensor *x, graft_tensor *y, int n) { return chain_at(x, y, n, false); }

int main(void) {
  graft_set_max_pending_nodes(10000000);
  float xv[4] = {1, 2, 3, 4}, yv[4] = {1, 1, 1, 1};
  int64_t n4 = 4;
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 1, &n4, 0);
  graft_tensor *y = graft_from_host(yv, GRAFT_F32, 1, &n4, 0);

  /* Tracing: 20 rounds of 10,000 recorded ops, released before the next round. */
  double tr[20];
  for (int r = 0; r < 20; r++) {
    double t0 = now_ns();
    graft_tensor *z = chain(x, y, 10000);
    tr[r] = (now_ns() - t0) / 10000;
    graft_release(z);
  }
  printf("BENCH trace_per_op ns=%.1f\n", median(tr, 20));
  for (int r = 0; r < 20; r++) { /* the same with a location set per op (graft_set_location) */
    double t0 = now_ns();
    graft_tensor *z = chain_at(x, y, 10000, true);
    tr[r] = (now_ns() - t0) / 10000;
    graft_release(z);
  }
  printf("BENCH trace_per_op_located ns=%.1f\n", median(tr, 20));

  /* Cached step: the same 1,000-node graph synced 200 times; the first sync compiles. */
  double st[200];
  for (int r = 0; r < 201; r++) {
    graft_tensor *z = chain(x, y, 1000);
    graft_metrics a, b;
    graft_metrics_get(&a);
    if (graft_sync(&z, 1) != GRAFT_OK) {
      fprintf(stderr, "sync failed: %s\n", graft_last_error());
      return 1;
    }
    graft_metrics_get(&b);
    if (r) st[r - 1] = (b.sync_overhead_ms - a.sync_overhead_ms) * 1e3;
    graft_release(z);
  }
  graft_metrics m;
  graft_metrics_get(&m);
  printf("BENCH cached_step_1000_nodes us=%.1f (graphs compiled %llu, cache hits %llu)\n",
         median(st, 200), (unsigned long long)m.graphs_compiled,
         (unsigned long long)m.cache_hits);
  graft_release(x);
  graft_release(y);
  graft_shutdown();
  return 0;
}
