/* The boundary between the host and a kernel object. A kernel runs over units [lo, hi) of its
 * work with its buffers in P (its body's parameters, in order); an object exports how many
 * bodies it holds, each one's library key (2 words) and its run function. The typedef's text
 * is also emitted into every object (cpu_rt_src), so both sides see the same type. */
#ifndef GRAFT_CPU_RT_H
#define GRAFT_CPU_RT_H
#include <stdint.h>

#define CPU_RT_EMIT(...) __VA_ARGS__ static const char cpu_rt_src[] = #__VA_ARGS__;

CPU_RT_EMIT(
typedef void (*cpu_kernel_fn)(void **P, int64_t lo, int64_t hi);
)

/* The exported symbols: const int <N>; const uint64_t <KEY>[2 * N]; const cpu_kernel_fn <FN>[N]. */
#define CPU_OBJ_N "graft_kobj_n"
#define CPU_OBJ_KEY "graft_kobj_key"
#define CPU_OBJ_FN "graft_kobj_fn"
#endif
