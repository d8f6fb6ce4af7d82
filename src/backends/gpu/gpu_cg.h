/* Renderer state shared by gpu_expr.c (values at positions) and gpu_kernel.c (kernels). */
#ifndef GRAFT_GPU_CG_H
#define GRAFT_GPU_CG_H
#include "gpu_render.h"
#include "../cpu/cpu_internal.h" /* the code generators' string builder and arena (cpu_str.c) */

/* A position in an instruction's index space: coordinates and/or a linear index (strings of
 * kernel expressions). */
typedef struct {
  int nd;
  const int64_t *shape;
  const char *lin;
  const char *c[GRAFT_MAX_DIMS];
  int has_c;
} gpu_pos;

typedef struct {
  const char *key, *val;
} gpu_memo;

typedef struct {
  const exec_program *p;
  const fuse_plan *pl;
  const gpu_dialect *d;
  const gpu_caps *caps;
  cpu_arena ar;
  cpu_sb *body;          /* statements of the kernel being generated */
  int ntmp;
  int self;              /* the instruction being computed (not loaded) */
  unsigned char *reads;  /* slots the kernel loads */
  gpu_memo *memo;        /* values of the current scope by (instruction, position) */
  int nmemo, memo_cap;
  int failed;
  char fail_what[160];
} gpu_cg;

const char *gpu_ctype(graft_dtype dt);
const char *gpu_value(gpu_cg *g, int i, gpu_pos pos);
void gpu_pos_coords(gpu_cg *g, gpu_pos *pos);
const char *gpu_pos_lin(gpu_cg *g, gpu_pos *pos);
const char *gpu_tmp(gpu_cg *g);
/* Emits "const T name = expr;" and returns name. */
const char *gpu_def(gpu_cg *g, graft_dtype dt, const char *expr);
/* Records that the kernel cannot be generated (the first reason wins). */
void gpu_fail(gpu_cg *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
