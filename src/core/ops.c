/* The op info table, generated from ops.def. */
#include "ir.h"

const ir_opinfo ir_ops[IR_OP_COUNT] = {
#define X(e, nm, ar, k, dts, api_, fn, cost_, ref_, cpu_, interp_, grad_)                       \
  [IR_##e] = {.name = nm, .arity = ar, .kind = k, .dtypes = dts, .api = OPS_API_##api_,       \
              .api_fn = "graft_" #fn, .cost = OPS_COST_##cost_, .ref = "ref_" #ref_,          \
              .cpu = OPS_CPU_##cpu_, .interp = OPS_INTERP_##interp_, .grad = OPS_GRAD_##grad_},
#include "ops.def"
};

const unsigned char ir_op_math[IR_OP_COUNT] = {
#define M1(e, expr) [IR_##e] = OPS_MATH_UNARY,
#define M2(e, expr) [IR_##e] = OPS_MATH_BINARY,
#include "ops.def"
};

/* The M lines as C functions of double (gm_op_<ENUM>): generated kernels that compute an op's
 * math line in double (ops.def's CPU_WIDE) include this text, so their code is the reference's. */
const char ir_op_math_src[] =
#define M1(e, expr) "static inline double gm_op_" #e "(double v) { return " #expr "; }\n"
#define M2(e, expr) "static inline double gm_op_" #e "(double a, double b) { return " #expr "; }\n"
#include "ops.def"
    "";

/* Every attribute field fits in ir_attrs.a (ND: one entry per dim). */
#define ND GRAFT_MAX_DIMS
#define ATTR(layout, field, off, count)                                                         \
  _Static_assert((off) + (count) <= IR_MAX_ATTRS, "attribute " #layout "." #field " past IR_MAX_ATTRS");
#include "ops.def"
#undef ND
