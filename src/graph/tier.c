/* Tiered execution. A graph seen for the first time runs at once on the first tier (the
 * interpreter of cpu_interp.c: BLAS and host kernels for contractions and convolutions, typed
 * loops and reference kernels for the rest). When it runs a second time, the compiling backend
 * builds it on a background thread and later executions switch to the compiled code: no step
 * waits for the compiler, and a graph that runs once (a training loop's first step) costs no
 * compile. A graph the first tier would run slower than the compiler builds it is compiled
 * before its first run.
 * GRAFT_COMPILE=async (default) | sync (compile before the first run; tests) | off (reference
 * kernels only); GRAFT_MAX_COMPILE_NODES (default TIER_MAX_COMPILE_NODES): larger graphs stay on
 * the first tier. */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include "graph.h"
#include "../core/trace.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <math.h>
#include <time.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

typedef enum { TIER_MODE_ASYNC, TIER_MODE_SYNC, TIER_MODE_OFF } tier_mode;

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_idle = PTHREAD_COND_INITIALIZER;
static pthread_cond_t q_landed = PTHREAD_COND_INITIALIZER; /* a first build finished */
static _Atomic double q_build_ms_per_instr; /* the last first build's time per instruction */
static cache_entry *q_head, *q_tail;
static cache_entry *q_current; /* the entry whose build is running (q_mu) */
static pthread_cond_t q_between = PTHREAD_COND_INITIALIZER; /* a build ended (q_busy = 0) */
static int q_busy, q_stop, q_started;
static int q_forking; /* a fork waits for the build in progress: start no other */
static pthread_t q_thread;
static int warned;

/* A build's result that waits for graft's lock to be recorded (tier_finish). A thread that
 * reads a value holds that lock while it waits for the steps queued before it (a training
 * loop traced far ahead, then `loss.item()`): the compile thread, which had waited for the lock
 * after each build, ran no other build meanwhile (a GPT LM on 4 lengths ran 150 of 200 steps on
 * the first tier, the other lengths' builds queued behind the lock). It leaves the result here
 * and starts its next build; the next thread to hold the lock records it (tier_hit). The steps
 * do not wait for the record: they run what tier_landed published. */
typedef struct tier_result {
  struct tier_result *next;
  cache_entry *e;
  void *exe;
  tier_level level;
  double ms;
  char err[512];
} tier_result;
static tier_result *q_results, **q_results_tail = &q_results; /* q_mu; in landing order */

/* The families (prog->shape_free) whose builds landed since the last tier_library_drain (q_mu):
 * their queued sizes may now be built from the kernel library. */
#define TIER_LANDED_MAX 8
static uint64_t q_landed_family[TIER_LANDED_MAX];
static int q_nlanded; /* > TIER_LANDED_MAX: more landed than were kept, try every family */
static atomic_bool q_any_landed; /* q_nlanded > 0, read without q_mu on every cache hit */

static tier_mode tier_get_mode(void) {
  static atomic_int unknown_said;
  const char *m = getenv("GRAFT_COMPILE");
  if (!m || !*m || !strcmp(m, "async")) return TIER_MODE_ASYNC;
  if (!strcmp(m, "off")) return TIER_MODE_OFF;
  if (!strcmp(m, "sync")) return TIER_MODE_SYNC;
  if (!atomic_exchange(&unknown_said, 1))
    fprintf(stderr, "graft: warning: GRAFT_COMPILE=%s is not one of async, sync, off; using "
            "async\n", m);
  return TIER_MODE_ASYNC;
}

static void tier_enqueue(cache_entry *e);
static void tier_queue(cache_entry *e);

/* The native code a queued or running step picks up when it starts (lock held). */
static void tier_publish(cache_entry *e, void *exe, tier_level level) {
  if (e->level == TIER_LEVEL_QUICK) e->replaced_exe = e->fast_exe; /* a step may be running it */
  e->fast_exe = exe;
  e->tier = TIER_READY;
  e->level = level;
  atomic_store_explicit(&e->published, exe, memory_order_release);
}

/* Records the result of a compile (lock held). A quick build is published, and the entry
 * queued again for the full one; a failed full build after a quick one keeps the quick one. */
