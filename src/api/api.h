/* Shared helpers of the C API front-end (src/api). Every helper runs with the lock held. */
#ifndef GRAFT_API_H
#define GRAFT_API_H
#include "../core/buffer.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include "../core/tensor.h"

/* Wraps a new node as a tensor, counts it, and syncs everything past the pending limit. */
graft_tensor *api_node(ir_node *n);
/* The tensor's node, or NULL with the error set (naming fn). */
ir_node *api_in(const graft_tensor *t, const char *fn);
/* n broadcast to (ndim, shape): a new reference (n itself retained when shapes match). */
ir_node *api_broadcast(ir_node *n, int ndim, const int64_t *shape);
/* Numpy broadcast of two shapes into out; -1 with the error set (naming fn) if incompatible. */
int api_broadcast_shape(const char *fn, const ir_node *a, const ir_node *b, int *nd, int64_t *out);
/* A 0-d data leaf holding value as dt: a graph parameter. */
ir_node *api_scalar_node(double value, graft_dtype dt, int device);
/* A random draw's seed: a 0-d i64 data leaf with the generator's next value (graft_manual_seed
 * restarts the sequence); NULL with the error set. */
ir_node *api_rng_seed(int device);
/* Normalizes axis into [0, ndim); -1 with GRAFT_ERR_AXIS set (naming fn) if out of range. */
int api_axis(const char *fn, int axis, int ndim);
/* Materializes every live tensor with pending IR. */
graft_status api_step_locked(void);
#endif
