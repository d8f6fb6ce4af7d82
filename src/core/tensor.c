/* Tensor handles, the live list, scopes and the global lock. */
#include "tensor.h"
#include "error.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t tensor_mu = PTHREAD_MUTEX_INITIALIZER;
void graft_lock(void) { pthread_mutex_lock(&tensor_mu); }
void graft_unlock(void) { pthread_mutex_unlock(&tensor_mu); }

/* Pool: chunks of handles, never freed before graft_shutdown. Released handles wait in a FIFO
 * quarantine so a stale pointer keeps reading TENSOR_DEAD for a long while. */
#define CHUNK 256
#define QUARANTINE 4096
typedef struct chunk {
  struct chunk *next;
  graft_tensor t[CHUNK];
} chunk;
static chunk *chunks;
static int chunk_used = CHUNK;
static graft_tensor *freeq_head, *freeq_tail;
static int64_t freeq_len;
static graft_tensor live_head = {.next = &live_head, .prev = &live_head};
static int64_t live_count;
static int64_t max_pending = 100000;

static graft_tensor *tensor_alloc(void) {
  graft_tensor *t;
  if (freeq_len > QUARANTINE) {
    t = freeq_head;
    freeq_head = t->next;
    if (!freeq_head) freeq_tail = NULL;
    freeq_len--;
  } else {
    if (chunk_used == CHUNK) {
      chunk *c = calloc(1, sizeof *c);
      if (!c) return err_set(GRAFT_ERR_OOM, "out of memory allocating a tensor handle");
      c->next = chunks;
      chunks = c;
      chunk_used = 0;
    }
    t = &chunks->t[chunk_used++];
  }
  memset(t, 0, sizeof *t);
  return t;
}

graft_tensor *tensor_check(const graft_tensor *t, const char *fn) {
  if (!t) {
    if (!err_pending()) err_set(GRAFT_ERR_NULL, "%s: tensor argument is NULL", fn);
    return NULL;
  }
  if (t->magic == TENSOR_DEAD)
    return err_set(GRAFT_ERR_RELEASED, "%s: tensor %p was already released", fn, (void *)t);
  if (t->magic != TENSOR_MAGIC)
    return err_set(GRAFT_ERR_ARG, "%s: %p is not a graft tensor", fn, (void *)t);
  return (graft_tensor *)t;
}

/* ---- scopes (per thread) ---- */
typedef struct scope {
  struct scope *up;
  graft_tensor **owned;
  size_t n, cap;
} scope;
static _Thread_local scope *scope_top;

static void scope_add(graft_tensor *t) {
  scope *s = scope_top;
  if (!s) return;
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    graft_tensor **o = realloc(s->owned, cap * sizeof *o);
    if (!o) abort(); /* the scope could not honour its promise to free t */
    s->owned = o;
    s->cap = cap;
  }
  s->owned[s->n++] = t;
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
  for (size_t i = 0; i < s->n; i++)
    if (s->owned[i]) graft_release(s->owned[i]);
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
      scope_add(t);
      scope_top = s;
      return t;
    }
  return t;
}

/* ---- handles ---- */
graft_tensor *tensor_wrap(ir_node *node) {
  if (!node) return NULL;
  graft_tensor *t = tensor_alloc();
  if (!t) {
    ir_release(node);
    return NULL;
  }
  t->magic = TENSOR_MAGIC;
  t->refcnt = 1;
  t->node = node;
  t->next = live_head.next;
  t->prev = &live_head;
  live_head.next->prev = t;
  live_head.next = t;
  live_count++;
  scope_add(t);
  return t;
}

void tensor_set_node(graft_tensor *t, ir_node *node) {
  ir_node *old = t->node;
  t->node = node;
  ir_release(old);
}

graft_tensor *graft_retain(graft_tensor *t) {
  graft_lock();
  graft_tensor *r = tensor_check(t, "graft_retain");
  if (r) r->refcnt++;
  graft_unlock();
  return r;
}

void graft_release(graft_tensor *t) {
  if (!t) return;
  graft_lock();
  if (tensor_check(t, "graft_release") && --t->refcnt == 0) {
    t->prev->next = t->next;
    t->next->prev = t->prev;
    live_count--;
    ir_release(t->node);
    t->node = NULL;
    t->magic = TENSOR_DEAD;
    t->next = NULL;
    if (freeq_tail) freeq_tail->next = t;
    else freeq_head = t;
    freeq_tail = t;
    freeq_len++;
  }
  graft_unlock();
}

void tensor_foreach_live(void (*fn)(graft_tensor *, void *), void *ctx) {
  for (graft_tensor *t = live_head.next; t != &live_head; t = t->next) fn(t, ctx);
}

int64_t tensor_live_count(void) { return live_count; }
int64_t tensor_max_pending(void) { return max_pending; }
void graft_set_max_pending_nodes(int64_t n) {
  graft_lock();
  max_pending = n > 0 ? n : 1;
  graft_unlock();
}

void tensor_free_all(void) {
  while (live_head.next != &live_head) {
    graft_tensor *t = live_head.next;
    t->prev->next = t->next;
    t->next->prev = t->prev;
    ir_release(t->node);
    t->magic = TENSOR_DEAD;
  }
  live_count = 0;
  while (chunks) {
    chunk *c = chunks;
    chunks = c->next;
    free(c);
  }
  chunk_used = CHUNK;
  freeq_head = freeq_tail = NULL;
  freeq_len = 0;
  while (scope_top) {
    scope *s = scope_top;
    scope_top = s->up;
    free(s->owned);
    free(s);
  }
}
