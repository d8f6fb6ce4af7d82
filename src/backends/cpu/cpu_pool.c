/* A persistent thread pool: the caller plus (nthreads-1) workers split [0,total) of one kernel
 * into contiguous chunks (a few per thread, taken in turn with an atomic ticket). A region ends
 * when its chunks are done, whoever ran them: the caller never waits for a worker that has not
 * woken up (with graphs executing on their own thread while the front-end traces, a worker
 * often has no core; waiting for it made each small kernel cost a time slice). Idle workers
 * spin for a few microseconds (the gap between a graph's kernels), then block on a condition
 * variable; OpenBLAS's own threads, which run only between our parallel regions, do not fight
 * a sleeping worker.
 * GRAFT_THREADS overrides the thread count (default: online CPUs, at most 64). */
#include "cpu_internal.h"
#include "trace.h"
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#define CPU_POOL_MAX 64
#define CPU_CHUNKS_PER_THREAD 4

static struct {
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  pthread_mutex_t busy; /* one parallel region at a time; others run inline */
  pthread_t th[CPU_POOL_MAX];
  int nthreads, started, stop;
  uint64_t gen; /* the current region's number (its low 32 bits tag the ticket) */
  int remaining; /* chunks of the current region not yet done */
  cpu_kernel_fn fn;
  void **S;
  int64_t total;
  int nchunks;
  uint64_t ticket; /* region << 32 | next chunk: a stale worker's claim fails */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_MUTEX_INITIALIZER, {0}, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, 0};

/* Chunk c of nc: boundaries on multiples of 64 units when there are plenty (a flat kernel's
 * chunks then start on whole cache lines, which its streaming stores want). */
static void cpu_chunk(int c, int nc, int64_t total, int64_t *lo, int64_t *hi) {
  int64_t al = total >= (int64_t)nc * 4096 ? 64 : 1;
  *lo = c == 0 ? 0 : total * c / nc / al * al;
  *hi = c == nc - 1 ? total : total * (c + 1) / nc / al * al;
}

