/* Expression semantics shared by the code generators (render.h). */
#include "render.h"
#include "dtype.h"
#include <inttypes.h>
#include <math.h>
#include <string.h>

const char *rd_ctype(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F32: return "float";
  case GRAFT_F64: return "double";
  case GRAFT_I32: return "int32_t";
  case GRAFT_I64: return "int64_t";
  default: return "uint8_t";
  }
}

const char *rd_narrow(rd_arena *ar, graft_dtype dt, const char *e64) {
  if (dt == GRAFT_BOOL) return rd_fmt(ar, "(uint8_t)((%s) != 0)", e64);
  if (dt == GRAFT_I64) return rd_fmt(ar, "(int64_t)(%s)", e64);
  return rd_fmt(ar, "(%s)(uint64_t)(%s)", rd_ctype(dt), e64);
}

const char *rd_int_unary(rd_arena *ar, ir_op op, graft_dtype dt, const char *a) {
  const char *e;
  switch (op) {
  case IR_NEG: e = rd_fmt(ar, "(int64_t)((uint64_t)0 - (uint64_t)(int64_t)%s)", a); break;
  case IR_ABS:
    e = rd_fmt(ar, "((int64_t)%s < 0 ? (int64_t)((uint64_t)0 - (uint64_t)(int64_t)%s) : (int64_t)%s)", a, a, a);
    break;
  case IR_SIGN: e = rd_fmt(ar, "(int64_t)(((int64_t)%s > 0) - ((int64_t)%s < 0))", a, a); break;
  case IR_NOT: e = dt == GRAFT_BOOL ? rd_fmt(ar, "(int64_t)!%s", a) : rd_fmt(ar, "~(int64_t)%s", a); break;
  default: return NULL;
  }
  return rd_narrow(ar, dt, e);
}

const char *rd_int_binary(rd_arena *ar, ir_op op, graft_dtype dt, const char *a, const char *b) {
  const char *e;
  switch (op) {
  case IR_ADD: e = rd_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s + (uint64_t)(int64_t)%s)", a, b); break;
  case IR_SUB: e = rd_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s - (uint64_t)(int64_t)%s)", a, b); break;
  case IR_MUL: e = rd_fmt(ar, "(int64_t)((uint64_t)(int64_t)%s * (uint64_t)(int64_t)%s)", a, b); break;
  case IR_DIV: e = rd_fmt(ar, "gc_idiv(%s, %s)", a, b); break;
  case IR_REM: e = rd_fmt(ar, "gc_irem(%s, %s)", a, b); break;
  case IR_MAX: e = rd_fmt(ar, "(int64_t)(%s > %s ? %s : %s)", a, b, a, b); break;
  case IR_MIN: e = rd_fmt(ar, "(int64_t)(%s < %s ? %s : %s)", a, b, a, b); break;
  case IR_AND: e = rd_fmt(ar, "((int64_t)%s & (int64_t)%s)", a, b); break;
  case IR_OR: e = rd_fmt(ar, "((int64_t)%s | (int64_t)%s)", a, b); break;
  case IR_XOR: e = rd_fmt(ar, "((int64_t)%s ^ (int64_t)%s)", a, b); break;
  default: return NULL;
  }
  return rd_narrow(ar, dt, e);
}

const char *rd_float_binary(rd_arena *ar, ir_op op, const char *a, const char *b) {
  switch (op) {
  case IR_ADD: return rd_fmt(ar, "%s + %s", a, b);
  case IR_SUB: return rd_fmt(ar, "%s - %s", a, b);
  case IR_MUL: return rd_fmt(ar, "%s * %s", a, b);
  case IR_DIV: return rd_fmt(ar, "%s / %s", a, b);
  /* NaN-propagating: a when a > b or a is NaN, else b (b's NaN included); valid on the GPU
   * dialects' vectors. CPU C has its own form (rd_dialect_c.minmax_unordered): under its
   * -fno-trapping-math gcc does not vectorize a clamp chain of this one. */
  case IR_MAX: return rd_fmt(ar, "((%s > %s || %s != %s) ? %s : %s)", a, b, a, a, a, b);
  case IR_MIN: return rd_fmt(ar, "((%s < %s || %s != %s) ? %s : %s)", a, b, a, a, a, b);
  default: return NULL;
  }
}

