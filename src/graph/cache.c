/* The in-memory compile cache: graph hash -> program and its backend executable; and the
 * reason a graph is compiled, found by comparing with the nearest cached graph. */
#include "graph.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 1024
static cache_entry *buckets[NBUCKETS];

/* A graph's structure, exactly as far as its hash describes it: per node in capture order its
 * op, dtype, rank, device, operand count, shape, attributes (not for data leaves: those are
 * parameters) and operand slots; then the roots' slots. A hash hit counts only when the
 * capture matches the entry's structure word for word, so two graphs whose 64-bit hashes
 * collide each get their own program. The same walk writes a structure (ref NULL)
 * or compares a capture against a stored one (ref set; stops at the first difference). */
#define SIG_BUF 512
typedef struct {
  uint64_t *w;          /* writing: the words */
  size_t n, cap;
  const uint64_t *ref;  /* comparing: the stored words */
  size_t nref;
  bool differ, oom;
  int nb;
  uint64_t buf[SIG_BUF]; /* words not yet written or compared */
} sig_walk;

static void sig_flush(sig_walk *s) {
  size_t k = (size_t)s->nb;
  s->nb = 0;
  if (s->ref) {
    if (s->n + k > s->nref || memcmp(s->ref + s->n, s->buf, k * sizeof *s->buf)) s->differ = true;
    s->n += k;
    return;
  }
  if (s->n + k > s->cap) {
    size_t nc = s->cap ? 2 * s->cap : 4 * SIG_BUF;
    uint64_t *w = realloc(s->w, nc * sizeof *w);
    if (!w) {
      s->oom = true;
      return;
    }
    s->w = w;
    s->cap = nc;
  }
  memcpy(s->w + s->n, s->buf, k * sizeof *s->buf);
  s->n += k;
}

static inline void sig_put(sig_walk *s, uint64_t v) {
  if (s->nb == SIG_BUF) sig_flush(s);
  s->buf[s->nb++] = v;
}

static void sig_graph(const graph_capture *g, sig_walk *s) {
  sig_put(s, ((uint64_t)(uint32_t)g->n << 32) | (uint32_t)g->nroots);
  for (int i = 0; i < g->n && !s->differ && !s->oom; i++) {
    const ir_node *nd = g->nodes[i];
    uint64_t fb = 0;
    if (nd->op != IR_DATA) memcpy(&fb, &nd->attr.f, sizeof fb);
    /* op < 2^16, dtype < 2^8, ndim <= GRAFT_MAX_DIMS, nattr <= IR_MAX_ATTRS: fields disjoint;
     * attr.a past nattr is zero (ir.c), so the count stands for the trailing zeros */
    sig_put(s, (uint64_t)nd->op | (uint64_t)nd->dtype << 16 | (uint64_t)nd->ndim << 24 |
                   (uint64_t)nd->nattr << 32 | (uint64_t)(fb != 0) << 40);
    sig_put(s, ((uint64_t)(uint32_t)nd->device << 32) | (uint32_t)nd->nin);
    for (int k = 0; k < nd->ndim; k++) sig_put(s, (uint64_t)nd->shape[k]);
    for (int k = 0; k < nd->nattr; k++) sig_put(s, (uint64_t)nd->attr.a[k]);
    if (fb) sig_put(s, fb);
    for (int k = 0; k < nd->nin; k++) sig_put(s, (uint64_t)(uint32_t)nd->in[k]->slot);
  }
  for (int r = 0; r < g->nroots; r++) sig_put(s, (uint64_t)(uint32_t)g->out_slot[r]);
  sig_flush(s);
}

static bool sig_matches(const cache_entry *e, const graph_capture *g) {
  sig_walk s;
  s.w = NULL;
  s.n = s.cap = 0;
  s.ref = e->sig;
  s.nref = e->nsig;
  s.differ = s.oom = false;
  s.nb = 0;
  sig_graph(g, &s);
  return !s.differ && s.n == s.nref;
}

