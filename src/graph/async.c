/* Asynchronous execution. A sync queues its graph and returns: the synced tensors become data
 * leaves over pending placeholder buffers, which one executor thread fills by running the
 * queued graphs in order, so the front-end traces step n+1 while step n runs (PyTorch/XLA does
 * the same). A read (graft_to_host, graft_item, graft_to_device) waits for the buffer it reads.
 * A step that fails makes its outputs failed buffers: reading one gives the step's error, a
 * later step that takes one as input fails without running, and the first failure not yet
 * reported is returned by the next sync or graft_wait. Nothing is half-written: an output
 * buffer becomes ready only when its value is final: after its step succeeded, or for a small
 * output, as soon as the backend says no later part of the step writes it (job_output_final:
 * a loop that reads its loss every step traces the next step while this one finishes).
 * The executor thread never takes the global lock: it touches only the queued jobs, their
 * buffers (reference-counted, with atomic states), the backends' executables (immutable once
 * published) and the execution counters (read by the tracing thread only after a drain).
 * GRAFT_ASYNC=0 runs every graph in the syncing thread instead. */
#include "graph.h"
#include "../core/trace.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct async_job {
  struct async_job *next;
  uint64_t seq, hash;
  cache_entry *e; /* cached entries live until shutdown, which drains the queue first */
  const exec_program *p;
  exec_buffer **bufs;     /* nparams inputs (the job's references), then the backend's outputs */
  unsigned char *donated; /* per input: its reference goes to the backend */
  exec_buffer **ph;       /* noutputs placeholders (the job's references) */
  unsigned char *early;   /* per output: its placeholder was filled while the step ran */
};

static pthread_mutex_t a_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t a_work = PTHREAD_COND_INITIALIZER; /* a job was queued, or stop */
static pthread_cond_t a_done = PTHREAD_COND_INITIALIZER; /* a job finished */
static async_job *a_head, *a_tail;
static int a_busy, a_stop, a_started;
static const cache_entry *a_running; /* the graph the executor runs (a_mu) */
static pthread_t a_thread;
static uint64_t a_seq;                 /* jobs queued (the step number in messages) */
static buffer_failure *a_unreported;   /* the first failure no sync has reported yet */
static uint64_t a_unreported_seq;      /* its step's number */

static inline void async_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

bool async_enabled(void) {
  const char *e = getenv("GRAFT_ASYNC");
  return !(e && !strcmp(e, "0"));
}

static void job_free(async_job *j) {
  free(j->early);
  free(j->bufs);
  free(j->donated);
  free(j->ph);
  free(j);
}

/* The reason the job cannot run: an input that a failed step should have computed. */
static buffer_failure *job_failed_input(const async_job *j) {
  for (int k = 0; k < j->p->nparams; k++)
    if (buffer_get_state(j->bufs[k]) == BUFFER_FAILED) {
      char msg[1024];
      const buffer_failure *f = j->bufs[k]->failure;
      snprintf(msg, sizeof msg, "step %llu (graph %016llx) did not run: its input %d comes from "
               "a step that failed: %.900s", (unsigned long long)j->seq, (unsigned long long)j->hash,
               k, f ? f->msg : "(no reason kept)");
      buffer_failure *nf = buffer_failure_new(f ? f->status : GRAFT_ERR_INTERNAL, msg);
      if (nf && f) nf->origin = f->origin;
      return nf;
    }
  return NULL;
}

/* Whether no queued or running job runs e's graph: a syncing thread may run it too (a backend's
 * per-executable profile is not shared between threads). */
bool async_entry_idle(const cache_entry *e) {
  pthread_mutex_lock(&a_mu);
  bool idle = a_running != e;
  for (const async_job *q = a_head; q && idle; q = q->next) idle = q->e != e;
  pthread_mutex_unlock(&a_mu);
  return idle;
}

/* How many queued jobs run e's graph (executor thread). */
static int async_queued_for(const cache_entry *e) {
  int n = 0;
  pthread_mutex_lock(&a_mu);
  for (const async_job *q = a_head; q; q = q->next) n += q->e == e;
  pthread_mutex_unlock(&a_mu);
  return n;
}

/* An output the backend says is final (backend_output_final) while the step goes on: a small
 * one (a loss, a metric: what a loop reads every step) is copied into its placeholder and its
 * waiters wake, so the tracing thread goes on with the next step while this one finishes.
 * Larger ones (parameters, gradients) wait for the end, where their memory moves instead of
 * being copied. A step that fails later still reports its error at the next sync. */
