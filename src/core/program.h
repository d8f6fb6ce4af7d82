/* A captured graph lowered to a backend-neutral program: one instruction per node in
 * post-order, each writing its own slot. Programs hold no pointers into the IR, so a cached
 * program outlives the graph it was made from. Backends compile programs. */
#ifndef GRAFT_PROGRAM_H
#define GRAFT_PROGRAM_H
#include "ir.h"
#include "buffer.h"

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
} exec_program;

void program_free(exec_program *p);

/* Counters a backend keeps, read into graft's metrics. */
typedef struct {
  uint64_t compiles;                 /* native compiler runs that succeeded */
  uint64_t disk_hits;                /* executables loaded from the disk cache */
  uint64_t disk_refused;             /* compiles that could not use the disk cache folder */
  uint64_t fallbacks[IR_OP_COUNT];   /* per op: instructions run on the reference kernels */
} backend_stats;

/* A backend: what it supports, how it compiles a program and runs the result. */
typedef struct backend {
  const char *name;
  bool (*supports)(const exec_instr *ins);
  /* Returns an executable or NULL with the error set. */
  void *(*compile)(const exec_program *p);
  /* params[i] binds p->param_slot[i]; outs[i] receives a new reference for output i. */
  int (*execute)(void *exe, const exec_program *p, exec_buffer *const *params, exec_buffer **outs);
  void (*free_exe)(void *exe);
  void (*stats)(backend_stats *out); /* optional */
  void (*shutdown)(void);            /* optional: stop threads, drop caches */
  /* Optional (GRAFT_CHECK reports): writes into buf which code of exe computed slot (a
   * generated kernel and what it inlines, a BLAS call, a host or reference kernel); when source
   * is not NULL, stores there the generated source (malloc'd) or NULL when there is none. It
   * may set the thread's error; the caller restores it. */
  void (*explain)(void *exe, const exec_program *p, int slot, char *buf, size_t n, char **source);
} backend;

extern const backend ref_backend;
#endif
