/* Measured choices between kernels that compute the same thing: graft's own GEMM kernels or
 * OpenBLAS's for a class of products, a direct convolution or im2col + GEMM for a class of
 * convolutions. A static rule picks the default (the kernel that won where it was measured);
 * on a shape nobody measured it may lose. So the first executions of each class alternate the
 * candidates, CPU_CHOICE_SAMPLES runs each, timed; then the class keeps the one with the lower
 * median, the default unless another is CPU_CHOICE_MARGIN faster (noise on a shared machine
 * must not flip equal kernels). Each run computes the real result, so measuring costs only
 * the slower candidate's few runs. A class is a hash of the op and its size classes (each
 * dim to the nearest half octave), so a product of a new size near a measured one reuses the
 * choice. GRAFT_KERNEL_CHOICE=0 keeps every default (the A/B). The classes that left their
 * default are counted (metrics: "kernels demoted") and listed by GRAFT_PROFILE at exit. */
#include "cpu_internal.h"
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  CPU_CHOICE_SAMPLES = 3,
  CPU_CHOICE_SLOTS = 1024, /* classes kept; past that, defaults */
  CPU_CHOICE_PROBE = 16,   /* slots probed for a key */
};
#define CPU_CHOICE_MARGIN 0.85 /* another candidate must take at most this much of the default's time */

typedef struct {
  uint64_t key;  /* 0: free */
  int n, chosen; /* candidates; the choice, -1 while measuring */
  int runs[CPU_CHOICE_MAX];
  double s[CPU_CHOICE_MAX][CPU_CHOICE_SAMPLES];
  const char *kind; /* the first instance of the class, for the report */
  int64_t dims[CPU_CHOICE_DIMS];
  int nd;
} cpu_choice_slot;

static cpu_choice_slot cpu_choice_tab[CPU_CHOICE_SLOTS];
static pthread_mutex_t cpu_choice_mu = PTHREAD_MUTEX_INITIALIZER;

static bool cpu_choice_on(void) {
  const char *e = getenv("GRAFT_KERNEL_CHOICE"); /* read per call: cheap next to a kernel */
  return !(e && !strcmp(e, "0"));
}

/* x's size class: the nearest half octave. */
int64_t cpu_choice_class(int64_t x) { return x <= 0 ? 0 : 1 + (int64_t)lround(2.0 * log2((double)x)); }

/* The class of (kind, dims): FNV-1a over the kind's address and the dims' size classes, the
 * first `exact` dims (flags, kernel sizes) taken as they are. */
static uint64_t cpu_choice_key(const char *kind, const int64_t *dims, int nd, int exact) {
  uint64_t h = (1469598103934665603ull ^ (uint64_t)(uintptr_t)kind) * 1099511628211ull;
  for (int i = 0; i < nd; i++)
    h = (h ^ (uint64_t)(i < exact ? dims[i] : cpu_choice_class(dims[i]))) * 1099511628211ull;
  return h ? h : 1;
}

static double cpu_choice_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_choice_median(const double *s) {
  double a = s[0], b = s[1], c = s[2]; /* CPU_CHOICE_SAMPLES == 3 */
  return a > b ? (b > c ? b : a > c ? c : a) : (a > c ? a : b > c ? c : b);
}

int cpu_choice_begin(const char *kind, const int64_t *dims, int nd, int exact, int n,
                     cpu_choice_ticket *t) {
  t->slot = -1;
  if (n < 2 || n > CPU_CHOICE_MAX || nd > CPU_CHOICE_DIMS || !cpu_choice_on()) return 0;
  uint64_t key = cpu_choice_key(kind, dims, nd, exact);
  pthread_mutex_lock(&cpu_choice_mu);
  int pick = 0;
  for (int i = 0; i < CPU_CHOICE_PROBE; i++) {
    int k = (int)((key + (uint64_t)i) % CPU_CHOICE_SLOTS);
    cpu_choice_slot *s = &cpu_choice_tab[k];
    if (s->key && s->key != key) continue;
    if (!s->key) {
      memset(s, 0, sizeof *s);
      s->key = key, s->n = n, s->chosen = -1, s->kind = kind, s->nd = nd;
      memcpy(s->dims, dims, sizeof(int64_t) * (size_t)nd);
    }
    if (s->chosen >= 0) {
      pick = s->chosen;
      break;
    }
    /* the candidate with the fewest runs; a run in flight counts (another thread's) */
    for (int c = 1; c < s->n; c++)
      if (s->runs[c] < s->runs[pick]) pick = c;
    if (s->runs[pick] >= CPU_CHOICE_SAMPLES) { /* all sampled, results not all in: default */
      pick = 0;
      break;
    }
    t->slot = k, t->which = pick, t->sample = s->runs[pick]++;
    break;
  }
  pthread_mutex_unlock(&cpu_choice_mu);
  if (t->slot >= 0) t->t0 = cpu_choice_now();
  return pick;
}

void cpu_choice_end(cpu_choice_ticket *t) {
  if (t->slot < 0) return;
  double dt = cpu_choice_now() - t->t0;
  pthread_mutex_lock(&cpu_choice_mu);
  cpu_choice_slot *s = &cpu_choice_tab[t->slot];
  s->s[t->which][t->sample] = dt > 0 ? dt : 1e-12;
  bool done = s->chosen < 0;
  for (int c = 0; c < s->n && done; c++)
    for (int q = 0; q < CPU_CHOICE_SAMPLES && done; q++) done = s->s[c][q] > 0;
  if (done) {
    double best = cpu_choice_median(s->s[0]) * CPU_CHOICE_MARGIN;
    s->chosen = 0;
    for (int c = 1; c < s->n; c++) {
      double m = cpu_choice_median(s->s[c]);
      if (m < best) best = m, s->chosen = c;
    }
    __atomic_fetch_add(&cpu_stats.choices, 1, __ATOMIC_RELAXED);
    if (s->chosen) __atomic_fetch_add(&cpu_stats.demoted, 1, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&cpu_choice_mu);
}

void cpu_choice_only(cpu_choice_ticket *t) {
  if (t->slot < 0) return;
  pthread_mutex_lock(&cpu_choice_mu);
  cpu_choice_tab[t->slot].chosen = 0;
  pthread_mutex_unlock(&cpu_choice_mu);
  t->slot = -1;
}

void cpu_choice_report(FILE *f) {
  pthread_mutex_lock(&cpu_choice_mu);
  for (int k = 0; k < CPU_CHOICE_SLOTS; k++) {
    const cpu_choice_slot *s = &cpu_choice_tab[k];
    if (!s->key || s->chosen <= 0) continue;
    fprintf(f, "graft kernel choice: %s", s->kind);
    for (int i = 0; i < s->nd; i++) fprintf(f, " %lld", (long long)s->dims[i]);
    fprintf(f, " (and its size class): candidate %d, %.1f us, over the default, %.1f us\n", s->chosen,
            cpu_choice_median(s->s[s->chosen]) * 1e6, cpu_choice_median(s->s[0]) * 1e6);
  }
  pthread_mutex_unlock(&cpu_choice_mu);
}