enum { ASYNC_EARLY_BYTES = 4096 };

static bool async_early_enabled(void) { /* GRAFT_EARLY_OUTPUTS=0: every output at the end */
  static int on = -1;
  if (on < 0) {
    const char *v = getenv("GRAFT_EARLY_OUTPUTS");
    on = !(v && !strcmp(v, "0"));
  }
  return on;
}

static void job_output_final(void *ctx, int k, exec_buffer *b) {
  async_job *j = ctx;
  if (j->early[k] || b->bytes > ASYNC_EARLY_BYTES || j->ph[k]->bytes != b->bytes) return;
  buffer_retain(b); /* the run keeps its own reference: buffer_fill copies */
  if (buffer_fill(j->ph[k], b)) {
    graft_clear_error(); /* the end of the step fills it instead */
    return;
  }
  j->early[k] = 1;
  pthread_mutex_lock(&a_mu);
  pthread_cond_broadcast(&a_done);
  pthread_mutex_unlock(&a_mu);
}

/* A run's figures in the metrics: the executor and a syncing thread running a small graph
 * inline (exec.c) both count, so under a lock of their own. */
static pthread_mutex_t a_count_mu = PTHREAD_MUTEX_INITIALIZER;

void async_count_run(const exec_program *p, double ms, bool native, bool partial, bool ok) {
  pthread_mutex_lock(&a_count_mu);
  metrics.m.execute_ms += ms;
  if (ok) {
    metrics.m.executions++;
    if (native) metrics.m.compiled_executions++;
    if (partial) metrics.m.partial_executions++;
    metrics.m.last_graph_nodes = (uint64_t)p->ninstr;
    if ((uint64_t)p->ninstr > metrics.m.max_graph_nodes) metrics.m.max_graph_nodes = (uint64_t)p->ninstr;
  }
  pthread_mutex_unlock(&a_count_mu);
}

/* Runs the job's graph (executor thread); returns the failure, or NULL on success with the
 * backend's outputs in bufs[nparams..]. */
static buffer_failure *job_execute(async_job *j) {
  const exec_program *p = j->p;
  exec_buffer **outs = j->bufs + p->nparams;
  graft_clear_error();
  uint64_t w0 = trace_on() ? trace_now() : 0;
  double share = 0;
  void *native = tier_native_for(j->e, async_queued_for(j->e), &share);
  bool partial = native && share < 1.0;
  if (w0) trace_span("wait", "wait for native code", w0, trace_now(), NULL);
  double x0 = metrics_now_ms();
  uint64_t s0 = trace_on() ? trace_now() : 0;
  int donated = 0; /* counted before the run: the backend frees them at their last use */
  for (int k = 0; s0 && k < p->nparams; k++) donated += j->bufs[k] && j->bufs[k]->donated;
  if (async_early_enabled()) backend_set_final_hook(job_output_final, j);
  int rc = native ? j->e->fast->execute(native, p, j->bufs, outs)
                  : j->e->be->execute(j->e->exe, p, j->bufs, outs);
  backend_set_final_hook(NULL, NULL);
  if (s0) {
    char args[200];
    snprintf(args, sizeof args,
             "\"graph\": \"%016llx\", \"step\": %llu, \"tier\": \"%s\", \"ok\": %s, \"donated inputs\": %d, "
             "\"native share\": %.3f", (unsigned long long)j->hash, (unsigned long long)j->seq,
             partial ? "partial" : native ? "native" : "first", rc ? "false" : "true", donated, share);
    trace_span("step", partial ? "step (native, some kernels on the first tier)"
                       : native ? "step (native)" : "step (first tier)", s0, trace_now(), args);
  }
  double ms = metrics_now_ms() - x0;
  async_count_run(p, ms, native != NULL, partial, rc == 0);
  if (!native && !rc) j->e->first_tier_ms = ms;
  if (partial && !rc && j->e->first_tier_ms > 0 && ms > j->e->first_tier_ms)
    j->e->partial_slow_share = share; /* slower than the first tier: wait for more (tier.c) */
  if (native && !rc) atomic_store(&j->e->native_ms, atomic_load(&j->e->native_ms) + ms);
  for (int k = 0; k < p->nparams; k++)
    if (!j->donated[k]) buffer_release(j->bufs[k]); /* the backend released the donated ones */
  if (!rc) return NULL;
  char msg[1024];
  snprintf(msg, sizeof msg, "step %llu (graph %016llx, run asynchronously) failed: %.900s",
           (unsigned long long)j->seq, (unsigned long long)j->hash,
           err_pending() ? graft_last_error() : "the backend failed");
  graft_status st = graft_last_status() ? graft_last_status() : GRAFT_ERR_INTERNAL;
  buffer_failure *f = buffer_failure_new(st, msg);
  return f ? f : buffer_failure_new(GRAFT_ERR_OOM, "a step failed (out of memory for its reason)");
}

