/* Helpers shared by the reference kernel files, and the kernel entry points that
 * ref_table.c wires into ref_kernels. Private to src/backends/ref. */
#ifndef GRAFT_REF_UTIL_H
#define GRAFT_REF_UTIL_H
#include "ref.h"
#include "dtype.h"
#include "error.h"
#include <stddef.h>
#include <stdint.h>

/* Bytes per element (bool and u8 are one byte). */
static inline size_t ref_elsize(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F64: case GRAFT_I64: return 8;
  case GRAFT_F32: case GRAFT_I32: return 4;
  case GRAFT_F16: case GRAFT_BF16: return 2;
  case GRAFT_U8: case GRAFT_BOOL: return 1;
  default: return 0;
  }
}

/* Row-major strides, in elements. */
static inline void ref_strides(int ndim, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

/* Coordinates c[0..ndim) of row-major linear index i. */
static inline void ref_unravel(int64_t i, int ndim, const int64_t *shape, int64_t *c) {
  for (int d = ndim - 1; d >= 0; d--) {
    c[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
}

/* Integer arithmetic that wraps instead of overflowing (two's complement via uint64). */
static inline int64_t ref_wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t ref_wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t ref_wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* Smallest / largest value of an integer (or bool) dtype, for empty max/min reductions. */
static inline int64_t ref_int_min(graft_dtype dt) {
  return dt == GRAFT_I32 ? INT32_MIN : dt == GRAFT_I64 ? INT64_MIN : 0;
}
static inline int64_t ref_int_max(graft_dtype dt) {
  return dt == GRAFT_I32 ? INT32_MAX : dt == GRAFT_I64 ? INT64_MAX : dt == GRAFT_U8 ? 255 : 1;
}

/* ref_elementwise.c */
int ref_constant(const exec_instr *ins, const ref_arg *in, void *out);
int ref_iota(const exec_instr *ins, const ref_arg *in, void *out);
int ref_unary(const exec_instr *ins, const ref_arg *in, void *out);
int ref_convert(const exec_instr *ins, const ref_arg *in, void *out);
int ref_binary(const exec_instr *ins, const ref_arg *in, void *out);
int ref_compare(const exec_instr *ins, const ref_arg *in, void *out);
int ref_select(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_movement.c */
int ref_broadcast(const exec_instr *ins, const ref_arg *in, void *out);
int ref_reshape(const exec_instr *ins, const ref_arg *in, void *out);
int ref_transpose(const exec_instr *ins, const ref_arg *in, void *out);
int ref_slice(const exec_instr *ins, const ref_arg *in, void *out);
int ref_concat(const exec_instr *ins, const ref_arg *in, void *out);
int ref_pad(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_reduce.c */
int ref_reduce(const exec_instr *ins, const ref_arg *in, void *out);
int ref_argmax(const exec_instr *ins, const ref_arg *in, void *out);
int ref_reduce_window(const exec_instr *ins, const ref_arg *in, void *out);
int ref_max_pool_grad(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_contract.c */
int ref_dot(const exec_instr *ins, const ref_arg *in, void *out);
int ref_conv2d(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_index.c */
int ref_gather(const exec_instr *ins, const ref_arg *in, void *out);
int ref_scatter_add(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_rng.c */
int ref_rng(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_host.c: the registered host function */
int ref_host_call(const exec_instr *ins, const ref_arg *in, void *out);
/* ref_coll.c: all_reduce, rank_broadcast, all_gather (pack, then core's collective hook) */
int ref_collective(const exec_instr *ins, const ref_arg *in, void *out);
#endif
