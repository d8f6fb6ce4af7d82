/* A progressive build's kernels whose code has not landed (cpu_backend.c): each runs as a
 * small program of its own on the first tier (cpu_interp.c: its views, fused groups and typed
 * loops), made of the kernel's instructions (the values it writes, its outputs, and those it
 * inlines) with the buffers it reads as the program's inputs. One instruction at a time with
 * every inlined value in a buffer of its own, a convolution's input gradient had materialized
 * each tap's pad: 11 of an 82 ms resnet18 step for 7% of its kernel work. */
#include "cpu_internal.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  exec_program *p; /* NULL: the launch's body was compiled when the build was handed out */
  void *exe;       /* the first tier's plan of p */
  int *in_slot;    /* per input of p: the graph's slot it reads */
  int *out_slot;   /* per output of p: the graph's slot (a member of the launch) */
} partial_launch;

struct cpu_partial {
  int n;
  partial_launch *l;
};

/* Launch l's instructions in program order: its members and the inlined values they read
 * (not through a buffer), into list (at most ninstr); their count. */
static int partial_closure(const exec_program *p, const fuse_plan *pl, const cpu_code *c,
                           int l, int *list, int *stack, int *stamp) {
  const cpu_launch *la = &c->launch[l];
  int top = 0, len = 0;
  for (int m = 0; m < la->nmem; m++) {
    int s = c->members[la->mem0 + m];
    stamp[s] = l + 1;
    stack[top++] = s;
  }
  while (top) {
    int s = stack[--top];
    list[len++] = s;
    const exec_instr *x = &p->instr[s];
    for (int q = 0; q < x->nin; q++) {
      int in = x->in[q];
      if (stamp[in] == l + 1 || pl->role[in] != FUSE_INLINE) continue;
      stamp[in] = l + 1;
      stack[top++] = in;
    }
  }
  for (int a = 1; a < len; a++) /* operands first; cones are small */
    for (int b = a; b > 0 && list[b - 1] > list[b]; b--) {
      int t = list[b];
      list[b] = list[b - 1];
      list[b - 1] = t;
    }
  return len;
}

/* The program of launch l: its inputs (the buffers its instructions read) as data leaves,
 * then its instructions, its members the outputs. -1 when out of memory. */
static int partial_program(const exec_program *p, const cpu_code *c, int l, const int *list,
                           int len, int *idx, int *stamp, partial_launch *out) {
  const cpu_launch *la = &c->launch[l];
  int nin = 0, cap = 8;
  int *ins = malloc(sizeof(int) * (size_t)cap);
  if (!ins) return -1;
  int mark = -(l + 2); /* stamp: in the closure (l + 1, set by partial_closure) or an input */
  for (int a = 0; a < len; a++) {
    const exec_instr *x = &p->instr[list[a]];
    for (int q = 0; q < x->nin; q++) {
      int s = x->in[q];
      if (stamp[s] == l + 1 || stamp[s] == mark) continue;
      stamp[s] = mark;
      if (nin == cap) {
        int *n2 = realloc(ins, sizeof(int) * (size_t)(cap *= 2));
        if (!n2) {
          free(ins);
          return -1;
        }
        ins = n2;
      }
      idx[s] = nin;
      ins[nin++] = s;
    }
  }
  exec_program *m = calloc(1, sizeof *m);
  int n = nin + len;
  if (m) {
    m->instr = calloc((size_t)n, sizeof *m->instr);
    m->param_slot = malloc(sizeof(int) * ((size_t)nin + 1));
    m->output_slot = malloc(sizeof(int) * ((size_t)la->nmem + 1));
    out->out_slot = malloc(sizeof(int) * ((size_t)la->nmem + 1));
  }
  bool ok = m && m->instr && m->param_slot && m->output_slot && out->out_slot;
  if (m) m->ninstr = ok ? n : 0;
  for (int k = 0; ok && k < nin; k++) {
    const exec_instr *x = &p->instr[ins[k]];
    exec_instr *d = &m->instr[k];
    d->op = IR_DATA;
    d->dtype = x->dtype;
    d->ndim = x->ndim;
    memcpy(d->shape, x->shape, sizeof d->shape);
    d->numel = x->numel;
    m->param_slot[k] = k;
  }
  for (int a = 0; ok && a < len; a++) {
    idx[list[a]] = nin + a;
    exec_instr *d = &m->instr[nin + a];
    *d = p->instr[list[a]];
    d->is_output = false;
    d->in = malloc(sizeof(int) * ((size_t)d->nin + 1));
    if (!d->in) {
      ok = false;
      break;
    }
    for (int q = 0; q < d->nin; q++) d->in[q] = idx[p->instr[list[a]].in[q]];
  }
  for (int j = 0; ok && j < la->nmem; j++) {
    int s = c->members[la->mem0 + j];
    m->output_slot[j] = idx[s];
    m->instr[idx[s]].is_output = true;
    out->out_slot[j] = s;
  }
  if (ok) {
    m->nparams = nin;
    m->noutputs = la->nmem;
    m->device = p->device;
    m->hash = p->hash;
    for (int i = 0; i < n; i++) m->instr[i].last_use = -1;
    for (int i = 0; i < n; i++)
      for (int q = 0; q < m->instr[i].nin; q++) m->instr[m->instr[i].in[q]].last_use = i;
    out->exe = cpu_interp_backend.compile(m);
    ok = out->exe != NULL;
  }
  out->p = m;
  out->in_slot = ins;
  return ok ? 0 : -1;
}

