/* The op info table, generated from ops.def. */
#include "ir.h"

const ir_opinfo ir_ops[IR_OP_COUNT] = {
#define X(e, nm, ar, k, dts) [IR_##e] = {.name = nm, .arity = ar, .kind = k, .dtypes = dts},
#include "ops.def"
#undef X
};
