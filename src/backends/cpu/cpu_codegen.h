/* Code generator state shared by cpu_codegen.c (kernels, entry), cpu_expr.c (its hooks into the
 * shared values at positions, render/rd_value.c) and cpu_aff.c (merged loop dims). */
#ifndef GRAFT_CPU_CODEGEN_H
#define GRAFT_CPU_CODEGEN_H
#include "cpu_internal.h"
#include "../render/rd_gen.h"

/* An affine form over a kernel's root loop variables: b + sum_r a[r] * i<r> (cpu_aff.c). A
 * position's affine form (lin: c[0] is the flat index; else one form per coordinate) is
 * tracked while loop dims may be merged. */
typedef struct {
  int64_t a[GRAFT_MAX_DIMS], b;
} cpu_aff;
typedef struct {
  int lin;
  cpu_aff c[GRAFT_MAX_DIMS];
} cpu_apos;

typedef struct {
  rd_gen r;             /* first: the shared state (positions, memo, body); hooks cast back */
  size_t *step_end;     /* per instruction step: the code's step count at its end (releases
                           go there) */
  cpu_code *code;       /* what is generated */
  int *body_kid;        /* per distinct body: the first kernel that had it (the rendering's name) */
  int cur_body, cur_slot0, cur_nslot; /* the kernel just generated: body and buffers */
  unsigned char *member;/* slots produced earlier in the current row group */
  int gouter;           /* outer (row) dims of the current group */
  const int64_t *oshape;
  int violation;        /* a group member read another member's output off its row */
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
  /* Merging loop dims (cpu_aff.c): while aff_on, positions carry exact affine forms over the
   * root's dims (aff_n: their sizes); a trial (aff_emit 0) records in aff_bad bit j that some
   * load's stride of candidate dim aff_cand[j] is not that of aff_cand[j+1] times its size, and
   * aff_fail that something reads coordinates otherwise (pad, concat, iota, an unravel that is
   * not exact). Emitting (aff_emit 1), the dims in aff_gone are folded into dim aff_inner,
   * whose loop runs over their product; loads index by the affine form. */
  int aff_on, aff_emit, aff_fail, aff_nv, aff_ncand, aff_inner;
  int aff_cand[GRAFT_MAX_DIMS];
  int64_t aff_n[GRAFT_MAX_DIMS];
  unsigned aff_bad, aff_gone;
  int kmerge_from;         /* a lone row kernel: first dim of its merged trailing dims, or -1 */
  int row_vars;            /* while a kernel member's element loop is generated: its row dims
                              (i0..i<row_vars-1> fixed for a row), else 0 */
  rd_sb *row_pre;         /* meanwhile: statements that run once per row, before its loops */
  size_t footprint;        /* bytes of the program's buffers: parameters and materialized values */
} cpu_cg;

const char *cpu_ctype(graft_dtype dt);
/* Sets up g->r for CPU C: the dialect, indent, index type and the hooks of cpu_expr.c (loads
 * that check row groups and index by affine forms, reshapes by digit groups, concats picked per
 * row, the row scratch). */
void cpu_expr_init(cpu_cg *g);
/* The position of element (i<a>..i<ond-1>) within a row of the group, as a C expression. */
const char *cpu_row_inner(cpu_cg *g);
int64_t cpu_row_len(const cpu_cg *g);

/* ---- cpu_aff.c: merging loop dims whose strides compose in every load ---- */
const cpu_apos *cpu_aff_root(cpu_cg *g, int nd);
/* The operand's affine position under movement op ins (broadcast, reshape, transpose, slice);
 * NULL (and aff_fail) when it is not exactly affine. */
const cpu_apos *cpu_aff_move(cpu_cg *g, const exec_instr *ins, const exec_instr *x,
                             const cpu_apos *ap);
/* A load of a buffer of shape (nd, shape) at ap: checks the candidates (trial) or returns the
 * index expression (emitting; NULL in a trial). */
const char *cpu_aff_load(cpu_cg *g, const cpu_apos *ap, int nd, const int64_t *shape);
const char *cpu_aff_key(cpu_cg *g, const cpu_apos *ap, int nd);
/* Runs a trial of value v at the root (dims nd, shape) with candidates cand[0..nc) (loop order,
 * innermost last); returns how many trailing candidates merge (0 or >= 2) and sets the emitting
 * state for them (cpu_aff_end clears it). */
int cpu_aff_plan(cpu_cg *g, int v, int nd, const int64_t *shape, const int *cand, int nc);
void cpu_aff_end(cpu_cg *g);
#endif
