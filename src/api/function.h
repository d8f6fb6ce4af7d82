/* A function's record (function.c), shared with its file form (function_file.c). */
#ifndef GRAFT_API_FUNCTION_H
#define GRAFT_API_FUNCTION_H
#include "api.h"

enum { FN_NAME_MAX = 4096 }; /* bytes of an output's name */

typedef enum { FN_OP, FN_PARAM, FN_CONST, FN_SEED } fn_kind;

typedef struct {
  fn_kind kind;
  int param;     /* FN_PARAM: the input's index */
  ir_node *leaf; /* FN_CONST: the data leaf (a reference) */
  ir_op op;
  graft_dtype dtype;
  int ndim, device;
  int64_t shape[GRAFT_MAX_DIMS];
  ir_attrs attr;
  uint32_t loc;
  int nin, in0; /* operands: the tape indices fn->operand[in0 .. in0 + nin) */
} fn_entry;

struct graft_function {
  int nin, nout, n, noperand;
  fn_entry *tape;
  int *operand;
  int *out;          /* per output: its tape index */
  int *same;         /* per input: the first input that was the same tensor (itself if none) */
  int *order;        /* tape indices in the order the traced nodes were made: a call makes its
                      * nodes in that order, so a sync walks its roots as the trace's (exec.c) */
  fn_entry *in_sig;  /* per input: dtype, shape, device (as a leaf's fields) */
  char **out_name;   /* per output: its name (graft_function_set_output_name), or NULL */
};

/* Frees f and drops its constants (the lock held). */
void fn_free(graft_function *f);
/* Puts f's nodes in an order to make them in: each after its operands, taken as early as
 * f->order (the traced creation order) allows; -1 out of memory. */
int fn_topo_order(graft_function *f);
#endif
