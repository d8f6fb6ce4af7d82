/* Tensor handles: reference-counted, always holding one IR node (a pending node, or a data
 * leaf once materialized). Handles live in a pool that is never unmapped while graft runs,
 * so a released handle is detected (magic) rather than read after free. */
#ifndef GRAFT_TENSOR_H
#define GRAFT_TENSOR_H
#include "ir.h"

#define TENSOR_MAGIC 0x67726166u
#define TENSOR_DEAD 0xdeadbeefu

struct graft_tensor {
  uint32_t magic;
  int refcnt;
  ir_node *node;
  graft_tensor *prev, *next; /* live list (for graft_step) or free queue */
};

/* The one lock that guards tracing, graphs and the caches (a lock per device later). */
void graft_lock(void);
void graft_unlock(void);

/* Validates a handle; sets the error (naming fn) and returns NULL if it is NULL/released. */
graft_tensor *tensor_check(const graft_tensor *t, const char *fn);
/* Wraps node in a new handle (takes the node reference); registers it with the current scope.
 * Lock held. Releases the node and returns NULL on failure. */
graft_tensor *tensor_wrap(ir_node *node);
/* Replaces t's node (takes the new reference, drops the old). */
void tensor_set_node(graft_tensor *t, ir_node *node);
/* Calls fn on every live tensor (under the lock). */
void tensor_foreach_live(void (*fn)(graft_tensor *, void *), void *ctx);
int64_t tensor_live_count(void);
/* Pending nodes past which the next op syncs everything. */
int64_t tensor_max_pending(void);
void tensor_free_all(void);
#endif
