/* Graph capture: an iterative post-order walk from the roots, de-duplicating shared nodes and
 * data leaves, hashing the graph as it goes (node identity + operand wiring, so two graphs with
 * equal hashes bind their parameters the same way). */
#include "graph.h"
#include "../core/error.h"
#include <stdlib.h>
#include <string.h>

static uint64_t capture_epoch;
static uint64_t capture_forced_hash;

void capture_test_force_hash(uint64_t hash) { capture_forced_hash = hash; }

static int grow(void **arr, int *cap, int need, size_t elem) {
  if (need <= *cap) return 0;
  int nc = *cap ? *cap : 64;
  while (nc < need) nc *= 2;
  void *p = realloc(*arr, (size_t)nc * elem);
  if (!p) {
    err_set(GRAFT_ERR_OOM, "out of memory capturing a graph of %d nodes", need);
    return -1;
  }
  *arr = p;
  *cap = nc;
  return 0;
}

typedef struct {
  ir_node *node;
  int next;
} frame;
static frame *stack;
static int stack_cap;

int capture_run(graph_capture *g, ir_node *const *roots, int nroots) {
  uint64_t epoch = ++capture_epoch;
  g->n = g->nparams = 0;
  g->nroots = nroots;
  if (grow((void **)&g->out_slot, &g->rcap, nroots, sizeof(int))) return -1;
  uint64_t h = 0x63617074ull, hs = h;
  for (int r = 0; r < nroots; r++) {
    ir_node *root = roots[r];
    if (root->mark != epoch) {
      int top = 0;
      if (grow((void **)&stack, &stack_cap, 1, sizeof(frame))) return -1;
      stack[top++] = (frame){root, 0};
      root->mark = epoch;
      while (top) {
        frame *f = &stack[top - 1];
        ir_node *n = f->node;
        if (f->next < n->nin) {
          ir_node *c = n->in[f->next++];
          if (c->mark == epoch) continue;
          c->mark = epoch;
          if (grow((void **)&stack, &stack_cap, top + 1, sizeof(frame))) return -1;
          stack[top++] = (frame){c, 0};
          continue;
        }
        top--;
        if (grow((void **)&g->nodes, &g->cap, g->n + 1, sizeof(ir_node *))) return -1;
        n->slot = g->n;
        g->nodes[g->n++] = n;
        h = ir_mix(h, n->lhash);
        hs = ir_mix(hs, (uint64_t)n->op);
        for (int i = 0; i < n->nin; i++) {
          h = ir_mix(h, (uint64_t)n->in[i]->slot);
          hs = ir_mix(hs, (uint64_t)n->in[i]->slot);
        }
        if (n->op == IR_DATA) {
          if (grow((void **)&g->params, &g->pcap, g->nparams + 1, sizeof(ir_node *))) return -1;
          g->params[g->nparams++] = n;
        }
      }
    }
    g->out_slot[r] = root->slot;
    h = ir_mix(h, 0xffff0000ull | (uint64_t)root->slot);
    hs = ir_mix(hs, 0xffff0000ull | (uint64_t)root->slot);
  }
  g->hash = capture_forced_hash ? capture_forced_hash : h;
  g->shape_free = hs;
  return 0;
}

/* Marks the pending nodes reachable from roots with epoch. Data leaves are not walked, and
 * nodes without operands (constants, iotas) not marked: computing one again costs nothing,
 * and a live constant synced with a read would make the next graph of the same code another
 * graph (a parameter where the first had a constant). */
static int capture_mark_pending(ir_node *const *roots, int nroots, uint64_t epoch) {
  int top = 0;
  for (int r = 0; r < nroots; r++) {
    if (roots[r]->op == IR_DATA || roots[r]->nin == 0 || roots[r]->mark == epoch) continue;
    if (grow((void **)&stack, &stack_cap, top + 1, sizeof(frame))) return -1;
    roots[r]->mark = epoch;
    stack[top++] = (frame){roots[r], 0};
    while (top) {
      ir_node *n = stack[--top].node;
      for (int i = 0; i < n->nin; i++) {
        ir_node *c = n->in[i];
        if (c->op == IR_DATA || c->nin == 0 || c->mark == epoch) continue;
        c->mark = epoch;
        if (grow((void **)&stack, &stack_cap, top + 1, sizeof(frame))) return -1;
        stack[top++] = (frame){c, 0};
      }
    }
  }
  return 0;
}

