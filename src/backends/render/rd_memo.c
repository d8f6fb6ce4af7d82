/* The memo: a value per (instruction, position) of the current scope (rd_gen.h). Rolling back
 * (nmemo set lower: a new loop body, after a branch) leaves stale slots in the index; a slot
 * counts only when it points below nmemo at an entry with the same key, and lookups probe past
 * stale ones (slots are emptied only by a rebuild). */
#include "rd_gen.h"
#include <stdlib.h>
#include <string.h>

uint64_t rd_memo_hash(const char *s) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

const char *rd_memo_find(const rd_gen *g, const char *key, uint64_t h) {
  if (!g->memo_nslots) return NULL;
  size_t mask = g->memo_nslots - 1;
  for (size_t s = h & mask; g->memo_slot[s]; s = (s + 1) & mask) {
    int k = g->memo_slot[s] - 1;
    if (k < g->nmemo && g->memo[k].hash == h && !strcmp(g->memo[k].key, key)) return g->memo[k].val;
  }
  return NULL;
}

static void rd_memo_index(rd_gen *g, int k) {
  size_t mask = g->memo_nslots - 1, s = g->memo[k].hash & mask;
  while (g->memo_slot[s]) s = (s + 1) & mask;
  g->memo_slot[s] = k + 1;
  g->memo_used++;
}

/* The index at most half full: rebuilt over the live entries (stale slots dropped), larger
 * when they need it. */
static int rd_memo_reindex(rd_gen *g) {
  size_t n = 256;
  while (n < 4 * ((size_t)g->nmemo + 1)) n *= 2;
  int32_t *slot = calloc(n, sizeof *slot);
  if (!slot) return -1;
  free(g->memo_slot);
  g->memo_slot = slot;
  g->memo_nslots = n;
  g->memo_used = 0;
  for (int k = 0; k < g->nmemo; k++) rd_memo_index(g, k);
  return 0;
}

void rd_memo_put(rd_gen *g, const char *key, uint64_t h, const char *val) {
  if (g->nmemo == g->memo_cap) {
    int cap = g->memo_cap ? 2 * g->memo_cap : 256;
    rd_memo_entry *m = realloc(g->memo, sizeof *m * (size_t)cap);
    if (!m) goto oom;
    g->memo = m;
    g->memo_cap = cap;
  }
  if (2 * (g->memo_used + 1) > g->memo_nslots && rd_memo_reindex(g)) goto oom;
  g->memo[g->nmemo] = (rd_memo_entry){key, val, h};
  rd_memo_index(g, g->nmemo++);
  return;
oom: /* the compile fails and says why; the graph stays where it ran */
  rd_fail(g, "out of memory memoizing values");
}

void rd_memo_free(rd_gen *g) {
  free(g->memo);
  free(g->memo_slot);
  g->memo = NULL;
  g->memo_slot = NULL;
  g->nmemo = g->memo_cap = 0;
  g->memo_nslots = g->memo_used = 0;
}