const char *rd_compare(rd_arena *ar, ir_op op, const char *a, const char *b) {
  const char *o = op == IR_EQ ? "==" : op == IR_NE ? "!=" : op == IR_LT ? "<" : op == IR_LE ? "<="
                : op == IR_GT ? ">" : ">=";
  return rd_fmt(ar, "(uint8_t)(%s %s %s)", a, o, b);
}

void rd_strides(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

bool rd_only_unit_dims_differ(const exec_instr *a, const exec_instr *b) {
  int i = 0, j = 0;
  for (;;) {
    while (i < a->ndim && a->shape[i] == 1) i++;
    while (j < b->ndim && b->shape[j] == 1) j++;
    if (i == a->ndim || j == b->ndim) return i == a->ndim && j == b->ndim;
    if (a->shape[i++] != b->shape[j++]) return false;
  }
}

const char *rd_lin(rd_arena *ar, int nd, const int64_t *shape, const char *const *c) {
  int64_t st[GRAFT_MAX_DIMS];
  rd_strides(nd, shape, st);
  rd_sb e = {0};
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    if (e.n) rd_sb_puts(&e, " + ");
    if (st[d] == 1) rd_sb_printf(&e, "%s", c[d]);
    else rd_sb_printf(&e, "%s * %" PRId64, c[d], st[d]);
  }
  const char *r = rd_fmt(ar, "(%s)", e.n ? e.s : "0");
  rd_sb_free(&e);
  return r;
}

const char *rd_literal(rd_arena *ar, const rd_dialect *d, graft_dtype dt, double v) {
  union { float f; double d; int32_t i32; int64_t i64; uint8_t u8; } u;
  memset(&u, 0, sizeof u);
  dtype_store(&u, dt, 0, v);
  switch (dt) {
  case GRAFT_F32:
    if (u.f != u.f) return d->nan32;
    if (isinf(u.f)) return u.f > 0 ? d->inf32 : rd_fmt(ar, "(-%s)", d->inf32);
    return rd_fmt(ar, "%af", (double)u.f);
  case GRAFT_F64:
    if (u.d != u.d) return d->nan64;
    if (isinf(u.d)) return u.d > 0 ? d->inf64 : rd_fmt(ar, "(-%s)", d->inf64);
    return rd_fmt(ar, "%a", u.d);
  case GRAFT_I32: return rd_fmt(ar, "((int32_t)%" PRId32 ")", u.i32);
  case GRAFT_I64: return rd_fmt(ar, "((int64_t)0x%" PRIx64 "%s)", (uint64_t)u.i64, d->u64_suffix);
  default: return rd_fmt(ar, "((uint8_t)%u)", (unsigned)u.u8);
  }
}

/* The op's enum name, as the generated gm_op_<ENUM> math functions are named. */
static const char *const rd_op_enum[IR_OP_COUNT] = {
#define X(e, ...) [IR_##e] = #e,
#include "ops.def"
};

/* True when ins's float math is computed in double by the op table's M line (gm_op_<ENUM>). */
static bool rd_wide(const exec_instr *ins, int math) {
  return ir_ops[ins->op].cpu == OPS_CPU_WIDE && ir_op_math[ins->op] == math;
}

