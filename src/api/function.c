/* Functions: a traced computation recorded once and called again with other inputs
 * (graft_function_capture, graft_function_call). The record is a tape: the computation's nodes
 * in post-order, each an op with its attributes, dtype, shape and operands (tape indices), or a
 * leaf: a parameter (one of the inputs), a constant (any other materialized tensor, held by
 * reference) or a random draw's seed (drawn again at each call, so a function with dropout does
 * not repeat its mask). A call makes the nodes again over the call's inputs, without checks or
 * shape inference (the record was checked when it was traced): the graph is the traced one, so
 * the compile cache finds it, and no front-end work (PyTorch's dispatcher, graft's bridge, a C
 * caller's op calls) is repeated. */
#include "function.h"
#include "../core/loc.h"
#include "../graph/graph.h"
#include <stdlib.h>
#include <string.h>

void fn_free(graft_function *f) {
  if (!f) return;
  for (int i = 0; f->tape && i < f->n; i++)
    if (f->tape[i].leaf) ir_release(f->tape[i].leaf);
  free(f->tape);
  free(f->operand);
  free(f->out);
  free(f->same);
  free(f->order);
  free(f->in_sig);
  for (int k = 0; f->out_name && k < f->nout; k++) free(f->out_name[k]);
  free(f->out_name);
  free(f);
}

/* One value: the same node, or data leaves over the same buffer with the same dtype and shape
 * (a sync gives each tensor of one value its own leaf; a reshape of an output shares its
 * output's buffer under another shape, and is another value). */
