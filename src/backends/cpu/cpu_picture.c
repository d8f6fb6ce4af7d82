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

void cpu_dump_picture(const exec_program *p, const fuse_plan *pl, const int *kernel_of, int nkernels) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  char path[4096], svg[4096], title[256];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".kernels.dot", dir, p->hash);
  snprintf(svg, sizeof svg, "%s/graph_%016" PRIx64 ".kernels.svg", dir, p->hash);
  snprintf(title, sizeof title, "graph %016" PRIx64 ": %d instructions after the passes, %d kernels (graph_%016" PRIx64 ".c)",
           p->hash, p->ninstr, nkernels, p->hash);
  FILE *f = fopen(path, "w");
  if (!f) return;
  int rc = fuse_plan_dot(f, p, pl, kernel_of, title);
  if (fclose(f) || rc) return;
  cpu_render_svg(path, svg);
}