static void tier_finish(cache_entry *e, void *exe, tier_level level, const char *err, double ms) {
  metrics.m.native_compile_ms += ms;
  if (exe && exe == atomic_load(&e->partial_exe)) atomic_store(&e->partial_exe, NULL); /* fast_exe now */
  if (exe) {
    tier_publish(e, exe, level);
    if (level == TIER_LEVEL_FULL) {
      metrics.m.native_compiles++;
      return;
    }
    metrics.m.quick_compiles++;
    e->quick_build_ms = ms;
    e->upgrade_pending = true; /* queued by tier_hit once it pays */
    atomic_store(&e->native_ms, 0.0);
    return;
  }
  if (e->level == TIER_LEVEL_NONE) e->tier = TIER_FAILED;
  metrics.m.native_compile_failures++;
  if (!warned) {
    warned = 1;
    fprintf(stderr, "graft: warning: the %s backend could not compile a graph; graphs that fail "
            "run on the first tier: %s\n", e->fast->name, err);
  }
}

void tier_record_results(void) {
  pthread_mutex_lock(&q_mu);
  tier_result *r = q_results;
  q_results = NULL;
  q_results_tail = &q_results;
  pthread_mutex_unlock(&q_mu);
  while (r) {
    tier_result *next = r->next;
    tier_finish(r->e, r->exe, r->level, r->err, r->ms);
    free(r);
    r = next;
  }
}

/* Records a build's result now if graft's lock is free, else leaves it for the next holder
 * (compile thread, no lock held). */
static void tier_record(cache_entry *e, void *exe, tier_level level, const char *err, double ms) {
  if (!tensor_trylock()) {
    tier_result *r = malloc(sizeof *r);
    if (r) {
      *r = (tier_result){.e = e, .exe = exe, .level = level, .ms = ms};
      snprintf(r->err, sizeof r->err, "%s", err);
      pthread_mutex_lock(&q_mu);
      *q_results_tail = r;
      q_results_tail = &r->next;
      pthread_mutex_unlock(&q_mu);
      return;
    }
    tensor_lock(); /* no memory for the record: wait for the lock as before */
  }
  tier_record_results();
  tier_finish(e, exe, level, err, ms);
  tensor_unlock();
}

/* GRAFT_COMPILE_QUICK (default on): a graph compiled in the background first gets a quick build,
 * so native code lands in a fraction of the full compile's time (resnet18's step: -O1 in ~40%
 * of -O3's compiler time, running ~25% slower), then the full build replaces it. */
static bool tier_quick_enabled(void) {
  const char *q = getenv("GRAFT_COMPILE_QUICK");
  return !(q && !strcmp(q, "0"));
}

/* Builds e's next level of native code into *exe, its error into err (compile thread, lock NOT
 * held: the program is immutable and outlives the queue, since shutdown joins this thread
 * first). */
static tier_level tier_build(cache_entry *e, bool quick, void **exe, char *err, size_t n) {
  bool full = !quick;
  *exe = quick ? e->fast->compile_quick(e->prog, &full) : e->fast->compile(e->prog);
  snprintf(err, n, "%s", *exe ? "" : graft_last_error());
  return full ? TIER_LEVEL_FULL : TIER_LEVEL_QUICK;
}

/* A build of e finished (compile thread, before it takes the lock: an executor waiting for
 * this code may be what a drain under the lock waits for). */
static void tier_landed(cache_entry *e, void *exe) {
  if (exe || atomic_load(&e->partial_exe)) /* a failed progressive build's is not run again */
    atomic_store_explicit(&e->published, exe, memory_order_release);
  pthread_mutex_lock(&q_mu);
  if (exe && atomic_load(&e->prog->varying)) {
    if (q_nlanded < TIER_LANDED_MAX) q_landed_family[q_nlanded] = e->prog->shape_free;
    if (q_nlanded <= TIER_LANDED_MAX) q_nlanded++;
    atomic_store(&q_any_landed, true);
  }
  atomic_store(&e->building, false);
  q_current = NULL;
  pthread_cond_broadcast(&q_landed);
  pthread_mutex_unlock(&q_mu);
}

/* The backend's counters (all zero for one that keeps none). */
static backend_stats tier_stats(const backend *b) {
  backend_stats st;
  memset(&st, 0, sizeof st);
  if (b->stats) b->stats(&st);
  return st;
}
/* How many times the backend's compiler has run (a build may compile nothing: its kernels
 * were all in memory or on disk). */
static uint64_t tier_compiler_runs(const backend *b) { return tier_stats(b).compiles; }

/* A native build as a span (name) of the thread that built it: its graph, size, what it
 * compiled and what it found compiled (the kernel library in memory, or objects from the disk
 * cache). */
