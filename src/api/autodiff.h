/* Reverse-mode differentiation over the IR (graft_grad, graft_vjp): the driver (autodiff.c) walks
 * the pending graph behind an output and calls one vector-Jacobian rule per node
 * (autodiff_rules.c, one per row of ops.def marked VJP), on the public API, so gradients are
 * lazy tensors like any other: forward, backward and an optimizer's update trace into one
 * graph. */
#ifndef GRAFT_AUTODIFF_H
#define GRAFT_AUTODIFF_H
#include "graft.h"
#include "../core/ir.h"
#include <stdbool.h>

/* One node as its rule sees it: the op, its attributes, its value y and its operands' values. */
typedef struct {
  ir_op op;
  const ir_attrs *attr;
  graft_tensor *y;
  int nin;
  graft_tensor *const *in;
  const bool *need; /* need[i]: operand i's gradient is wanted (it reaches a wrt tensor) */
} ad_op;

/* Fills gin[i] (i < o->nin, NULL-initialized) with the gradient of operand i given g, the
 * gradient of y (y's shape and dtype), for each needed operand; NULL for an operand no gradient
 * reaches. Returns 0, or -1 with the error set. */
typedef int (*ad_rule)(const ad_op *o, graft_tensor *g, graft_tensor **gin);

/* ad_rules[op]: the rule of each op whose ops.def grad column is VJP, NULL otherwise. */
extern const ad_rule ad_rules[IR_OP_COUNT];
#endif