static void job_run(async_job *j) {
  const exec_program *p = j->p;
  exec_buffer **outs = j->bufs + p->nparams;
  for (int k = 0; k < p->noutputs; k++) outs[k] = NULL;
  buffer_failure *f = job_failed_input(j);
  if (f) { /* never ran: the inputs are still the job's, donated or not */
    for (int k = 0; k < p->nparams; k++) buffer_release(j->bufs[k]);
  } else {
    f = job_execute(j);
  }
  for (int k = 0; k < p->noutputs && !f; k++) {
    if (j->early[k]) continue; /* filled already; the run's buffer is released below */
    if (buffer_fill(j->ph[k], outs[k]) == 0) {
      outs[k] = NULL;
      continue;
    }
    outs[k] = NULL; /* buffer_fill took it */
    char msg[1024];
    snprintf(msg, sizeof msg, "step %llu (graph %016llx) failed: %.900s", (unsigned long long)j->seq,
             (unsigned long long)j->hash, graft_last_error());
    f = buffer_failure_new(GRAFT_ERR_OOM, msg);
  }
  /* The failure is recorded as unreported before any output reads as failed: a reader that
   * sees one (polling, without the lock) then finds it here and marks it reported. */
  if (f) {
    pthread_mutex_lock(&a_mu);
    if (!a_unreported) {
      __atomic_add_fetch(&f->refcnt, 1, __ATOMIC_RELAXED); /* a_unreported's own reference */
      a_unreported = f;
      a_unreported_seq = j->seq;
    }
    pthread_mutex_unlock(&a_mu);
  }
  for (int k = 0; k < p->noutputs; k++) {
    buffer_release(outs[k]);
    if (f && buffer_get_state(j->ph[k]) == BUFFER_PENDING) buffer_fail(j->ph[k], f);
    buffer_release(j->ph[k]);
  }
  buffer_failure_release(f);
}

/* The executor polls for the next step a while before it sleeps: waking a sleeping thread costs
 * the tracing thread ~15-40 us in the system call and the step another ~45 us before it starts
 * (a virtual machine's idle CPU), where a small model's whole step runs in ~1.5 ms. Polling
 * yields the CPU to any runnable thread; a loop that pauses longer than this lets it sleep. */
enum { ASYNC_POLL_US = 3000 };

/* GRAFT_POLL_US: the executor's poll in microseconds (default ASYNC_POLL_US; 0: no polling, and
 * readers sleep at once: the A/B switch). Read once. */
static double async_poll_ms(void) {
  static int us = -1; /* atomic: the executor and the readers ask */
  int v = __atomic_load_n(&us, __ATOMIC_RELAXED);
  if (v < 0) {
    const char *e = getenv("GRAFT_POLL_US");
    v = e && *e ? atoi(e) : ASYNC_POLL_US;
    if (v < 0) v = 0;
    __atomic_store_n(&us, v, __ATOMIC_RELAXED);
  }
  return v / 1000.0;
}
static int a_polling;   /* the executor is polling (a_mu): a push need not wake it */
static unsigned a_pushes; /* jobs pushed (atomic): what the poll watches */

/* Polls while busy(arg) holds, for up to ms, yielding the CPU every 64 checks (to any runnable
 * thread: on a small machine, the pool's). The executor's poll and a reader's spin. */
static void async_spin_while(bool (*busy)(const void *), const void *arg, double ms) {
  double until = metrics_now_ms() + ms;
  for (unsigned i = 1; busy(arg); i++) {
    if (i % 64 == 0) {
      if (metrics_now_ms() > until) return;
      sched_yield();
    }
    async_pause();
  }
}

static bool async_no_push_since(const void *seen) {
  return __atomic_load_n(&a_pushes, __ATOMIC_ACQUIRE) == *(const unsigned *)seen;
}