static void tier_trace_build(const cache_entry *e, const char *name, bool ok, const char *err,
                             const backend_stats *before, uint64_t s0) {
  backend_stats now = tier_stats(e->fast);
  char args[900]; /* "reason": the compiler's error, if it failed */
  trace_args_reason(args, sizeof args - 256, e->prog->hash, ok ? "" : err);
  size_t k = strlen(args);
  snprintf(args + k, sizeof args - k,
           ", \"instructions\": %d, \"compiler runs\": %llu, \"kernels compiled\": %llu, "
           "\"kernels reused\": %llu, \"objects from disk\": %llu, \"ok\": %s",
           e->prog->ninstr, (unsigned long long)(now.compiles - before->compiles),
           (unsigned long long)(now.kernels_compiled - before->kernels_compiled),
           (unsigned long long)(now.kernels_reused - before->kernels_reused),
           (unsigned long long)(now.disk_hits - before->disk_hits), ok ? "true" : "false");
  trace_span("compile", name, s0, trace_now(), args);
}

/* A progressive first build's executable: steps run it from now on where enough of its
 * kernel work is native (tier_native_for). A fork waits for the build in progress to land, so
 * none is handed out twice; an earlier one would be a failed build's, unpublished (compile
 * thread). */
static void tier_partial(void *ctx, void *exe) {
  cache_entry *e = ctx;
  void *old = atomic_exchange(&e->partial_exe, exe);
  if (old && old != exe) e->fast->free_exe(old);
  atomic_store_explicit(&e->published, exe, memory_order_release);
}

static void *tier_worker(void *arg) {
  (void)arg;
  /* The compilers (started from this thread and the kernel library's, which inherit its
   * policy) must not slow down the steps running meanwhile: SCHED_IDLE runs them only on a core
   * nothing else wants, and a step's thread waking up takes its core back at once (at nice 10
   * alone, two compilers cost the pool's threads a wakeup latency per kernel: resnet18's steps
   * ran ~40% slower beside them). Where SCHED_IDLE is refused, nice 10. On Linux both apply
   * to this thread only. When steps wait for its code (tier_native_for) the cores are its own
   * anyway. */
  struct sched_param idle = {0};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle))
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10); /* best effort */
  trace_thread_name("compiler (native builds)");
  pthread_mutex_lock(&q_mu);
  for (;;) {
    while ((!q_head || q_forking) && !q_stop) pthread_cond_wait(&q_cv, &q_mu);
    if (q_stop) break;
    cache_entry *e = q_head;
    q_head = e->qnext;
    if (!q_head) q_tail = NULL;
    q_busy = 1;
    q_current = e;
    pthread_mutex_unlock(&q_mu);
    /* e->level and e->full_only change only under the lock, and not while e is queued */
    bool first = e->level == TIER_LEVEL_NONE;
    bool quick = first && !e->full_only && e->fast->compile_quick && tier_quick_enabled();
    void *exe;
    char err[512];
    double t0 = metrics_now_ms();
    if (first) atomic_store(&e->build_started_ms, t0);
    backend_stats before = tier_stats(e->fast);
    uint64_t runs = before.compiles;
    uint64_t s0 = trace_on() ? trace_now() : 0;
    if (first && e->fast->native_share) backend_set_partial_hook(tier_partial, e);
    tier_level level = tier_build(e, quick, &exe, err, sizeof err);
    backend_set_partial_hook(NULL, NULL);
    double ms = metrics_now_ms() - t0;
    if (s0)
      tier_trace_build(e, level == TIER_LEVEL_QUICK ? "native build (quick)" : "native build (full)",
                       exe != NULL, err, &before, s0);
    if (level == TIER_LEVEL_QUICK && exe && tier_compiler_runs(e->fast) > runs) /* it compiled */
      atomic_store(&q_build_ms_per_instr, ms / (e->prog->ninstr + 1));
    tier_landed(e, exe);
    tier_record(e, exe, level, err, ms);
    pthread_mutex_lock(&q_mu);
    q_busy = 0;
    pthread_cond_broadcast(&q_between);
    if (!q_head) pthread_cond_broadcast(&q_idle);
  }
  pthread_mutex_unlock(&q_mu);
  return NULL;
}

static pthread_once_t backends_once = PTHREAD_ONCE_INIT;

/* Also where the fork handlers are registered: before any step or build runs, with no graft
 * lock held (pthread_atfork waits for a fork in progress, whose handlers take graft's locks). */
void graph_backends_init(void) {
  pthread_once(&backends_once, backend_register_builtin);
  graph_fork_register();
}

const backend *graph_backend(int device, backend_role role) {
  graph_backends_init();
  return backend_find(device_kind(device), role);
}

const backend *tier_first_backend(int device) {
  return graph_backend(device, tier_get_mode() == TIER_MODE_OFF ? BACKEND_REFERENCE
                                                                 : BACKEND_FIRST_TIER);
}