static bool fn_same_value(const ir_node *a, const ir_node *b) {
  if (a == b) return true;
  return a->op == IR_DATA && b->op == IR_DATA && a->data && a->data == b->data &&
         a->dtype == b->dtype && a->ndim == b->ndim &&
         !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static void fn_fields(fn_entry *e, const ir_node *n) {
  e->op = n->op;
  e->dtype = n->dtype;
  e->ndim = n->ndim;
  e->device = n->device;
  memcpy(e->shape, n->shape, sizeof e->shape);
  e->attr = n->attr;
  e->loc = n->loc;
}

static const char *fn_shape(const fn_entry *e, char *buf, size_t n) {
  return ir_shape_str(e->ndim, e->shape, buf, n);
}

typedef struct {
  uint64_t seq; /* when the traced node was made */
  int i;        /* its tape index */
} fn_made;

static int fn_cmp_made(const void *a, const void *b) {
  const fn_made *x = a, *y = b;
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* f->order (the tape by when each traced node was made) made a valid order to make them in:
 * each entry after its operands, taken as early as the order allows. A sync can give an older
 * node a newer operand (a value materialized later), so the creation order alone is not always
 * one. */
int fn_topo_order(graft_function *f) {
  int n = f->n, m = 0;
  unsigned char *done = calloc((size_t)n + 1, 1);
  int *out = malloc(sizeof(int) * ((size_t)n + 1)), *stack = malloc(sizeof(int) * ((size_t)n + 1));
  int *next = calloc((size_t)n + 1, sizeof(int));
  if (!done || !out || !stack || !next) {
    free(done), free(out), free(stack), free(next);
    return -1;
  }
  for (int j = 0; j < n; j++) {
    int top = 0;
    if (!done[f->order[j]]) stack[top++] = f->order[j];
    while (top) { /* a DAG: an entry is on the stack at most once at a time */
      int i = stack[top - 1];
      if (next[i] < f->tape[i].nin) {
        int c = f->operand[f->tape[i].in0 + next[i]++];
        if (!done[c]) stack[top++] = c;
        continue;
      }
      top--;
      if (!done[i]) done[i] = 1, out[m++] = i;
    }
  }
  memcpy(f->order, out, sizeof(int) * (size_t)n);
  free(done), free(out), free(stack), free(next);
  return 0;
}

/* The tape of capture g: a leaf that is input k's node is parameter k; a 0-d i64 leaf that a
 * random draw takes as its seed is drawn again; any other leaf is a constant. */
static int fn_record(graft_function *f, const graph_capture *g, ir_node *const *in_nodes) {
  f->n = g->n;
  f->tape = calloc((size_t)g->n + 1, sizeof *f->tape);
  int total = 0;
  for (int i = 0; i < g->n; i++) total += g->nodes[i]->nin;
  f->operand = malloc(sizeof(int) * ((size_t)total + 1));
  if (!f->tape || !f->operand) return -1;
  for (int i = 0, at = 0; i < g->n; i++) {
    const ir_node *n = g->nodes[i];
    fn_entry *e = &f->tape[i];
    fn_fields(e, n);
    e->param = -1;
    e->kind = FN_OP;
    if (n->op == IR_DATA) {
      for (int k = 0; k < f->nin && e->param < 0; k++)
        if (fn_same_value(in_nodes[k], n)) e->param = k;
      e->kind = e->param >= 0 ? FN_PARAM : FN_CONST;
    }
    e->nin = n->nin;
    e->in0 = at;
    for (int k = 0; k < n->nin; k++) f->operand[at++] = n->in[k]->slot;
  }
  f->noperand = total;
  fn_made *key = malloc(sizeof *key * ((size_t)g->n + 1));
  f->order = malloc(sizeof(int) * ((size_t)g->n + 1));
  if (!key || !f->order) {
    free(key);
    return -1;
  }
  for (int i = 0; i < g->n; i++) key[i] = (fn_made){g->nodes[i]->seq, i};
  qsort(key, (size_t)g->n, sizeof *key, fn_cmp_made);
  for (int i = 0; i < g->n; i++) f->order[i] = key[i].i;
  free(key);
  for (int i = 0; i < g->n; i++) { /* seeds: the operand of a random draw */
    const fn_entry *e = &f->tape[i];
    if (e->op == IR_RNG && e->nin == 1) {
      fn_entry *s = &f->tape[f->operand[e->in0]];
      if (s->kind == FN_CONST && s->dtype == GRAFT_I64 && s->ndim == 0) s->kind = FN_SEED;
    }
  }
  /* a value computed after the inputs came from them: a sync inside (a function of no inputs,
   * named tensors, holds values whatever made them) */
  uint64_t newest = 0;
  for (int k = 0; k < f->nin; k++)
    if (in_nodes[k]->seq > newest) newest = in_nodes[k]->seq;
  for (int i = 0; i < g->n; i++) {
    const ir_node *n = g->nodes[i];
    if (f->nin && f->tape[i].kind == FN_CONST && n->computed && n->seq > newest) {
      char sh[128], where[400];
      loc_str(n->loc, where, sizeof where);
      err_set(GRAFT_ERR_ARG, "graft_function_capture: the computation reads %s %s%s%s, computed "
              "after its inputs were: a sync inside it (an op that read a value) cut the graph "
              "there, so it cannot be recorded whole", graft_dtype_name(n->dtype),
              ir_shape_str(n->ndim, n->shape, sh, sizeof sh), where[0] ? " made at " : "", where);
      return -1;
    }
  }
  for (int i = 0; i < g->n; i++)
    if (f->tape[i].kind == FN_CONST) {
      f->tape[i].leaf = g->nodes[i];
      ir_retain(g->nodes[i]);
    }
  return fn_topo_order(f);
}

graft_function *graft_function_capture(int nin, graft_tensor *const *inputs, int nout,
                                       graft_tensor *const *outputs) {
  const char *fn = "graft_function_capture";
  if (nin < 0 || nout < 1 || (nin && !inputs) || !outputs)
    return err_set(GRAFT_ERR_ARG, "%s: needs at least one output and valid arrays (got %d "
                   "inputs, %d outputs)", fn, nin, nout);
  tensor_lock();
  graft_function *f = calloc(1, sizeof *f);
  ir_node **in_nodes = malloc(sizeof *in_nodes * ((size_t)nin + 1));
  ir_node **roots = malloc(sizeof *roots * ((size_t)nout + 1));
  graph_capture g = {0};
  bool ok = f && in_nodes && roots;
  if (!ok) err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
  if (ok) {
    f->nin = nin, f->nout = nout;
    f->in_sig = calloc((size_t)nin + 1, sizeof *f->in_sig);
    f->out = malloc(sizeof(int) * ((size_t)nout + 1));
    f->same = malloc(sizeof(int) * ((size_t)nin + 1));
    ok = f->in_sig && f->out && f->same;
    if (!ok) err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
  }
  for (int k = 0; ok && k < nin; k++) {
    ir_node *n = api_in(inputs[k], fn);
    if (n && n->op != IR_DATA) {
      err_set(GRAFT_ERR_ARG, "%s: input %d is pending (not computed yet): an input must be "
              "materialized (graft_sync) before the computation that reads it is traced", fn, k);
      n = NULL;
    }
    ok = n != NULL;
    if (ok) in_nodes[k] = n, fn_fields(&f->in_sig[k], n);
    f->same[k] = k; /* an input given twice (the same value): a call must do the same */
    for (int j = 0; ok && j < k && f->same[k] == k; j++)
      if (fn_same_value(in_nodes[j], n)) f->same[k] = j;
  }
  for (int k = 0; ok && k < nout; k++) ok = (roots[k] = api_in(outputs[k], fn)) != NULL;
  if (ok) ok = capture_run(&g, roots, nout) == 0 && fn_record(f, &g, in_nodes) == 0;
  if (ok)
    for (int k = 0; k < nout; k++) f->out[k] = g.out_slot[k];
  else if (!err_pending())
    err_set(GRAFT_ERR_OOM, "%s: out of memory recording %d nodes", fn, g.n);
  capture_free(&g);
  free(in_nodes);
  free(roots);
  tensor_unlock();
  if (ok) return f;
  fn_free(f);
  return NULL;
}

/* The call's node for tape entry i, over the nodes made so far (a new reference). */
static ir_node *fn_node(const graft_function *f, int i, ir_node **made, ir_node *const *in_nodes) {
  const fn_entry *e = &f->tape[i];
  switch (e->kind) {
  case FN_PARAM: ir_retain(in_nodes[e->param]); return in_nodes[e->param];
  case FN_CONST: ir_retain(e->leaf); return e->leaf;
  case FN_SEED: return api_rng_seed(e->device);
  case FN_OP: break;
  }
  ir_node *ops[16], **in = ops;
  if (e->nin > 16 && !(in = malloc(sizeof *in * (size_t)e->nin)))
    return err_set(GRAFT_ERR_OOM, "graft_function_call: out of memory");
  for (int k = 0; k < e->nin; k++) in[k] = made[f->operand[e->in0 + k]];
  ir_node *n = ir_make_raw(e->op, e->dtype, e->ndim, e->shape, &e->attr, e->device, e->loc,
                           e->nin, in);
  if (in != ops) free(in);
  return n;
}

/* Input k against the recorded one: dtype, shape and device must agree. */
static int fn_check_input(const graft_function *f, int k, const ir_node *n) {
  const fn_entry *s = &f->in_sig[k];
  bool same = n->dtype == s->dtype && n->ndim == s->ndim && n->device == s->device &&
              !memcmp(n->shape, s->shape, sizeof(int64_t) * (size_t)n->ndim);
  if (same) return 0;
  char a[128], b[128];
  err_set(GRAFT_ERR_SHAPE, "graft_function_call: input %d is %s %s on device %d; the function "
          "was recorded with %s %s on device %d", k, graft_dtype_name(n->dtype),
          ir_shape_str(n->ndim, n->shape, a, sizeof a), n->device, graft_dtype_name(s->dtype),
          fn_shape(s, b, sizeof b), s->device);
  return -1;
}

graft_status graft_function_call(graft_function *f, int nin, graft_tensor *const *inputs,
                                 int nout, graft_tensor **outputs) {
  const char *fn = "graft_function_call";
  if (!f || !outputs || (nin && !inputs)) {
    err_set(GRAFT_ERR_NULL, "%s: the function or an array is NULL", fn);
    return GRAFT_ERR_NULL;
  }
  if (nin != f->nin || nout != f->nout) {
    err_set(GRAFT_ERR_ARG, "%s: the function takes %d inputs and gives %d outputs; called with "
            "%d and %d", fn, f->nin, f->nout, nin, nout);
    return GRAFT_ERR_ARG;
  }
  for (int k = 0; k < nout; k++) outputs[k] = NULL;
  tensor_lock();
  ir_node **in_nodes = malloc(sizeof *in_nodes * ((size_t)nin + 1));
  ir_node **made = calloc((size_t)f->n + 1, sizeof *made);
  bool ok = in_nodes && made;
  if (!ok) err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
  for (int k = 0; ok && k < nin; k++) {
    in_nodes[k] = api_in(inputs[k], fn);
    ok = in_nodes[k] && !fn_check_input(f, k, in_nodes[k]);
    if (ok && !fn_same_value(in_nodes[f->same[k]], in_nodes[k])) { /* the graph has one value */
      err_set(GRAFT_ERR_ARG, "%s: inputs %d and %d were the same tensor when the function was "
              "recorded, and are not now", fn, f->same[k], k);
      ok = false;
    }
  }
  for (int j = 0; ok && j < f->n; j++) {
    int i = f->order[j];
    ok = (made[i] = fn_node(f, i, made, in_nodes)) != NULL;
  }
  for (int k = 0; ok && k < nout; k++) {
    ir_retain(made[f->out[k]]);
    ok = (outputs[k] = tensor_wrap(made[f->out[k]])) != NULL;
  }
  for (int i = 0; made && i < f->n; i++)
    if (made[i]) ir_release(made[i]);
  free(made);
  free(in_nodes);
  graft_status st = ok ? GRAFT_OK : graft_last_status() ? graft_last_status() : GRAFT_ERR_OOM;
  if (ok) metrics.m.nodes_traced += (uint64_t)f->n;
  tensor_unlock();
  if (!ok) /* none half-made: the outputs made so far go (graft_release takes the lock) */
    for (int k = 0; k < nout; k++)
      if (outputs[k]) graft_release(outputs[k]), outputs[k] = NULL;
  return st;
}

int graft_function_inputs(const graft_function *f) { return f ? f->nin : -1; }
int graft_function_outputs(const graft_function *f) { return f ? f->nout : -1; }

graft_status graft_function_set_output_name(graft_function *f, int k, const char *name) {
  const char *fn = "graft_function_set_output_name";
  if (!f || !name)
    return err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, f ? "name" : "the function"), GRAFT_ERR_NULL;
  if (k < 0 || k >= f->nout)
    return err_set(GRAFT_ERR_ARG, "%s: output %d of a function of %d outputs", fn, k, f->nout),
           GRAFT_ERR_ARG;
  if (!*name || strlen(name) > FN_NAME_MAX)
    return err_set(GRAFT_ERR_ARG, "%s: a name is 1 to %d bytes", fn, FN_NAME_MAX), GRAFT_ERR_ARG;
  char *copy = strdup(name);
  if (!f->out_name) f->out_name = calloc((size_t)f->nout, sizeof *f->out_name);
  if (!copy || !f->out_name) {
    free(copy);
    return err_set(GRAFT_ERR_OOM, "%s: out of memory", fn), GRAFT_ERR_OOM;
  }
  free(f->out_name[k]);
  f->out_name[k] = copy;
  return GRAFT_OK;
}

const char *graft_function_output_name(const graft_function *f, int k) {
  return f && k >= 0 && k < f->nout && f->out_name ? f->out_name[k] : NULL;
}

void graft_function_free(graft_function *f) {
  tensor_lock();
  fn_free(f);
  tensor_unlock();
}
