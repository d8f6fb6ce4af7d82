/* Movement reference kernels: pure index arithmetic, elements copied as bytes so every dtype
 * (i64 included) moves exactly. */
#include "ref_util.h"
#include <string.h>

/* Copies element si of src to element di of dst. */
static void ref_copy_el(void *dst, int64_t di, const void *src, int64_t si, size_t es) {
  memcpy((char *)dst + (size_t)di * es, (const char *)src + (size_t)si * es, es);
}

int ref_broadcast(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = ref_elsize(ins->dtype);
  int nd = ins->ndim, off = nd - in[0].ndim; /* operand dims are right-aligned */
  int64_t st[GRAFT_MAX_DIMS], c[GRAFT_MAX_DIMS];
  ref_strides(in[0].ndim, in[0].shape, st);
  for (int64_t i = 0; i < ins->numel; i++) {
    ref_unravel(i, nd, ins->shape, c);
    int64_t si = 0;
    for (int d = 0; d < in[0].ndim; d++)
      if (in[0].shape[d] != 1) si += c[d + off] * st[d]; /* size-1 dims repeat */
    ref_copy_el(out, i, in[0].data, si, es);
  }
  return 0;
}

int ref_reshape(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t bytes = (size_t)ins->numel * ref_elsize(ins->dtype);
  if (bytes) memcpy(out, in[0].data, bytes); /* row-major order is unchanged */
  return 0;
}

int ref_transpose(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = ref_elsize(ins->dtype);
  int nd = ins->ndim;
  int64_t st[GRAFT_MAX_DIMS], c[GRAFT_MAX_DIMS];
  ref_strides(in[0].ndim, in[0].shape, st);
  for (int64_t i = 0; i < ins->numel; i++) {
    ref_unravel(i, nd, ins->shape, c);
    int64_t si = 0;
    for (int d = 0; d < nd; d++) si += c[d] * st[IR_ATTR_AT(ins->attr, TRANSPOSE, perm, d)];
    ref_copy_el(out, i, in[0].data, si, es);
  }
  return 0;
}

int ref_slice(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = ref_elsize(ins->dtype);
  int nd = ins->ndim;
  const int64_t *start = &IR_ATTR_AT(ins->attr, SLICE, start, 0);
  const int64_t *stride = &IR_ATTR_AT(ins->attr, SLICE, stride, 0);
  int64_t st[GRAFT_MAX_DIMS], c[GRAFT_MAX_DIMS];
  ref_strides(in[0].ndim, in[0].shape, st);
  for (int64_t i = 0; i < ins->numel; i++) {
    ref_unravel(i, nd, ins->shape, c);
    int64_t si = 0;
    for (int d = 0; d < nd; d++) si += (start[d] + c[d] * stride[d]) * st[d];
    ref_copy_el(out, i, in[0].data, si, es);
  }
  return 0;
}

int ref_concat(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = ref_elsize(ins->dtype);
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  /* Row-major: for each index over the dims before axis, every operand contributes one
   * contiguous block of shape[axis] * inner elements, in operand order. */
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; d++) outer *= ins->shape[d];
  for (int d = axis + 1; d < ins->ndim; d++) inner *= ins->shape[d];
  char *o = out;
  for (int64_t b = 0; b < outer; b++) {
    for (int k = 0; k < ins->nin; k++) {
      size_t block = (size_t)(in[k].shape[axis] * inner) * es;
      if (block) memcpy(o, (const char *)in[k].data + (size_t)b * block, block);
      o += block;
    }
  }
  return 0;
}

int ref_pad(const exec_instr *ins, const ref_arg *in, void *out) {
  size_t es = ref_elsize(ins->dtype);
  int nd = ins->ndim;
  const int64_t *lo = &IR_ATTR_AT(ins->attr, PAD, lo, 0);
  const int64_t *interior = &IR_ATTR_AT(ins->attr, PAD, interior, 0);
  int64_t ost[GRAFT_MAX_DIMS], c[GRAFT_MAX_DIMS];
  ref_strides(nd, ins->shape, ost);
  for (int64_t i = 0; i < ins->numel; i++) dtype_store(out, ins->dtype, i, ins->attr.f);
  for (int64_t i = 0; i < in[0].numel; i++) { /* element c lands at c*(1+interior) + lo */
    ref_unravel(i, nd, in[0].shape, c);
    int64_t di = 0;
    for (int d = 0; d < nd; d++) di += (c[d] * (1 + interior[d]) + lo[d]) * ost[d];
    ref_copy_el(out, di, in[0].data, i, es);
  }
  return 0;
}
