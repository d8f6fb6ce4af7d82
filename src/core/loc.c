/* Source locations (loc.h). The table maps (file pointer, line) to an id: callers pass strings
 * that stay valid and unchanged (__FILE__, or the bridge's interned file names), so the first
 * sight of a pair copies its text and later ones are a pointer compare. Op names
 * (graft_set_op_name) share the table, as (name pointer, LOC_OP_LINE) whose text is the name.
 * It has its own lock: graft_set_location runs outside graft's global lock, on any thread. */
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
#define LOC_OP_LINE (-1) /* an op name's entry */

/* A thread's current id of one kind (a location, an op name) and the last pair it set: the
 * ops one line makes come in runs. */
typedef struct {
  uint32_t cur;
  unsigned cur_gen;
  const char *last_key;
  int last_line;
  uint32_t last_id;
  unsigned last_gen;
} loc_thread;
static _Thread_local loc_thread loc_here, loc_op_here;

static uint32_t loc_get(const loc_thread *t) {
  return t->cur_gen == __atomic_load_n(&loc_gen, __ATOMIC_RELAXED) ? t->cur : 0;
}
uint32_t loc_current(void) { return loc_get(&loc_here); }
uint32_t loc_op_current(void) { return loc_get(&loc_op_here); }

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
  if (line == LOC_OP_LINE) snprintf(text, len, "%s", key);
  else snprintf(text, len, "%s:%d", key, line);
  loc_tab[loc_n] = (loc_entry){key, line, text, 0, loc_bucket[b]};
  loc_bucket[b] = loc_n;
  return loc_n++;
}

static void loc_set(loc_thread *t, const char *key, int line) {
  if (!key) {
    t->cur = 0;
    return;
  }
  unsigned gen = __atomic_load_n(&loc_gen, __ATOMIC_RELAXED);
  if (key == t->last_key && line == t->last_line && t->last_gen == gen) {
    t->cur = t->last_id;
    t->cur_gen = gen;
    return;
  }
  pthread_mutex_lock(&loc_mu);
  uint32_t id = loc_intern(key, line);
  gen = loc_gen;
  pthread_mutex_unlock(&loc_mu);
  t->last_key = key;
  t->last_line = line;
  t->last_gen = t->cur_gen = gen;
  t->last_id = t->cur = id;
}

void graft_set_location(const char *file, int line) { loc_set(&loc_here, file, line); }
void graft_set_op_name(const char *name) { loc_set(&loc_op_here, name, LOC_OP_LINE); }

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
