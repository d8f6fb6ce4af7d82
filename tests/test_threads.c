/* Tracing and syncing from several threads at once (run under ThreadSanitizer by make test). */
#include "check.h"
#include "graft.h"
#include <pthread.h>

#define ITERS 200

static void *worker(void *arg) {
  long id = (long)arg;
  float base[16];
  for (int i = 0; i < 16; i++) base[i] = (float)(i + id);
  int64_t n = 16;
  graft_tensor *x = graft_from_host(base, GRAFT_F32, 1, &n, 0);
  long bad = 0;
  for (int it = 0; it < ITERS; it++) {
    graft_scope_begin();
    graft_tensor *y = graft_mul_scalar(graft_add_scalar(x, it), 2);
    graft_tensor *s = graft_sum(y, NULL, 0, false);
    if (it % 3 == 0) graft_step(); /* steps race with the other thread's tracing */
    double v = 0;
    if (graft_item(s, &v) != GRAFT_OK) bad++;
    double want = 0;
    for (int i = 0; i < 16; i++) want += 2.0 * (i + id + it);
    if (v != want) bad++;
    graft_scope_end();
  }
  graft_release(x);
  return (void *)bad;
}

TEST(two_threads_trace_and_sync) {
  pthread_t th[2];
  for (long i = 0; i < 2; i++) pthread_create(&th[i], NULL, worker, (void *)(i * 100));
  for (int i = 0; i < 2; i++) {
    void *bad;
    pthread_join(th[i], &bad);
    CHECK(bad == NULL);
  }
  graft_metrics m;
  graft_metrics_get(&m);
  CHECK(m.live_tensors == 0);
  CHECK(m.pending_nodes == 0);
}

int main(void) {
  RUN(two_threads_trace_and_sync);
  graft_shutdown();
  return CHECK_DONE();
}
