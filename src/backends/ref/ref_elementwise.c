/* Elementwise reference kernels: leaves (constant, iota), unary, convert, binary, compare,
 * select. Float math is done in double and rounded once on store; integer math is done in
 * int64 (wrapping) and narrowed on store, so i32/u8 results wrap like their own type would. */
#include "ref_util.h"
#include "opmath.h"
#include <math.h>
#include <string.h>

int ref_constant(const exec_instr *ins, const ref_arg *in, void *out) {
  (void)in;
  for (int64_t i = 0; i < ins->numel; i++) dtype_store(out, ins->dtype, i, ins->attr.f);
  return 0;
}

int ref_iota(const exec_instr *ins, const ref_arg *in, void *out) {
  (void)in;
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  int64_t c[GRAFT_MAX_DIMS];
  for (int64_t i = 0; i < ins->numel; i++) {
    ref_unravel(i, ins->ndim, ins->shape, c);
    dtype_store_i(out, ins->dtype, i, c[axis]);
  }
  return 0;
}

int ref_unary(const exec_instr *ins, const ref_arg *in, void *out) {
  const void *x = in[0].data;
  graft_dtype dt = ins->dtype;
  if (dtype_is_float(dt)) {
    for (int64_t i = 0; i < ins->numel; i++) {
      double v = dtype_load(x, dt, i), r;
      switch (ins->op) { /* the M1 lines of ops.def */
#define M1(e, expr) case IR_##e: r = (expr); break;
#include "ops.def"
      default:
        err_set(GRAFT_ERR_INTERNAL, "ref: unary op %s has no float kernel (no M1 line in ops.def)",
                ir_ops[ins->op].name);
        return -1;
      }
      dtype_store(out, dt, i, r);
    }
    return 0;
  }
  for (int64_t i = 0; i < ins->numel; i++) {
    int64_t v = dtype_load_i(x, dt, i), r;
    switch (ins->op) {
    case IR_NEG: r = ref_wrap_sub(0, v); break;
    case IR_ABS: r = v < 0 ? ref_wrap_sub(0, v) : v; break; /* |INT64_MIN| wraps to itself */
    case IR_SIGN: r = (v > 0) - (v < 0); break;
    /* bool: logical not; ints: bitwise not (u8 narrows back into 0..255 on store) */
    case IR_NOT: r = dt == GRAFT_BOOL ? !v : ~v; break;
    default:
      err_set(GRAFT_ERR_INTERNAL, "ref: unary op %s has no integer kernel", ir_ops[ins->op].name);
      return -1;
    }
    dtype_store_i(out, dt, i, r);
  }
  return 0;
}

int ref_convert(const exec_instr *ins, const ref_arg *in, void *out) {
  graft_dtype from = in[0].dtype, to = ins->dtype;
  for (int64_t i = 0; i < ins->numel; i++) {
    if (dtype_is_float(from)) /* float->int truncates, NaN->0, clamps; ->bool is != 0 */
      dtype_store(out, to, i, dtype_load(in[0].data, from, i));
    else /* int/bool source: exact int64, so int->int never goes through double */
      dtype_store_i(out, to, i, dtype_load_i(in[0].data, from, i));
  }
  return 0;
}

int ref_binary(const exec_instr *ins, const ref_arg *in, void *out) {
  const void *x = in[0].data, *y = in[1].data;
  graft_dtype dt = ins->dtype;
  if (dtype_is_float(dt)) {
    for (int64_t i = 0; i < ins->numel; i++) {
      double a = dtype_load(x, dt, i), b = dtype_load(y, dt, i), r;
      switch (ins->op) { /* the M2 lines of ops.def */
#define M2(e, expr) case IR_##e: r = (expr); break;
#include "ops.def"
      default:
        err_set(GRAFT_ERR_INTERNAL, "ref: binary op %s has no float kernel (no M2 line in ops.def)",
                ir_ops[ins->op].name);
        return -1;
      }
      dtype_store(out, dt, i, r);
    }
    return 0;
  }
  for (int64_t i = 0; i < ins->numel; i++) {
    int64_t a = dtype_load_i(x, dt, i), b = dtype_load_i(y, dt, i), r;
    switch (ins->op) {
    case IR_ADD: r = ref_wrap_add(a, b); break;
    case IR_SUB: r = ref_wrap_sub(a, b); break;
    case IR_MUL: r = ref_wrap_mul(a, b); break;
    /* Integer division by zero yields 0 (defined here, not trapped); INT64_MIN / -1 wraps
     * to INT64_MIN. i32 operands never hit that case in int64; the store wraps instead. */
    case IR_DIV: r = b == 0 ? 0 : (b == -1 ? ref_wrap_sub(0, a) : a / b); break;
    case IR_REM: r = (b == 0 || b == -1) ? 0 : a % b; break; /* x % -1 is 0; avoids UB */
    case IR_MAX: r = a > b ? a : b; break;
    case IR_MIN: r = a < b ? a : b; break;
    /* bool buffers hold 0/1, so bitwise equals logical; normalize anyway */
    case IR_AND: r = dt == GRAFT_BOOL ? (a && b) : (a & b); break;
    case IR_OR: r = dt == GRAFT_BOOL ? (a || b) : (a | b); break;
    case IR_XOR: r = dt == GRAFT_BOOL ? ((a != 0) != (b != 0)) : (a ^ b); break;
    default:
      err_set(GRAFT_ERR_INTERNAL, "ref: binary op %s has no integer kernel", ir_ops[ins->op].name);
      return -1;
    }
    dtype_store_i(out, dt, i, r);
  }
  return 0;
}

int ref_compare(const exec_instr *ins, const ref_arg *in, void *out) {
  const void *x = in[0].data, *y = in[1].data;
  graft_dtype dt = in[0].dtype;
  uint8_t *o = out;
  for (int64_t i = 0; i < ins->numel; i++) {
    int lt, eq, unordered = 0;
    if (dtype_is_float(dt)) {
      double a = dtype_load(x, dt, i), b = dtype_load(y, dt, i);
      unordered = isnan(a) || isnan(b); /* NaN: every comparison false except ne */
      lt = a < b;
      eq = a == b;
    } else { /* exact int64 comparison (i64 past 2^53 must not go through double) */
      int64_t a = dtype_load_i(x, dt, i), b = dtype_load_i(y, dt, i);
      lt = a < b;
      eq = a == b;
    }
    int r;
    switch (ins->op) {
    case IR_EQ: r = eq; break;
    case IR_NE: r = !eq; break;
    case IR_LT: r = lt; break;
    case IR_LE: r = lt || eq; break;
    case IR_GT: r = !unordered && !lt && !eq; break;
    case IR_GE: r = !unordered && !lt; break;
    default:
      err_set(GRAFT_ERR_INTERNAL, "ref: op %s is not a comparison", ir_ops[ins->op].name);
      return -1;
    }
    o[i] = (uint8_t)r;
  }
  return 0;
}

int ref_select(const exec_instr *ins, const ref_arg *in, void *out) {
  const uint8_t *pred = in[0].data;
  size_t es = ref_elsize(ins->dtype);
  for (int64_t i = 0; i < ins->numel; i++) {
    const char *src = pred[i] ? in[1].data : in[2].data;
    memcpy((char *)out + (size_t)i * es, src + (size_t)i * es, es);
  }
  return 0;
}
