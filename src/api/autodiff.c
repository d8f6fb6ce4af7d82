/* graft_grad / graft_vjp: reverse-mode gradients over the pending IR. The walk (under the lock)
 * orders the nodes behind the output, operands first, and marks those that lie on a float path
 * from a wrt tensor; then, from the output back, each marked node's rule (autodiff_rules.c)
 * turns its gradient into its operands', summed where a value feeds several nodes. The rules
 * run on the public API (unlocked), so the gradients are pending IR: the forward, the backward
 * and whatever update follows are one graph at the next sync. A value already computed by a
 * sync is a data leaf: the graph behind it is gone, so gradients stop there. */
#include "autodiff.h"
#include "api.h"
#include "composite.h"
#include "../core/loc.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  ir_node *n;
  graft_tensor *h; /* n's value as a handle (made for the nodes rules read) */
  graft_tensor *g; /* the gradient reaching n so far */
  bool on_path;    /* float, and some wrt tensor reaches the output through it */
} ad_entry;

typedef struct {
  ad_entry *e;    /* in discovery order */
  int64_t *order; /* entry indices, operands before their users (post-order) */
  int64_t n, norder, cap;
  int64_t *map; /* open addressing: node -> entry index + 1 (0 empty) */
  int64_t mapcap;
} ad_graph;

