/* A planned program as a Graphviz picture: what ran as which kernel. Each kernel is a cluster
 * holding the values it writes and the values inlined into it (an inlined value read by
 * several kernels is recomputed by each; it sits in its last reader's cluster and says how
 * many kernels read it directly); library calls (GEMM), fallbacks, inputs and outputs are marked; dead
 * instructions are left out. */
#include "fusion.h"
#include "loc.h"
#include <stdlib.h>
#include <string.h>

/* s, quoted for a Graphviz label (quotes and backslashes escaped). */
static void dot_put_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
}

static int dot_cmp_pair(const void *a, const void *b) {
  const int *x = a, *y = b;
  return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* The cluster each live slot is drawn in (-1: none) and, for inlined values, how many kernels
 * read it directly (readers[s]). Consumers come after their operands, so one backward walk
 * hands each inlined value its last reader's cluster; the (value, reader's cluster) pairs,
 * sorted, count the distinct readers. -1 when out of memory. */
static int dot_homes(const exec_program *p, const fuse_plan *pl, const int *kernel_of, int *home,
                     int *readers) {
  int64_t edges = 0;
  for (int s = 0; s < p->ninstr; s++) home[s] = kernel_of[s], readers[s] = 0, edges += p->instr[s].nin;
  int *pair = malloc(sizeof(int) * 2 * ((size_t)edges + 1)), np = 0;
  if (!pair) return -1;
  for (int i = p->ninstr - 1; i >= 0; i--) {
    if (pl->role[i] == FUSE_DEAD || home[i] < 0) continue;
    const exec_instr *ins = &p->instr[i];
    for (int k = 0; k < ins->nin; k++) {
      int q = ins->in[k];
      if (pl->role[q] != FUSE_INLINE || kernel_of[q] >= 0) continue;
      if (home[q] < 0) home[q] = home[i];
      pair[2 * np] = q, pair[2 * np + 1] = home[i], np++;
    }
  }
  qsort(pair, (size_t)np, 2 * sizeof(int), dot_cmp_pair);
  for (int j = 0; j < np; j++)
    if (!j || pair[2 * j] != pair[2 * j - 2] || pair[2 * j + 1] != pair[2 * j - 1]) readers[pair[2 * j]]++;
  free(pair);
  return 0;
}

static void dot_node(FILE *f, const exec_program *p, const fuse_plan *pl, int s, int readers,
                     const char *note) {
  const exec_instr *ins = &p->instr[s];
  char shp[128], where[512];
  fprintf(f, "    n%d [label=\"%%%d %s\\n%s%s", s, s, ir_ops[ins->op].name, graft_dtype_name(ins->dtype),
          ir_shape_str(ins->ndim, ins->shape, shp, sizeof shp));
  if (*loc_str(ins->opname, where, sizeof where)) {
    fputs("\\nfrom ", f);
    dot_put_escaped(f, where);
  }
  int role = pl->role[s];
  for (int k = 0; k < p->nparams; k++)
    if (p->param_slot[k] == s) fprintf(f, "\\ninput %d", k);
  for (int k = 0; k < p->noutputs; k++)
    if (p->output_slot[k] == s) fprintf(f, "\\noutput %d", k);
  if (role == FUSE_LIBRARY) fprintf(f, "\\nlibrary GEMM");
  if (role == FUSE_FALLBACK) fprintf(f, "\\nfallback kernel");
  if (readers > 1) fprintf(f, "\\ninlined into %d kernels", readers);
  if (note && *note) {
    fputs("\\n", f);
    dot_put_escaped(f, note);
  }
  if (*loc_str(ins->loc, where, sizeof where)) {
    fputs("\\n", f);
    dot_put_escaped(f, where);
  }
  fputc('"', f);
  if (ins->is_output) fprintf(f, ", peripheries=2");
  if (role == FUSE_PARAM) fprintf(f, ", style=filled, fillcolor=lightblue");
  else if (role == FUSE_LIBRARY) fprintf(f, ", shape=box3d, style=filled, fillcolor=lightyellow");
  else if (role == FUSE_FALLBACK) fprintf(f, ", style=filled, fillcolor=pink");
  else if (role == FUSE_INLINE) fprintf(f, ", style=dashed");
  fprintf(f, "];\n");
}

int fuse_plan_dot(FILE *f, const exec_program *p, const fuse_plan *pl, const int *kernel_of,
                  const char *const *note, const char *title) {
  int n = p->ninstr;
  int *home = malloc(sizeof(int) * ((size_t)n + 1)), *readers = malloc(sizeof(int) * ((size_t)n + 1));
  if (!home || !readers || dot_homes(p, pl, kernel_of, home, readers)) {
    free(home);
    free(readers);
    return -1;
  }
  int nk = 0;
  for (int s = 0; s < n; s++)
    if (home[s] >= nk) nk = home[s] + 1;
  fprintf(f, "digraph graft {\n  rankdir=TB;\n  labelloc=t;\n  label=\"");
  dot_put_escaped(f, title ? title : "");
  fprintf(f, "\";\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n");
  for (int c = 0; c < nk; c++) {
    int any = 0;
    for (int s = 0; s < n && !any; s++) any = home[s] == c && pl->role[s] != FUSE_DEAD;
    if (!any) continue;
    fprintf(f, "  subgraph cluster_k%d {\n    label=\"kernel k%d\";\n    style=rounded;\n    color=steelblue;\n", c, c);
    for (int s = 0; s < n; s++)
      if (home[s] == c && pl->role[s] != FUSE_DEAD) dot_node(f, p, pl, s, readers[s], note ? note[s] : NULL);
    fprintf(f, "  }\n");
  }
  for (int s = 0; s < n; s++)
    if (home[s] < 0 && pl->role[s] != FUSE_DEAD) dot_node(f, p, pl, s, 0, note ? note[s] : NULL);
  for (int i = 0; i < n; i++) {
    if (pl->role[i] == FUSE_DEAD) continue;
    for (int k = 0; k < p->instr[i].nin; k++)
      if (pl->role[p->instr[i].in[k]] != FUSE_DEAD) fprintf(f, "  n%d -> n%d;\n", p->instr[i].in[k], i);
  }
  fprintf(f, "}\n");
  free(home);
  free(readers);
  return ferror(f) ? -1 : 0;
}
