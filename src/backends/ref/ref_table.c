/* The reference kernel table, generated from ops.def's ref column: [IR_<op>] = ref_<ref>.
 * The one row with none (IR_DATA: data leaves are bound, not computed) gets NULL. */
#include "ref_util.h"

#define ref_none NULL
const ref_fn ref_kernels[IR_OP_COUNT] = {
#define X(e, nm, ar, k, dts, api, fn, cost, ref, ...) [IR_##e] = ref_##ref,
#include "ops.def"
};
#undef ref_none
