/* A kernel generator's shared state and its values at positions (rd_value.c, rd_memo.c), the
 * same for every C-like language: positions in an instruction's index space, the memo of values
 * per (instruction, position), movement ops as index arithmetic, pad and concat as branches,
 * elementwise math through the expression dialect. A generator (the CPU's C, the GPU renderer's
 * OpenCL C and CUDA C) embeds an rd_gen as its state's first member and supplies the loads and
 * whatever it renders differently through rd_hooks. Private to the backends. */
#ifndef GRAFT_RD_GEN_H
#define GRAFT_RD_GEN_H
#include "render.h"
#include "../../passes/fusion.h"

/* A position in an instruction's index space: coordinates and/or a linear index (strings of
 * expressions over the enclosing loop variables or work-item index). */
typedef struct {
  int nd;
  const int64_t *shape;
  const char *lin;
  const char *c[GRAFT_MAX_DIMS];
  int has_c;
  const void *ap; /* the generator's exact affine form of the position (the CPU's, while it
                     merges loop dims), else NULL */
} rd_pos;

typedef struct {
  const char *key, *val;
  uint64_t hash;
} rd_memo_entry;

typedef struct rd_gen rd_gen;

/* What a generator renders its own way; every hook but load may be NULL (the shared form). */
typedef struct {
  /* Materialized slot s's value at pos: a load (recorded in g->reads). */
  const char *(*load)(rd_gen *g, int s, rd_pos *pos);
  /* Instruction i's value when the memo lacks it, around rd_value_fresh (the CPU's row
   * scratch). */
  const char *(*fresh)(rd_gen *g, int i, rd_pos *pos);
  /* What tells two positions apart besides their strings ("" for nothing). */
  const char *(*key)(rd_gen *g, const rd_pos *pos);
  /* The operand's affine form for a movement op (before its coordinates are mapped). */
  const void *(*move)(rd_gen *g, const exec_instr *ins, const exec_instr *x, const rd_pos *pos);
  /* A reshape's operand coordinates from pos's when more than unit dims differ; false: the
   * operand is read at pos's linear index. */
  bool (*reshape)(rd_gen *g, const exec_instr *ins, const exec_instr *x, const rd_pos *pos,
                  rd_pos *q);
  /* A concat's value picked once per row, or NULL: the if/else chain. */
  const char *(*concat)(rd_gen *g, const exec_instr *ins, rd_pos *pos);
  /* Rendering read coordinates outside the loop's own (pad, concat, iota). */
  void (*coords_read)(rd_gen *g);
} rd_hooks;

struct rd_gen {
  const exec_program *p;
  const fuse_plan *pl;
  const rd_dialect *d;  /* how expressions are spelled */
  const rd_hooks *h;
  bool fp64;            /* doubles are fast on the device */
  const char *ind;      /* a statement's indent in the body */
  const char *itype;    /* the index type ("int64_t", "gi_t") */
  int64_t pad_branch_min; /* a pad's rows at least this long read the operand in a branch; shorter
                           ones clamp the index and select (CPU C: see rd_value.c) */
  rd_arena ar;
  rd_sb *body;          /* statements of the current loop body or kernel */
  int ntmp;
  int self;             /* the instruction being computed (not loaded) */
  unsigned char *reads; /* slots the kernel being generated loads */
  int branch;           /* depth of the conditional branches being rendered (pad, concat) */
  int need_unravel;     /* a coordinate was recovered from a linear index (div/mod) */
  /* The values of the current scope by (instruction, position), without a cap (rd_memo.c):
   * memo[0..nmemo) in insertion order; rolling back (a new scope, after a branch) is setting
   * nmemo lower. memo_slot indexes it by key hash (open addressing; a slot holds index + 1,
   * 0 is empty). */
  rd_memo_entry *memo;
  int nmemo, memo_cap;
  int32_t *memo_slot;
  size_t memo_nslots, memo_used;
  int failed;
  char fail_what[160];  /* why (the first reason wins; "" when out of memory) */
};

/* ---- rd_value.c ---- */
const char *rd_tmp(rd_gen *g);
/* Emits "const T name = expr;" and returns name. */
const char *rd_def(rd_gen *g, graft_dtype dt, const char *expr);
/* Records that the kernel cannot be generated (the first reason wins). */
void rd_fail(rd_gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rd_pos_coords(rd_gen *g, rd_pos *pos);
const char *rd_pos_lin(rd_gen *g, rd_pos *pos);
/* The operand position a broadcast, reshape, transpose or slice reads for output position pos. */
rd_pos rd_move_pos(rd_gen *g, const exec_instr *ins, const exec_instr *x, rd_pos *pos);
/* Instruction i's value at pos, memoized within the scope. */
const char *rd_value(rd_gen *g, int i, rd_pos pos);
/* Its value not found in the memo: a load (materialized) or the inlined expression. */
const char *rd_value_fresh(rd_gen *g, int i, rd_pos *pos);
/* The load of a materialized slot at linear index idx, as every language writes it. */
const char *rd_load_at(rd_gen *g, int s, const char *idx);
/* Part `part` of a concat along ax starting at off on the axis, at the concat's position pos,
 * assigned to t inside the branch the caller opened (its values scoped to the branch). */
void rd_concat_part(rd_gen *g, const rd_pos *pos, int nd, int ax, int part, int64_t off, const char *t);

/* ---- rd_memo.c ---- */
uint64_t rd_memo_hash(const char *s);
const char *rd_memo_find(const rd_gen *g, const char *key, uint64_t h);
void rd_memo_put(rd_gen *g, const char *key, uint64_t h, const char *val);
void rd_memo_free(rd_gen *g);
#endif