static uint64_t ad_hash(const ir_node *n) {
  uint64_t h = (uint64_t)(uintptr_t)n * 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

static int64_t ad_find(const ad_graph *G, const ir_node *n) {
  if (!G->mapcap) return -1;
  uint64_t m = (uint64_t)G->mapcap - 1;
  for (uint64_t i = ad_hash(n) & m;; i = (i + 1) & m) {
    int64_t k = G->map[i];
    if (!k) return -1;
    if (G->e[k - 1].n == n) return k - 1;
  }
}

static void ad_map_put(ad_graph *G, int64_t idx) {
  uint64_t m = (uint64_t)G->mapcap - 1, i = ad_hash(G->e[idx].n) & m;
  while (G->map[i]) i = (i + 1) & m;
  G->map[i] = idx + 1;
}

/* A new entry for n; its index, or -1 out of memory. */
static int64_t ad_add(ad_graph *G, ir_node *n) {
  if (G->n == G->cap) {
    int64_t cap = G->cap ? 2 * G->cap : 256;
    ad_entry *e = realloc(G->e, sizeof *e * (size_t)cap);
    if (!e) return -1;
    G->e = e;
    int64_t *o = realloc(G->order, sizeof *o * (size_t)cap);
    if (!o) return -1;
    G->order = o, G->cap = cap;
  }
  if (2 * (G->n + 1) > G->mapcap) { /* grow and rehash */
    int64_t cap = G->mapcap ? 2 * G->mapcap : 512;
    int64_t *m = calloc((size_t)cap, sizeof *m);
    if (!m) return -1;
    free(G->map);
    G->map = m, G->mapcap = cap;
    for (int64_t k = 0; k < G->n; k++) ad_map_put(G, k);
  }
  G->e[G->n] = (ad_entry){.n = n};
  ad_map_put(G, G->n);
  return G->n++;
}

static bool ad_float(graft_dtype dt) {
  return dt == GRAFT_F32 || dt == GRAFT_F64 || dt == GRAFT_F16 || dt == GRAFT_BF16;
}

/* Every node behind root, and their post-order (an explicit stack: a graph may be long). */
static bool ad_walk(ad_graph *G, ir_node *root) {
  typedef struct { int64_t e; int next; } frame;
  int64_t cap = 256, top = 0, r = ad_add(G, root);
  frame *st = malloc(sizeof *st * (size_t)cap);
  if (!st || r < 0) return free(st), false;
  st[top++] = (frame){r, 0};
  while (top) {
    frame *f = &st[top - 1];
    ir_node *n = G->e[f->e].n;
    if (f->next == n->nin) {
      G->order[G->norder++] = f->e;
      top--;
      continue;
    }
    ir_node *c = n->in[f->next++];
    if (ad_find(G, c) >= 0) continue; /* done, or on the stack: a shared operand */
    int64_t k = ad_add(G, c);
    if (k < 0) return free(st), false;
    if (top == cap) {
      frame *s2 = realloc(st, sizeof *st * (size_t)(cap *= 2));
      if (!s2) return free(st), false;
      st = s2;
    }
    st[top++] = (frame){k, 0};
  }
  free(st);
  return true;
}

static void ad_graph_free(ad_graph *G) {
  free(G->e);
  free(G->order);
  free(G->map);
}

/* The value handle of entry i (lock held). */
static graft_tensor *ad_handle(ad_graph *G, int64_t i) {
  if (!G->e[i].h) {
    ir_retain(G->e[i].n);
    G->e[i].h = tensor_wrap(G->e[i].n);
  }
  return G->e[i].h;
}

/* Walks the graph behind out (lock held): post-order, the path marks, and handles for every
 * node a rule reads. *out_idx / wrt_idx[i]: the entries of out and of each wrt tensor (-1: not
 * behind out). */
static graft_status ad_prepare(const char *fn, ad_graph *G, graft_tensor *out, graft_tensor *cot,
                               int n, graft_tensor *const *wrt, int64_t *wrt_idx) {
  ir_node *o = api_in(out, fn);
  if (!o) return graft_last_status();
  if (!ad_float(o->dtype))
    return err_set(GRAFT_ERR_DTYPE, "%s: the output is %s; only float outputs have gradients", fn,
                   graft_dtype_name(o->dtype)), GRAFT_ERR_DTYPE;
  if (cot) {
    ir_node *c = api_in(cot, fn);
    if (!c) return graft_last_status();
    if (c->dtype != o->dtype || c->ndim != o->ndim ||
        memcmp(c->shape, o->shape, sizeof(int64_t) * (size_t)o->ndim))
      return err_set(GRAFT_ERR_SHAPE, "%s: the cotangent must have the output's shape and dtype",
                     fn), GRAFT_ERR_SHAPE;
  } else if (o->numel != 1) {
    return err_set(GRAFT_ERR_SHAPE, "%s: the output has %lld elements; graft_grad takes a "
                   "one-element loss (graft_vjp takes any output with its cotangent)", fn,
                   (long long)o->numel), GRAFT_ERR_SHAPE;
  }
  ir_node *w[n > 0 ? n : 1];
  for (int i = 0; i < n; i++) {
    if (!(w[i] = api_in(wrt[i], fn))) return graft_last_status();
    if (!ad_float(w[i]->dtype))
      return err_set(GRAFT_ERR_DTYPE, "%s: wrt[%d] is %s; only float tensors have gradients", fn,
                     i, graft_dtype_name(w[i]->dtype)), GRAFT_ERR_DTYPE;
  }
  if (o->op == IR_DATA && o->computed) {
    bool listed = false;
    for (int i = 0; i < n; i++) listed = listed || w[i] == o;
    if (!listed)
      return err_set(GRAFT_ERR_ARG, "%s: the output was computed by an earlier sync, so the graph "
                     "behind it is gone: take gradients before syncing it", fn), GRAFT_ERR_ARG;
  }
  if (!ad_walk(G, o)) return err_set(GRAFT_ERR_OOM, "%s: out of memory", fn), GRAFT_ERR_OOM;
  for (int i = 0; i < n; i++) {
    wrt_idx[i] = ad_find(G, w[i]);
    if (wrt_idx[i] >= 0) G->e[wrt_idx[i]].on_path = true;
  }
  for (int64_t q = 0; q < G->norder; q++) { /* operands come first */
    ad_entry *e = &G->e[G->order[q]];
    for (int j = 0; j < e->n->nin && !e->on_path && ad_float(e->n->dtype); j++)
      e->on_path = G->e[ad_find(G, e->n->in[j])].on_path;
  }
  /* handles keep what the backward pass reads alive (an automatic sync past the pending limit
   * replaces pending nodes in their tensors): every node it visits, and a rule's operands */
  for (int64_t k = 0; k < G->n; k++) {
    ad_entry *e = &G->e[k];
    if (!e->on_path || !e->n->nin) continue;
    if (!ad_handle(G, k)) return graft_last_status();
    for (int j = 0; j < e->n->nin && ir_ops[e->n->op].grad == OPS_GRAD_VJP; j++)
      if (!ad_handle(G, ad_find(G, e->n->in[j]))) return graft_last_status();
  }
  return GRAFT_OK;
}

/* Runs entry k's rule on its gradient, adding what it gives to its operands' (unlocked). */
static graft_status ad_back(const char *fn, ad_graph *G, int64_t k) {
  ad_entry *e = &G->e[k];
  ir_node *n = e->n;
  bool any = false; /* a wrt tensor no other reaches through this node: nothing to pass on */
  for (int j = 0; j < n->nin && !any; j++) any = G->e[ad_find(G, n->in[j])].on_path;
  if (!any) return GRAFT_OK;
  switch (ir_ops[n->op].grad) {
  case OPS_GRAD_LEAF: case OPS_GRAD_ZERO: return GRAFT_OK;
  case OPS_GRAD_NONE: {
    char where[256];
    const char *at = loc_str(n->loc, where, sizeof where);
    return err_set(GRAFT_ERR_ARG, "%s: the gradient must pass through %s%s%s, which has no "
                   "gradient rule", fn, ir_ops[n->op].name, *at ? " traced at " : "", at),
           GRAFT_ERR_ARG;
  }
  case OPS_GRAD_VJP: break;
  }
  graft_tensor *in[n->nin], *gin[n->nin];
  bool need[n->nin];
  int64_t idx[n->nin];
  for (int j = 0; j < n->nin; j++) {
    idx[j] = ad_find(G, n->in[j]);
    in[j] = G->e[idx[j]].h, gin[j] = NULL;
    need[j] = G->e[idx[j]].on_path;
  }
  ad_op o = {n->op, &n->attr, e->h, n->nin, in, need};
  if (ad_rules[n->op](&o, e->g, gin)) {
    err_rename(fn);
    return graft_last_status();
  }
  for (int j = 0; j < n->nin; j++) {
    if (!need[j] || !gin[j]) continue;
    ad_entry *u = &G->e[idx[j]];
    u->g = u->g ? graft_add(u->g, gin[j]) : gin[j];
    if (!u->g) {
      err_rename(fn);
      return graft_last_status();
    }
  }
  return GRAFT_OK;
}

/* The gradient of wrt[i] as a new handle: what reached it, or zeros where nothing did; a wrt
 * tensor listed twice gets two handles. */
static graft_tensor *ad_result(ad_graph *G, int64_t k, graft_tensor *w, graft_tensor **done, int i) {
  int64_t s[GRAFT_MAX_DIMS];
  int nd = graft_shape(w, s);
  graft_tensor *g = k >= 0 ? G->e[k].g : NULL;
  if (!g) return graft_zeros_on(graft_get_dtype(w), nd, s, graft_device(w));
  for (int j = 0; j < i; j++)
    if (done[j] == g) return graft_broadcast_to(g, nd, s); /* a new handle on the same value */
  return g;
}

graft_status graft_vjp(graft_tensor *out, graft_tensor *cotangent, int n, graft_tensor *const *wrt,
                       graft_tensor **grads) {
  const char *fn = cotangent ? "graft_vjp" : "graft_grad";
  if (n < 0) return err_set(GRAFT_ERR_ARG, "%s: n = %d < 0", fn, n), GRAFT_ERR_ARG;
  if (n && (!wrt || !grads))
    return err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, wrt ? "grads" : "wrt"), GRAFT_ERR_NULL;
  for (int i = 0; i < n; i++) grads[i] = NULL;
  if (comp_bad_input(fn, "the output", out)) return graft_last_status();
  int64_t wrt_idx[n > 0 ? n : 1];
  ad_graph G = {0};
  graft_scope_begin();
  tensor_lock();
  graft_status st = ad_prepare(fn, &G, out, cotangent, n, wrt, wrt_idx);
  tensor_unlock();
  if (st == GRAFT_OK) {
    ad_entry *root = &G.e[0]; /* the walk starts at the output */
    int64_t s[GRAFT_MAX_DIMS];
    int nd = graft_shape(out, s);
    root->g = cotangent ? graft_broadcast_to(cotangent, nd, s)
                        : graft_ones_on(graft_get_dtype(out), nd, s, graft_device(out));
    if (!root->g) st = graft_last_status();
  }
  for (int64_t q = G.norder - 1; q >= 0 && st == GRAFT_OK; q--) { /* users before operands */
    int64_t k = G.order[q];
    if (G.e[k].on_path && G.e[k].g) st = ad_back(fn, &G, k);
  }
  for (int i = 0; i < n && st == GRAFT_OK; i++)
    if (!(grads[i] = ad_result(&G, wrt_idx[i], wrt[i], grads, i))) st = graft_last_status();
  for (int i = 0; i < n && st == GRAFT_OK; i++) graft_keep(grads[i]);
  if (st != GRAFT_OK)
    for (int i = 0; i < n; i++) grads[i] = NULL; /* the scope releases what was made */
  graft_scope_end();
  ad_graph_free(&G);
  return st;
}

graft_status graft_grad(graft_tensor *loss, int n, graft_tensor *const *wrt, graft_tensor **grads) {
  return graft_vjp(loss, NULL, n, wrt, grads);
}
