/* The seam between collective instructions and the process group. Kernels (backends) run a
 * collective through coll_run; the process group (src/dist, above core) installs the hook at
 * graft_dist_init. Backends may not include the dist layer (layers point down), and graft must
 * run without MPI: with no hook installed the world is one process and a collective leaves its
 * buffer as it is (a sum, mean, max or min over one rank, a broadcast from rank 0 and a gather of
 * one row are all the identity). */
#ifndef GRAFT_COLL_H
#define GRAFT_COLL_H
#include "ir.h"

typedef struct {
  /* Runs collective op (IR_ALL_REDUCE/RANK_BROADCAST/ALL_GATHER, attr COLLECTIVE.arg) in place on buf:
   * count elements of dt (ALL_GATHER: world rows of count, this rank's row filled). sig is a
   * hash of the operands' shapes, checked across ranks first. 0, or -1 with the error set. */
  int (*run)(ir_op op, int64_t arg, graft_dtype dt, void *buf, int64_t count, uint64_t sig);
  int rank, world;
} coll_hooks;

/* Installs h (copied), or removes the hook when h is NULL. Called under no lock, before or
 * after graphs run, never during one. */
void coll_set_hooks(const coll_hooks *h);
/* This process's rank and the world size (0 and 1 without a hook). */
int coll_rank(void);
int coll_world(void);
/* Runs a collective through the hook; the identity without one. */
int coll_run(ir_op op, int64_t arg, graft_dtype dt, void *buf, int64_t count, uint64_t sig);
#endif
