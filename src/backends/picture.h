/* Pictures of compiled graphs for GRAFT_DUMP_DIR, shared by the compiling backends: the
 * program after the passes as its kernels run (src/passes/fusion_dot.c), written beside the
 * other dumps and rendered to SVG by Graphviz's dot where it is installed. Private to the
 * backends. */
#ifndef GRAFT_PICTURE_H
#define GRAFT_PICTURE_H
#include "program.h"
#include "../passes/fusion.h"

/* With GRAFT_DUMP_DIR set: graph_<hash>.kernels.dot (kernel_of[s]: the kernel k<N> that
 * writes slot s, -1 for none; note[s]: a backend's word on slot s, or NULL) and its SVG.
 * source names the generated source it pictures ("c", "cl"). Failures only leave the files
 * out (a dump, not a result). */
void picture_dump(const exec_program *p, const fuse_plan *pl, const int *kernel_of,
                  const char *const *note, int nkernels, const char *source);
#endif
