/* The compiled graph as a picture (picture_dump: GRAFT_DUMP_DIR/graph_<hash>.kernels.dot and
 * its SVG), with this backend's word on the inputs it can give back early. */
#include "cpu_internal.h"
#include "../picture.h"
#include <stdio.h>

/* Per input slot whose buffer the code frees at its last use when the caller donated it (the
 * executor hands over a sole reference: the memory goes to the values made after), which
 * step read it last. NULL entries elsewhere; NULL when out of memory. */
static char **cpu_picture_notes(const exec_program *p, const fuse_plan *pl, const cpu_code *c,
                                rd_arena *ar) {
  char **note = rd_arena_alloc(ar, sizeof(char *) * ((size_t)p->ninstr + 1));
  char last[64] = "";
  for (int i = 0; note && i < c->nstep; i++) {
    const cpu_step *st = &c->step[i];
    if (st->kind == CPU_STEP_KERNEL) snprintf(last, sizeof last, "kernel k%d", st->arg);
    else if (st->kind == CPU_STEP_GEMM) snprintf(last, sizeof last, "the GEMM of %%%d", c->gemm[st->arg].c);
    else if (st->kind == CPU_STEP_FALLBACK) snprintf(last, sizeof last, "the fallback %%%d", st->arg);
    else if (st->kind == CPU_STEP_RELEASE && pl->role[st->arg] == FUSE_PARAM &&
             p->instr[st->arg].numel * graft_dtype_size(p->instr[st->arg].dtype) >= EXEC_DONATE_MIN_BYTES)
      note[st->arg] = rd_fmt(ar, "donatable: if donated, freed after %s", last);
  }
  return note;
}

void cpu_dump_picture(const exec_program *p, const fuse_plan *pl, const cpu_code *code,
                      const int *kernel_of) {
  rd_arena ar = {0};
  picture_dump(p, pl, kernel_of, (const char *const *)cpu_picture_notes(p, pl, code, &ar), code->nlaunch, "c");
  rd_arena_free(&ar);
}