static const char *rd_unary_float(rd_arena *ar, const rd_dialect *d, bool fp64, const exec_instr *ins,
                                  const char *a) {
  bool f = ins->dtype == GRAFT_F32;
  /* f32 results computed in double are rounded through d->round32, which CPU C's compiler
   * cannot see through: gcc 12's SLP vectorizer dropped a (float) rounding followed by a
   * widening (convert to f64), found by the fuzzer (seed 1150: cos then convert). */
  const char *round = f ? d->round32 : "";
  if (rd_wide(ins, OPS_MATH_UNARY)) return rd_fmt(ar, "%s(gm_op_%s(%s(%s)))", round, rd_op_enum[ins->op], d->widen, a);
  switch (ins->op) {
  case IR_NEG: return rd_fmt(ar, "-%s", a);
  case IR_RSQRT:
    return fp64 || !f ? rd_fmt(ar, "%s(1.0 / %s((double)%s))", round, d->sqrt64, a)
                      : rd_fmt(ar, "(1.0f / %s(%s))", d->call32[IR_SQRT], a);
  case IR_SIGN: return rd_fmt(ar, "(%s > 0 ? 1 : %s < 0 ? -1 : %s)", a, a, a);
  /* 1/a rounded once from double equals the f32 quotient (53 >= 2*24+2: double rounding of a
   * division is innocuous), so f32 divides in f32 and vectorizes. */
  case IR_RECIPROCAL: return rd_fmt(ar, f ? "1.0f / %s" : "1.0 / %s", a);
  default: break;
  }
  const char *call = f ? d->call32[ins->op] : d->call64[ins->op];
  return call ? rd_fmt(ar, "%s(%s)", call, a) : NULL;
}

const char *rd_unary(rd_arena *ar, const rd_dialect *d, bool fp64, const exec_instr *ins, const char *a) {
  if (dtype_is_float(ins->dtype)) return rd_unary_float(ar, d, fp64, ins, a);
  return rd_int_unary(ar, ins->op, ins->dtype, a);
}

const char *rd_binary(rd_arena *ar, const rd_dialect *d, const exec_instr *ins, const char *a, const char *b) {
  graft_dtype dt = ins->dtype;
  if (!dtype_is_float(dt)) return rd_int_binary(ar, ins->op, dt, a, b);
  if (rd_wide(ins, OPS_MATH_BINARY))
    return rd_fmt(ar, "%s(gm_op_%s(%s(%s), %s(%s)))", dt == GRAFT_F32 ? d->round32 : "", rd_op_enum[ins->op],
                  d->widen, a, d->widen, b);
  /* NaN-propagating max/min as an unordered test and a plain select (a NaN operand propagates
   * through a + b): gcc vectorizes this form with or without -ftrapping-math, where the shared
   * (a > b || a != a) form stopped vectorizing a BN-apply + ReLU6 loop under
   * -fno-trapping-math (mobilenet_v2's 4x96x32x32 site 0.03 -> 1.23 ms). */
  if (d->minmax_unordered && (ins->op == IR_MAX || ins->op == IR_MIN))
    return rd_fmt(ar, "(__builtin_isunordered(%s, %s) ? %s + %s : (%s %s %s ? %s : %s))", a, b, a, b, a,
                  ins->op == IR_MAX ? ">" : "<", b, a, b);
  return rd_float_binary(ar, ins->op, a, b);
}

const char *rd_convert(rd_arena *ar, const rd_dialect *d, graft_dtype from, graft_dtype to, const char *a) {
  bool ff = dtype_is_float(from), tf = dtype_is_float(to);
  if (to == GRAFT_BOOL) return rd_fmt(ar, "(uint8_t)(%s != 0)", a);
  if (to == GRAFT_F32 && from == GRAFT_F64) return rd_fmt(ar, "%s(%s)", d->round32, a); /* see rd_unary_float */
  /* an integer made a float through an opaque helper where the dialect has one: gcc folded a
   * float -> integer -> float round trip into trunc() (which keeps -0.0 where 0 gives +0.0) */
  if (to == GRAFT_F32 && !ff && from != GRAFT_U8 && from != GRAFT_BOOL) return rd_fmt(ar, "%s(%s)", d->i2f32, a);
  if (to == GRAFT_F64 && (from == GRAFT_I32 || from == GRAFT_I64)) return rd_fmt(ar, "%s(%s)", d->i2f64, a);
  if (tf) return rd_fmt(ar, "(%s)%s", rd_ctype(to), a);
  if (ff) {
    if (to == GRAFT_I32) return rd_fmt(ar, "gc_sat32(gc_d2i(%s%s))", d->d2i_arg, a);
    return rd_narrow(ar, to, rd_fmt(ar, "gc_d2i(%s%s)", d->d2i_arg, a));
  }
  return rd_narrow(ar, to, rd_fmt(ar, "(int64_t)%s", a));
}

