/* The timeline trace: spans kept in memory under one lock while recording, written as one JSON
 * document (Chrome's trace-event format: complete events "X" with microsecond times, and each
 * thread's name as metadata "M") when recording ends. See trace.h. */
#include "trace.h"
#include "error.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { TRACE_NAME = 64, TRACE_ARGS = 160 };

typedef struct {
  const char *cat; /* a literal */
  char name[TRACE_NAME];
  uint64_t t0, t1;
  int tid;
  char args[TRACE_ARGS]; /* short args inline (a kernel's, a GEMM's) */
  char *long_args;       /* longer ones (a compile's reason) */
} trace_event;

typedef struct {
  int tid;
  char name[48];
} trace_thread;

static atomic_bool trace_active;
static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;
static trace_event *trace_ev;
static size_t trace_n, trace_cap;
static trace_thread *trace_th;
static int trace_nth, trace_cap_th;
static char *trace_path;
static uint64_t trace_origin;
static atomic_int trace_next_tid;
static _Thread_local int trace_tid; /* 0: not yet given one */
static pthread_once_t trace_env_once = PTHREAD_ONCE_INIT;

uint64_t trace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static graft_status trace_start(const char *path, const char *fn);

static void trace_env(void) {
  const char *p = getenv("GRAFT_TRACE");
  if (p && *p && trace_start(p, "GRAFT_TRACE") != GRAFT_OK)
    fprintf(stderr, "graft: warning: %s\n", graft_last_error());
  if (p && *p) atexit(trace_shutdown);
}

bool trace_on(void) {
  pthread_once(&trace_env_once, trace_env);
  return atomic_load_explicit(&trace_active, memory_order_relaxed);
}

static int trace_my_tid(void) {
  if (!trace_tid) trace_tid = atomic_fetch_add(&trace_next_tid, 1) + 1;
  return trace_tid;
}

void trace_thread_name(const char *name) {
  static _Thread_local bool named;
  if (named) return;
  named = true;
  int tid = trace_my_tid();
  pthread_mutex_lock(&trace_mu);
  int k = 0;
  while (k < trace_nth && trace_th[k].tid != tid) k++;
  if (k == trace_nth && trace_nth == trace_cap_th) {
    int cap = trace_cap_th ? 2 * trace_cap_th : 16;
    trace_thread *t = realloc(trace_th, sizeof *t * (size_t)cap);
    if (t) trace_th = t, trace_cap_th = cap;
  }
  if (k < trace_cap_th) {
    trace_th[k].tid = tid;
    snprintf(trace_th[k].name, sizeof trace_th[k].name, "%s", name);
    if (k == trace_nth) trace_nth++;
  }
  pthread_mutex_unlock(&trace_mu);
}

void trace_span(const char *cat, const char *name, uint64_t t0, uint64_t t1, const char *args) {
  if (!trace_on()) return;
  int tid = trace_my_tid();
  size_t alen = args ? strlen(args) : 0;
  char *big = alen >= TRACE_ARGS ? strdup(args) : NULL;
  pthread_mutex_lock(&trace_mu);
  if (atomic_load(&trace_active)) {
    if (trace_n == trace_cap) {
      size_t cap = trace_cap ? 2 * trace_cap : 4096;
      trace_event *e = realloc(trace_ev, sizeof *e * cap);
      if (e) trace_ev = e, trace_cap = cap;
    }
    if (trace_n < trace_cap && (alen < TRACE_ARGS || big)) { /* else dropped: best effort */
      trace_event *e = &trace_ev[trace_n++];
      e->cat = cat, e->t0 = t0, e->t1 = t1 < t0 ? t0 : t1, e->tid = tid;
      size_t nl = strlen(name);
      if (nl >= TRACE_NAME) nl = TRACE_NAME - 1;
      memcpy(e->name, name, nl), e->name[nl] = 0;
      memcpy(e->args, args ? args : "", alen < TRACE_ARGS ? alen + 1 : 1);
      e->long_args = big;
      big = NULL;
    }
  }
  pthread_mutex_unlock(&trace_mu);
  free(big);
}

/* s as a JSON string's contents. */
static void trace_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
}

void trace_args_reason(char *buf, size_t n, uint64_t graph, const char *reason) {
  size_t at = (size_t)snprintf(buf, n, "\"graph\": \"%016llx\", \"reason\": \"", (unsigned long long)graph);
  for (const char *c = reason ? reason : ""; *c && at + 8 < n; c++) {
    unsigned char u = (unsigned char)*c;
    if (u == '"' || u == '\\') {
      buf[at++] = '\\', buf[at++] = (char)u;
    } else if (u < 0x20) {
      at += (size_t)snprintf(buf + at, n - at, "\\u%04x", u);
    } else if (u >= 0xc0) { /* a UTF-8 sequence goes whole or not at all (valid JSON text) */
      size_t len = u >= 0xf0 ? 4 : u >= 0xe0 ? 3 : 2, k = 1;
      while (k < len && ((unsigned char)c[k] & 0xc0) == 0x80) k++;
      if (k < len || at + len + 8 >= n) break;
      memcpy(buf + at, c, len);
      at += len, c += len - 1;
    } else if (u < 0x80) {
      buf[at++] = (char)u;
    } /* a stray continuation byte is dropped */
  }
  if (at + 2 <= n) buf[at++] = '"', buf[at] = 0;
  else if (n) buf[n - 1] = 0;
}

