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
} cpu_memo;
#define CPU_MAX_MEMO 4096

typedef struct {
  const exec_program *p;
  const cpu_plan *pl;
  cpu_arena ar;
  cpu_sb *body;         /* statements of the current loop body */
  int ntmp;
  cpu_memo memo[CPU_MAX_MEMO];
  int nmemo;
  int need_unravel;     /* a coordinate was recovered from a linear index (div/mod) */
  int self;             /* the root being computed (not loaded) */
  unsigned char *reads; /* slots loaded by the kernel being generated */
  unsigned char *member;/* slots produced earlier in the current row group */
  int gouter;           /* outer (row) dims of the current group */
  const int64_t *oshape;
  int violation;        /* a group member read another member's output off its row */
  int failed;
} cpu_cg;

const char *cpu_ctype(graft_dtype dt);
void cpu_pos_coords(cpu_cg *g, cpu_pos *pos);
const char *cpu_pos_lin(cpu_cg *g, cpu_pos *pos);
const char *cpu_value(cpu_cg *g, int i, cpu_pos pos);
#endif