int capture_overlap(ir_node *const *roots, int nroots, ir_node *const *cand, int ncand,
                    bool *overlaps) {
  uint64_t in_roots = ++capture_epoch, clear = ++capture_epoch, shared = ++capture_epoch;
  if (capture_mark_pending(roots, nroots, in_roots)) return -1;
  for (int c = 0; c < ncand; c++) { /* post-order; each node's answer kept in its mark */
    ir_node *root = cand[c];
    overlaps[c] = root->mark == shared; /* one the roots' sync computes is not: the sync's
                                         * own intermediate (a C scope's, a Python local) */
    if (root->op == IR_DATA || root->mark == in_roots || root->mark == clear ||
        root->mark == shared)
      continue;
    int top = 0;
    if (grow((void **)&stack, &stack_cap, 1, sizeof(frame))) return -1;
    stack[top++] = (frame){root, 0};
    root->mark = clear;
    while (top) {
      frame *f = &stack[top - 1];
      ir_node *n = f->node;
      if (f->next < n->nin) {
        ir_node *k = n->in[f->next++];
        if (k->mark == in_roots || k->mark == shared) {
          n->mark = shared;
        } else if (k->op != IR_DATA && k->mark != clear) {
          k->mark = clear;
          if (grow((void **)&stack, &stack_cap, top + 1, sizeof(frame))) return -1;
          stack[top++] = (frame){k, 0};
        }
        continue;
      }
      top--;
      if (top && n->mark == shared) stack[top - 1].node->mark = shared;
    }
    overlaps[c] = root->mark == shared;
  }
  return 0;
}

void capture_free(graph_capture *g) {
  free(g->nodes);
  free(g->params);
  free(g->out_slot);
  memset(g, 0, sizeof *g);
  free(stack);
  stack = NULL;
  stack_cap = 0;
}

exec_program *capture_lower(const graph_capture *g) {
  exec_program *p = calloc(1, sizeof *p);
  if (!p) return err_set(GRAFT_ERR_OOM, "out of memory lowering a graph");
  p->hash = g->hash;
  p->shape_free = g->shape_free;
  p->ninstr = g->n;
  p->instr = calloc((size_t)g->n, sizeof *p->instr);
  p->nparams = g->nparams;
  p->param_slot = calloc((size_t)g->nparams + 1, sizeof(int));
  p->output_slot = calloc((size_t)g->nroots + 1, sizeof(int));
  p->device = g->n ? g->nodes[0]->device : 0;
  if (!p->instr || !p->param_slot || !p->output_slot) goto oom;
  for (int i = 0; i < g->n; i++) {
    const ir_node *n = g->nodes[i];
    exec_instr *ins = &p->instr[i];
    ins->op = n->op;
    ins->dtype = n->dtype;
    ins->ndim = n->ndim;
    memcpy(ins->shape, n->shape, sizeof ins->shape);
    ins->numel = n->numel;
    ins->attr = n->attr;
    ins->loc = n->loc;
    ins->opname = n->opname;
    p->has_collective |= ir_ops[n->op].kind == IR_K_COLLECTIVE;
    ins->nin = n->nin;
    ins->last_use = -1;
    ins->in = calloc((size_t)n->nin + 1, sizeof(int));
    if (!ins->in) goto oom;
    for (int k = 0; k < n->nin; k++) {
      ins->in[k] = n->in[k]->slot;
      p->instr[ins->in[k]].last_use = i;
    }
  }
  for (int k = 0; k < g->nparams; k++) p->param_slot[k] = g->params[k]->slot;
  /* Outputs are unique slots; several roots may name one. */
  for (int r = 0; r < g->nroots; r++) {
    int s = g->out_slot[r];
    if (!p->instr[s].is_output) {
      p->instr[s].is_output = true;
      p->output_slot[p->noutputs++] = s;
    }
  }
  return p;
oom:
  program_free(p);
  return err_set(GRAFT_ERR_OOM, "out of memory lowering a graph of %d nodes", g->n);
}
