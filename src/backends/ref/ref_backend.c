/* The reference backend: interprets a program one instruction at a time with the plain
 * kernels in ref_kernels. It supports every op; it is the oracle and the fallback. */
#include "ref.h"
#include "error.h"
#include <stdlib.h>

static bool ref_supports(const exec_instr *ins) { return ref_kernels[ins->op] != NULL || ins->op == IR_DATA; }

/* Nothing to compile: the program is the executable. */
static void *ref_compile(const exec_program *p) { return (void *)p; }

/* Runs ins into a new buffer *out (pick: the caller's kernel for it, else the reference). */
static int ref_run_one(const exec_program *p, const exec_instr *ins, const ref_arg *args,
                       ref_pick_fn pick, exec_buffer **out) {
  *out = program_instr_buffer(p, ins);
  if (*out && program_instr_empty(ins)) return 0;
  ref_fn fn = pick ? pick(ins, args) : NULL;
  return !*out || (fn ? fn : ref_kernels[ins->op])(ins, args, (*out)->ptr);
}

int ref_run(const exec_program *p, exec_buffer *const *params, exec_buffer **outs,
            ref_pick_fn pick) {
  exec_buffer **slot = calloc((size_t)p->ninstr + 1, sizeof *slot);
  ref_arg *args = NULL;
  int maxin = 1;
  for (int i = 0; i < p->ninstr; i++)
    if (p->instr[i].nin > maxin) maxin = p->instr[i].nin;
  args = malloc(sizeof *args * (size_t)maxin);
  if (!slot || !args) {
    free(slot);
    free(args);
    err_set(GRAFT_ERR_OOM, "out of memory running a graph");
    return -1;
  }
  for (int k = 0; k < p->nparams; k++) {
    slot[p->param_slot[k]] = params[k];
    if (!params[k]->donated) buffer_retain(params[k]); /* a donated one comes with its reference */
  }
  int rc = 0;
  for (int i = 0; i < p->ninstr && !rc; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op == IR_DATA) continue;
    for (int k = 0; k < ins->nin; k++) {
      const exec_instr *src = &p->instr[ins->in[k]];
      args[k] = (ref_arg){slot[ins->in[k]]->ptr, src->dtype, src->ndim, src->shape, src->numel};
    }
    if (ins->op == IR_RESHAPE) { /* row-major order is unchanged: the operand's buffer */
      slot[i] = slot[ins->in[0]];
      buffer_retain(slot[i]);
    } else if (ref_run_one(p, ins, args, pick, &slot[i])) {
      rc = -1;
      break;
    }
    /* Free operands at their last use: peak memory follows liveness, not graph size. */
    for (int k = 0; k < ins->nin; k++) {
      int s = ins->in[k];
      if (p->instr[s].last_use == i && !p->instr[s].is_output && slot[s]) {
        buffer_release(slot[s]);
        slot[s] = NULL;
      }
    }
  }
  for (int k = 0; k < p->noutputs && !rc; k++) {
    outs[k] = slot[p->output_slot[k]];
    buffer_retain(outs[k]);
    if (outs[k]->donated) /* a donated input's buffer a reshape passed on is the output's now; */
      outs[k]->donated = 0; /* a plain input another thread's run reads is not written */
  }
  for (int i = 0; i < p->ninstr; i++) buffer_release(slot[i]);
  free(slot);
  free(args);
  return rc;
}

static int ref_execute(void *exe, const exec_program *p, exec_buffer *const *params,
                       exec_buffer **outs) {
  (void)exe;
  return ref_run(p, params, outs, NULL);
}

const backend ref_backend = {
    .name = "ref",
    .supports = ref_supports,
    .compile = ref_compile,
    .execute = ref_execute,
    .free_exe = NULL,
};
