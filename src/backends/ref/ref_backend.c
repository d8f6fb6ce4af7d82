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

/* Slot s as an operand: its buffer, through its view where it is one. */
static ref_arg ref_operand(const exec_program *p, const ref_plan *pl, exec_buffer *const *slot, int s) {
  const exec_instr *src = &p->instr[s];
  const ref_view *v = pl && pl->views && pl->views[s].on ? &pl->views[s] : NULL;
  char *data = (char *)slot[s]->ptr;
  if (v) data += v->offset * (int64_t)graft_dtype_size(src->dtype);
  return (ref_arg){data, src->dtype, src->ndim, src->shape, src->numel, v};
}

/* Runs instruction i (its slot filled); 0 or -1. */
static int ref_step(const exec_program *p, const ref_plan *pl, ref_pick_fn pick, int i,
                    exec_buffer **slot, ref_arg *args) {
  const exec_instr *ins = &p->instr[i];
  if (ins->op == IR_RESHAPE || (pl && pl->views && pl->views[i].on)) {
    slot[i] = slot[ins->in[0]]; /* row-major order is unchanged, or a view: the operand's buffer */
    buffer_retain(slot[i]);
    return 0;
  }
  if (pl && pl->nleaf && pl->nleaf[i]) { /* a group's root: its members from its leaves */
    for (int q = 0; q < pl->nleaf[i]; q++) args[q] = ref_operand(p, pl, slot, pl->leaf[i][q]);
    slot[i] = program_instr_buffer(p, ins);
    if (!slot[i]) return -1;
    return program_instr_empty(ins) ? 0 : pl->run_root(pl, p, i, args, slot[i]->ptr);
  }
  for (int k = 0; k < ins->nin; k++) args[k] = ref_operand(p, pl, slot, ins->in[k]);
  return ref_run_one(p, ins, args, pick, &slot[i]);
}

/* Frees the slots instruction i read last (at their last use, peak memory follows liveness,
 * not graph size): its operands, or a root's leaves. */
static void ref_release_read(const exec_program *p, const ref_plan *pl, int i, exec_buffer **slot) {
  bool root = pl && pl->nleaf && pl->nleaf[i];
  int n = root ? pl->nleaf[i] : p->instr[i].nin;
  for (int k = 0; k < n; k++) {
    int s = root ? pl->leaf[i][k] : p->instr[i].in[k];
    int last = pl && pl->last_use ? pl->last_use[s] : p->instr[s].last_use;
    if (last == i && !p->instr[s].is_output && slot[s]) {
      buffer_release(slot[s]);
      slot[s] = NULL;
    }
  }
}

int ref_run(const exec_program *p, exec_buffer *const *params, exec_buffer **outs,
            ref_pick_fn pick, const ref_plan *plan) {
  exec_buffer **slot = calloc((size_t)p->ninstr + 1, sizeof *slot);
  ref_arg *args = NULL;
  int maxin = 1;
  for (int i = 0; i < p->ninstr; i++) {
    if (p->instr[i].nin > maxin) maxin = p->instr[i].nin;
    if (plan && plan->nleaf && plan->nleaf[i] > maxin) maxin = plan->nleaf[i];
  }
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
    if (p->instr[i].op == IR_DATA || (plan && plan->inside && plan->inside[i] >= 0)) continue;
    if (ref_step(p, plan, pick, i, slot, args)) rc = -1;
    else ref_release_read(p, plan, i, slot);
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
  return ref_run(p, params, outs, NULL, NULL);
}

const backend ref_backend = {
    .name = "ref",
    .supports = ref_supports,
    .compile = ref_compile,
    .execute = ref_execute,
    .free_exe = NULL,
};