rd_red rd_reduce(const rd_dialect *d, bool wide, const exec_instr *ins) {
  static const char *const mins[] = {[GRAFT_I32] = "INT32_MIN", [GRAFT_I64] = "INT64_MIN", [GRAFT_U8] = "0",
                                     [GRAFT_BOOL] = "0"};
  static const char *const maxs[] = {[GRAFT_I32] = "INT32_MAX", [GRAFT_I64] = "INT64_MAX", [GRAFT_U8] = "255",
                                     [GRAFT_BOOL] = "1"};
  graft_dtype dt = ins->dtype;
  rd_red r = {.fl = dtype_is_float(dt), .mx = ins->op == IR_REDUCE_MAX, .mn = ins->op == IR_REDUCE_MIN};
  bool sum = ins->op == IR_REDUCE_SUM;
  r.combine = sum ? "+" : ins->op == IR_REDUCE_PROD ? "*" : r.mx ? "max" : "min";
  if (r.fl && !r.mx && !r.mn) {
    r.acc_t = wide ? "double" : "float";
    r.init = wide ? (sum ? "0.0" : "1.0") : (sum ? "0.0f" : "1.0f");
  } else if (r.fl) {
    r.acc_t = rd_ctype(dt);
    r.init = r.mx ? d->ninf_acc : d->inf_acc;
  } else if (!r.mx && !r.mn) {
    r.acc_t = "uint64_t";
    r.init = sum ? "0" : "1";
  } else {
    r.acc_t = "int64_t";
    r.init = r.mx ? mins[dt] : maxs[dt];
  }
  return r;
}

void rd_red_step(rd_sb *b, const char *indent, const rd_red *r, const char *acc, const char *nf, const char *v) {
  const char *op = r->combine;
  if (r->fl && !r->mx && !r->mn) rd_sb_printf(b, "%s%s %s= (%s)%s;\n", indent, acc, op, r->acc_t, v);
  else if (r->fl)
    rd_sb_printf(b, "%s%s = %s %s %s ? %s : %s; %s |= %s != %s;\n", indent, acc, v, r->mx ? ">" : "<", acc, v,
                 acc, nf, v, v);
  else if (!r->mx && !r->mn) rd_sb_printf(b, "%s%s %s= (uint64_t)(int64_t)%s;\n", indent, acc, op, v);
  else
    rd_sb_printf(b, "%s%s = (int64_t)%s %s %s ? (int64_t)%s : %s;\n", indent, acc, v, r->mx ? ">" : "<", acc, v,
                 acc);
}

const char *rd_red_final(rd_arena *ar, const rd_dialect *d, const exec_instr *ins, const rd_red *r,
                         const char *acc, const char *nf) {
  const char *T = rd_ctype(ins->dtype);
  if (r->fl && (r->mx || r->mn)) return rd_fmt(ar, "%s ? (%s)%s : %s", nf, T, d->nan_acc, acc);
  if (r->fl) return rd_fmt(ar, "%s(%s)", ins->dtype == GRAFT_F32 ? d->round32 : "", acc);
  if (ins->dtype == GRAFT_BOOL) return rd_fmt(ar, "(uint8_t)(%s != 0)", acc);
  return rd_fmt(ar, "(%s)(uint64_t)%s", T, acc);
}