/* Rough cost of a program on the first tier, as measured here: ~1.5G elements/s for its
 * elementwise, movement and reduction loops, ~20G multiply-adds/s for the contractions and
 * convolutions it runs on BLAS (resnet18's step: 224 ms estimated, 110 measured; mobilenet_v2's
 * 90 and 88). A graph's first run measures the real figure (first_tier_ms). */
static double tier_ref_cost_ms(const exec_program *p) {
  double elems = 0, macs = 0;
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op == IR_DOT) {
      const exec_instr *a = &p->instr[ins->in[0]];
      macs += (double)ins->numel * (double)a->shape[a->ndim - 1];
    } else if (ins->op == IR_CONV2D) {
      const exec_instr *w = &p->instr[ins->in[1]];
      macs += (double)ins->numel * (double)(w->shape[1] * w->shape[2] * w->shape[3]);
    } else {
      elems += (double)ins->numel;
    }
  }
  return elems / 1.5e6 + macs / 20e6;
}

/* densenet121's training step (28k instructions) reached native code in ~50 s when a graph was
 * one translation unit, 8.2 s with the kernel library (its bodies repeat), and runs 2.5x faster
 * than on the first tier; at the old 20000 it never left the first tier. What a bigger graph
 * costs now is its code generation, not its compile. */
#define TIER_MAX_COMPILE_NODES 40000

/* Rough cost of a native compile here: the compiler's start plus a little per instruction. */
static double tier_compile_cost_ms(const exec_program *p) { return 50 + 1.5 * p->ninstr; }

/* e's native code built from kernels compiled before, if they all were (lock held). */
static bool tier_from_library(cache_entry *e) {
  bool full = false;
  double t0 = metrics_now_ms();
  uint64_t s0 = trace_on() ? trace_now() : 0;
  backend_stats before = s0 ? tier_stats(e->fast) : (backend_stats){0};
  void *exe = e->fast->compile_cached(e->prog, &full);
  graft_clear_error();
  /* on the tracing thread: a try that found kernels missing cost its code generation there */
  if (s0)
    tier_trace_build(e, exe ? "native build (from the library)" : "library build (kernels missing)",
                     exe != NULL, "", &before, s0);
  if (!exe) return false;
  metrics.m.library_builds++;
  tier_finish(e, exe, full ? TIER_LEVEL_FULL : TIER_LEVEL_QUICK, "", metrics_now_ms() - t0);
  return true;
}

/* Code generation's rough time a library build pays per instruction (resnet18's training
 * step, 3063 instructions: 31-45 ms). */
#define TIER_CODEGEN_MS_PER_INSTR 0.012

/* A build of e from the library where it may succeed: there are compiled kernels (this
 * process's, or a disk cache that holds some: a second process of a training script) and,
 * after a try failed, the compiler has run since. The try looks every kernel up on disk too,
 * so what other graphs load from there later cannot supply what it missed: a warm process
 * with part of its kernels on disk had retried at the next run, each try mobilenet_v2's ~70 ms
 * of code generation on the tracing thread. */
static bool tier_try_library(cache_entry *e) {
  if (!e->fast->compile_cached || !e->fast->cached_pieces || !e->fast->cached_pieces()) return false;
  uint64_t runs = tier_compiler_runs(e->fast);
  if (e->lib_failed && runs == e->lib_tried) return false;
  if (tier_from_library(e)) return true;
  e->lib_failed = true;
  e->lib_tried = runs;
  return false;
}

/* A family with this many sizes is taken to keep bringing new ones (text batched by length):
 * a new size's build is queued at once and steps wait for it, as the family's templates serve
 * the sizes to come. With two, the second may be an epoch's last partial batch: it is built
 * at its second run as any graph is (a CNN's batch of 8 after 31 batches of 32 compiled 59
 * template bodies for 2.9 s, beside the steps and with one waiting for it, to run 3 times). */
#define TIER_MANY_SIZES 3

/* e's sibling (cache_sibling), both marked as sizes of a varying family; NULL if none. From
 * TIER_MANY_SIZES sizes on, every size of the family may run size-generic kernels; a family of
 * two keeps specialised code (the second size is often an epoch's rare last batch). */
