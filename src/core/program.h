/* A captured graph lowered to a backend-neutral program: one instruction per node in
 * post-order, each writing its own slot. Programs hold no pointers into the IR, so a cached
 * program outlives the graph it was made from. Backends compile programs. */
#ifndef GRAFT_PROGRAM_H
#define GRAFT_PROGRAM_H
#include "ir.h"
#include "buffer.h"
#include <stdatomic.h>

typedef struct {
  ir_op op;
  graft_dtype dtype;
  int ndim;
  int64_t shape[GRAFT_MAX_DIMS];
  int64_t numel;
  ir_attrs attr;
  int nin;
  int *in;          /* operand slots */
  int last_use;     /* index of the last instruction reading this slot (-1: none) */
  bool is_output;
  uint32_t loc;     /* where its node was traced (loc.h; 0: unknown): not hashed, for pictures */
  uint32_t opname;  /* the framework op its node came from (loc.h; 0: unknown): not hashed */
} exec_instr;

typedef struct {
  uint64_t hash;        /* graph hash: node kinds, shapes, dtypes, attrs, operand wiring */
  uint64_t shape_free;  /* the same ignoring shapes and dtypes: finds the nearest graph */
  int ninstr;           /* == number of slots */
  exec_instr *instr;
  int nparams;
  int *param_slot;      /* DATA leaves in capture order */
  int noutputs;
  int *output_slot;
  int device;
  bool has_collective;  /* an instruction runs across processes (MPI): run in the syncing thread */
  /* Its structure was seen at other sizes (a batch or sequence length that varies): a backend
   * may build code that takes what varies as run-time values. Set once, before a build of it
   * reads it (the tier, under graft's lock). */
  atomic_bool varying;
} exec_program;
/* The executor donates an input's buffer to a run (it hands over the caller's sole reference:
 * the backend frees it at its last use) only from this size up: below it, pooled memory costs
 * less than the bookkeeping. */
#define EXEC_DONATE_MIN_BYTES 4096

/* Frees a program and its arrays (program.c); NULL is a no-op. */
void program_free(exec_program *p);
/* Whether ins computes nothing: its value is empty. A collective still runs (the other ranks
 * meet it there). */
static inline bool program_instr_empty(const exec_instr *ins) {
  return ins->numel == 0 && ir_ops[ins->op].kind != IR_K_COLLECTIVE;
}
/* A new buffer for instruction ins's value on p's device; out of memory names its op, shape,
 * dtype, device and size. */
exec_buffer *program_instr_buffer(const exec_program *p, const exec_instr *ins);

#endif