static graft_status trace_write(void) {
  FILE *f = fopen(trace_path, "w");
  if (!f)
    return err_set(GRAFT_ERR_FILE, "graft_trace_end: cannot write %s: %s", trace_path,
                   strerror(errno)), GRAFT_ERR_FILE;
  int pid = (int)getpid();
  fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
  fprintf(f, "{\"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"name\": \"process_name\", \"args\": {\"name\": \"graft\"}}", pid);
  for (int k = 0; k < trace_nth; k++) {
    fprintf(f, ",\n{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"thread_name\", \"args\": {\"name\": \"", pid, trace_th[k].tid);
    trace_escape(f, trace_th[k].name);
    fprintf(f, "\"}}");
  }
  int ntid = atomic_load(&trace_next_tid) + 1; /* tids are 1, 2, ...: a thread that never named
                                                  itself is "thread N" */
  unsigned char *seen = calloc((size_t)ntid, 1);
  for (int k = 0; k < trace_nth && seen; k++)
    if (trace_th[k].tid < ntid) seen[trace_th[k].tid] = 1;
  for (size_t i = 0; i < trace_n && seen; i++) {
    int t = trace_ev[i].tid;
    if (t < ntid && !seen[t])
      fprintf(f, ",\n{\"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"name\": \"thread_name\", "
              "\"args\": {\"name\": \"thread %d\"}}", pid, t, t);
    if (t < ntid) seen[t] = 1;
  }
  free(seen);
  for (size_t i = 0; i < trace_n; i++) {
    const trace_event *e = &trace_ev[i];
    uint64_t t0 = e->t0 > trace_origin ? e->t0 - trace_origin : 0;
    fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"cat\": \"%s\", \"name\": \"",
            pid, e->tid, (double)t0 / 1e3, (double)(e->t1 - e->t0) / 1e3, e->cat);
    trace_escape(f, e->name);
    fprintf(f, "\", \"args\": {%s}}", e->long_args ? e->long_args : e->args);
  }
  fprintf(f, "\n]}\n");
  bool ok = !ferror(f);
  if (fclose(f) || !ok)
    return err_set(GRAFT_ERR_FILE, "graft_trace_end: cannot write %s", trace_path), GRAFT_ERR_FILE;
  return GRAFT_OK;
}

static void trace_clear(void) {
  for (size_t i = 0; i < trace_n; i++) free(trace_ev[i].long_args);
  free(trace_ev);
  trace_ev = NULL, trace_n = trace_cap = 0;
  free(trace_path);
  trace_path = NULL;
}

static graft_status trace_start(const char *path, const char *fn) {
  if (!path || !*path) return err_set(GRAFT_ERR_NULL, "%s: no path", fn), GRAFT_ERR_NULL;
  if (atomic_load(&trace_active)) /* checked again under the lock */
    return err_set(GRAFT_ERR_ARG, "%s: a trace is already being recorded", fn), GRAFT_ERR_ARG;
  FILE *probe = fopen(path, "w"); /* a path that cannot be written is said now, not at the end */
  if (!probe)
    return err_set(GRAFT_ERR_FILE, "%s: cannot write %s: %s", fn, path, strerror(errno)), GRAFT_ERR_FILE;
  fclose(probe);
  pthread_mutex_lock(&trace_mu);
  graft_status st = GRAFT_OK;
  if (atomic_load(&trace_active)) {
    err_set(GRAFT_ERR_ARG, "%s: a trace is already being recorded (to %s)", fn, trace_path);
    st = GRAFT_ERR_ARG;
  } else if (!(trace_path = strdup(path))) {
    err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
    st = GRAFT_ERR_OOM;
  } else {
    trace_origin = trace_now();
    atomic_store(&trace_active, true);
  }
  pthread_mutex_unlock(&trace_mu);
  return st;
}

graft_status graft_trace_begin(const char *path) {
  pthread_once(&trace_env_once, trace_env);
  return trace_start(path, "graft_trace_begin");
}

graft_status graft_trace_end(void) {
  pthread_mutex_lock(&trace_mu);
  graft_status st;
  if (!atomic_load(&trace_active)) {
    err_set(GRAFT_ERR_ARG, "graft_trace_end: no trace is being recorded");
    st = GRAFT_ERR_ARG;
  } else {
    atomic_store(&trace_active, false);
    st = trace_write();
    trace_clear();
  }
  pthread_mutex_unlock(&trace_mu);
  return st;
}

void trace_shutdown(void) {
  if (atomic_load(&trace_active) && graft_trace_end() != GRAFT_OK)
    fprintf(stderr, "graft: warning: %s\n", graft_last_error());
}
