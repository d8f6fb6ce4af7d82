/* The first tier's fused elementwise groups. One instruction at a time, a chain of elementwise
 * ops (a batch norm's subtract, scale, shift and ReLU; an optimizer's momentum and update) sent
 * each intermediate to memory and read it back. An elementwise instruction whose only reader is
 * another one (not an output, not a view) is computed inside that reader: the group's root runs
 * its members a chunk at a time (GROUP_CHUNK elements in L1 per member, the same loops, so the
 * same values bit for bit), reading the group's leaves, and only the root's output is written. */
#include "cpu_internal.h"
#include <stdlib.h>
#include <string.h>

enum {
  GROUP_MAX_NODES = 8,   /* members of a group, its root included */
  GROUP_MAX_LEAVES = 16, /* operands from outside (an upper bound while merging) */
  GROUP_MAX_IN = 3,      /* operands of a member (select's three) */
  GROUP_CHUNK = 2048,
};

typedef struct {
  int n;                                   /* members in program order, the root last */
  int node[GROUP_MAX_NODES];
  signed char src[GROUP_MAX_NODES][GROUP_MAX_IN]; /* operand k: leaf q (>= 0) or member -(1 + m) */
  ref_fn fn[GROUP_MAX_NODES];
} cpu_group;

/* The plan's own part (ref_plan.ctx): the groups by root. */
typedef struct {
  int n;               /* instructions */
  cpu_group **by_root; /* per instruction: its group if it is a root */
} cpu_groups;

/* A run of root: its output, its leaves (views' strides coalesced for the gathers). */
typedef struct {
  const exec_program *p;
  const cpu_group *g;
  const ref_arg *leaves;
  int nleaf;
  cpu_copy view[GROUP_MAX_LEAVES]; /* nd 0: a row-major leaf */
  char *out;
  int rc;
} groups_job;

/* The next chunk of n elements (of up to 8 bytes) of the scratch at *next. */
static char *groups_take(char **next, int64_t n) {
  char *p = *next;
  *next += (size_t)n * sizeof(double);
  return p;
}

static void groups_range(void **S, int64_t lo, int64_t hi) {
  groups_job *j = S[0];
  const cpu_group *g = j->g;
  /* scratch: a chunk for each member but the root (it writes the output) and each view leaf;
   * on the stack when small (a malloc that big is an mmap and page faults every run) */
  int64_t chunk = hi - lo < GROUP_CHUNK ? hi - lo : GROUP_CHUNK;
  int slots = g->n - 1;
  for (int q = 0; q < j->nleaf; q++) slots += j->view[q].nd > 0;
  size_t need = (size_t)slots * (size_t)chunk * sizeof(double);
  _Alignas(64) char local[32768];
  char *scratch = need <= sizeof local ? local : malloc(need), *next = scratch;
  if (!scratch) {
    __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED);
    return;
  }
  char *node_buf[GROUP_MAX_NODES], *leaf_buf[GROUP_MAX_LEAVES];
  const void *leaf_data[GROUP_MAX_LEAVES];
  exec_instr part[GROUP_MAX_NODES]; /* the members, each chunk's numel set in its copy */
  for (int m = 0; m < g->n; m++) {
    node_buf[m] = m < g->n - 1 ? groups_take(&next, chunk) : NULL;
    part[m] = j->p->instr[g->node[m]];
  }
  for (int q = 0; q < j->nleaf; q++)
    leaf_buf[q] = j->view[q].nd ? groups_take(&next, chunk) : NULL;
  for (int64_t c = lo; c < hi; c += GROUP_CHUNK) {
    int64_t n = hi - c < GROUP_CHUNK ? hi - c : GROUP_CHUNK;
    for (int q = 0; q < j->nleaf; q++) {
      const ref_arg *x = &j->leaves[q];
      if (j->view[q].nd) {
        cpu_copy_gather(&j->view[q], c, n, leaf_buf[q]);
        leaf_data[q] = leaf_buf[q];
      } else {
        leaf_data[q] = (const char *)x->data + (size_t)c * graft_dtype_size(x->dtype);
      }
    }
    for (int m = 0; m < g->n; m++) {
      ref_arg a[GROUP_MAX_IN];
      part[m].numel = n;
      for (int k = 0; k < part[m].nin; k++) {
        int s = g->src[m][k];
        const exec_instr *x = &j->p->instr[part[m].in[k]];
        a[k] = (ref_arg){s >= 0 ? leaf_data[s] : node_buf[-1 - s], x->dtype, x->ndim, x->shape, n, NULL};
      }
      void *o = m == g->n - 1 ? j->out + (size_t)c * graft_dtype_size(part[m].dtype) : node_buf[m];
      if (g->fn[m](&part[m], a, o)) __atomic_store_n(&j->rc, -1, __ATOMIC_RELAXED);
    }
  }
  if (scratch != local) free(scratch);
}

