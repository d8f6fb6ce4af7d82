/* The first tier: a new graph runs at once, one instruction at a time, while the cpu backend
 * compiles it. The reference kernels run most instructions, but contractions, convolutions,
 * pooling, gather and scatter_add take the host kernels (BLAS, im2col): a CNN step ran 107 ms
 * on the reference kernels alone, the time a first epoch spent waiting for the compiler. */
#include "cpu_internal.h"

static bool interp_supports(const exec_instr *ins) {
  return ins->op == IR_DATA || ref_kernels[ins->op] != NULL;
}

static void *interp_compile(const exec_program *p) { return (void *)p; } /* nothing to build */

static ref_fn interp_pick(const exec_instr *ins, const ref_arg *in) { return cpu_host_kernel(ins, in); }

static int interp_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                          exec_buffer **outs) {
  (void)exe;
  return ref_run(p, params, outs, interp_pick);
}

const backend cpu_interp_backend = {
    .name = "interp",
    .supports = interp_supports,
    .compile = interp_compile,
    .execute = interp_execute,
    .free_exe = NULL,
};
