/* Code generator state shared by cpu_expr.c (expressions) and cpu_codegen.c (kernels, entry). */
#ifndef GRAFT_CPU_CODEGEN_H
#define GRAFT_CPU_CODEGEN_H
#include "cpu_internal.h"

/* A position in an instruction's index space: coordinates and/or a linear index (strings of
 * C expressions over the enclosing loop variables). */
typedef struct {
  int nd;
  const int64_t *shape;
  const char *lin;
  const char *c[GRAFT_MAX_DIMS];
  int has_c;
} cpu_pos;

typedef struct {
  const char *key, *val;
  uint64_t hash;
} cpu_memo;

typedef struct {
  const exec_program *p;
  const fuse_plan *pl;
  cpu_arena ar;
  cpu_sb *body;         /* statements of the current loop body */
  int ntmp;
  size_t *step_end;     /* per entry step: where its text ends (releases go there) */
  /* The values of the current loop body by (instruction, position), without a cap (cpu_expr.c,
   * cpu_memo_*): memo[0..nmemo) in insertion order; rolling back is setting nmemo lower.
   * memo_slot indexes it by key hash (open addressing; a slot holds index + 1, 0 is empty). */
  cpu_memo *memo;
  int nmemo, memo_cap;
  int32_t *memo_slot;
  size_t memo_nslots, memo_used;
  int need_unravel;     /* a coordinate was recovered from a linear index (div/mod) */
  int self;             /* the root being computed (not loaded) */
  unsigned char *reads; /* slots loaded by the kernel being generated */
  unsigned char *member;/* slots produced earlier in the current row group */
  int gouter;           /* outer (row) dims of the current group */
  const int64_t *oshape;
  int violation;        /* a group member read another member's output off its row */
  int failed;
  char fail_what[128];  /* the first instruction it has no code for (the compile error names it) */
  /* Row groups: an expensive inlined value that several members compute at the same row
   * position (softmax's exp) is kept in a per-row scratch rc<i>[] by the first member that
   * computes it, and loaded by the later ones. */
  unsigned char *rc_state; /* 0 no; 1 cached, not yet computed in this row; 2 stored; 3 stored
                              by the member being generated */
  int *rc_count;           /* planning: evaluations at the row position (one per member) */
  int *cost;               /* rough per-element cost of an inlined value (its subtree) */
  int ond;                 /* dims of the group's row space (oshape) */
  int stream;              /* member whose rows go out through a scratch row + streaming stores */
  /* Splitting a member's innermost loop i<L> into i<L>h * F + i<L>l, when a reshape reads it
   * by digits (merging attention's heads reads (i % 64) and (i / 64)): the inner loop's index
   * is then affine in i<L>l. A trial generation records the wanted F (0 none, -1 conflicting). */
  const char *split_var;   /* "i<L>" while generating a kernel member, else NULL */
  int64_t split_want, split_f;
  cpu_dedup dedup;         /* kernel definitions emitted so far (cpu_dedup.c) */
  int trial;               /* generating to measure, not to emit: nothing is recorded */
} cpu_cg;

const char *cpu_ctype(graft_dtype dt);
void cpu_pos_coords(cpu_cg *g, cpu_pos *pos);
const char *cpu_pos_lin(cpu_cg *g, cpu_pos *pos);
const char *cpu_value(cpu_cg *g, int i, cpu_pos pos);
void cpu_memo_free(cpu_cg *g);
/* The position of element (i<a>..i<ond-1>) within a row of the group, as a C expression. */
const char *cpu_row_inner(cpu_cg *g);
int64_t cpu_row_len(const cpu_cg *g);
#endif