static cache_entry *tier_mark_varying(cache_entry *e) {
  int sizes;
  cache_entry *sib = cache_sibling(e, &sizes);
  if (!sib) return NULL;
  e->varying = sib->varying = true;
  if (sizes < TIER_MANY_SIZES) return sib;
  cache_mark_family(e);
  /* The backend sees the sibling's bodies first (built or not: a library-only lookup), so
   * that e's build compiles templates of what differs between the two rather than e's own
   * bodies. Once per sibling: it is code generation, ~6 ms of this thread. */
  if (sib->fast == e->fast && e->fast->compile_cached && !sib->sizes_shown) {
    bool full;
    void *x = e->fast->compile_cached(sib->prog, &full);
    if (x) e->fast->free_exe(x);
    else graft_clear_error();
    sib->sizes_shown = true;
  }
  return sib;
}

/* e is a new size of a cached graph (a batch or sequence length that varies): its kernels may
 * all be compiled already (the backend's size-generic ones), and then it is native from its
 * first run. Else, in a family of many sizes, it is queued at once rather than at its second
 * run: its build serves every later size, and the steps wait for it (tier_native_for); a
 * family's second size is built at its second run, as any graph. False when e has no
 * sibling. */
static bool tier_submit_varying(cache_entry *e) {
  cache_entry *sib = tier_mark_varying(e);
  if (!sib) return false;
  if (!atomic_load(&e->many_sizes)) {
    e->tier = TIER_ONCE;
    return true;
  }
  if (tier_from_library(e)) return true;
  /* Queued even while a sibling's build is running: when that lands, tier_library_drain builds
   * e from its kernels on this thread; a size seen once never runs again to retry. */
  tier_queue(e);
  return true;
}

/* Whether a build of family f landed since the last drain (q_mu held). */
static bool tier_family_landed(uint64_t f) {
  if (q_nlanded > TIER_LANDED_MAX) return true;
  for (int i = 0; i < q_nlanded; i++)
    if (q_landed_family[i] == f) return true;
  return false;
}

/* Builds from the kernel library the queued sizes whose family's build landed since the last
 * call (lock held: the tracing thread, at each graph it looks up). A varying LM's sizes traced
 * while their family's first build ran were queued behind it; the compile thread, which runs
 * under SCHED_IDLE, then built them one by one (code generation only, ~6 ms each) on a core the
 * first tier's steps kept busy: 70-290 ms apiece, the steps meanwhile on the first tier at ~2.5x
 * a native step. Those that still need the compiler go back to the queue's head, in order. */
static void tier_library_drain(void) {
  if (!atomic_load_explicit(&q_any_landed, memory_order_relaxed)) return; /* the usual hit */
  pthread_mutex_lock(&q_mu);
  if (!q_nlanded || q_forking) {
    pthread_mutex_unlock(&q_mu);
    return;
  }
  cache_entry *take = NULL, **tt = &take, **pp = &q_head;
  q_tail = NULL;
  for (cache_entry *e = q_head; e; e = *pp) {
    if (atomic_load(&e->many_sizes) && e->level == TIER_LEVEL_NONE && e->fast->compile_cached &&
        tier_family_landed(e->prog->shape_free)) {
      *pp = e->qnext;
      *tt = e;
      tt = &e->qnext;
      *tt = NULL;
    } else {
      q_tail = e;
      pp = &e->qnext;
    }
  }
  q_nlanded = 0;
  atomic_store(&q_any_landed, false);
  pthread_mutex_unlock(&q_mu);
  cache_entry *back = NULL, *last = NULL;
  for (cache_entry *e = take, *next; e; e = next) {
    next = e->qnext;
    e->qnext = NULL;
    if (tier_from_library(e)) {
      atomic_store(&e->building, false);
      continue;
    }
    if (last) last->qnext = e;
    else back = e;
    last = e;
  }
  if (!back) return;
  pthread_mutex_lock(&q_mu);
  last->qnext = q_head;
  if (!q_head) q_tail = last;
  q_head = back;
  pthread_cond_signal(&q_cv);
  pthread_mutex_unlock(&q_mu);
}