static void *async_worker(void *arg) {
  (void)arg;
  trace_thread_name("executor (steps)");
  pthread_mutex_lock(&a_mu);
  for (;;) {
    if (!a_head && !a_stop && async_poll_ms() > 0) {
      a_polling = 1;
      unsigned seen = __atomic_load_n(&a_pushes, __ATOMIC_ACQUIRE); /* under a_mu: no push missed */
      pthread_mutex_unlock(&a_mu);
      async_spin_while(async_no_push_since, &seen, async_poll_ms());
      pthread_mutex_lock(&a_mu);
      a_polling = 0;
    }
    while (!a_head && !a_stop) pthread_cond_wait(&a_work, &a_mu);
    if (!a_head) break; /* stopping, and everything queued has run */
    async_job *j = a_head;
    a_head = j->next;
    if (!a_head) a_tail = NULL;
    a_busy = 1;
    a_running = j->e;
    pthread_mutex_unlock(&a_mu);
    job_run(j);
    job_free(j);
    pthread_mutex_lock(&a_mu);
    a_busy = 0;
    a_running = NULL;
    pthread_cond_broadcast(&a_done);
  }
  pthread_mutex_unlock(&a_mu);
  return NULL;
}

/* fork (fork.c): the child has no executor thread. Queued steps run before the fork (so the
 * child sees their results) and the child starts its own thread when it queues a step. */
void async_fork_prepare(void) {
  pthread_mutex_lock(&a_mu);
  while (a_head || a_busy) pthread_cond_wait(&a_done, &a_mu);
}
void async_fork_parent(void) { pthread_mutex_unlock(&a_mu); }
void async_fork_child(void) { /* the parent's waiters do not exist here */
  a_started = a_busy = a_stop = a_polling = 0; /* no executor here, polling or not */
  a_running = NULL;
  pthread_cond_init(&a_work, NULL);
  pthread_cond_init(&a_done, NULL);
  pthread_mutex_unlock(&a_mu);
}

/* Queues j (lock held); -1 with the error set when the executor thread cannot start. */
static int async_push(async_job *j) {
  async_poll_ms(); /* read GRAFT_POLL_US here, before the executor runs (getenv is not thread-safe) */
  pthread_mutex_lock(&a_mu);
  if (!a_started) {
    a_stop = 0;
    if (pthread_create(&a_thread, NULL, async_worker, NULL)) {
      pthread_mutex_unlock(&a_mu);
      err_set(GRAFT_ERR_INTERNAL, "graft_sync: cannot start the executor thread");
      return -1;
    }
    a_started = 1;
  }
  j->seq = ++a_seq;
  j->next = NULL;
  if (a_tail) a_tail->next = j;
  else a_head = j;
  a_tail = j;
  __atomic_add_fetch(&a_pushes, 1, __ATOMIC_RELEASE);
  if (!a_polling) pthread_cond_signal(&a_work);
  pthread_mutex_unlock(&a_mu);
  return 0;
}

async_job *async_job_new(cache_entry *e) {
  const exec_program *p = e->prog;
  async_job *j = calloc(1, sizeof *j);
  if (j) {
    j->bufs = calloc((size_t)p->nparams + (size_t)p->noutputs + 1, sizeof *j->bufs);
    j->donated = calloc((size_t)p->nparams + 1, 1);
    j->ph = calloc((size_t)p->noutputs + 1, sizeof *j->ph);
    j->early = calloc((size_t)p->noutputs + 1, 1);
  }
  if (!j || !j->bufs || !j->donated || !j->ph || !j->early) {
    if (j) job_free(j);
    return err_set(GRAFT_ERR_OOM, "graft_sync: out of memory queuing a graph");
  }
  j->p = p, j->e = e, j->hash = p->hash;
  return j;
}

int async_job_make_outputs(async_job *j) {
  const exec_program *p = j->p;
  for (int k = 0; k < p->noutputs; k++) {
    const exec_instr *o = &p->instr[p->output_slot[k]];
    size_t bytes = (size_t)o->numel * graft_dtype_size(o->dtype);
    if (!(j->ph[k] = buffer_new_pending(bytes, p->device, "graft_sync"))) return -1;
  }
  return 0;
}

void async_job_take_inputs(async_job *j, exec_buffer *const *inputs) {
  for (int k = 0; k < j->p->nparams; k++) {
    j->bufs[k] = inputs[k];
    j->donated[k] = (unsigned char)inputs[k]->donated;
    if (!inputs[k]->donated) buffer_retain(inputs[k]); /* a donated one comes with its reference */
  }
}

