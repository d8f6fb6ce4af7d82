/* Debug dumps: each compiled graph's IR as text and as Graphviz, into $GRAFT_DUMP_DIR. */
#include "graph.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

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
