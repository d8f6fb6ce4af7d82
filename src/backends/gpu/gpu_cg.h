/* Renderer state shared by the GPU renderer's files (kernels, row groups, special kernels);
 * values at positions are the shared layer's (render/rd_value.c). */
#ifndef GRAFT_GPU_CG_H
#define GRAFT_GPU_CG_H
#include "gpu_render.h"
#include "../render/rd_gen.h"

typedef struct {
  rd_gen r;              /* first: the shared state (positions, memo, body) */
  const gpu_dialect *d;
  const gpu_caps *caps;
  /* A row group being rendered (gpu_row.c): the slots its kernel writes (NULL outside one), the
   * rows and their length; vfail: the value asked for has no vector form here. */
  unsigned char *member;
  int64_t rows, rlen;
  bool vfail;
  unsigned char *safe; /* gpu_row.c's answers per (slot, row): 0 unknown, 1 safe, 2 not */
  /* gpu_row.c's row scratch: the lanes of inlined value vc, stored in member vc_buf's output
   * row by the member that computes them first and loaded by the members after it up to vc_buf
   * (which overwrites them); vc_state: 0 off, 1 store when computed, 2 stored by this member,
   * 3 load. cur: the member being rendered. use_first/use_last (a render that counts, else
   * NULL): the first and last member that computes each value's lanes in its row, -1 none. */
  int vc, vc_buf, vc_state, cur;
  int *use_first, *use_last;
  const char *rowlin; /* "gid * <rlen> + e": element e of this work-item's row */
} gpu_cg;

/* ---- gpu_kernel.c: pieces the kernels share ---- */
/* Work-group size and launch for n outputs; *guard: gid may pass n (check it). */
void gpu_launch_shape(int64_t n, gpu_step *st, bool *guard);
void gpu_kernel_index(gpu_cg *g, rd_sb *out, int64_t n, bool guard);
/* Ends a kernel: with n > 0 the index of a work-item per output (launch sized in st), then the
 * body (freed) and the closing brace. */
void gpu_kernel_close(gpu_cg *g, rd_sb *out, rd_sb *body, int64_t n, gpu_step *st);
/* Writes kernel k<kernel>'s signature: output slot s, then the slots in g->reads. */
void gpu_signature(gpu_cg *g, rd_sb *out, int s, int kernel, gpu_step *st);
void gpu_scope_begin(gpu_cg *g, rd_sb *body);

/* ---- gpu_row.c: the vector row form of CPU-type devices ---- */
/* Renders the row group that starts at reduction s (kernel k<kernel>) and marks the slots it
 * writes in done; false (nothing rendered) when s has no row form. */
bool gpu_kernel_rows(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st, unsigned char *done);

/* ---- gpu_special.c: conv2d, reduce_window, gather as kernels over whole operands ---- */
bool gpu_special_supported(const exec_program *p, int i);
void gpu_kernel_special(gpu_cg *g, int s, int kernel, rd_sb *out, gpu_step *st);
#endif
