/* The boundary between the host and a generated object: one struct of callbacks handed to the
 * generated entry. Its text is also emitted into the generated source (cpu_rt_src), so both
 * sides see the same layout. */
#ifndef GRAFT_CPU_RT_H
#define GRAFT_CPU_RT_H
#include <stdint.h>

#define CPU_RT_EMIT(...) __VA_ARGS__ static const char cpu_rt_src[] = #__VA_ARGS__;

CPU_RT_EMIT(
typedef void (*cpu_kernel_fn)(void **S, int64_t lo, int64_t hi);
typedef struct cpu_rt {
  void *ctx;
  void **S;
  int (*alloc)(void *ctx, int slot);
  void (*release)(void *ctx, int slot);
  int (*fallback)(void *ctx, int instr);
  void (*parallel)(void *ctx, cpu_kernel_fn fn, void **S, int64_t total);
  /* a kernel too small to split, on the calling thread (a call, so that profiling sees it) */
  void (*serial)(void *ctx, cpu_kernel_fn fn, void **S, int64_t total);
  /* batch row-major products C[q] = op(A[q]) op(B[q]), q < batch, element strides sa sb sc
     between items; dbl: f64, else f32 */
  void (*gemm)(int dbl, int ta, int tb, int m, int n, int k, const void *a, int lda, int64_t sa,
               const void *b, int ldb, int64_t sb, void *c, int ldc, int64_t sc, int64_t batch);
} cpu_rt;
typedef int (*cpu_entry_fn)(const cpu_rt *rt);
)
#endif
