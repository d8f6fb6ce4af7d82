/* One forward sweep over the post-ordered program (operands come before users), then DCE and
 * compaction. Each instruction is first simplified or folded, then looked up for CSE. */
#include "passes.h"
#include "error.h"
#include <stdlib.h>
#include <string.h>

static bool same_shape(const exec_instr *a, const exec_instr *b) {
  return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* A constant instruction's value if it is one: its dtype's value (i32 3.7 is 3, u8 300 is 44),
 * whatever the program holds, for folding and identities. */
static bool const_value(const exec_instr *ins, double *v) {
  if (ins->op != IR_CONSTANT) return false;
  *v = dtype_round(ins->dtype, ins->attr.f);
  return true;
}

/* Returns the slot ins can be replaced by, or -1. */
static int simplify(const exec_program *p, const exec_instr *ins) {
  const exec_instr *a = ins->nin ? &p->instr[ins->in[0]] : NULL;
  const exec_instr *b = ins->nin > 1 ? &p->instr[ins->in[1]] : NULL;
  double v;
  switch (ins->op) {
  case IR_BROADCAST: case IR_RESHAPE:
    return same_shape(ins, a) ? ins->in[0] : -1;
  case IR_CONVERT:
    return a->dtype == ins->dtype ? ins->in[0] : -1;
  case IR_TRANSPOSE:
    for (int i = 0; i < ins->ndim; i++)
      if (IR_ATTR_AT(ins->attr, TRANSPOSE, perm, i) != i) return -1;
    return ins->in[0];
  case IR_SLICE:
    for (int i = 0; i < ins->ndim; i++)
      if (IR_ATTR_AT(ins->attr, SLICE, stride, i) != 1 || ins->shape[i] != a->shape[i]) return -1;
    return ins->in[0];
  case IR_PAD:
    for (int i = 0; i < ins->ndim; i++)
      if (IR_ATTR_AT(ins->attr, PAD, lo, i) || IR_ATTR_AT(ins->attr, PAD, hi, i) ||
          IR_ATTR_AT(ins->attr, PAD, interior, i))
        return -1;
    return ins->in[0];
  case IR_MUL:
    if (const_value(b, &v) && v == 1) return ins->in[0];
    if (const_value(a, &v) && v == 1) return ins->in[1];
    return -1;
  case IR_DIV:
    return const_value(b, &v) && v == 1 ? ins->in[0] : -1;
  case IR_ADD:
    if (const_value(b, &v) && v == 0) return ins->in[0];
    if (const_value(a, &v) && v == 0) return ins->in[1];
    return -1;
  case IR_SUB:
    return const_value(b, &v) && v == 0 ? ins->in[0] : -1;
  case IR_NEG:
    return a->op == IR_NEG ? a->in[0] : -1;
  default:
    return -1;
  }
}

typedef union { double d; int64_t i; unsigned char b[8]; } passes_elem; /* one aligned element */

/* x (a value of dtype from) converted to dtype to as ref_convert does: a float source through
 * dtype_store (truncates, saturates), an integer source through int64 (narrowing wraps). */
static double convert_value(graft_dtype from, graft_dtype to, double x) {
  passes_elem src, dst;
  dtype_store(&src, from, 0, x);
  if (dtype_is_float(from)) dtype_store(&dst, to, 0, dtype_load(&src, from, 0));
  else dtype_store_i(&dst, to, 0, dtype_load_i(&src, from, 0));
  return dtype_load(&dst, to, 0);
}

static double float_op(ir_op op, double x, double y) {
  switch (op) {
  case IR_NEG: return -x;
  case IR_ADD: return x + y;
  case IR_SUB: return x - y;
  case IR_MUL: return x * y;
  default: return x / y;
  }
}

/* Integer ops as the reference kernels do them: in int64, wrapping, then narrowed to dt.
 * False when the result would not survive the double a constant holds (i64 past 2^53). */
static bool int_op(ir_op op, graft_dtype dt, double x, double y, double *r) {
  passes_elem e;
  dtype_store(&e, GRAFT_I64, 0, x);
  uint64_t a = (uint64_t)e.i;
  dtype_store(&e, GRAFT_I64, 0, y);
  uint64_t b = (uint64_t)e.i, v;
  int64_t bs = (int64_t)b;
  switch (op) {
  case IR_NEG: v = 0 - a; break;
  case IR_ADD: v = a + b; break;
  case IR_SUB: v = a - b; break;
  case IR_MUL: v = a * b; break;
  default: v = bs == 0 ? 0 : bs == -1 ? 0 - a : (uint64_t)((int64_t)a / bs); break;
  }
  dtype_store_i(&e, dt, 0, (int64_t)v);
  int64_t w = dtype_load_i(&e, dt, 0);
  if (w > (INT64_C(1) << 53) || w < -(INT64_C(1) << 53)) return false;
  *r = (double)w;
  return true;
}

/* The value ins folds to when its operands are constants; false if it does not fold. Values
 * are read in their dtype; float math is in double, rounded once to the dtype; integer math
 * wraps: all as the reference kernels compute them. */
static bool fold_value(const exec_program *p, const exec_instr *ins, double *r) {
  double x, y = 0;
  const exec_instr *a = ins->nin ? &p->instr[ins->in[0]] : NULL;
  if (!a || !const_value(a, &x)) return false;
  switch (ins->op) {
  case IR_BROADCAST: case IR_RESHAPE: case IR_TRANSPOSE: case IR_SLICE:
    *r = x;
    return true;
  case IR_CONVERT:
    *r = convert_value(a->dtype, ins->dtype, x);
    return true;
  case IR_NEG: case IR_ADD: case IR_SUB: case IR_MUL: case IR_DIV:
    if (ins->op != IR_NEG && !const_value(&p->instr[ins->in[1]], &y)) return false;
    if (!dtype_is_float(ins->dtype)) return int_op(ins->op, ins->dtype, x, y, r);
    *r = dtype_round(ins->dtype, float_op(ins->op, x, y));
    return true;
  default:
    return false;
  }
}

/* Folds ins into a constant when its operands are constants; true if it did. */
static bool fold(const exec_program *p, exec_instr *ins) {
  double r;
  if (!fold_value(p, ins, &r)) return false;
  free(ins->in);
  ins->in = NULL;
  ins->nin = 0;
  ins->op = IR_CONSTANT;
  memset(&ins->attr, 0, sizeof ins->attr);
  ins->attr.f = r;
  return true;
}

static uint64_t instr_key(const exec_instr *ins) {
  uint64_t h = ir_mix((uint64_t)ins->op, (uint64_t)ins->dtype);
  for (int i = 0; i < ins->ndim; i++) h = ir_mix(h, (uint64_t)ins->shape[i]);
  for (int i = 0; i < IR_MAX_ATTRS; i++) h = ir_mix(h, (uint64_t)ins->attr.a[i]);
  uint64_t fb;
  memcpy(&fb, &ins->attr.f, sizeof fb);
  h = ir_mix(h, fb);
  for (int i = 0; i < ins->nin; i++) h = ir_mix(h, (uint64_t)ins->in[i]);
  return h;
}

static bool instr_equal(const exec_instr *a, const exec_instr *b) {
  return a->op == b->op && a->dtype == b->dtype && same_shape(a, b) && a->nin == b->nin &&
         !memcmp(&a->attr, &b->attr, sizeof a->attr) &&
         (!a->nin || !memcmp(a->in, b->in, sizeof(int) * (size_t)a->nin));
}

int passes_run(exec_program *p, passes_stats *st) {
  passes_stats s = {0};
  int n = p->ninstr;
  int *alias = malloc(sizeof(int) * ((size_t)n + 1));
  int *table = malloc(sizeof(int) * (size_t)(2 * n + 2)); /* open addressing for CSE */
  uint64_t *keys = malloc(sizeof(uint64_t) * ((size_t)n + 1));
  bool *live = calloc((size_t)n + 1, sizeof(bool));
  int *newslot = malloc(sizeof(int) * ((size_t)n + 1));
  if (!alias || !table || !keys || !live || !newslot) {
    free(alias), free(table), free(keys), free(live), free(newslot);
    err_set(GRAFT_ERR_OOM, "out of memory running graph passes");
    return -1;
  }
  int tsize = 2 * n + 2;
  for (int i = 0; i < tsize; i++) table[i] = -1;

  for (int i = 0; i < n; i++) {
    exec_instr *ins = &p->instr[i];
    alias[i] = i;
    if (ins->op == IR_DATA) continue; /* parameters are bound by position: never merged */
    for (int k = 0; k < ins->nin; k++) ins->in[k] = alias[ins->in[k]];
    int to = simplify(p, ins);
    /* An output keeps its own buffer: it may not become a parameter or another output. */
    if (to >= 0 && ins->is_output && (p->instr[to].op == IR_DATA || p->instr[to].is_output))
      to = -1;
    if (to >= 0) {
      alias[i] = to;
      if (ins->is_output) p->instr[to].is_output = true;
      s.simplified++;
      continue;
    }
    /* A collective talks to the other ranks: merging two would change what every rank
     * sends and waits for, so it is never folded or merged (and nothing moves past it). */
    if (ir_ops[ins->op].kind == IR_K_COLLECTIVE) continue;
    if (fold(p, ins)) s.folded++;
    uint64_t key = instr_key(ins);
    keys[i] = key;
    int pos = (int)(key % (uint64_t)tsize);
    for (; table[pos] >= 0; pos = (pos + 1) % tsize) {
      int j = table[pos];
      if (keys[j] == key && instr_equal(&p->instr[j], ins) &&
          !(ins->is_output && p->instr[j].is_output)) {
        alias[i] = j;
        if (ins->is_output) p->instr[j].is_output = true;
        s.cse++;
        break;
      }
    }
    if (alias[i] == i) table[pos] = i;
  }

  /* DCE: live = reachable from outputs; parameters always stay (bound by position). */
  for (int k = 0; k < p->noutputs; k++) p->output_slot[k] = alias[p->output_slot[k]];
  for (int k = 0; k < p->noutputs; k++) live[p->output_slot[k]] = true;
  for (int i = n - 1; i >= 0; i--) {
    if (p->instr[i].op == IR_DATA) live[i] = true;
    if (!live[i] || alias[i] != i) continue;
    for (int k = 0; k < p->instr[i].nin; k++) live[p->instr[i].in[k]] = true;
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (live[i] && alias[i] == i) {
      newslot[i] = m;
      p->instr[m++] = p->instr[i];
    } else {
      if (alias[i] == i) s.dead++;
      free(p->instr[i].in);
    }
  }
  for (int i = 0; i < m; i++) {
    exec_instr *ins = &p->instr[i];
    ins->last_use = -1;
    for (int k = 0; k < ins->nin; k++) ins->in[k] = newslot[ins->in[k]];
  }
  for (int i = 0; i < m; i++)
    for (int k = 0; k < p->instr[i].nin; k++) p->instr[p->instr[i].in[k]].last_use = i;
  for (int k = 0; k < p->nparams; k++) p->param_slot[k] = newslot[p->param_slot[k]];
  for (int k = 0; k < p->noutputs; k++) p->output_slot[k] = newslot[p->output_slot[k]];
  for (int i = 0; i < m; i++) p->instr[i].is_output = false;
  for (int k = 0; k < p->noutputs; k++) p->instr[p->output_slot[k]].is_output = true;
  p->ninstr = m;
  free(alias), free(table), free(keys), free(live), free(newslot);
  if (st) *st = s;
  return 0;
}
