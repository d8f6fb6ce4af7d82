/* What each generated kernel of a graph is, for the timeline trace: the ops it fused (the
 * values it writes and those inlined into it, in program order), the framework ops they came
 * from (graft_set_op_name: PyTorch's aten ops), the source line most of them were traced at, the bytes of the buffers it reads and writes, and an estimate of its
 * floating-point work (one per element per arithmetic op: a value's elements, a reduction's
 * input's). Made once per compiled graph, as the text of a trace span's args, so a traced
 * kernel costs a copy. */
#include "cpu_internal.h"
#include "loc.h"
#include <stdlib.h>
#include <string.h>

#define DESCRIBE_MAX_OPS 24 /* ops named per kernel; the rest are counted */

/* s into b as a JSON string's contents. */
static void describe_escaped(rd_sb *b, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') rd_sb_printf(b, "\\%c", *s);
    else if ((unsigned char)*s < 0x20) rd_sb_printf(b, "\\u%04x", *s);
    else rd_sb_printf(b, "%c", *s);
  }
}

static int64_t describe_flops(const exec_program *p, int s) {
  const exec_instr *ins = &p->instr[s];
  if (ir_ops[ins->op].cost == OPS_COST_MOVE) return 0;
  return ir_ops[ins->op].kind == IR_K_REDUCE ? p->instr[ins->in[0]].numel : ins->numel;
}

/* The source line most of a kernel's ops (mem[0..nm)) came from (0: none known). */
static uint32_t describe_loc(const exec_program *p, const int *mem, int nm) {
  uint32_t best = 0;
  int best_n = 0;
  for (int i = 0; i < nm; i++) {
    uint32_t l = p->instr[mem[i]].loc;
    if (!l || l == best) continue;
    int n = 0;
    for (int j = i; j < nm; j++) n += p->instr[mem[j]].loc == l;
    if (n > best_n) best = l, best_n = n;
  }
  return best;
}

/* Kernel c's args; mem[0..nm): the slots it writes and inlines, in program order. */
static char *describe_one(const exec_program *p, const cpu_code *code, int c, const int *mem, int nm) {
  const cpu_launch *l = &code->launch[c];
  rd_sb b = {0};
  int64_t bytes = 0, flops = 0;
  for (int j = 0; j < l->nslot; j++) {
    const exec_instr *x = &p->instr[code->slots[l->slot0 + j]];
    bytes += x->numel * (int64_t)graft_dtype_size(x->dtype);
  }
  rd_sb_printf(&b, "\"units\": %lld, \"fused\": \"", (long long)l->units);
  int named = 0, more = 0;
  for (int i = 0; i < nm; i++) {
    int s = mem[i];
    flops += describe_flops(p, s);
    if (named == DESCRIBE_MAX_OPS) {
      more++;
      continue;
    }
    rd_sb_printf(&b, "%s%s", named++ ? " " : "", ir_ops[p->instr[s].op].name);
  }
  if (more) rd_sb_printf(&b, " (+%d more)", more);
  char where[512];
  rd_sb_puts(&b, "\", \"from\": \"");
  for (int i = 0, listed = 0; i < nm && listed < DESCRIBE_MAX_OPS; i++) { /* each op name once */
    uint32_t o = p->instr[mem[i]].opname;
    bool seen = !o;
    for (int j = 0; j < i && !seen; j++) seen = p->instr[mem[j]].opname == o;
    if (seen || !*loc_str(o, where, sizeof where)) continue;
    rd_sb_puts(&b, listed++ ? " " : "");
    describe_escaped(&b, where);
  }
  uint32_t loc = describe_loc(p, mem, nm);
  rd_sb_puts(&b, "\"");
  if (loc && *loc_str(loc, where, sizeof where)) {
    rd_sb_puts(&b, ", \"at\": \"");
    describe_escaped(&b, where);
    rd_sb_puts(&b, "\"");
  }
  rd_sb_printf(&b, ", \"bytes\": %lld, \"flops\": %lld", (long long)bytes, (long long)flops);
  if (b.oom) {
    rd_sb_free(&b);
    return NULL;
  }
  return b.s;
}

/* Kernel c's slots into mem: those it writes (kernel_of) and every inlined value it computes,
 * reached through inlined operands (a value inlined into several kernels is in each), sorted.
 * stamp[s] == c marks those taken. Returns how many. */
static int describe_members(const exec_program *p, const fuse_plan *pl, const int *kernel_of,
                            const int *writes, int nw, int c, int *stamp, int *stack, int *mem) {
  int nm = 0, sp = 0;
  for (int k = 0; k < nw; k++) stamp[writes[k]] = c, mem[nm++] = stack[sp++] = writes[k];
  while (sp) {
    const exec_instr *ins = &p->instr[stack[--sp]];
    for (int k = 0; k < ins->nin; k++) {
      int q = ins->in[k];
      if (stamp[q] == c || pl->role[q] != FUSE_INLINE || kernel_of[q] >= 0) continue;
      stamp[q] = c;
      mem[nm++] = stack[sp++] = q;
    }
  }
  for (int a = 1; a < nm; a++) /* insertion sort: program order (kernels are small) */
    for (int b = a; b > 0 && mem[b - 1] > mem[b]; b--) {
      int t = mem[b];
      mem[b] = mem[b - 1], mem[b - 1] = t;
    }
  return nm;
}

char **cpu_describe_kernels(const exec_program *p, const fuse_plan *pl, const cpu_code *code,
                            const int *kernel_of) {
  int n = p->ninstr, nk = code->nlaunch;
  size_t sz = sizeof(int) * ((size_t)n + 1);
  int *start = calloc((size_t)nk + 2, sizeof(int)), *writes = malloc(sz), *stamp = malloc(sz);
  int *stack = malloc(sz), *mem = malloc(sz);
  char **what = calloc((size_t)nk + 1, sizeof *what);
  bool ok = start && writes && stamp && stack && mem && what;
  if (ok) { /* each kernel's written slots, in program order: counted, then placed */
    for (int s = 0; s < n; s++) {
      stamp[s] = -1;
      if (kernel_of[s] >= 0 && kernel_of[s] < nk) start[kernel_of[s] + 1]++;
    }
    for (int c = 0; c < nk; c++) start[c + 1] += start[c];
    int *fill = stack; /* borrowed until the walks: the next free place of each kernel */
    for (int c = 0; c < nk; c++) fill[c] = start[c];
    for (int s = 0; s < n; s++)
      if (kernel_of[s] >= 0 && kernel_of[s] < nk) writes[fill[kernel_of[s]]++] = s;
    for (int c = 0; c < nk; c++) {
      int nm = describe_members(p, pl, kernel_of, writes + start[c], start[c + 1] - start[c], c,
                                stamp, stack, mem);
      what[c] = describe_one(p, code, c, mem, nm);
    }
  }
  free(start);
  free(writes);
  free(stamp);
  free(stack);
  free(mem);
  if (!ok) {
    free(what);
    return NULL;
  }
  return what;
}

void cpu_describe_free(char **what, int nk) {
  for (int c = 0; what && c < nk; c++) free(what[c]);
  free(what);
}