static int groups_run(const ref_plan *pl, const exec_program *p, int i, const ref_arg *leaves,
                      void *out) {
  const cpu_groups *gs = pl->ctx;
  groups_job j = {p, gs->by_root[i], leaves, pl->nleaf[i], {{0}}, out, 0};
  for (int q = 0; q < j.nleaf; q++) cpu_copy_view(&j.view[q], &leaves[q]);
  void *S[1] = {&j};
  int64_t n = p->instr[i].numel;
  if (n < CPU_COPY_PAR_MIN) groups_range(S, 0, n);
  else cpu_parallel_run(groups_range, S, n);
  if (j.rc) return err_set(GRAFT_ERR_OOM, "out of memory for a fused group's scratch"), -1; /* the loops cannot fail: planned only for ops they run */
  return 0;
}

/* Root r's operand sources and leaves, its members listed (false: out of memory). */
static bool groups_build(const exec_program *p, ref_plan *pl, cpu_group *g, int r) {
  int *leaf = malloc(sizeof(int) * GROUP_MAX_LEAVES), nleaf = 0;
  if (!leaf) return false;
  for (int m = 0; m < g->n; m++) {
    const exec_instr *ins = &p->instr[g->node[m]];
    for (int k = 0; k < ins->nin; k++) {
      int s = ins->in[k], at = -1;
      for (int q = 0; q < m && at < 0; q++)
        if (g->node[q] == s) at = q;
      if (at >= 0) {
        g->src[m][k] = (signed char)(-1 - at);
        continue;
      }
      for (int q = 0; q < nleaf && at < 0; q++)
        if (leaf[q] == s) at = q;
      if (at < 0) leaf[at = nleaf++] = s;
      g->src[m][k] = (signed char)at;
    }
  }
  pl->leaf[r] = leaf;
  pl->nleaf[r] = nleaf;
  return true;
}

/* Root of x's group (inside chains followed to their end). */
static int groups_find(const int *inside, int x) {
  while (inside[x] >= 0) x = inside[x];
  return x;
}

void cpu_groups_free(ref_plan *pl) {
  cpu_groups *gs = pl->ctx;
  for (int i = 0; gs && i < gs->n; i++) {
    if (gs->by_root) free(gs->by_root[i]);
    if (pl->leaf) free(pl->leaf[i]);
  }
  if (gs) free(gs->by_root);
  free(gs);
  free(pl->inside), free(pl->last_use), free(pl->nleaf), free(pl->leaf);
  pl->ctx = NULL, pl->inside = pl->last_use = pl->nleaf = NULL, pl->leaf = NULL;
}

/* Merges each loop's single-reader loop operands into it, within the bounds. */
static int groups_merge(const exec_program *p, const ref_plan *pl, const ref_fn *fn) {
  int n = p->ninstr, merged = 0;
  int *readers = calloc((size_t)n + 1, sizeof(int)), *size = malloc(sizeof(int) * ((size_t)n + 1)),
      *leaves = malloc(sizeof(int) * ((size_t)n + 1));
  if (!readers || !size || !leaves) {
    free(readers), free(size), free(leaves);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    size[i] = 1, leaves[i] = p->instr[i].nin;
    for (int k = 0; k < p->instr[i].nin; k++) readers[p->instr[i].in[k]]++;
  }
  for (int j = 0; j < n; j++) {
    if (!fn[j]) continue;
    for (int k = 0; k < p->instr[j].nin; k++) {
      int i = p->instr[j].in[k];
      if (!fn[i] || readers[i] != 1 || p->instr[i].is_output || pl->inside[i] >= 0 ||
          (pl->views && pl->views[i].on) || size[j] + size[i] > GROUP_MAX_NODES ||
          leaves[j] - 1 + leaves[i] > GROUP_MAX_LEAVES)
        continue;
      pl->inside[i] = j, size[j] += size[i], leaves[j] += leaves[i] - 1, merged++;
    }
  }
  free(readers), free(size), free(leaves);
  return merged;
}

