/* The compiling CPU backend: renders a program as one C translation unit, compiles it with the
 * system compiler ($GRAFT_CC, default "cc"), loads it with dlopen and runs it on a persistent
 * thread pool; matmul goes to OpenBLAS (loaded at run time); ops it does not generate code for
 * call the reference kernels. Compiled objects are cached on disk per user. */
#ifndef GRAFT_CPU_H
#define GRAFT_CPU_H
#include "backend.h"
#include "../ref/ref.h"

extern const backend cpu_backend;
/* The first tier: interprets a program with the reference kernels, except the instructions
 * that have host kernels (BLAS contractions, convolution, pooling, gather, scatter_add). */
extern const backend cpu_interp_backend;
/* Tests: p's executable as a progressive build's before any kernel landed: every kernel runs
 * on the first tier (cpu_partial.c); nothing is compiled. NULL with the error set. */
void *cpu_compile_unlanded(const exec_program *p);

/* The path the first tier takes for ins with operands in (only their dtypes and shapes are
 * read): what ops.def's interp column declares; tests/test_op_coverage.c checks the two agree. */
ops_interp_path cpu_interp_route(const exec_instr *ins, const ref_arg *in);

typedef struct {
  uint64_t compiles;      /* compiler invocations that succeeded */
  uint64_t compile_fail;  /* compiler invocations that failed */
  uint64_t disk_hits;     /* kernel objects loaded from the disk cache (no compiler run) */
  uint64_t bodies_compiled; /* kernel bodies compiled (cpu_klib.c) */
  uint64_t bodies_reused;   /* kernel bodies a build found compiled (memory or disk) */
  uint64_t bodies_sized;    /* of a build's bodies, those run as size-generic templates */
  uint64_t disk_corrupt;  /* cache entries rejected (size/checksum mismatch) and rebuilt */
  uint64_t disk_refused;  /* compiles whose cache dir was unsafe, not creatable or read-only */
  double compile_ms;      /* wall time spent in the compiler */
  uint64_t fallback[IR_OP_COUNT]; /* per op: instructions run on ref kernels (per execution) */
  uint64_t narrow_gemms;  /* f32 products with a side of 8-16 run on cpu_narrow.c's kernels */
  uint64_t fewrows_gemms; /* f32 A B^T of 2-32 rows run on cpu_fewrows.c's kernels */
  uint64_t own_gemms;     /* f32 GEMMs (or parts of one) run on cpu_sgemm.c's AVX-512 kernel */
  uint64_t onednn_gemms;  /* f32 GEMMs (or parts of one) run on oneDNN's sgemm */
  uint64_t choices;       /* classes of products/convolutions whose kernel was chosen by measurement */
  uint64_t demoted;       /* of those, classes that left the default kernel (cpu_choice.c) */
  uint64_t views;         /* first-tier instructions planned as views (cpu_views.c) */
  uint64_t fused;         /* first-tier instructions planned inside a fused group (cpu_groups.c) */
} cpu_counters;
extern cpu_counters cpu_stats;
/* The thread pool's fork handler (a forked child starts with no workers); registered with the
 * backends, before any step runs. */
void cpu_pool_fork_register(void);

/* Number of threads of the pool (callers included); starts it on first use. */
int cpu_pool_threads(void);
/* Stops the pool's threads (optional at exit; the pool restarts on next use). */
void cpu_pool_shutdown(void);
/* Forgets the kernel bodies held in memory (cpu_klib.c; tests of the disk layer: what a new
 * process holds). The objects stay loaded. */
void cpu_klib_forget(void);
/* Tests: GRAFT_SIZED's switch (size-generic kernel bodies, cpu_sized.c). */
void cpu_sized_enable(bool on);
/* Tests: templates made from now on do not compile (the fallback to specialised bodies). */
void cpu_sized_test_poison(bool on);
/* The size of the last kernel object's source compiled (tests: what a folder must take). */
size_t cpu_klib_last_source_bytes(void);
/* The last generated source (for dumps/debugging); valid until the next compile. */
const char *cpu_last_source(void);
#endif
