/* Debug dumps: each compiled graph's IR as text and as Graphviz, into $GRAFT_DUMP_DIR; and a
 * program as it ran, with its generated source (GRAFT_CHECK's mismatch reports). */
#include "graph.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int dump_seq;

static FILE *dump_open(const char *dir, uint64_t hash, const char *ext) {
  char path[4096];
  snprintf(path, sizeof path, "%s/graph_%03d_%016" PRIx64 ".%s", dir, dump_seq, hash, ext);
  return fopen(path, "w");
}

void dump_graph(const graph_capture *g, const exec_program *p, const char *reason,
                const passes_stats *ps) {
  const char *dir = getenv("GRAFT_DUMP_DIR");
  if (!dir || !*dir) return;
  dump_seq++;
  char shp[128], attr[1024];
  FILE *f = dump_open(dir, p->hash, "txt");
  if (f) {
    fprintf(f, "# graph %016" PRIx64 ": %d nodes, %d inputs, %d outputs\n# reason: %s\n",
            p->hash, g->n, p->nparams, p->noutputs, reason);
    fprintf(f, "# passes: %d simplified, %d folded, %d merged (CSE), %d dead; %d instructions "
            "remain\n", ps->simplified, ps->folded, ps->cse, ps->dead, p->ninstr);
    for (int i = 0; i < g->n; i++) {
      const ir_node *n = g->nodes[i];
      ir_attr_str(n, attr, sizeof attr);
      fprintf(f, "%%%d = %s %s%s", i, ir_ops[n->op].name, graft_dtype_name(n->dtype),
              ir_shape_str(n->ndim, n->shape, shp, sizeof shp));
      for (int k = 0; k < n->nin; k++) fprintf(f, "%s%%%d", k ? ", " : " (", n->in[k]->slot);
      fprintf(f, "%s%s%s\n", n->nin ? ")" : "", *attr ? "  " : "", attr);
    }
    fclose(f);
  }
  f = dump_open(dir, p->hash, "dot");
  if (f) {
    fprintf(f, "digraph graft_%016" PRIx64 " {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n", p->hash);
    for (int i = 0; i < g->n; i++) {
      const ir_node *n = g->nodes[i];
      fprintf(f, "  n%d [label=\"%%%d %s\\n%s%s\"%s];\n", i, i, ir_ops[n->op].name,
              graft_dtype_name(n->dtype), ir_shape_str(n->ndim, n->shape, shp, sizeof shp),
              n->op == IR_DATA ? ", style=filled, fillcolor=lightblue" : "");
      for (int k = 0; k < n->nin; k++) fprintf(f, "  n%d -> n%d;\n", n->in[k]->slot, i);
    }
    fprintf(f, "}\n");
    fclose(f);
  }
}

int dump_program(const char *dir, const exec_program *p, const char *tag, const char *header,
                 const char *source, char *path, size_t n) {
  char shp[128], attr[1024];
  snprintf(path, n, "%s/graph_%016" PRIx64 ".%s.txt", dir, p->hash, tag);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  for (const char *h = header; h && *h;) { /* the header, as comment lines */
    size_t len = strcspn(h, "\n");
    fprintf(f, "# %.*s\n", (int)len, h);
    h += len + (h[len] == '\n');
  }
  fprintf(f, "# program %016" PRIx64 " as it ran: %d instructions, %d inputs, %d outputs (slot "
          "numbers are the generated source's p<N> and S[N])\n", p->hash, p->ninstr, p->nparams,
          p->noutputs);
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    ir_attr_fmt(ins->op, &ins->attr, ins->nin ? p->instr[ins->in[0]].ndim : ins->ndim, attr,
                sizeof attr);
    fprintf(f, "%%%d = %s %s%s", i, ir_ops[ins->op].name, graft_dtype_name(ins->dtype),
            ir_shape_str(ins->ndim, ins->shape, shp, sizeof shp));
    for (int k = 0; k < ins->nin; k++) fprintf(f, "%s%%%d", k ? ", " : " (", ins->in[k]);
    fprintf(f, "%s%s%s", ins->nin ? ")" : "", *attr ? "  " : "", attr);
    for (int k = 0; k < p->nparams; k++)
      if (p->param_slot[k] == i) fprintf(f, "  # input %d", k);
    for (int k = 0; k < p->noutputs; k++)
      if (p->output_slot[k] == i) fprintf(f, "  # output %d", k);
    fputc('\n', f);
  }
  int rc = fclose(f) ? -1 : 0;
  if (source) {
    char src[4200];
    snprintf(src, sizeof src, "%s/graph_%016" PRIx64 ".c", dir, p->hash);
    f = fopen(src, "w");
    if (!f) return -1;
    fputs(source, f);
    if (fclose(f)) rc = -1;
  }
  return rc;
}
