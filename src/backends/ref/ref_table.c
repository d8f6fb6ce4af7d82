/* The reference kernel table: one entry per op-table row (IR_DATA excepted). */
#include "ref_util.h"

const ref_fn ref_kernels[IR_OP_COUNT] = {
  [IR_DATA] = NULL, /* data leaves are bound, not computed */
  [IR_CONSTANT] = ref_constant,
  [IR_IOTA] = ref_iota,
  [IR_RNG] = ref_rng,

  [IR_NEG] = ref_unary,
  [IR_ABS] = ref_unary,
  [IR_EXP] = ref_unary,
  [IR_LOG] = ref_unary,
  [IR_SQRT] = ref_unary,
  [IR_RSQRT] = ref_unary,
  [IR_TANH] = ref_unary,
  [IR_ERF] = ref_unary,
  [IR_SIGMOID] = ref_unary,
  [IR_SIN] = ref_unary,
  [IR_COS] = ref_unary,
  [IR_FLOOR] = ref_unary,
  [IR_CEIL] = ref_unary,
  [IR_ROUND] = ref_unary,
  [IR_SIGN] = ref_unary,
  [IR_RECIPROCAL] = ref_unary,
  [IR_LOG1P] = ref_unary,
  [IR_EXPM1] = ref_unary,
  [IR_NOT] = ref_unary,
  [IR_CONVERT] = ref_convert,

  [IR_ADD] = ref_binary,
  [IR_SUB] = ref_binary,
  [IR_MUL] = ref_binary,
  [IR_DIV] = ref_binary,
  [IR_POW] = ref_binary,
  [IR_MAX] = ref_binary,
  [IR_MIN] = ref_binary,
  [IR_REM] = ref_binary,
  [IR_AND] = ref_binary,
  [IR_OR] = ref_binary,
  [IR_XOR] = ref_binary,

  [IR_EQ] = ref_compare,
  [IR_NE] = ref_compare,
  [IR_LT] = ref_compare,
  [IR_LE] = ref_compare,
  [IR_GT] = ref_compare,
  [IR_GE] = ref_compare,

  [IR_SELECT] = ref_select,

  [IR_BROADCAST] = ref_broadcast,
  [IR_RESHAPE] = ref_reshape,
  [IR_TRANSPOSE] = ref_transpose,
  [IR_SLICE] = ref_slice,
  [IR_CONCAT] = ref_concat,
  [IR_PAD] = ref_pad,

  [IR_REDUCE_SUM] = ref_reduce,
  [IR_REDUCE_MAX] = ref_reduce,
  [IR_REDUCE_MIN] = ref_reduce,
  [IR_REDUCE_PROD] = ref_reduce,
  [IR_ARGMAX] = ref_argmax,
  [IR_ARGMIN] = ref_argmax,

  [IR_DOT] = ref_dot,
  [IR_CONV2D] = ref_conv2d,

  [IR_GATHER] = ref_gather,
  [IR_SCATTER_ADD] = ref_scatter_add,
  [IR_REDUCE_WINDOW] = ref_reduce_window,

  [IR_ALL_REDUCE] = ref_collective,
  [IR_RANK_BROADCAST] = ref_collective,
  [IR_ALL_GATHER] = ref_collective,
};
