/* C API: the collectives. Operands are grouped by dtype; each group becomes ONE collective node
 * whose result is the group's elements flattened and concatenated (so the executor makes one
 * MPI call per dtype), and each output is a slice of it reshaped back: movement ops, which the
 * compiler inlines as index arithmetic. */
#include "api.h"
#include <stdlib.h>
#include <string.h>

/* Output k of a collective node: the elements [off, off + numel) of its last dim, reshaped to
 * the operand's shape (all_gather: with the rank dim in front). A new reference or NULL. */
static ir_node *coll_piece(ir_node *flat, const ir_node *like, int64_t off) {
  ir_attrs at = {0};
  int nd = flat->ndim, last = nd - 1;
  for (int d = 0; d < nd; d++) {
    IR_ATTR_AT(at, SLICE, limit, d) = flat->shape[d];
    IR_ATTR_AT(at, SLICE, stride, d) = 1;
  }
  IR_ATTR_AT(at, SLICE, start, last) = off;
  IR_ATTR_AT(at, SLICE, limit, last) = off + like->numel;
  ir_node *s = ir_make(IR_SLICE, 1, &flat, &at, flat->dtype, 0, NULL);
  if (!s) return NULL;
  int64_t shape[GRAFT_MAX_DIMS + 1];
  int k = 0;
  if (flat->op == IR_ALL_GATHER) shape[k++] = flat->shape[0];
  if (k + like->ndim > GRAFT_MAX_DIMS) {
    ir_release(s);
    return err_set(GRAFT_ERR_SHAPE, "all_gather: a %d-d operand has no room for the rank dim "
                   "(at most %d dims)", like->ndim, GRAFT_MAX_DIMS);
  }
  memcpy(shape + k, like->shape, sizeof(int64_t) * (size_t)like->ndim);
  ir_node *r = ir_make(IR_RESHAPE, 1, &s, NULL, s->dtype, k + like->ndim, shape);
  ir_release(s);
  return r;
}

/* One collective over the inputs of dtype dt (their indices in idx[0..m)); outputs go to
 * nodes[idx[j]]. Returns 0 or -1 with the error set. */
static int coll_group(ir_op op, int64_t arg, ir_node **in, const int *idx, int m,
                      ir_node **nodes) {
  ir_node **ops = calloc((size_t)m, sizeof *ops);
  if (!ops) return err_set(GRAFT_ERR_OOM, "out of memory"), -1;
  for (int j = 0; j < m; j++) ops[j] = in[idx[j]];
  ir_attrs at = {.a[IR_ATTR_COLLECTIVE_arg] = arg};
  ir_node *flat = ir_make(op, m, ops, &at, in[idx[0]]->dtype, 0, NULL);
  free(ops);
  if (!flat) return -1;
  int64_t off = 0;
  int rc = 0;
  for (int j = 0; j < m && !rc; j++) {
    nodes[idx[j]] = coll_piece(flat, in[idx[j]], off);
    off += in[idx[j]]->numel;
    rc = nodes[idx[j]] ? 0 : -1;
  }
  ir_release(flat); /* the pieces hold it */
  return rc;
}

/* Builds every output node (lock held): one collective per dtype, in order of first use. */
static int coll_build(ir_op op, int64_t arg, ir_node **in, int n, ir_node **nodes) {
  int *idx = malloc(sizeof *idx * (size_t)n);
  if (!idx) return err_set(GRAFT_ERR_OOM, "out of memory"), -1;
  int rc = 0;
  for (int dt = 0; dt < GRAFT_NDTYPES && !rc; dt++) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (in[i]->dtype == (graft_dtype)dt) idx[m++] = i;
    if (m) rc = coll_group(op, arg, in, idx, m, nodes);
  }
  free(idx);
  return rc;
}

/* Wraps every node as a tensor before the pending limit may sync: a sync between two wraps
 * would run the collective, and the outputs not yet wrapped would run it again later. */
static void coll_wrap(ir_node **nodes, int n, graft_tensor **out) {
  for (int i = 0; i < n; i++) {
    metrics.m.nodes_traced++;
    out[i] = tensor_wrap(nodes[i]);
  }
  if (ir_pending_count() > tensor_max_pending()) {
    metrics.m.auto_syncs++;
    api_step_locked(); /* the outputs stay valid (pending) when it fails */
  }
}

static graft_status coll_api(const char *fn, ir_op op, int64_t arg, graft_tensor *const *ts,
                             int n, graft_tensor **out) {
  if (!ts || !out || n < 1)
    return err_set(GRAFT_ERR_ARG, "%s: needs n >= 1 tensors and an out array", fn),
           GRAFT_ERR_ARG;
  memset(out, 0, sizeof *out * (size_t)n);
  ir_node **in = calloc((size_t)n * 2, sizeof *in), **nodes = in + n;
  if (!in) return err_set(GRAFT_ERR_OOM, "%s: out of memory", fn), GRAFT_ERR_OOM;
  tensor_lock();
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) rc = (in[i] = api_in(ts[i], fn)) ? 0 : -1;
  if (!rc) rc = coll_build(op, arg, in, n, nodes);
  if (!rc) coll_wrap(nodes, n, out);
  else
    for (int i = 0; i < n; i++)
      if (nodes[i]) ir_release(nodes[i]);
  tensor_unlock();
  free(in);
  if (rc) err_rename(fn);
  return rc ? graft_last_status() : GRAFT_OK;
}

graft_status graft_dist_all_reduce(graft_tensor *const *in, int n, graft_reduce_op op,
                                   graft_tensor **out) {
  if ((unsigned)op > GRAFT_REDUCE_MIN)
    return err_set(GRAFT_ERR_ARG, "graft_dist_all_reduce: unknown reduction %d", (int)op),
           GRAFT_ERR_ARG;
  return coll_api("graft_dist_all_reduce", IR_ALL_REDUCE, op, in, n, out);
}

graft_status graft_dist_broadcast(graft_tensor *const *in, int n, int root, graft_tensor **out) {
  if (root < 0 || root >= graft_dist_world_size())
    return err_set(GRAFT_ERR_ARG, "graft_dist_broadcast: root %d is not a rank of this world "
                   "of %d", root, graft_dist_world_size()), GRAFT_ERR_ARG;
  return coll_api("graft_dist_broadcast", IR_RANK_BROADCAST, root, in, n, out);
}

graft_status graft_dist_all_gather(graft_tensor *const *in, int n, graft_tensor **out) {
  return coll_api("graft_dist_all_gather", IR_ALL_GATHER, graft_dist_world_size(), in, n, out);
}
