/* The GPU kernel renderer: one renderer for every GPU backend, a dialect per language (OpenCL C
 * here; CUDA C differs only in the dialect's strings). From the fusion plan (src/passes/fusion.h)
 * each materialized instruction becomes one kernel: work-items over output elements, inlined
 * elementwise math, movement ops as index arithmetic; reductions loop over the reduced dims in
 * one work-item per output, or a work-group per output with a tree in local memory when few
 * outputs each reduce many elements. On a CPU-type device (caps.row_vec) a reduction over
 * contiguous rows and the kernels after it that read the same rows run as one kernel, a
 * work-item per row with vectors (gpu_row.c). Library calls (GEMM) and fallbacks are steps the runtime
 * runs. Private to the GPU backends. */
#ifndef GRAFT_GPU_RENDER_H
#define GRAFT_GPU_RENDER_H
#include "program.h"
#include "../../passes/fusion.h"
#include "../render/render.h"

/* A language's spelling of the few things that differ between GPU C dialects. */
typedef struct gpu_dialect {
  const char *name;
  const rd_dialect *expr;   /* how expressions are spelled (render.h) */
  const char *ext;          /* the generated source's file extension (dumps: graph_<hash>.<ext>) */
  const char *prelude;      /* before everything: pragmas, typedefs (int64_t...), helpers */
  const char *kernel;       /* the qualifier a kernel entry starts with */
  const char *global;       /* qualifier of a pointer to device memory */
  const char *restrict_;    /* restrict keyword */
  const char *global_id;    /* this work-item's index over the whole launch */
  const char *local_id, *group_id, *local_size; /* within a work-group */
  const char *local_decl;   /* declares a work-group array: printf format (type, name, count) */
  const char *barrier;      /* work-group barrier on local memory */
  /* Vectors for the row form of CPU-type devices (gpu_row.c); vprelude NULL: the dialect has
   * none. vprelude follows "#define GC_VW <width>": it defines GC_V(name) (name pasted with the
   * width), gc_vf (GC_VW floats), gc_vd (doubles, with GC_FP64), gc_vf2d(v) and gm_expf_v, the
   * lane-wise twin of gm_expf (same operations, same results). */
  const char *vprelude;
  const char *vload;        /* printf (pointer expression): GC_VW floats from there */
  const char *vstore;       /* printf (value, pointer expression) */
} gpu_dialect;

extern const gpu_dialect gpu_dialect_opencl;
extern const gpu_dialect gpu_dialect_cuda; /* for NVRTC: no CUDA runtime here yet (tests compile it) */

/* What the runtime does at one step of a program. */
typedef enum { GPU_STEP_KERNEL, GPU_STEP_LIBRARY, GPU_STEP_FALLBACK } gpu_step_kind;
typedef struct {
  gpu_step_kind kind;
  int slot;       /* the instruction whose value this step writes */
  int kernel;     /* GPU_STEP_KERNEL: the entry is named k<kernel> */
  int nargs;      /* kernel arguments after the output: the slots it reads, in order */
  int *args;     /* the first nout are further outputs it writes (a row group's members) */
  int nout;
  int64_t global; /* work-items (a multiple of local when local > 0) */
  int64_t local;  /* work-group size; 0: the runtime chooses */
  int trans[2];   /* GPU_STEP_LIBRARY: operand 0/1 read transposed (last two dims) */
  bool status;    /* the kernel's last argument is the program's status buffer (gather) */
} gpu_step;

typedef struct {
  char *source;   /* the translation unit (malloc'd) */
  int nsteps;
  gpu_step *steps;
  int nkernels;
  int *last_step; /* per slot: the last step that reads it (-1: none) */
  /* Kernels that can fail (a gather's index out of range) record it in a status buffer of
   * GPU_STATUS_WORDS int64: [0] nonzero when one failed, [1] the bad index, [2] the slot, [3]
   * the bound; the runtime zeroes it before and reads it after the program. */
  bool uses_status;
} gpu_program;
#define GPU_STATUS_WORDS 4

/* What the device can do, for the classification (which ops are generated). */
typedef struct {
  bool fp64;           /* double precision in kernels */
  bool have_gemm;      /* a library GEMM for f32 (and f64 when fp64) */
  int64_t max_wg;      /* largest work-group */
  /* A CPU-type device (pocl): rows are reduced and written by one work-item each with vectors
   * of row_vec lanes (gpu_row.c); 0: the GPU forms only. */
  int row_vec;
} gpu_caps;

/* Plans and renders p for dialect d; 0, or -1 with the error set. */
int gpu_render(const exec_program *p, const gpu_dialect *d, const gpu_caps *caps, gpu_program *out);
void gpu_program_free(gpu_program *g);
/* What the plan makes of instruction i on such a device (a fuse_classify_fn's answer). */
int gpu_classify(const exec_program *p, int i, const gpu_caps *caps);
#endif
