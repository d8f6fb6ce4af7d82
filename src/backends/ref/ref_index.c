/* Indexing reference kernels: gather and scatter_add along one axis (torch semantics). An
 * index outside [0, size) is a runtime error, never an out-of-bounds access. */
#include "ref_util.h"
#include <stdlib.h>
#include <string.h>

/* Offset into data (shape dshape, strides dst) of index element i: the index tensor's own
 * coordinates, with the axis coordinate replaced by the index value. -1 after err_set when
 * the value is out of range. */
static int64_t ref_index_offset(const char *what, const ref_arg *idx, int64_t i, int axis,
                                const int64_t *dshape, const int64_t *dst) {
  int64_t c[GRAFT_MAX_DIMS];
  int64_t v = dtype_load_i(idx->data, idx->dtype, i);
  if (v < 0 || v >= dshape[axis]) {
    err_set(GRAFT_ERR_ARG, "%s: index %lld out of range [0, %lld) on axis %d", what,
            (long long)v, (long long)dshape[axis], axis);
    return -1;
  }
  ref_unravel(i, idx->ndim, idx->shape, c);
  c[axis] = v;
  int64_t off = 0;
  for (int d = 0; d < idx->ndim; d++) off += c[d] * dst[d];
  return off;
}

int ref_gather(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0], *idx = &in[1];
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  size_t es = ref_elsize(ins->dtype);
  int64_t st[GRAFT_MAX_DIMS];
  ref_strides(x->ndim, x->shape, st);
  for (int64_t i = 0; i < ins->numel; i++) {
    int64_t si = ref_index_offset("gather", idx, i, axis, x->shape, st);
    if (si < 0) return -1;
    memcpy((char *)out + (size_t)i * es, (const char *)x->data + (size_t)si * es, es);
  }
  return 0;
}

int ref_scatter_add(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0], *idx = &in[1], *src = &in[2];
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  graft_dtype dt = ins->dtype;
  int64_t st[GRAFT_MAX_DIMS];
  ref_strides(ins->ndim, ins->shape, st);
  if (ins->numel) memcpy(out, x->data, (size_t)ins->numel * ref_elsize(dt));
  if (!dtype_is_float(dt)) { /* integers: exact wrapping adds straight into out */
    for (int64_t i = 0; i < idx->numel; i++) {
      int64_t di = ref_index_offset("scatter_add", idx, i, axis, ins->shape, st);
      if (di < 0) return -1;
      dtype_store_i(out, dt, di, ref_wrap_add(dtype_load_i(out, dt, di),
                                              dtype_load_i(src->data, dt, i)));
    }
    return 0;
  }
  /* floats: accumulate every contribution in double, round once per output element */
  double *acc = malloc((size_t)(ins->numel ? ins->numel : 1) * sizeof *acc);
  if (!acc) {
    err_set(GRAFT_ERR_OOM, "scatter_add: cannot allocate %lld accumulators",
            (long long)ins->numel);
    return -1;
  }
  for (int64_t i = 0; i < ins->numel; i++) acc[i] = dtype_load(x->data, dt, i);
  for (int64_t i = 0; i < idx->numel; i++) {
    int64_t di = ref_index_offset("scatter_add", idx, i, axis, ins->shape, st);
    if (di < 0) {
      free(acc);
      return -1;
    }
    acc[di] += dtype_load(src->data, dt, i);
  }
  for (int64_t i = 0; i < ins->numel; i++) dtype_store(out, dt, i, acc[i]);
  free(acc);
  return 0;
}
