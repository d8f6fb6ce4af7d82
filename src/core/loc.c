/* Source locations (loc.h). The table maps (file pointer, line) to an id: callers pass strings
 * that stay valid and unchanged (__FILE__, or the bridge's interned file names), so the first
 * sight of a pair copies its text and later ones are a pointer compare. It has its own lock:
 * graft_set_location runs outside graft's global lock, on any thread. */
#include "loc.h"
#include "graft.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOC_MAX 65536 /* distinct locations kept; later ones are unknown (0) */
#define LOC_BUCKETS 4096

typedef struct {
  const char *key; /* the caller's pointer */
  int line;
  char *text;      /* "file:line" */
  uint64_t recompiles;
  uint32_t next;   /* hash chain (ids; 0 ends) */
} loc_entry;

static pthread_mutex_t loc_mu = PTHREAD_MUTEX_INITIALIZER;
static loc_entry *loc_tab;  /* [0] unused: id 0 is "unknown" */
static uint32_t loc_n = 1, loc_cap;
static uint32_t loc_bucket[LOC_BUCKETS];
static unsigned loc_gen = 1; /* bumped by loc_free_all: ids a thread kept are stale */
static _Thread_local uint32_t loc_cur;
static _Thread_local unsigned loc_cur_gen;
/* the last pair this thread set: the ops one line makes come in runs */
static _Thread_local const char *loc_last_key;
static _Thread_local int loc_last_line;
static _Thread_local uint32_t loc_last_id;
static _Thread_local unsigned loc_last_gen;

uint32_t loc_current(void) {
  return loc_cur_gen == __atomic_load_n(&loc_gen, __ATOMIC_RELAXED) ? loc_cur : 0;
}

static uint32_t loc_hash(const char *key, int line) {
  uint64_t h = (uint64_t)(uintptr_t)key * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uint32_t)line * 0xbf58476d1ce4e5b9ull;
  return (uint32_t)(h >> 40) % LOC_BUCKETS;
}

/* Under loc_mu. */
static uint32_t loc_intern(const char *key, int line) {
  uint32_t b = loc_hash(key, line);
  for (uint32_t i = loc_bucket[b]; i; i = loc_tab[i].next)
    if (loc_tab[i].key == key && loc_tab[i].line == line) return i;
  if (loc_n >= LOC_MAX) return 0;
  if (loc_n >= loc_cap) {
    uint32_t c = loc_cap ? loc_cap * 2 : 256;
    loc_entry *t = realloc(loc_tab, sizeof *t * c);
    if (!t) return 0;
    loc_tab = t;
    loc_cap = c;
  }
  size_t len = strlen(key) + 16;
  char *text = malloc(len);
  if (!text) return 0;
  snprintf(text, len, "%s:%d", key, line);
  loc_tab[loc_n] = (loc_entry){key, line, text, 0, loc_bucket[b]};
  loc_bucket[b] = loc_n;
  return loc_n++;
}

void graft_set_location(const char *file, int line) {
  if (!file) {
    loc_cur = 0;
    return;
  }
  unsigned gen = __atomic_load_n(&loc_gen, __ATOMIC_RELAXED);
  if (file == loc_last_key && line == loc_last_line && loc_last_gen == gen) {
    loc_cur = loc_last_id;
    loc_cur_gen = gen;
    return;
  }
  pthread_mutex_lock(&loc_mu);
  uint32_t id = loc_intern(file, line);
  gen = loc_gen;
  pthread_mutex_unlock(&loc_mu);
  loc_last_key = file;
  loc_last_line = line;
  loc_last_gen = loc_cur_gen = gen;
  loc_last_id = loc_cur = id;
}

const char *loc_str(uint32_t id, char *buf, size_t n) {
  if (n) buf[0] = 0;
  pthread_mutex_lock(&loc_mu);
  if (id && id < loc_n) snprintf(buf, n, "%s", loc_tab[id].text);
  pthread_mutex_unlock(&loc_mu);
  return buf;
}

void loc_count_recompile(uint32_t id) {
  pthread_mutex_lock(&loc_mu);
  if (id && id < loc_n) loc_tab[id].recompiles++;
  pthread_mutex_unlock(&loc_mu);
}

void loc_reset_counts(void) {
  pthread_mutex_lock(&loc_mu);
  for (uint32_t i = 1; i < loc_n; i++) loc_tab[i].recompiles = 0;
  pthread_mutex_unlock(&loc_mu);
}

size_t loc_top(char *buf, size_t n, int k) {
  size_t w = 0;
  if (n) buf[0] = 0;
  pthread_mutex_lock(&loc_mu);
  uint64_t below = UINT64_MAX; /* counts listed so far are >= below; ties listed together */
  for (int listed = 0; listed < k;) {
    uint64_t best = 0;
    for (uint32_t i = 1; i < loc_n; i++)
      if (loc_tab[i].recompiles < below && loc_tab[i].recompiles > best) best = loc_tab[i].recompiles;
    if (!best) break;
    for (uint32_t i = 1; i < loc_n && listed < k; i++)
      if (loc_tab[i].recompiles == best && w < n) {
        w += (size_t)snprintf(buf + w, n - w, "%s%s (%llu)", listed ? ", " : "", loc_tab[i].text,
                              (unsigned long long)best);
        listed++;
      }
    below = best;
  }
  pthread_mutex_unlock(&loc_mu);
  return w < n ? w : n;
}

void loc_free_all(void) {
  pthread_mutex_lock(&loc_mu);
  for (uint32_t i = 1; i < loc_n; i++) free(loc_tab[i].text);
  free(loc_tab);
  loc_tab = NULL;
  loc_n = 1;
  loc_cap = 0;
  memset(loc_bucket, 0, sizeof loc_bucket);
  __atomic_store_n(&loc_gen, loc_gen + 1, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&loc_mu);
}
