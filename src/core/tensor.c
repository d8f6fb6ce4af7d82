/* Tensor handles (slot index + generation), the live list, scopes and the global lock. */
#include "tensor.h"
#include "error.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(uintptr_t) >= 8, "a handle packs a 32-bit index and a 32-bit generation");

static pthread_mutex_t tensor_mu = PTHREAD_MUTEX_INITIALIZER;
void tensor_lock(void) { pthread_mutex_lock(&tensor_mu); }
void tensor_unlock(void) { pthread_mutex_unlock(&tensor_mu); }
bool tensor_trylock(void) { return pthread_mutex_trylock(&tensor_mu) == 0; }

/* Slots live in chunks that never move while graft runs; the table of chunks is fixed-size so a
 * handle decodes with two loads. */
#define SLOT_CHUNK 256
#define SLOT_MAX_CHUNKS 65536 /* 16M tensors alive at once */
static tensor_slot *slot_chunks[SLOT_MAX_CHUNKS];
static uint32_t slot_used; /* slots handed out so far (indices 1..slot_used) */
static tensor_slot *slot_free;
/* Generations come from one counter that shutdown does not reset, so no handle made before a
 * shutdown matches a slot made after it. */
static uint32_t slot_gen;
static tensor_slot live_head = {.next = &live_head, .prev = &live_head};
static int64_t live_count;
static int64_t max_pending = 100000;

static uint32_t next_gen(void) {
  if (++slot_gen == 0) slot_gen = 1;
  return slot_gen;
}

static tensor_slot *slot_at(uint32_t index) {
  if (index == 0 || index > slot_used) return NULL;
  tensor_slot *c = slot_chunks[(index - 1) / SLOT_CHUNK];
  return c ? &c[(index - 1) % SLOT_CHUNK] : NULL;
}

static tensor_slot *slot_alloc(void) {
  tensor_slot *s = slot_free;
  if (s) {
    slot_free = s->next;
  } else {
    if (slot_used == (uint32_t)SLOT_MAX_CHUNKS * SLOT_CHUNK)
      return err_set(GRAFT_ERR_OOM, "too many live tensors (%u)", slot_used);
    uint32_t c = slot_used / SLOT_CHUNK;
    if (!slot_chunks[c] && !(slot_chunks[c] = calloc(SLOT_CHUNK, sizeof(tensor_slot))))
      return err_set(GRAFT_ERR_OOM, "out of memory allocating a tensor handle");
    s = &slot_chunks[c][slot_used % SLOT_CHUNK];
    s->index = ++slot_used;
  }
  uint32_t index = s->index;
  memset(s, 0, sizeof *s);
  s->index = index;
  s->gen = next_gen();
  return s;
}

graft_tensor *tensor_handle(const tensor_slot *s) {
  return (graft_tensor *)(uintptr_t)(((uint64_t)s->gen << 32) | s->index);
}

/* The slot a handle names while its tensor lives, else NULL (no error set). */
static tensor_slot *slot_live(const graft_tensor *h) {
  uint64_t v = (uint64_t)(uintptr_t)h;
  tensor_slot *s = slot_at((uint32_t)v);
  return s && s->gen && s->gen == (uint32_t)(v >> 32) ? s : NULL;
}

tensor_slot *tensor_check(const graft_tensor *h, const char *fn) {
  if (!h) {
    if (!err_pending()) err_set(GRAFT_ERR_NULL, "%s: tensor argument is NULL", fn);
    return NULL;
  }
  tensor_slot *s = slot_live(h);
  if (s) return s;
  uint64_t v = (uint64_t)(uintptr_t)h;
  if ((uint32_t)(v >> 32) == 0 || (uint32_t)(v >> 32) > slot_gen)
    return err_set(GRAFT_ERR_ARG, "%s: %p is not a graft tensor", fn, (void *)h);
  return err_set(GRAFT_ERR_RELEASED, "%s: tensor %p was already released", fn, (void *)h);
}

/* Drops one reference (lock held). */
static void slot_release(tensor_slot *s) {
  if (--s->refcnt) return;
  s->prev->next = s->next;
  s->next->prev = s->prev;
  live_count--;
  ir_release(s->node);
  s->node = NULL;
  s->gen = 0;
  s->prev = NULL;
  s->next = slot_free;
  slot_free = s;
}