exec_buffer *async_job_output(const async_job *j, int k) { return j->ph[k]; }

int async_job_submit(async_job *j) {
  if (async_push(j) == 0) return 0;
  /* Never to run: whoever holds an output reads this error instead of waiting forever. */
  buffer_failure *f = buffer_failure_new(graft_last_status(), graft_last_error());
  for (int k = 0; k < j->p->noutputs; k++) buffer_fail(j->ph[k], f);
  buffer_failure_release(f);
  return -1;
}

void async_job_discard(async_job *j) {
  for (int k = 0; k < j->p->noutputs; k++) buffer_release(j->ph[k]);
  for (int k = 0; k < j->p->nparams; k++) buffer_release(j->bufs[k]); /* donated or retained */
  job_free(j);
}

void async_drain(void) {
  pthread_mutex_lock(&a_mu);
  while (a_head || a_busy) pthread_cond_wait(&a_done, &a_mu);
  pthread_mutex_unlock(&a_mu);
}

/* A wait of a few tens of microseconds (a small step's loss) costs as much again in waking up
 * once the waiter sleeps: a virtual machine's idle CPU takes ~40-50 us to run a woken thread. So
 * a waiter first polls, briefly, yielding its CPU to any runnable thread (the pool's, on a small
 * machine), then sleeps. */
enum { ASYNC_SPIN_US = 150 };

static bool async_pending(const void *b) { return buffer_get_state(b) == BUFFER_PENDING; }

graft_status async_wait_buffer(const exec_buffer *b, const char *fn) {
  if (buffer_get_state(b) == BUFFER_PENDING) {
    double t0 = metrics_now_ms();
    uint64_t s0 = trace_on() ? trace_now() : 0;
    if (async_poll_ms() > 0) async_spin_while(async_pending, b, ASYNC_SPIN_US / 1000.0);
    pthread_mutex_lock(&a_mu);
    while (buffer_get_state(b) == BUFFER_PENDING) pthread_cond_wait(&a_done, &a_mu);
    pthread_mutex_unlock(&a_mu);
    metrics.m.async_waits++;
    metrics.m.async_wait_ms += metrics_now_ms() - t0;
    if (s0) trace_span("wait", fn, s0, trace_now(), NULL);
  }
  if (buffer_get_state(b) == BUFFER_READY) return GRAFT_OK;
  const buffer_failure *f = b->failure;
  graft_status st = f ? (graft_status)f->status : GRAFT_ERR_INTERNAL;
  err_set(st, "%s: this tensor's value was lost: %s", fn, f ? f->msg : "its step failed");
  if (f) { /* the user has it now: the next sync or wait does not raise it again */
    pthread_mutex_lock(&a_mu);
    if (a_unreported && a_unreported->origin == f->origin) {
      buffer_failure_release(a_unreported);
      a_unreported = NULL;
    }
    pthread_mutex_unlock(&a_mu);
  }
  return st;
}

uint64_t async_last_seq(void) {
  pthread_mutex_lock(&a_mu);
  uint64_t s = a_seq;
  pthread_mutex_unlock(&a_mu);
  return s;
}

graft_status async_take_failure(const char *fn, uint64_t upto) {
  pthread_mutex_lock(&a_mu);
  buffer_failure *f = a_unreported_seq <= upto ? a_unreported : NULL;
  if (f) a_unreported = NULL;
  pthread_mutex_unlock(&a_mu);
  if (!f) return GRAFT_OK;
  graft_status st = (graft_status)f->status;
  err_set(st, "%s: %s (the tensors that step computed cannot be read)", fn,
          f->msg);
  buffer_failure_release(f);
  return st;
}

void async_shutdown(void) {
  pthread_mutex_lock(&a_mu);
  if (!a_started) {
    pthread_mutex_unlock(&a_mu);
  } else {
    a_stop = 1;
    __atomic_add_fetch(&a_pushes, 1, __ATOMIC_RELEASE); /* ends a poll */
    pthread_cond_broadcast(&a_work);
    pthread_mutex_unlock(&a_mu);
    pthread_join(a_thread, NULL); /* it runs what is queued first */
    a_started = 0;
  }
  buffer_failure_release(a_unreported);
  a_unreported = NULL;
}

graft_status graft_wait(void) {
  uint64_t s0 = trace_on() ? trace_now() : 0;
  async_drain();
  if (s0) trace_span("wait", "graft_wait", s0, trace_now(), NULL);
  return async_take_failure("graft_wait", UINT64_MAX);
}
