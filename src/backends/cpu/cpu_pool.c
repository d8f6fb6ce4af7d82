/* A persistent thread pool: the caller plus (nthreads-1) workers split [0,total) of one kernel
 * into contiguous chunks. Idle workers block on a condition variable (no spinning), so
 * OpenBLAS's own threads, which run only between our parallel regions, never fight them.
 * GRAFT_THREADS overrides the thread count (default: online CPUs, at most 64). */
#include "cpu_internal.h"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define CPU_POOL_MAX 64

static struct {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_mutex_t busy; /* one parallel region at a time; others run inline */
  pthread_t th[CPU_POOL_MAX];
  int nthreads, started, stop;
  uint64_t gen;
  int pending;
  cpu_kernel_fn fn;
  void **S;
  int64_t total;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0, 0, 0, 0, NULL, NULL, 0};

static void cpu_chunk(int w, int nt, int64_t total, int64_t *lo, int64_t *hi) {
  *lo = total * w / nt;
  *hi = total * (w + 1) / nt;
}

static void *cpu_worker(void *arg) {
  int w = (int)(intptr_t)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (pool.gen == seen && !pool.stop) pthread_cond_wait(&pool.go, &pool.mu);
    if (pool.stop) break;
    seen = pool.gen;
    cpu_kernel_fn fn = pool.fn;
    void **S = pool.S;
    int64_t total = pool.total, lo, hi;
    int nt = pool.nthreads;
    pthread_mutex_unlock(&pool.mu);
    cpu_chunk(w, nt, total, &lo, &hi);
    if (hi > lo) fn(S, lo, hi);
    pthread_mutex_lock(&pool.mu);
    if (--pool.pending == 0) pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

static int cpu_pool_start_locked(void) {
  if (pool.started) return pool.nthreads;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  const char *e = getenv("GRAFT_THREADS");
  if (e && atoi(e) > 0) n = atoi(e);
  if (n < 1) n = 1;
  if (n > CPU_POOL_MAX) n = CPU_POOL_MAX;
  pool.stop = 0;
  int made = 1;
  for (int w = 1; w < n; w++) {
    if (pthread_create(&pool.th[w], NULL, cpu_worker, (void *)(intptr_t)w)) break;
    made++;
  }
  pool.nthreads = made;
  pool.started = 1;
  return made;
}

int cpu_pool_threads(void) {
  pthread_mutex_lock(&pool.mu);
  int n = cpu_pool_start_locked();
  pthread_mutex_unlock(&pool.mu);
  return n;
}

void cpu_pool_shutdown(void) {
  pthread_mutex_lock(&pool.busy);
  pthread_mutex_lock(&pool.mu);
  if (!pool.started) {
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
    return;
  }
  pool.stop = 1;
  pthread_cond_broadcast(&pool.go);
  int n = pool.nthreads;
  pthread_mutex_unlock(&pool.mu);
  for (int w = 1; w < n; w++) pthread_join(pool.th[w], NULL);
  pthread_mutex_lock(&pool.mu);
  pool.started = 0;
  pool.nthreads = 0;
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}

void cpu_parallel_run(cpu_kernel_fn fn, void **S, int64_t total) {
  if (total <= 0) return;
  if (cpu_pool_threads() == 1 || total == 1 || pthread_mutex_trylock(&pool.busy)) {
    fn(S, 0, total);
    return;
  }
  pthread_mutex_lock(&pool.mu);
  int nt = pool.nthreads;
  pool.fn = fn;
  pool.S = S;
  pool.total = total;
  pool.pending = nt - 1;
  pool.gen++;
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  int64_t lo, hi;
  cpu_chunk(0, nt, total, &lo, &hi);
  if (hi > lo) fn(S, lo, hi);
  pthread_mutex_lock(&pool.mu);
  while (pool.pending > 0) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}