/* ---- scopes (per thread): the handles made inside, released at the end ---- */
typedef struct scope {
  struct scope *up;
  graft_tensor **owned;
  size_t n, cap;
} scope;
static _Thread_local scope *scope_top;

/* Forgets handles the user already released, so a loop of create/release stays bounded. */
static void scope_compact(scope *s) {
  size_t k = 0;
  for (size_t i = 0; i < s->n; i++)
    if (s->owned[i] && slot_live(s->owned[i])) s->owned[k++] = s->owned[i];
  s->n = k;
}

static void scope_add(graft_tensor *h) {
  scope *s = scope_top;
  if (!s) return;
  if (s->n == s->cap) scope_compact(s);
  if (s->n == s->cap || s->n * 2 > s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    graft_tensor **o = realloc(s->owned, cap * sizeof *o);
    if (!o) abort(); /* the scope could not honour its promise to free h */
    s->owned = o;
    s->cap = cap;
  }
  s->owned[s->n++] = h;
}

void graft_scope_begin(void) {
  scope *s = calloc(1, sizeof *s);
  if (!s) {
    err_set(GRAFT_ERR_OOM, "graft_scope_begin: out of memory");
    return;
  }
  s->up = scope_top;
  scope_top = s;
}

void graft_scope_end(void) {
  scope *s = scope_top;
  if (!s) {
    err_set(GRAFT_ERR_ARG, "graft_scope_end: no open scope");
    return;
  }
  scope_top = s->up;
  tensor_lock();
  for (size_t i = 0; i < s->n; i++) {
    tensor_slot *t = s->owned[i] ? slot_live(s->owned[i]) : NULL;
    if (t) slot_release(t); /* a handle the user released already is no longer ours */
  }
  tensor_unlock();
  free(s->owned);
  free(s);
}

graft_tensor *graft_keep(graft_tensor *t) {
  scope *s = scope_top;
  if (!s || !t) return t;
  for (size_t i = s->n; i-- > 0;)
    if (s->owned[i] == t) {
      s->owned[i] = NULL;
      scope_top = s->up; /* hand the reference to the outer scope, if any */
      tensor_lock();
      scope_add(t);
      tensor_unlock();
      scope_top = s;
      return t;
    }
  return t;
}

/* ---- handles ---- */
graft_tensor *tensor_wrap(ir_node *node) {
  if (!node) return NULL;
  tensor_slot *s = slot_alloc();
  if (!s) {
    ir_release(node);
    return NULL;
  }
  s->refcnt = 1;
  s->node = node;
  s->next = live_head.next;
  s->prev = &live_head;
  live_head.next->prev = s;
  live_head.next = s;
  live_count++;
  graft_tensor *h = tensor_handle(s);
  scope_add(h);
  return h;
}

void tensor_set_node(tensor_slot *s, ir_node *node) {
  ir_node *old = s->node;
  s->node = node;
  ir_release(old);
}

graft_tensor *graft_retain(graft_tensor *t) {
  tensor_lock();
  tensor_slot *s = tensor_check(t, "graft_retain");
  if (s) s->refcnt++;
  tensor_unlock();
  return s ? t : NULL;
}

void graft_release(graft_tensor *t) {
  if (!t) return;
  tensor_lock();
  tensor_slot *s = tensor_check(t, "graft_release");
  if (s) slot_release(s);
  tensor_unlock();
}

void tensor_foreach_live(void (*fn)(tensor_slot *, void *), void *ctx) {
  for (tensor_slot *s = live_head.next; s != &live_head; s = s->next) fn(s, ctx);
}

int64_t tensor_live_count(void) { return live_count; }
int64_t tensor_max_pending(void) { return max_pending; }
void graft_set_max_pending_nodes(int64_t n) {
  tensor_lock();
  max_pending = n > 0 ? n : 1;
  tensor_unlock();
}

void tensor_free_all(void) {
  for (tensor_slot *s = live_head.next; s != &live_head; s = s->next) ir_release(s->node);
  live_head.next = live_head.prev = &live_head;
  live_count = 0;
  for (uint32_t c = 0; c < SLOT_MAX_CHUNKS && slot_chunks[c]; c++) {
    free(slot_chunks[c]);
    slot_chunks[c] = NULL;
  }
  slot_used = 0;
  slot_free = NULL;
  while (scope_top) { /* the calling thread's scopes; other threads' hold only stale handles */
    scope *s = scope_top;
    scope_top = s->up;
    free(s->owned);
    free(s);
  }
}
