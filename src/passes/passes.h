/* Graph passes on a lowered program, run once per compile (never on the cached path):
 * algebraic simplification, constant folding, CSE and DCE. */
#ifndef GRAFT_PASSES_H
#define GRAFT_PASSES_H
#include "program.h"

typedef struct {
  int simplified; /* instructions replaced by an operand (x*1, reshape to the same shape, ...) */
  int folded;     /* instructions turned into constants */
  int cse;        /* instructions merged with an identical earlier one */
  int dead;       /* instructions removed as unused */
} passes_stats;

/* Rewrites p in place. Parameters keep their order; outputs keep their order, stay distinct
 * and never alias a parameter. Returns 0, or -1 with the error set (p is then unchanged). */
int passes_run(exec_program *p, passes_stats *st);
#endif