cache_entry *cache_lookup(const graph_capture *g) {
  bool collided = false;
  cache_entry *found = NULL;
  for (cache_entry *e = buckets[g->hash % NBUCKETS]; e && !found; e = e->next) {
    if (e->prog->hash != g->hash) continue;
    if (sig_matches(e, g)) found = e;
    else collided = true;
  }
  if (collided) metrics.m.cache_collisions++;
  return found;
}

cache_entry *cache_insert(exec_program *prog, const graph_capture *g, const backend *be,
                          void *exe) {
  sig_walk s;
  s.w = NULL;
  s.n = s.cap = 0;
  s.ref = NULL;
  s.nref = 0;
  s.differ = s.oom = false;
  s.nb = 0;
  sig_graph(g, &s);
  cache_entry *e = s.oom ? NULL : calloc(1, sizeof *e);
  if (!e) {
    free(s.w);
    return err_set(GRAFT_ERR_OOM, "out of memory adding a graph to the cache");
  }
  uint64_t *fit = realloc(s.w, (s.n ? s.n : 1) * sizeof *fit);
  e->sig = fit ? fit : s.w;
  e->nsig = s.n;
  e->prog = prog;
  e->be = be;
  e->exe = exe;
  e->next = buckets[prog->hash % NBUCKETS];
  buckets[prog->hash % NBUCKETS] = e;
  return e;
}

void cache_foreach(void (*fn)(cache_entry *e)) {
  for (int b = 0; b < NBUCKETS; b++)
    for (cache_entry *e = buckets[b]; e; e = e->next) fn(e);
}

void cache_clear(void) {
  for (int b = 0; b < NBUCKETS; b++) {
    while (buckets[b]) {
      cache_entry *e = buckets[b];
      buckets[b] = e->next;
      if (e->be->free_exe) e->be->free_exe(e->exe);
      if (e->tier == TIER_READY && e->fast->free_exe) e->fast->free_exe(e->fast_exe);
      if (e->replaced_exe && e->fast->free_exe) e->fast->free_exe(e->replaced_exe);
      program_free(e->prog);
      free(e->sig);
      free(e);
    }
  }
}

static void reason_param(char *buf, size_t n, int k, const ir_node *now, const exec_instr *was) {
  char a[128], b[128];
  snprintf(buf, n, "input %d is %s %s, the cached graph of the same structure has %s %s", k,
           graft_dtype_name(now->dtype), ir_shape_str(now->ndim, now->shape, a, sizeof a),
           graft_dtype_name(was->dtype), ir_shape_str(was->ndim, was->shape, b, sizeof b));
}

void cache_reason(const graph_capture *g, char *buf, size_t n) {
  const exec_program *near = NULL;
  int ncached = 0;
  for (cache_entry *e = buckets[g->hash % NBUCKETS]; e; e = e->next)
    if (e->prog->hash == g->hash) { /* a miss with this hash cached: a collision */
      snprintf(buf, n, "new graph %016" PRIx64 " (%d nodes): a cached graph of another "
               "structure has the same hash (a hash collision); compiled on its own",
               g->hash, g->n);
      return;
    }
  for (int b = 0; b < NBUCKETS; b++)
    for (cache_entry *e = buckets[b]; e; e = e->next) {
      ncached++;
      if (e->prog->shape_free == g->shape_free && e->prog->nparams == g->nparams) near = e->prog;
    }
  if (!near) {
    snprintf(buf, n, "new graph %016" PRIx64 " (%d nodes, %d inputs): %s", g->hash, g->n,
             g->nparams, ncached ? "no cached graph has this structure" : "cache empty");
    return;
  }
  size_t k = (size_t)snprintf(buf, n, "new graph %016" PRIx64 " (%d nodes): ", g->hash, g->n);
  for (int i = 0; i < g->nparams; i++) {
    const ir_node *now = g->params[i];
    const exec_instr *was = &near->instr[near->param_slot[i]];
    if (now->dtype != was->dtype || now->ndim != was->ndim ||
        memcmp(now->shape, was->shape, sizeof(int64_t) * (size_t)now->ndim)) {
      reason_param(buf + k, n - k, i, now, was);
      return;
    }
  }
  snprintf(buf + k, n - k, "same structure and inputs as cached graph %016" PRIx64
           ", but an intermediate shape, constant or attribute differs", near->hash);
}