/* Whether loop x reads a view: it runs as a root (a group of one at least), whose runner
 * gathers its leaves' views. */
static bool groups_reads_view(const exec_program *p, const ref_plan *pl, int x) {
  for (int k = 0; pl->views && k < p->instr[x].nin; k++)
    if (pl->views[p->instr[x].in[k]].on) return true;
  return false;
}

bool cpu_groups_plan(const exec_program *p, ref_plan *pl, cpu_loop_fn loop_of) {
  int n = p->ninstr, roots = 0;
  const char *env = getenv("GRAFT_FIRST_TIER_FUSE"); /* 0: no loop runs inside another (A/B) */
  bool fuse = !env || strcmp(env, "0");
  ref_fn *fn = calloc((size_t)n + 1, sizeof *fn);
  pl->inside = malloc(sizeof(int) * ((size_t)n + 1));
  if (!fn || !pl->inside) goto oom;
  for (int i = 0; i < n; i++) {
    pl->inside[i] = -1;
    fn[i] = p->instr[i].nin <= GROUP_MAX_IN && p->instr[i].numel > 0 ? loop_of(p, i) : NULL;
  }
  int merged = fuse ? groups_merge(p, pl, fn) : 0;
  if (merged < 0) goto oom;
  for (int x = 0; x < n; x++) roots += fn[x] && groups_reads_view(p, pl, x);
  if (!merged && !roots) {
    free(fn), free(pl->inside);
    pl->inside = NULL;
    return true;
  }
  cpu_groups *gs = calloc(1, sizeof *gs);
  pl->ctx = gs;
  pl->nleaf = calloc((size_t)n + 1, sizeof(int));
  pl->leaf = calloc((size_t)n + 1, sizeof(int *));
  pl->last_use = malloc(sizeof(int) * ((size_t)n + 1));
  if (!gs || !(gs->by_root = calloc((size_t)n + 1, sizeof *gs->by_root)) || !pl->nleaf || !pl->leaf ||
      !pl->last_use)
    goto oom;
  gs->n = n;
  for (int i = 0; i < n; i++) {
    if (pl->inside[i] >= 0) pl->inside[i] = groups_find(pl->inside, i);
    pl->last_use[i] = -1;
  }
  for (int x = 0; x < n; x++) {
    int step = pl->inside[x] >= 0 ? pl->inside[x] : x; /* a member reads at its root's step */
    for (int k = 0; k < p->instr[x].nin; k++)
      if (pl->last_use[p->instr[x].in[k]] < step) pl->last_use[p->instr[x].in[k]] = step;
    int r = pl->inside[x] >= 0 ? pl->inside[x] : fn[x] && groups_reads_view(p, pl, x) ? x : -1;
    if (r >= 0 && !gs->by_root[r] && !(gs->by_root[r] = calloc(1, sizeof(cpu_group)))) goto oom;
  }
  for (int x = 0; x < n; x++) { /* members in program order: operands before readers, root last */
    cpu_group *g = gs->by_root[pl->inside[x] >= 0 ? pl->inside[x] : x];
    if (!g) continue;
    g->fn[g->n] = fn[x], g->node[g->n++] = x;
    if (pl->inside[x] < 0 && !groups_build(p, pl, g, x)) goto oom;
  }
  pl->run_root = groups_run;
  __atomic_fetch_add(&cpu_stats.fused, (uint64_t)merged, __ATOMIC_RELAXED);
  free(fn);
  return true;
oom:
  free(fn);
  cpu_groups_free(pl);
  err_set(GRAFT_ERR_OOM, "out of memory planning a graph's first tier");
  return false;
}