void tier_submit(cache_entry *e) {
  tier_library_drain();
  tier_mode mode = tier_get_mode();
  e->fast = graph_backend(e->prog->device, BACKEND_COMPILER);
  /* A huge graph would stall the compiler for long; it stays on the first tier. So does a
   * graph with an instruction the compiler does not support (its supports(), asked per
   * instruction): a declared fallback, not a compile failure. */
  const char *cap = getenv("GRAFT_MAX_COMPILE_NODES");
  int max_nodes = cap && atoi(cap) > 0 ? atoi(cap) : TIER_MAX_COMPILE_NODES;
  if (mode == TIER_MODE_OFF || !e->fast || e->prog->ninstr > max_nodes ||
      !backend_supports_program(e->fast, e->prog, NULL)) {
    e->tier = TIER_OFF;
    return;
  }
  if (mode == TIER_MODE_ASYNC && e->fast->compile_cached && tier_submit_varying(e)) return;
  /* A graph seen for the first time whose kernels were all compiled before (a second process
   * on a warm disk cache: its first step's graph, which runs once, and its steady graph) is
   * native from its first run, where its first-tier run would cost more than the build's code
   * generation (resnet18's first step: 229 ms on the first tier, 31 ms to build). */
  if (mode == TIER_MODE_ASYNC &&
      tier_ref_cost_ms(e->prog) >= TIER_CODEGEN_MS_PER_INSTR * e->prog->ninstr &&
      tier_try_library(e))
    return;
  /* Running first on the first tier only pays when it beats the compiler: a graph with big
   * contractions (the estimate puts a 1024x2048x1024 matmul at ~100 ms there) or
   * a huge elementwise volume is compiled before its first run. */
  if (mode == TIER_MODE_SYNC) tier_mark_varying(e); /* its compile may take size-generic code */
  if (mode == TIER_MODE_SYNC || tier_ref_cost_ms(e->prog) > tier_compile_cost_ms(e->prog)) {
    double t0 = metrics_now_ms();
    void *exe = e->fast->compile(e->prog);
    char err[512];
    snprintf(err, sizeof err, "%s", exe ? "" : graft_last_error());
    if (!exe) graft_clear_error(); /* the graph still runs, on the first tier */
    tier_finish(e, exe, TIER_LEVEL_FULL, err, metrics_now_ms() - t0);
    return;
  }
  e->tier = TIER_ONCE;
}

/* Starts the compile thread if it is not running (q_mu held): at the first build, and in a
 * forked child whose queue holds builds the parent had not started. -1 when it cannot start. */
static int tier_start_locked(void) {
  if (q_started) return 0;
  q_stop = 0;
  if (pthread_create(&q_thread, NULL, tier_worker, NULL)) return -1;
  q_started = 1;
  return 0;
}

/* Appends e to the compile thread's queue (lock held); if the thread cannot start, e stays
 * where it is (the first tier, or its quick build). */
static void tier_enqueue(cache_entry *e) {
  pthread_mutex_lock(&q_mu);
  if (tier_start_locked()) {
    pthread_mutex_unlock(&q_mu);
    if (e->tier == TIER_COMPILING) e->tier = TIER_OFF;
    return;
  }
  e->qnext = NULL;
  if (q_tail) q_tail->qnext = e;
  else q_head = e;
  q_tail = e;
  pthread_cond_signal(&q_cv);
  pthread_mutex_unlock(&q_mu);
}

/* Queues e for its first native build (lock held). */
static void tier_queue(cache_entry *e) {
  e->tier = TIER_COMPILING;
  atomic_store(&e->building, true);
  tier_enqueue(e);
  if (e->tier != TIER_COMPILING) atomic_store(&e->building, false); /* no compile thread */
}

/* The time e's first background build still needs: at the rate the last first build ran, per
 * instruction (or the full compile's estimate before any), less what it has run. */
static double tier_build_left_ms(const cache_entry *e) {
  double rate = atomic_load(&q_build_ms_per_instr);
  double total = rate > 0 ? 50 + rate * e->prog->ninstr : tier_compile_cost_ms(e->prog);
  double t0 = atomic_load(&e->build_started_ms);
  return t0 > 0 ? total - (metrics_now_ms() - t0) : total;
}

/* The share of a first-tier step's time native code saves (its quick build runs resnet18's
 * step in 55 ms against the first tier's 110, mobilenet_v2's in 50 against 90). */
#define TIER_NATIVE_SAVING 0.5
/* A build for a new size of a family of many sizes (e->many_sizes) serves the sizes to come:
 * waited for as if this many steps would run it. */
#define TIER_FAMILY_RUNS 64
/* The least a step waits for a build it decided to wait for (tier_native_for). */
#define TIER_WAIT_MIN_MS 1000.0

/* The least share of a graph's kernel work that must run native code for a progressive build's
 * executable to replace the first tier (its other kernels run on the first tier, each as a
 * program of its own). resnet18's step beside its build (traced, 60 steps): at 0.13 and 0.44
 * of its work native ~ the first tier's 65-80 ms, at 0.61 55-70, at 0.93 40-64; 39-43 native.
 * mobilenet_v2's (its many small kernels) at 0.47 and 0.57 ~60-70 against 45-68, at 0.72 ~51.
 * So it is measured: a run that took longer than the first tier's last raises the share the
 * next one needs to TIER_PARTIAL_STEP above its own. */
#define TIER_PARTIAL_MIN_SHARE 0.4
#define TIER_PARTIAL_STEP 0.1

