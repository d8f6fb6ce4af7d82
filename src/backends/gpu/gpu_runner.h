/* The device step runner shared by the GPU backends (OpenCL, CUDA): it walks a rendered program's
 * steps (gpu_render.h), makes each step's output buffer, launches kernels and library GEMMs
 * through a small runtime vtable, runs what the renderer does not lower on the host with the
 * transfers it needs (counted per op), frees operands after their last read, and waits once per
 * graph. A runtime supplies only what differs between device APIs. Private to the GPU backends. */
#ifndef GRAFT_GPU_RUNNER_H
#define GRAFT_GPU_RUNNER_H
#include "gpu_render.h"
#include "backend.h"
#include <pthread.h>

/* Row-major C[b] = op(A[b]) x op(B[b]) for b < batch, each matrix dense and consecutive. */
typedef struct {
  size_t m, n, k, batch;
  bool trans_a, trans_b; /* A stored [k, m] / B stored [n, k] */
  bool f64;
} gpu_gemm;

/* A backend's counters (backend.h's stats), guarded: compiles and fallbacks are counted from
 * any thread. Define one per backend with GPU_COUNTERS_INIT. */
typedef struct {
  pthread_mutex_t mu;
  backend_stats s;
} gpu_counters;
#define GPU_COUNTERS_INIT {.mu = PTHREAD_MUTEX_INITIALIZER}
void gpu_count_compile(gpu_counters *c, bool disk_hit);
void gpu_counters_get(gpu_counters *c, backend_stats *out);

/* What a device API does for the runner; each returns 0, or -1 with the error set. exe is the
 * backend's compiled executable. Memory handles are what the device's device_mem put in
 * exec_buffer.ptr. Work is queued in order; only finish and status_read wait. */
typedef struct gpu_runtime {
  const char *name;         /* the API, in messages: "OpenCL", "CUDA" */
  const char *kernel_what;  /* what a kernel step is, for explain: "an OpenCL kernel" */
  const char *library_what; /* "a CLBlast GEMM" */
  /* Kernel st->kernel over st->global work-items (st->local a group; 0: the runtime chooses),
   * its arguments mem[0..nmem) (the output, then st->args' buffers), then the executable's
   * status buffer when st->status. what names the step in an error. */
  int (*launch)(void *exe, const gpu_step *st, void *const *mem, int nmem, const char *what);
  int (*gemm)(void *exe, const gpu_gemm *g, void *a, void *b, void *c);
  /* The status words (gpu_program.uses_status) zeroed before the steps, read after finish. */
  int (*status_reset)(void *exe);
  int (*status_read)(void *exe, int64_t w[GPU_STATUS_WORDS]);
  /* Waits for everything queued (the graph's one wait); what names the graph. */
  int (*finish)(void *exe, const char *what);
  gpu_counters *counters; /* a step that ran on the host is counted in its fallbacks */
} gpu_runtime;

/* Runs program p (rendered as gp, compiled as exe) on its device: backend.h's execute. */
int gpu_run(const gpu_runtime *rt, void *exe, const gpu_program *gp, const exec_program *p,
            exec_buffer *const *params, exec_buffer **outs);
/* Releases the inputs given to a run (donated) when it cannot start: they go either way. */
void gpu_release_donated(const exec_program *p, exec_buffer *const *params);
/* backend.h's explain for a rendered program. */
void gpu_explain(const gpu_runtime *rt, const gpu_program *gp, int slot, char *buf, size_t n,
                 char **source);
/* GRAFT_DUMP_DIR: the rendered source beside the graph's IR dump (graph_<hash>.<d->ext>). */
void gpu_dump_source(const exec_program *p, const gpu_dialect *d, const char *source);
#endif
