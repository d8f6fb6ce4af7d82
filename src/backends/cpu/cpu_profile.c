/* GRAFT_PROFILE=1: each compiled graph times its kernel and GEMM call sites, and writes a table
 * to stderr when the graph is freed (at graft_shutdown or cache eviction). The call sites are
 * counted in execution order, which a compiled graph keeps from run to run. */
#define _GNU_SOURCE
#include "cpu_internal.h"
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool cpu_profile_enabled(void) { /* read per execution: a program may switch it on and off */
  const char *e = getenv("GRAFT_PROFILE");
  return e && *e && strcmp(e, "0") != 0;
}

double cpu_profile_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void cpu_profile_atexit(void);
static void cpu_profile_register_atexit(void) { atexit(cpu_profile_atexit); }

static cpu_profile_site *cpu_profile_at(cpu_profile *p, int site) {
  if (site >= p->cap) {
    int cap = p->cap ? p->cap * 2 : 64;
    while (cap <= site) cap *= 2;
    cpu_profile_site *v = realloc(p->site, sizeof *v * (size_t)cap);
    if (!v) return NULL; /* profiling is best effort */
    memset(v + p->cap, 0, sizeof *v * (size_t)(cap - p->cap));
    p->site = v;
    p->cap = cap;
  }
  if (site >= p->n) p->n = site + 1;
  return &p->site[site];
}

void cpu_profile_kernel(cpu_profile *p, int site, cpu_kernel_fn fn, int64_t total, double ms) {
  cpu_profile_site *s = cpu_profile_at(p, site);
  if (!s) return;
  if (!s->calls) {
    Dl_info di;
    void *addr;
    memcpy(&addr, &fn, sizeof addr);
    const char *nm = dladdr(addr, &di) && di.dli_sname ? di.dli_sname : "kernel";
    snprintf(s->name, sizeof s->name, "%s x%" PRId64, nm, total);
  }
  s->ms += ms;
  s->calls++;
}

/* "d0xd1x..." of a shape, into buf. */
static const char *cpu_profile_dims(char *buf, size_t n, const int64_t *shape, int nd) {
  size_t at = 0;
  buf[0] = 0;
  for (int d = 0; d < nd && at < n; d++)
    at += (size_t)snprintf(buf + at, n - at, "%s%" PRId64, d ? "x" : "", shape[d]);
  return buf;
}

/* A host call site is named by its op, its operands' shapes and its output's: the same op at
 * different shapes (a depthwise convolution and its two gradients) reads apart. */
void cpu_profile_host(cpu_profile *p, int site, const exec_instr *ins, const exec_program *prog,
                      double ms) {
  cpu_profile_site *s = cpu_profile_at(p, site);
  if (!s) return;
  if (!s->calls) {
    char a[48], b[48], o[48];
    const exec_instr *x = ins->nin > 0 ? &prog->instr[ins->in[0]] : ins;
    const exec_instr *y = ins->nin > 1 ? &prog->instr[ins->in[1]] : NULL;
    snprintf(s->name, sizeof s->name, "host %s %s%s%s -> %s", ir_ops[ins->op].name,
             cpu_profile_dims(a, sizeof a, x->shape, x->ndim), y ? ", " : "",
             y ? cpu_profile_dims(b, sizeof b, y->shape, y->ndim) : "",
             cpu_profile_dims(o, sizeof o, ins->shape, ins->ndim));
  }
  s->ms += ms;
  s->calls++;
}

void cpu_profile_gemm(cpu_profile *p, int site, int dbl, int ta, int tb, int m, int n, int k,
                      int64_t batch, double ms) {
  cpu_profile_site *s = cpu_profile_at(p, site);
  if (!s) return;
  if (!s->calls)
    snprintf(s->name, sizeof s->name, "%s %c%c %" PRId64 " x %dx%dx%d", dbl ? "dgemm" : "sgemm",
             ta ? 'T' : 'N', tb ? 'T' : 'N', batch, m, n, k);
  s->ms += ms;
  s->calls++;
}

static pthread_mutex_t cpu_profile_mu = PTHREAD_MUTEX_INITIALIZER;
static cpu_profile *cpu_profile_list;

static void cpu_profile_print(const cpu_profile *p) {
  uint64_t hash = p->hash;
  double sum = 0;
  for (int i = 0; i < p->n; i++) sum += p->site[i].ms;
  fprintf(stderr, "graft profile: graph %016" PRIx64 ": %" PRId64 " runs, %.3f ms a run, %.3f ms "
          "of it in %d call sites (the rest: allocation and release)\n",
          hash, p->runs, p->ms / (double)p->runs, sum / (double)p->runs, p->n);
  for (int i = 0; i < p->n; i++) {
    const cpu_profile_site *s = &p->site[i];
    if (!s->calls) continue;
    fprintf(stderr, "  %4d %-40s %9.3f ms a run %5.1f%%\n", i, s->name, s->ms / (double)s->calls,
            p->ms > 0 ? 100.0 * s->ms / p->ms : 0.0);
  }
}

static void cpu_profile_atexit(void) {
  pthread_mutex_lock(&cpu_profile_mu);
  for (cpu_profile *p = cpu_profile_list; p; p = p->next) cpu_profile_print(p);
  cpu_profile_list = NULL;
  pthread_mutex_unlock(&cpu_profile_mu);
  cpu_choice_report(stderr);
}

void cpu_profile_run(cpu_profile *p, uint64_t hash, double ms) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, cpu_profile_register_atexit);
  if (!p->runs++) {
    p->hash = hash;
    pthread_mutex_lock(&cpu_profile_mu);
    p->next = cpu_profile_list;
    cpu_profile_list = p;
    pthread_mutex_unlock(&cpu_profile_mu);
  }
  p->ms += ms;
}

void cpu_profile_free(cpu_profile *p) {
  if (p->runs) {
    pthread_mutex_lock(&cpu_profile_mu);
    for (cpu_profile **q = &cpu_profile_list; *q; q = &(*q)->next)
      if (*q == p) {
        *q = p->next;
        cpu_profile_print(p);
        break;
      }
    pthread_mutex_unlock(&cpu_profile_mu);
  }
  free(p->site);
  memset(p, 0, sizeof *p);
}