/* exe, published while e's first build runs, if enough of it is native now (*share: how much),
 * else NULL (executor thread). */
static void *tier_partial_pays(cache_entry *e, void *exe, double *share) {
  *share = exe ? 1.0 : 0.0;
  if (!exe || !atomic_load(&e->building)) return exe; /* the build's result, or none */
  if (e->fast->native_share) *share = e->fast->native_share(exe);
  double need = fmax(TIER_PARTIAL_MIN_SHARE, e->partial_slow_share + TIER_PARTIAL_STEP);
  return *share >= need ? exe : NULL;
}

void *tier_native_for(cache_entry *e, int queued, double *share) {
  void *exe = atomic_load_explicit(&e->published, memory_order_acquire);
  if (tier_partial_pays(e, exe, share) || !atomic_load(&e->building)) return exe;
  double step_ms = e->first_tier_ms > 0 ? e->first_tier_ms : tier_ref_cost_ms(e->prog);
  if (atomic_load(&e->many_sizes) && queued < TIER_FAMILY_RUNS) queued = TIER_FAMILY_RUNS;
  /* waiting pays when the queued steps would save more on native code than the wait costs */
  if ((queued + 1) * step_ms * TIER_NATIVE_SAVING <= tier_build_left_ms(e)) return NULL;
  /* Steps are queued ahead (the front-end traces faster than the first tier runs them): the
   * build gets the cores and they run on its code. For a bounded time: the build runs under
   * SCHED_IDLE, which other busy processes can starve; then the step runs on the first tier. */
  double left = tier_build_left_ms(e), wait_ms = left > TIER_WAIT_MIN_MS / 2 ? 2 * left : TIER_WAIT_MIN_MS;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(wait_ms / 1000);
  until.tv_nsec += (long)(fmod(wait_ms, 1000) * 1e6);
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  /* Only for a build that is running: one queued behind others waits for them too, which the
   * estimate does not count. */
  pthread_mutex_lock(&q_mu);
  while (atomic_load(&e->building) && q_current == e && q_started && !q_stop && !q_forking)
    if (pthread_cond_timedwait(&q_landed, &q_mu, &until) == ETIMEDOUT) break;
  pthread_mutex_unlock(&q_mu);
  return tier_partial_pays(e, atomic_load_explicit(&e->published, memory_order_acquire), share);
}

/* What a full build saves on a quick build's step (-O1 against -O3: resnet18's training step
 * at batch 32, ~70 against ~57 ms), and how much longer it compiles (-O1 takes ~40% of -O3's
 * compiler time). */
#define TIER_FULL_SAVING 0.2
#define TIER_FULL_OVER_QUICK 2.5

/* Queues e's full build once the time its quick code has run would have saved on full code
 * what the full build costs (a ski rental: a loop that has run this long is as likely to run as
 * long again). At once, the full build competed for the cores with the steps of a short run
 * that would never use it (resnet18's first 30 steps: the quick build lands, then its -O3 build
 * ran beside the steps to the end). Lock held. */
static void tier_upgrade_when_it_pays(cache_entry *e, bool now) {
  if (!e->upgrade_pending) return;
  double saved = TIER_FULL_SAVING * atomic_load(&e->native_ms);
  if (!now && saved < TIER_FULL_OVER_QUICK * e->quick_build_ms) return;
  e->upgrade_pending = false;
  tier_enqueue(e);
}

/* Whether a size of a two-size family, whose sibling is built or building, has run often
 * enough for its own build to pay: its runs so far (a ski rental: as many again to come) times
 * what native code saves a run on the estimate of the first tier's time, against the build's
 * estimated time. An epoch's last partial batch is not built for the few epochs a short run
 * has; a size that keeps coming is. */
static bool tier_rare_size_pays(const cache_entry *e) {
  int sizes;
  const cache_entry *sib = cache_sibling(e, &sizes);
  if (!sib || (sib->level == TIER_LEVEL_NONE && !atomic_load(&sib->building))) return true;
  return e->hits * tier_ref_cost_ms(e->prog) * TIER_NATIVE_SAVING >= tier_build_left_ms(e);
}

void tier_hit(cache_entry *e) {
  tier_record_results();
  tier_library_drain();
  tier_upgrade_when_it_pays(e, false);
  e->inherited = false;
  if (e->tier != TIER_ONCE || tier_get_mode() == TIER_MODE_OFF) return;
  e->hits++;
  bool many = atomic_load(&e->many_sizes);
  if (many ? tier_from_library(e) : tier_try_library(e)) return;
  if (e->varying && !many && !e->full_only && !tier_rare_size_pays(e)) return;
  tier_queue(e);
}

