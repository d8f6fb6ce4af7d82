/* The compiled graph as a picture, beside the other dumps: GRAFT_DUMP_DIR/graph_<hash>.kernels.dot
 * (after the passes, each generated kernel a cluster: fuse_plan_dot) and .kernels.svg, rendered
 * by Graphviz's dot where it is installed (run without a shell; what it prints goes to a
 * temporary file, said on stderr if it complains). */
#include "cpu_internal.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cpu_render_svg(const char *dot_path, const char *svg_path) {
  char tmpl[] = "/tmp/graft-dot-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return;
  unlink(tmpl);
  char *argv[] = {"dot", "-Tsvg", "-o", (char *)svg_path, (char *)dot_path, NULL};
  int rc = cpu_spawn(argv, fd);
  char said[512] = {0};
  ssize_t got = rc >= 0 ? pread(fd, said, sizeof said - 1, 0) : 0;
  close(fd);
  if (rc > 0 || got > 0) /* -1: no dot here (not installed): the .dot stays */
    fprintf(stderr, "graft: dot could not render %s (exit %d): %s\n", dot_path, rc, got > 0 ? said : "");
}

/* Per input slot whose buffer the code frees at its last use when the caller donated it (the
 * executor hands over a sole reference: the memory goes to the values made after), which
 * step read it last. NULL entries elsewhere; NULL when out of memory. */
static char **cpu_picture_notes(const exec_program *p, const fuse_plan *pl, const cpu_code *c,
                                cpu_arena *ar) {
  char **note = cpu_arena_alloc(ar, sizeof(char *) * ((size_t)p->ninstr + 1));
  char last[64] = "";
  for (int i = 0; note && i < c->nstep; i++) {
    const cpu_step *st = &c->step[i];
    if (st->kind == CPU_STEP_KERNEL) snprintf(last, sizeof last, "kernel k%d", st->arg);
    else if (st->kind == CPU_STEP_GEMM) snprintf(last, sizeof last, "the GEMM of %%%d", c->gemm[st->arg].c);
    else if (st->kind == CPU_STEP_FALLBACK) snprintf(last, sizeof last, "the fallback %%%d", st->arg);
    else if (st->kind == CPU_STEP_RELEASE && pl->role[st->arg] == FUSE_PARAM &&
             p->instr[st->arg].numel * graft_dtype_size(p->instr[st->arg].dtype) >= EXEC_DONATE_MIN_BYTES)
      note[st->arg] = cpu_fmt(ar, "donatable: if donated, freed after %s", last);
  }
  return note;
}

void cpu_dump_picture(const exec_program *p, const fuse_plan *pl, const cpu_code *code,
                      const int *kernel_of) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  char path[4096], svg[4096], title[256];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".kernels.dot", dir, p->hash);
  snprintf(svg, sizeof svg, "%s/graph_%016" PRIx64 ".kernels.svg", dir, p->hash);
  snprintf(title, sizeof title, "graph %016" PRIx64 ": %d instructions after the passes, %d kernels (graph_%016" PRIx64 ".c)",
           p->hash, p->ninstr, code->nlaunch, p->hash);
  FILE *f = fopen(path, "w");
  if (!f) return;
  cpu_arena ar = {0};
  int rc = fuse_plan_dot(f, p, pl, kernel_of, (const char *const *)cpu_picture_notes(p, pl, code, &ar), title);
  cpu_arena_free(&ar);
  if (fclose(f) || rc) return;
  cpu_render_svg(path, svg);
}
