/* Tensor handles. A graft_tensor * given to the user is not an address but a token: a slot index
 * and the generation the slot had when the tensor was made. Every entry point decodes it
 * (tensor_check); a released tensor's slot gets a new generation when reused, so a stale handle,
 * or one kept past graft_shutdown, reads as released instead of acting on another tensor. A slot
 * is reference-counted and always holds one IR node (a pending node, or a data leaf once
 * materialized). */
#ifndef GRAFT_TENSOR_H
#define GRAFT_TENSOR_H
#include "ir.h"

typedef struct tensor_slot {
  uint32_t gen;   /* generation of the tensor in this slot; 0 while free */
  uint32_t index; /* position in the slot table, from 1 */
  int refcnt;
  ir_node *node;
  struct tensor_slot *prev, *next; /* live list (for graft_step), or the free list */
} tensor_slot;

/* The one lock that guards tracing, graphs and the caches (a lock per device later). */
void tensor_lock(void);
void tensor_unlock(void);
/* Takes the lock if no other thread holds it; false otherwise. */
bool tensor_trylock(void);

/* Decodes a handle (lock held); sets the error (naming fn) and returns NULL if it is NULL,
 * released, or not a graft tensor. */
tensor_slot *tensor_check(const graft_tensor *h, const char *fn);
/* The handle of a live slot. */
graft_tensor *tensor_handle(const tensor_slot *s);
/* Wraps node in a new tensor (takes the node reference); registers it with the current scope.
 * Lock held. Releases the node and returns NULL on failure. */
graft_tensor *tensor_wrap(ir_node *node);
/* Replaces s's node (takes the new reference, drops the old). */
void tensor_set_node(tensor_slot *s, ir_node *node);
/* Calls fn on every live tensor (under the lock). */
void tensor_foreach_live(void (*fn)(tensor_slot *, void *), void *ctx);
int64_t tensor_live_count(void);
/* Pending nodes past which the next op syncs everything. */
int64_t tensor_max_pending(void);
/* graft_shutdown: frees every tensor and the slot table; old handles read as released. */
void tensor_free_all(void);
#endif
