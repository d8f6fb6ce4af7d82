/* The in-memory compile cache: graph hash -> program and its backend executable; and the
 * reason a graph is compiled, found by comparing with the nearest cached graph. */
#include "graph.h"
#include "../core/error.h"
#include "../core/loc.h"
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
  size_t *starts;       /* writing, when set: each node's first word */
  uint64_t buf[SIG_BUF]; /* words not yet written or compared */
} sig_walk;

/* Starts a walk: writing (ref NULL) or comparing against ref's nref words. The buffer is
 * not cleared: a walk writes before it reads. */
static void sig_begin(sig_walk *s, const uint64_t *ref, size_t nref) {
  s->w = NULL;
  s->n = s->cap = 0;
  s->ref = ref;
  s->nref = nref;
  s->differ = s->oom = false;
  s->nb = 0;
  s->starts = NULL;
}

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

static void sig_node(sig_walk *s, const ir_node *nd) {
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

static void sig_graph(const graph_capture *g, sig_walk *s) {
  sig_put(s, ((uint64_t)(uint32_t)g->n << 32) | (uint32_t)g->nroots);
  for (int i = 0; i < g->n && !s->differ && !s->oom; i++) {
    if (s->starts) s->starts[i] = s->n + (size_t)s->nb;
    sig_node(s, g->nodes[i]);
  }
  for (int r = 0; r < g->nroots; r++) sig_put(s, (uint64_t)(uint32_t)g->out_slot[r]);
  sig_flush(s);
}

static bool sig_matches(const cache_entry *e, const graph_capture *g) {
  sig_walk s;
  sig_begin(&s, e->sig, e->nsig);
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
  sig_begin(&s, NULL, 0);
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

/* Whether o is a size of e's family (e itself included): equal structure up to shapes. */
static bool cache_same_family(const cache_entry *o, const cache_entry *e) {
  return o->prog->shape_free == e->prog->shape_free && o->prog->device == e->prog->device;
}

void cache_mark_family(const cache_entry *e) {
  for (int b = 0; b < NBUCKETS; b++)
    for (cache_entry *o = buckets[b]; o; o = o->next)
      if (cache_same_family(o, e)) {
        o->varying = true;
        atomic_store(&o->many_sizes, true);
        atomic_store(&o->prog->varying, true);
      }
}

cache_entry *cache_sibling(const cache_entry *e, int *sizes) {
  cache_entry *best = NULL;
  *sizes = 1;
  for (int b = 0; b < NBUCKETS; b++)
    for (cache_entry *o = buckets[b]; o; o = o->next)
      if (o != e && cache_same_family(o, e)) {
        ++*sizes;
        if (!best || o->level > best->level) best = o;
      }
  return best;
}

void cache_clear(void) {
  for (int b = 0; b < NBUCKETS; b++) {
    while (buckets[b]) {
      cache_entry *e = buckets[b];
      buckets[b] = e->next;
      if (e->be->free_exe) e->be->free_exe(e->exe);
      if (e->tier == TIER_READY && e->fast->free_exe) e->fast->free_exe(e->fast_exe);
      if (e->replaced_exe && e->fast->free_exe) e->fast->free_exe(e->replaced_exe);
      void *partial = atomic_load(&e->partial_exe);
      if (partial && partial != e->fast_exe && e->fast->free_exe) e->fast->free_exe(partial);
      program_free(e->prog);
      free(e->sig);
      free(e);
    }
  }
}

/* Where node i of g was traced; for a node without a location (a leaf made before any was
 * set, a gradient traced on autograd's own thread) the nearest one around it: the first later
 * node that reads it, else its operands', breadth first. */
#define REASON_LOC_VISITS 256
static uint32_t reason_loc(const graph_capture *g, int i) {
  const ir_node *nd = g->nodes[i];
  if (nd->loc) return nd->loc;
  for (int j = i + 1; j < g->n && j < i + REASON_LOC_VISITS; j++)
    for (int k = 0; k < g->nodes[j]->nin; k++)
      if (g->nodes[j]->in[k] == nd && g->nodes[j]->loc) return g->nodes[j]->loc;
  const ir_node *queue[REASON_LOC_VISITS];
  int head = 0, tail = 0;
  queue[tail++] = nd;
  while (head < tail) {
    const ir_node *m = queue[head++];
    for (int k = 0; k < m->nin; k++) {
      if (m->in[k]->loc) return m->in[k]->loc;
      if (tail < REASON_LOC_VISITS) queue[tail++] = m->in[k];
    }
  }
  return 0;
}

/* " at file:line" of node i (counted as a recompile site), or "" (where it is not known). */
static const char *reason_at(const graph_capture *g, int i, char *buf, size_t n) {
  uint32_t id = reason_loc(g, i);
  char where[400];
  loc_str(id, where, sizeof where);
  if (n) buf[0] = 0;
  if (!id || !where[0]) return buf;
  loc_count_recompile(id);
  snprintf(buf, n, " at %s", where);
  return buf;
}

static size_t sig_nodes_end(const uint64_t *sig, size_t nsig) { /* sig[0]: nodes, roots */
  size_t roots = nsig ? (size_t)(uint32_t)sig[0] : 0;
  return roots < nsig ? nsig - roots : 0;
}

/* The cached graph whose structure agrees with g's longest (compared word by word after the
 * node count), and the first node of g past the agreement (g->n: all nodes agree, the
 * outputs differ); NULL when nothing is cached or memory runs out. *was: where that node's
 * record starts in the cached graph's words. */
static const cache_entry *reason_nearest(const graph_capture *g, int *node, size_t *was) {
  sig_walk s;
  sig_begin(&s, NULL, 0);
  s.starts = malloc(sizeof *s.starts * ((size_t)g->n + 1));
  if (!s.starts) return NULL;
  sig_graph(g, &s);
  if (s.oom) {
    free(s.starts);
    free(s.w);
    return NULL;
  }
  const cache_entry *best = NULL;
  size_t best_k = 0, best_agree = 0;
  for (int b = 0; b < NBUCKETS && !s.oom; b++)
    for (const cache_entry *e = buckets[b]; e; e = e->next) {
      /* node words only: the root words come last in both */
      size_t mine = sig_nodes_end(s.w, s.n), theirs = sig_nodes_end(e->sig, e->nsig);
      size_t m = mine < theirs ? mine : theirs, k = 1;
      while (k < m && e->sig[k] == s.w[k]) k++;
      if (k == m && mine == theirs) k = s.n; /* every node agrees: rank by the roots too */
      /* a tie (both differ at the first input: a new batch size) goes to the graph that agrees
       * in more words in all: the same program at another size, not another program */
      size_t agree = k;
      for (size_t q = k; q < m; q++) agree += e->sig[q] == s.w[q];
      if (!best || k > best_k || (k == best_k && agree > best_agree))
        best = e, best_k = k, best_agree = agree;
    }
  size_t nodes_end = sig_nodes_end(s.w, s.n);
  int i = g->n;
  if (best_k < nodes_end) {
    i = 0;
    while (i + 1 < g->n && s.starts[i + 1] <= best_k) i++;
  }
  *node = i;
  *was = *node < g->n ? s.starts[*node] : 0;
  free(s.starts);
  free(s.w);
  return best;
}

/* A cached graph's node record at word p: "op dtype[shape]"; a data leaf "dtype[shape]" (fields as sig_node writes them). */
static void reason_record(const cache_entry *e, size_t p, char *buf, size_t n) {
  size_t end = sig_nodes_end(e->sig, e->nsig);
  if (p + 2 > end) {
    snprintf(buf, n, "no node there (it has %u)", (unsigned)(e->nsig ? e->sig[0] >> 32 : 0));
    return;
  }
  uint64_t w = e->sig[p];
  int op = (int)(w & 0xffff), dt = (int)(w >> 16 & 0xff), nd = (int)(w >> 24 & 0xff);
  if (nd > GRAFT_MAX_DIMS) nd = GRAFT_MAX_DIMS;
  int64_t shape[GRAFT_MAX_DIMS] = {0};
  for (int k = 0; k < nd && p + 2 + (size_t)k < end; k++)
    shape[k] = (int64_t)e->sig[p + 2 + (size_t)k];
  char sh[128];
  snprintf(buf, n, "%s%s%s%s", op == IR_DATA ? "" : op < IR_OP_COUNT ? ir_ops[op].name : "?",
           op == IR_DATA ? "" : " ", graft_dtype_name((graft_dtype)dt),
           ir_shape_str(nd, shape, sh, sizeof sh));
}

/* The reason from the nearest cached graph by structure: its first differing node, where it
 * was traced, and what the cached graph has there. */
static void reason_structure(const graph_capture *g, char *buf, size_t n) {
  int i = 0;
  size_t was = 0;
  const cache_entry *e = reason_nearest(g, &i, &was);
  if (!e) {
    snprintf(buf, n, "no cached graph has this structure");
    return;
  }
  char at[420], now[200], then[200], sh[128];
  if (i >= g->n) {
    unsigned more = (unsigned)(e->nsig ? e->sig[0] >> 32 : 0);
    if (more > (unsigned)g->n)
      snprintf(buf, n, "its %d nodes are the first of cached graph %016" PRIx64 "'s %u", g->n,
               e->prog->hash, more);
    else
      snprintf(buf, n, "its nodes match cached graph %016" PRIx64 " but other tensors are its "
               "outputs", e->prog->hash);
    return;
  }
  const ir_node *nd = g->nodes[i];
  snprintf(now, sizeof now, "%s %s%s", ir_ops[nd->op].name, graft_dtype_name(nd->dtype),
           ir_shape_str(nd->ndim, nd->shape, sh, sizeof sh));
  reason_record(e, was, then, sizeof then);
  int param = -1;
  for (int k = 0; nd->op == IR_DATA && k < g->nparams && param < 0; k++)
    if (g->params[k] == nd) param = k;
  if (param >= 0) {
    snprintf(buf, n, "input %d%s is %s, where cached graph %016" PRIx64 " has %s", param,
             reason_at(g, i, at, sizeof at), now + strlen(ir_ops[IR_DATA].name) + 1,
             e->prog->hash, then);
    return;
  }
  snprintf(buf, n, "first differs from cached graph %016" PRIx64 " at node %d, %s%s; the cached "
           "graph has %s%s", e->prog->hash, i, now, reason_at(g, i, at, sizeof at), then,
           strcmp(now, then) ? "" : " (its attributes or operands differ)");
}

void cache_reason(const graph_capture *g, char *buf, size_t n) {
  int ncached = 0;
  for (cache_entry *e = buckets[g->hash % NBUCKETS]; e; e = e->next)
    if (e->prog->hash == g->hash) { /* a miss with this hash cached: a collision */
      snprintf(buf, n, "new graph %016" PRIx64 " (%d nodes): a cached graph of another "
               "structure has the same hash (a hash collision); compiled on its own",
               g->hash, g->n);
      return;
    }
  for (int b = 0; b < NBUCKETS && !ncached; b++) ncached = buckets[b] != NULL;
  size_t k = (size_t)snprintf(buf, n, "new graph %016" PRIx64 " (%d nodes, %d inputs): ",
                              g->hash, g->n, g->nparams);
  if (k >= n) return;
  if (!ncached) snprintf(buf + k, n - k, "cache empty");
  else reason_structure(g, buf + k, n - k);
}
