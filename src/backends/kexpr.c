/* Kernel expression semantics shared by the code generators (kexpr.h). */
#include "kexpr.h"
#include <inttypes.h>

const char *kx_ctype(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F32: return "float";
  case GRAFT_F64: return "double";
  case GRAFT_I32: return "int32_t";
  case GRAFT_I64: return "int64_t";
  default: return "uint8_t";
  }
}

const char *kx_narrow(cpu_arena *ar, graft_dtype dt, const char *e64) {
  if (dt == GRAFT_BOOL) return cpu_fmt(ar, "(uint8_t)((%s) != 0)", e64);
  if (dt == GRAFT_I64) return cpu_fmt(ar, "(int64_t)(%s)", e64);
  return cpu_fmt(ar, "(%s)(uint64_t)(%s)", kx_ctype(dt), e64);
}

const char *kx_int_unary(cpu_arena *ar, ir_op op, graft_dtype dt, const char *a) {
  const char *e;
  switch (op) {
  case IR_NEG: e = cpu_fmt(ar, "(int64_t)((uint64_t)0 - (uint64_t)(int64_t)%s)", a); break;
  case IR_ABS:
    e = cpu_fmt(ar, "((int64_t)%s < 0 ? (int64_t)((uint64_t)0 - (uint64_t)(int64_t)%s) : (int64_t)%s)", a, a, a);
    break;
  case IR_SIGN: e = cpu_fmt(ar, "(int64_t)(((int64_t)%s > 0) - ((int64_t)%s < 0))", a, a); break;
  case IR_NOT: e = dt == GRAFT_BOOL ? cpu_fmt(ar, "(int64_t)!%s", a) : cpu_fmt(ar, "~(int64_t)%s", a); break;
  default: return NULL;
  }
  return kx_narrow(ar, dt, e);
}

const char *kx_int_binary(cpu_arena *ar, ir_op op, graft_dtype dt, const char *a, const char *b) {
  const char *e;
  switch (op) {
  case IR_ADD: e = cpu_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s + (uint64_t)(int64_t)%s)", a, b); break;
  case IR_SUB: e = cpu_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s - (uint64_t)(int64_t)%s)", a, b); break;
  case IR_MUL: e = cpu_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s * (uint64_t)(int64_t)%s)", a, b); break;
  case IR_DIV: e = cpu_fmt(ar, "gc_idiv(%s, %s)", a, b); break;
  case IR_REM: e = cpu_fmt(ar, "gc_irem(%s, %s)", a, b); break;
  case IR_MAX: e = cpu_fmt(ar, "(int64_t)(%s > %s ? %s : %s)", a, b, a, b); break;
  case IR_MIN: e = cpu_fmt(ar, "(int64_t)(%s < %s ? %s : %s)", a, b, a, b); break;
  case IR_AND: e = cpu_fmt(ar, "((int64_t)%s & (int64_t)%s)", a, b); break;
  case IR_OR: e = cpu_fmt(ar, "((int64_t)%s | (int64_t)%s)", a, b); break;
  case IR_XOR: e = cpu_fmt(ar, "((int64_t)%s ^ (int64_t)%s)", a, b); break;
  default: return NULL;
  }
  return kx_narrow(ar, dt, e);
}

const char *kx_float_binary(cpu_arena *ar, ir_op op, const char *a, const char *b) {
  switch (op) {
  case IR_ADD: return cpu_fmt(ar, "%s + %s", a, b);
  case IR_SUB: return cpu_fmt(ar, "%s - %s", a, b);
  case IR_MUL: return cpu_fmt(ar, "%s * %s", a, b);
  case IR_DIV: return cpu_fmt(ar, "%s / %s", a, b);
  /* NaN-propagating: a when a > b or a is NaN, else b (b's NaN included); valid on the GPU
   * dialects' vectors. The CPU generator has its own form (cpu_expr.c): under its
   * -fno-trapping-math gcc does not vectorize a clamp chain of this one. */
  case IR_MAX: return cpu_fmt(ar, "((%s > %s || %s != %s) ? %s : %s)", a, b, a, a, a, b);
  case IR_MIN: return cpu_fmt(ar, "((%s < %s || %s != %s) ? %s : %s)", a, b, a, a, a, b);
  default: return NULL;
  }
}

const char *kx_compare(cpu_arena *ar, ir_op op, const char *a, const char *b) {
  const char *o = op == IR_EQ ? "==" : op == IR_NE ? "!=" : op == IR_LT ? "<" : op == IR_LE ? "<="
                : op == IR_GT ? ">" : ">=";
  return cpu_fmt(ar, "(uint8_t)(%s %s %s)", a, o, b);
}

void kx_strides(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

bool kx_only_unit_dims_differ(const exec_instr *a, const exec_instr *b) {
  int i = 0, j = 0;
  for (;;) {
    while (i < a->ndim && a->shape[i] == 1) i++;
    while (j < b->ndim && b->shape[j] == 1) j++;
    if (i == a->ndim || j == b->ndim) return i == a->ndim && j == b->ndim;
    if (a->shape[i++] != b->shape[j++]) return false;
  }
}

const char *kx_lin(cpu_arena *ar, int nd, const int64_t *shape, const char *const *c) {
  int64_t st[GRAFT_MAX_DIMS];
  kx_strides(nd, shape, st);
  cpu_sb e = {0};
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    if (e.n) cpu_sb_puts(&e, " + ");
    if (st[d] == 1) cpu_sb_printf(&e, "%s", c[d]);
    else cpu_sb_printf(&e, "%s * %" PRId64, c[d], st[d]);
  }
  const char *r = cpu_fmt(ar, "(%s)", e.n ? e.s : "0");
  cpu_sb_free(&e);
  return r;
}
