/* See picture.h. dot runs without a shell; what it prints goes to a temporary file, said on
 * stderr if it complains. */
#include "picture.h"
#include "spawn.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void picture_render_svg(const char *dot_path, const char *svg_path) {
  char tmpl[] = "/tmp/graft-dot-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return;
  unlink(tmpl);
  char *argv[] = {"dot", "-Tsvg", "-o", (char *)svg_path, (char *)dot_path, NULL};
  int rc = spawn_run(argv, fd);
  char said[512] = {0};
  ssize_t got = rc >= 0 ? pread(fd, said, sizeof said - 1, 0) : 0;
  close(fd);
  if (rc > 0 || got > 0) /* -1: no dot here (not installed): the .dot stays */
    fprintf(stderr, "graft: dot could not render %s (exit %d): %s\n", dot_path, rc, got > 0 ? said : "");
}

void picture_dump(const exec_program *p, const fuse_plan *pl, const int *kernel_of,
                  const char *const *note, int nkernels, const char *source) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  char path[4096], svg[4096], title[256];
  snprintf(path, sizeof path, "%s/graph_%016" PRIx64 ".kernels.dot", dir, p->hash);
  snprintf(svg, sizeof svg, "%s/graph_%016" PRIx64 ".kernels.svg", dir, p->hash);
  snprintf(title, sizeof title, "graph %016" PRIx64 ": %d instructions after the passes, %d kernels (graph_%016" PRIx64 ".%s)",
           p->hash, p->ninstr, nkernels, p->hash, source);
  FILE *f = fopen(path, "w");
  if (!f) return;
  int rc = fuse_plan_dot(f, p, pl, kernel_of, note, title);
  if (fclose(f) || rc) return;
  picture_render_svg(path, svg);
}
