/* The fusion plan (fusion.c), shared by the compiling backends: which instructions get a buffer
 * and which are inlined into their consumers' kernels. A backend says per instruction what it
 * can do (its classify callback); the plan decides the rest the same way for every backend. */
#ifndef GRAFT_FUSION_H
#define GRAFT_FUSION_H
#include "program.h"
#include <stdio.h>

/* Roles. INLINE: computed inside its consumers' loops (elementwise, movement: index arithmetic);
 * KERNEL: a kernel of its own writes it to a buffer; REDUCE: a reduction kernel; LIBRARY: a
 * library call (BLAS, CLBlast) reads whole buffers; FALLBACK: the reference kernel runs it;
 * PARAM: a bound input; DEAD: no output depends on it. */
enum { FUSE_INLINE = 0, FUSE_PARAM, FUSE_KERNEL, FUSE_REDUCE, FUSE_LIBRARY, FUSE_FALLBACK, FUSE_DEAD };
enum { FUSE_VIEW_TRANSPOSE = 1, FUSE_VIEW_RESHAPE = 2 };
typedef struct {
  int n;
  unsigned char *role; /* FUSE_* per instruction */
  int *nuse;           /* consumers per instruction */
  unsigned char *tview;/* FUSE_VIEW_* bits of an inlined value a library GEMM reads as a view of
                          a buffer (no copy): a transpose of the last two dims (BLAS's transpose
                          flag) and, under it, reshapes (the same bytes) */
} fuse_plan;
/* What a backend can do with live instruction i: FUSE_INLINE (it generates the op: kernels or
 * inlined), FUSE_REDUCE, FUSE_LIBRARY or FUSE_FALLBACK. */
typedef int (*fuse_classify_fn)(const exec_program *p, int i, void *ctx);
/* Plans p; 0, or -1 with the error set. */
int fuse_plan_build(const exec_program *p, fuse_classify_fn classify, void *ctx, fuse_plan *pl);
void fuse_plan_free(fuse_plan *pl);
/* The slot a library GEMM reads for its operand s, and whether it reads it transposed. */
int fuse_library_operand(const exec_program *p, const fuse_plan *pl, int s, int *trans);
/* Writes p as planned, in Graphviz's language (fusion_dot.c): one cluster per kernel
 * (kernel_of[s]: the number N of the kernel k<N> that writes slot s, -1 for none) holding the
 * values it writes and those inlined into it; library calls, fallbacks, inputs and outputs
 * marked; each node labelled with its slot, op, dtype and shape and the source line it was
 * traced at, and note[s] when note and it are not NULL (a backend's word: a donatable input).
 * title heads the picture. 0, or -1 when f could not be written. */
int fuse_plan_dot(FILE *f, const exec_program *p, const fuse_plan *pl, const int *kernel_of,
                  const char *const *note, const char *title);
#endif