cpu_partial *cpu_partial_plan(const exec_program *p, const fuse_plan *pl, const cpu_code *c,
                              cpu_kernel_fn const *fn) {
  int n = p->ninstr;
  cpu_partial *x = calloc(1, sizeof *x);
  int *list = malloc(sizeof(int) * ((size_t)n + 1)), *stack = malloc(sizeof(int) * ((size_t)n + 1));
  int *stamp = calloc((size_t)n + 1, sizeof(int)), *idx = malloc(sizeof(int) * ((size_t)n + 1));
  bool ok = x && list && stack && stamp && idx && (x->l = calloc((size_t)c->nlaunch + 1, sizeof *x->l));
  if (x) x->n = ok ? c->nlaunch : 0;
  for (int l = 0; ok && l < c->nlaunch; l++) {
    if (fn[c->launch[l].body]) continue;
    int len = partial_closure(p, pl, c, l, list, stack, stamp);
    ok = !partial_program(p, c, l, list, len, idx, stamp, &x->l[l]);
  }
  free(list);
  free(stack);
  free(stamp);
  free(idx);
  if (!ok) {
    cpu_partial_free(x);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory planning a progressive build");
    return NULL;
  }
  return x;
}

void cpu_partial_free(cpu_partial *x) {
  if (!x) return;
  for (int l = 0; l < x->n; l++) {
    if (x->l[l].exe) cpu_interp_backend.free_exe(x->l[l].exe);
    program_free(x->l[l].p);
    free(x->l[l].in_slot);
    free(x->l[l].out_slot);
  }
  free(x->l);
  free(x);
}

int cpu_partial_run(const cpu_partial *x, int l, exec_buffer **B, void **S) {
  const partial_launch *pl = &x->l[l];
  const exec_program *m = pl->p;
  exec_buffer *one[8], **in = m->nparams + m->noutputs <= 8 ? one : NULL;
  unsigned char flag[8], *was = m->nparams <= 8 ? flag : NULL;
  if (!in) in = calloc((size_t)(m->nparams + m->noutputs) + 1, sizeof *in);
  if (!was) was = malloc((size_t)m->nparams + 1);
  if (!in || !was) {
    if (in != one) free(in);
    if (was != flag) free(was);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory running a kernel on the first tier");
    return -1;
  }
  exec_buffer **outs = in + m->nparams;
  for (int k = 0; k < m->noutputs; k++) outs[k] = NULL;
  /* read, never consumed: a donated input is still the graph's (restored in reverse: one
   * buffer may be two inputs) */
  for (int k = 0; k < m->nparams; k++) {
    in[k] = B[pl->in_slot[k]];
    was[k] = in[k]->donated;
    in[k]->donated = 0;
  }
  int rc = cpu_interp_backend.execute(pl->exe, m, in, outs);
  for (int k = m->nparams - 1; k >= 0; k--) in[k]->donated = was[k];
  for (int j = 0; j < m->noutputs; j++) {
    exec_buffer *o = outs[j];
    int s = pl->out_slot[j];
    if (!o) continue;
    bool shared = false; /* a reshape of an input passes its buffer on: copied into the slot's */
    for (int k = 0; k < m->nparams && !shared; k++) shared = o == in[k];
    if (!rc && (!shared || !B[s])) {
      buffer_release(B[s]);
      B[s] = o;
      S[s] = o->ptr;
      continue;
    }
    if (!rc) memcpy(S[s], o->ptr, o->bytes < B[s]->bytes ? o->bytes : B[s]->bytes);
    buffer_release(o);
  }
  if (in != one) free(in);
  if (was != flag) free(was);
  return rc;
}