/* The caller wants the full native code now: no quick build first. A forked child wants it for
 * the graphs it ran, not for every graph its parent had run once. */
static void tier_want_full(cache_entry *e) {
  if (e->inherited) return;
  if (e->tier == TIER_ONCE) e->full_only = true;
  tier_hit(e);
  tier_upgrade_when_it_pays(e, true);
}

void graft_wait_compiles(void) {
  for (;;) { /* until no build is queued, running, or left to record (a quick build's record
              * makes its full build due) */
    tensor_lock(); /* graphs that ran once are compiled too: the caller wants native code */
    tier_record_results();
    cache_foreach(tier_want_full);
    tensor_unlock();
    pthread_mutex_lock(&q_mu);
    bool any = q_started && (q_head || q_busy);
    while (q_started && (q_head || q_busy)) pthread_cond_wait(&q_idle, &q_mu);
    any = any || q_results != NULL;
    pthread_mutex_unlock(&q_mu);
    if (!any) return;
  }
}

static void tier_stop_thread(void) {
  pthread_mutex_lock(&q_mu);
  if (!q_started) {
    pthread_mutex_unlock(&q_mu);
    return;
  }
  q_stop = 1;
  pthread_cond_broadcast(&q_cv);
  pthread_cond_broadcast(&q_landed);
  pthread_mutex_unlock(&q_mu);
  pthread_join(q_thread, NULL);
  tensor_lock(); /* the results the thread left own their code (freed with the graphs) */
  tier_record_results();
  tensor_unlock();
  /* Emptied after the join: a quick build finishing during the stop re-queues its entry for the
   * full one (tier_finish), and the queue must not keep it past cache_clear, which frees it
   * (a later session's enqueue wrote through the stale tail: AddressSanitizer, test_tiers). */
  q_head = q_tail = NULL;
  q_started = 0;
  q_busy = 0;
}

/* fork (fork.c): first the build in progress lands (its compiler's locks and files are then
 * consistent in the child) and no other starts; steps waiting for a build stop waiting (they
 * run on the first tier), so the executor can drain. No lock is kept: the executor may need
 * this one while it drains. The child drops the parent's queue (a DataLoader worker must not
 * compile its parent's graphs): a graph that had no native code yet is compiled again only if
 * the child runs it again. */
void tier_fork_wait_build(void) {
  pthread_mutex_lock(&q_mu);
  if (!(q_started && pthread_equal(pthread_self(), q_thread))) { /* the compile thread forks */
    q_forking = 1;
    pthread_cond_broadcast(&q_landed);
    while (q_busy) pthread_cond_wait(&q_between, &q_mu);
  }
  pthread_mutex_unlock(&q_mu);
}

/* Then, with the steps drained, the queue is held across the fork. */
void tier_fork_prepare(void) { pthread_mutex_lock(&q_mu); }

void tier_fork_parent(void) {
  q_forking = 0;
  pthread_cond_broadcast(&q_cv);
  pthread_mutex_unlock(&q_mu);
}

static void tier_mark_inherited(cache_entry *e) { e->inherited = true; }

void tier_fork_child(void) { /* this thread is the only one: the parent's waiters are gone */
  for (cache_entry *e = q_head; e; e = e->qnext) {
    atomic_store(&e->building, false);
    if (e->level == TIER_LEVEL_NONE) e->tier = TIER_ONCE; /* else it keeps its quick build */
  }
  q_head = q_tail = NULL;
  q_current = NULL;
  cache_foreach(tier_mark_inherited);
  q_forking = q_started = q_busy = q_stop = 0;
  pthread_cond_init(&q_cv, NULL);
  pthread_cond_init(&q_idle, NULL);
  pthread_cond_init(&q_landed, NULL);
  pthread_cond_init(&q_between, NULL);
  pthread_mutex_unlock(&q_mu);
}

void tier_shutdown(void) { tier_stop_thread(); }

void tier_wait_idle(void) {
  pthread_mutex_lock(&q_mu);
  while (q_started && (q_head || q_busy)) pthread_cond_wait(&q_idle, &q_mu);
  pthread_mutex_unlock(&q_mu);
}

void graph_backends_shutdown(void) {
  graph_backends_init();
  for (int i = 0; i < backend_count(); i++) {
    const backend *be = backend_at(i, NULL, NULL);
    bool seen = false; /* one backend registered in two roles shuts down once */
    for (int j = 0; j < i; j++) seen = seen || backend_at(j, NULL, NULL) == be;
    if (!seen && be->shutdown) be->shutdown();
  }
}