/* Claims the next chunk of region; false when its chunks are all taken or it is over. */
static bool cpu_claim(uint32_t region, int nc, int *c) {
  uint64_t t = __atomic_load_n(&pool.ticket, __ATOMIC_ACQUIRE);
  for (;;) {
    if ((uint32_t)(t >> 32) != region || (int)(uint32_t)t >= nc) return false;
    if (__atomic_compare_exchange_n(&pool.ticket, &t, t + 1, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      *c = (int)(uint32_t)t;
      return true;
    }
  }
}

/* Runs chunks of region until none is left. A region is cut in a few chunks per thread,
 * taken in turn: a thread slowed down (this machine is shared) takes fewer. */
static int cpu_take_chunks(uint32_t region, cpu_kernel_fn fn, void **S, int64_t total, int nc) {
  int c, taken = 0;
  while (cpu_claim(region, nc, &c)) {
    taken++;
    int64_t lo, hi;
    cpu_chunk(c, nc, total, &lo, &hi);
    if (hi > lo) fn(S, lo, hi);
    if (__atomic_sub_fetch(&pool.remaining, 1, __ATOMIC_ACQ_REL) == 0) {
      pthread_mutex_lock(&pool.mu); /* the caller may be asleep waiting for this chunk */
      pthread_cond_signal(&pool.done);
      pthread_mutex_unlock(&pool.mu);
    }
  }
  return taken;
}

/* A graph's kernels come a few microseconds apart: a worker (or the caller waiting for the
 * workers) spins that long before it sleeps, so a small kernel does not pay a futex wake-up
 * and a context switch (12% of the demo CNN's step went to them). Long enough for the gap
 * between kernels, short enough not to take a core from the next traced step. */
#define CPU_SPIN_ITERS 64
/* A yield, not a pause: when more threads are runnable than cores (OpenBLAS's or PyTorch's
 * threads still spinning after an eager op), a pausing spinner kept the thread it waits for
 * off its core for a whole time slice (a CNN step went from 1.9 to 4.3 ms). */
#define CPU_PAUSE() sched_yield()

static bool cpu_spin_until_ne(const uint64_t *v, uint64_t old) {
  for (int i = 0; i < CPU_SPIN_ITERS; i++) {
    if (__atomic_load_n(v, __ATOMIC_ACQUIRE) != old) return true;
    CPU_PAUSE();
  }
  return false;
}

static void *cpu_worker(void *arg) {
  (void)arg;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    if (pool.gen == seen && !pool.stop) {
      pthread_mutex_unlock(&pool.mu);
      cpu_spin_until_ne(&pool.gen, seen);
      pthread_mutex_lock(&pool.mu);
    }
    while (pool.gen == seen && !pool.stop) pthread_cond_wait(&pool.go, &pool.mu);
    if (pool.stop) break;
    seen = pool.gen;
    cpu_kernel_fn fn = pool.fn;
    void **S = pool.S;
    int64_t total = pool.total;
    int nc = pool.nchunks;
    pthread_mutex_unlock(&pool.mu);
    uint64_t t0 = trace_on() ? trace_now() : 0;
    int taken = cpu_take_chunks((uint32_t)seen, fn, S, total, nc);
    if (t0 && taken) { /* the caller's span (a kernel, a GEMM) says what it was */
      char args[64];
      snprintf(args, sizeof args, "\"chunks\": %d, \"of\": %d", taken, nc);
      trace_thread_name("thread pool worker");
      trace_span("pool", "parallel chunks", t0, trace_now(), args);
    }
    pthread_mutex_lock(&pool.mu);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

/* A forked child has none of the workers (the graph layer's fork handlers drained every step
 * before the fork, so no region was running): it starts with a pool not yet started. */
static void cpu_pool_fork_child(void) {
  pthread_mutex_init(&pool.mu, NULL);
  pthread_mutex_init(&pool.busy, NULL);
  pthread_cond_init(&pool.go, NULL);
  pthread_cond_init(&pool.done, NULL);
  pool.started = pool.nthreads = pool.stop = 0;
  __atomic_store_n(&pool.remaining, 0, __ATOMIC_RELAXED);
}

static pthread_once_t cpu_pool_fork_once = PTHREAD_ONCE_INIT;
static void cpu_pool_fork_install(void) { pthread_atfork(NULL, NULL, cpu_pool_fork_child); }

/* At backend registration, before any step runs: never under the pool's lock (pthread_atfork
 * waits for a fork in progress). */
void cpu_pool_fork_register(void) { pthread_once(&cpu_pool_fork_once, cpu_pool_fork_install); }

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
  int nc = total < (int64_t)nt * CPU_CHUNKS_PER_THREAD ? (int)(total < nt ? total : nt)
                                                        : nt * CPU_CHUNKS_PER_THREAD;
  pool.nchunks = nc;
  uint64_t region = pool.gen + 1;
  __atomic_store_n(&pool.remaining, nc, __ATOMIC_RELAXED);
  __atomic_store_n(&pool.ticket, (uint64_t)(uint32_t)region << 32, __ATOMIC_RELEASE);
  __atomic_store_n(&pool.gen, region, __ATOMIC_RELEASE); /* read unlocked by spinners */
  pthread_cond_broadcast(&pool.go);
  pthread_mutex_unlock(&pool.mu);
  cpu_take_chunks((uint32_t)region, fn, S, total, nc);
  /* spin while the workers finish their last chunks */
  for (int i = 0; i < CPU_SPIN_ITERS && __atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) > 0; i++)
    CPU_PAUSE();
  pthread_mutex_lock(&pool.mu);
  while (__atomic_load_n(&pool.remaining, __ATOMIC_ACQUIRE) > 0) pthread_cond_wait(&pool.done, &pool.mu);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}
