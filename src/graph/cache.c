/* The in-memory compile cache: graph hash -> program and its backend executable; and the
 * reason a graph is compiled, found by comparing with the nearest cached graph. */
#include "graph.h"
#include "../core/error.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 1024
static cache_entry *buckets[NBUCKETS];

cache_entry *cache_lookup(uint64_t hash) {
  for (cache_entry *e = buckets[hash % NBUCKETS]; e; e = e->next)
    if (e->prog->hash == hash) return e;
  return NULL;
}

cache_entry *cache_insert(exec_program *prog, const backend *be, void *exe) {
  cache_entry *e = calloc(1, sizeof *e);
  if (!e) return err_set(GRAFT_ERR_OOM, "out of memory adding a graph to the cache");
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
      program_free(e->prog);
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
