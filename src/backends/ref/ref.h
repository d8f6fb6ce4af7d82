/* Reference CPU kernels: plain loop nests, one per op, the oracle every other backend is
 * checked against. Private to the backends. */
#ifndef GRAFT_REF_H
#define GRAFT_REF_H
#include "backend.h"

typedef struct ref_view ref_view;

typedef struct {
  const void *data;
  graft_dtype dtype;
  int ndim;
  const int64_t *shape;
  int64_t numel;
  /* NULL: data is row-major. Else data is a view of another value's buffer (the first tier's
   * movement instructions run as views where every reader takes one). Only kernels that
   * declare they take views ever see one. */
  const ref_view *view;
} ref_arg;

/* Computes instruction ins (its op, attr, output dtype, ndim, shape, numel) from operands
 * in[0..ins->nin) into out (ins->numel elements of ins->dtype, already allocated, NOT zeroed).
 * Returns 0, or -1 after err_set(...) for a runtime failure. */
typedef int (*ref_fn)(const exec_instr *ins, const ref_arg *in, void *out);

/* One per op-table row except IR_DATA (NULL: data leaves are bound, not computed). */
extern const ref_fn ref_kernels[IR_OP_COUNT];

/* A faster kernel for an instruction, or NULL for the reference one. */
typedef ref_fn (*ref_pick_fn)(const exec_instr *ins, const ref_arg *in);
/* How an instruction runs as a view: no kernel, its slot shares its operand's buffer. Its
 * elements in row-major order are those of the walk (ndim, shape): element c of the walk at
 * offset + sum c[d] * strides[d]. The walk is the instruction's own shape, except for a
 * reshape of a view whose strides cannot say the new shape (a convolution's taps, slices of a
 * padded input, flattened): the walk stays the operand's (on = false: it runs). */
typedef struct {
  double fill;
  int64_t lo[GRAFT_MAX_DIMS], step[GRAFT_MAX_DIMS], src[GRAFT_MAX_DIMS];
  bool on_view; /* planned over its operand's view (whose buffer and offset it reads) */
} ref_padding;
struct ref_view {
  bool on;
  int ndim;
  int64_t offset;
  int64_t shape[GRAFT_MAX_DIMS];
  int64_t strides[GRAFT_MAX_DIMS];
  /* A pad's view (float data): the walk is the pad's output; element c is the fill unless every
   * c[d] - lo[d] >= 0 is a multiple of step[d] below step[d] * src[d] (src: the operand's
   * shape), then the operand's element (c[d] - lo[d]) / step[d], at offset + the sum of those
   * times strides[d]. NULL: no padding. */
  const ref_padding *pad;
};
/* A backend's plan for ref_run beyond its kernels (the first tier's, cpu_views.c and
 * cpu_groups.c): instructions that run as views; instructions computed inside a later one (a
 * fused group's root, which computes its members a chunk at a time from the group's leaves). */
typedef struct ref_plan ref_plan;
struct ref_plan {
  ref_view *views;   /* per instruction (on: a view, no kernel), or NULL */
  int *inside;       /* per instruction: the root that computes it, or -1; or NULL (none) */
  int *last_use;     /* per slot: the step of its last reader (a member reads at its root's) */
  int *nleaf;        /* per instruction: a root's number of leaves (0: not a root) */
  int **leaf;        /* per root: its leaves' slots (the operands of its members outside it) */
  /* runs root i into out, leaves[q] being leaf[i][q]'s value; 0, or -1 with the error set */
  int (*run_root)(const ref_plan *pl, const exec_program *p, int i, const ref_arg *leaves, void *out);
  void *ctx;         /* the backend's */
};
/* Interprets program p one instruction at a time (operands freed at their last use), each with
 * pick's kernel or the reference one, as plan says (NULL: every instruction runs itself); outs
 * receive new references. Returns 0 or -1 (error set). */
int ref_run(const exec_program *p, exec_buffer *const *params, exec_buffer **outs, ref_pick_fn pick,
            const ref_plan *plan);
/* The reference backend: ref_run with the reference kernels only. */
extern const backend ref_backend;
#endif
