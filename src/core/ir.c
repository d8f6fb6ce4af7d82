/* IR node construction: validation and shape inference per op, hashing, lifetime.
 * All calls happen under the global graft lock, so counts and refcounts are plain ints. */
#include "ir.h"
#include "device.h"
#include "buffer.h"
#include "error.h"
#include "loc.h"
#include <inttypes.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static int64_t ir_pending; /* live nodes that are not data leaves */

int64_t ir_pending_count(void) { return ir_pending; }
static int64_t ir_collectives; /* live collective nodes (exec.c widens syncs while any) */
int64_t ir_collective_count(void) { return ir_collectives; }

int64_t ir_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] && n > (INT64_C(1) << 56) / shape[i]) return -1; /* bytes fit in size_t */
    n *= shape[i];
  }
  return n;
}

const char *ir_shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = 0; i < ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? "," : "", shape[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

#define SHP(nd, s) ir_shape_str((nd), (s), (char[128]){0}, 128)

/* Also sets n->nattr: attributes past it are zero, so the hash takes the count and the
 * prefix (the same information as all IR_MAX_ATTRS words, at a fraction of the mixing). */
static uint64_t ir_local_hash(ir_node *n) {
  uint64_t h = ir_mix(0x6772616674ull, (uint64_t)n->op);
  h = ir_mix(h, (uint64_t)n->dtype);
  h = ir_mix(h, (uint64_t)n->ndim);
  h = ir_mix(h, (uint64_t)n->device);
  for (int i = 0; i < n->ndim; i++) h = ir_mix(h, (uint64_t)n->shape[i]);
  n->nattr = 0;
  if (n->op != IR_DATA) {
    int k = IR_MAX_ATTRS;
    while (k && !n->attr.a[k - 1]) k--;
    n->nattr = k;
    h = ir_mix(h, (uint64_t)k);
    for (int i = 0; i < k; i++) h = ir_mix(h, (uint64_t)n->attr.a[i]);
    uint64_t fb;
    memcpy(&fb, &n->attr.f, sizeof fb);
    h = ir_mix(h, fb);
  }
  return h;
}

static _Atomic uint64_t ir_next_seq;

static ir_node *ir_alloc(int nin) {
  ir_node *n = calloc(1, sizeof *n + (size_t)nin * sizeof(ir_node *));
  if (!n) return err_set(GRAFT_ERR_OOM, "out of memory allocating an IR node");
  n->refcnt = 1;
  n->nin = nin;
  n->slot = -1;
  n->loc = loc_current();
  n->opname = loc_op_current();
  n->seq = atomic_fetch_add_explicit(&ir_next_seq, 1, memory_order_relaxed);
  return n;
}

static void ir_finish(ir_node *n) {
  n->numel = ir_numel(n->ndim, n->shape);
  n->lhash = ir_local_hash(n);
  uint64_t h = n->lhash;
  for (int i = 0; i < n->nin; i++) h = ir_mix(h, n->in[i]->hash);
  n->hash = h;
  if (n->op != IR_DATA) ir_pending++;
  if (ir_ops[n->op].kind == IR_K_COLLECTIVE) ir_collectives++;
}

ir_node *ir_make_data(exec_buffer *buf, graft_dtype dt, int ndim, const int64_t *shape,
                      int device) {
  ir_node *n = ir_alloc(0);
  if (!n) return NULL;
  n->op = IR_DATA;
  n->dtype = dt;
  n->ndim = ndim;
  if (ndim) memcpy(n->shape, shape, sizeof(int64_t) * (size_t)ndim);
  n->device = device;
  buffer_retain(buf);
  n->data = buf;
  ir_finish(n);
  return n;
}

ir_node *ir_make_raw(ir_op op, graft_dtype dt, int ndim, const int64_t *shape,
                     const ir_attrs *attr, int device, uint32_t loc, int nin, ir_node *const *in) {
  ir_node *n = ir_alloc(nin);
  if (!n) return NULL;
  n->op = op;
  n->dtype = dt;
  n->ndim = ndim;
  if (ndim) memcpy(n->shape, shape, sizeof(int64_t) * (size_t)ndim);
  if (attr) n->attr = *attr;
  n->device = device;
  if (loc) n->loc = loc;
  for (int i = 0; i < nin; i++) {
    n->in[i] = in[i];
    ir_retain(in[i]);
  }
  ir_finish(n);
  return n;
}

void ir_retain(ir_node *n) { n->refcnt++; }

void ir_release(ir_node *n) {
  /* Iterative: a chain of 100k pending nodes must not recurse 100k deep. */
  ir_node *small[64], **stack = small;
  size_t top = 0, cap = 64;
  stack[top++] = n;
  while (top) {
    ir_node *m = stack[--top];
    if (--m->refcnt > 0) continue;
    for (int i = 0; i < m->nin; i++) {
      if (top == cap) {
        ir_node **bigger = malloc(sizeof *bigger * cap * 2);
        if (!bigger) abort(); /* cannot leave a half-freed graph */
        memcpy(bigger, stack, sizeof *stack * top);
        if (stack != small) free(stack);
        stack = bigger;
        cap *= 2;
      }
      stack[top++] = m->in[i];
    }
    if (m->op != IR_DATA) ir_pending--;
    if (ir_ops[m->op].kind == IR_K_COLLECTIVE) ir_collectives--;
    buffer_release(m->data);
    free(m);
  }
  if (stack != small) free(stack);
}

static int ir_dtype_ok(int classes, graft_dtype dt) {
  if (dtype_is_float(dt)) return classes & IR_D_FLOAT;
  if (dtype_is_int(dt)) return classes & IR_D_INT;
  return classes & IR_D_BOOL;
}

static const char *ir_class_str(int classes) {
  switch (classes) {
  case IR_D_FLOAT: return "a floating dtype";
  case IR_D_NUM: return "a numeric (non-bool) dtype";
  case IR_D_INTBOOL: return "an integer or bool dtype";
  default: return "a valid dtype";
  }
}

static int ir_check_shape_arg(const char *nm, int ndim, const int64_t *shape) {
  if (ndim < 0 || ndim > GRAFT_MAX_DIMS) {
    err_set(GRAFT_ERR_SHAPE, "%s: ndim %d out of range [0, %d]", nm, ndim, GRAFT_MAX_DIMS);
    return -1;
  }
  if (ndim && !shape) {
    err_set(GRAFT_ERR_NULL, "%s: shape is NULL", nm);
    return -1;
  }
  if (ir_numel(ndim, shape) < 0) {
    err_set(GRAFT_ERR_SHAPE, "%s: invalid shape %s (negative or too many elements)", nm,
            SHP(ndim, shape));
    return -1;
  }
  return 0;
}

/* Size checks below run before the arithmetic they guard: a shape past int64 is an error, never
 * signed overflow. */

/* Dim i of pad(a): lo + d + hi + (d-1)*interior. */
static int ir_pad_dim(const ir_node *a, const ir_attrs *at, int i, int64_t *out) {
  int64_t d = a->shape[i], lo = IR_ATTR_AT(*at, PAD, lo, i), hi = IR_ATTR_AT(*at, PAD, hi, i);
  int64_t in = IR_ATTR_AT(*at, PAD, interior, i), fill;
  if (lo < 0 || hi < 0 || in < 0)
    return err_set(GRAFT_ERR_SHAPE, "pad: negative padding on dim %d of %s (lo %" PRId64
                   " hi %" PRId64 " interior %" PRId64 ")", i, SHP(a->ndim, a->shape), lo, hi,
                   in), -1;
  if (__builtin_mul_overflow(d ? d - 1 : 0, in, &fill) || __builtin_add_overflow(d, fill, out) ||
      __builtin_add_overflow(*out, lo, out) || __builtin_add_overflow(*out, hi, out))
    return err_set(GRAFT_ERR_SHAPE, "pad: dim %d of %s with lo %" PRId64 " hi %" PRId64
                   " interior %" PRId64 " overflows int64", i, SHP(a->ndim, a->shape), lo, hi,
                   in), -1;
  return 0;
}

/* Spatial dim d of conv2d(a, w): (x' + lo + hi - dil*(k-1) - 1) / stride + 1, where x' is
 * the input after lhs dilation. */
static int ir_conv_dim(const ir_node *a, const ir_node *w, const ir_attrs *at, int d,
                       int64_t *out) {
  int64_t st = IR_ATTR_AT(*at, CONV2D, stride, d), lo = IR_ATTR_AT(*at, CONV2D, pad_lo, d);
  int64_t hi = IR_ATTR_AT(*at, CONV2D, pad_hi, d), dil = IR_ATTR_AT(*at, CONV2D, dilation, d);
  int64_t ld = IR_ATTR_AT(*at, CONV2D, lhs_dilation, d);
  int64_t x = a->shape[2 + d], k = w->shape[2 + d], in, kext, span;
  if (st < 1 || dil < 1 || ld < 1 || lo < 0 || hi < 0)
    return err_set(GRAFT_ERR_ARG, "conv2d: stride, dilation must be >= 1, padding >= 0"), -1;
  if (__builtin_mul_overflow(x ? x - 1 : 0, ld, &in) ||
      __builtin_add_overflow(in, x ? 1 : 0, &in) || __builtin_add_overflow(in, lo, &in) ||
      __builtin_add_overflow(in, hi, &in) || __builtin_mul_overflow(dil, k - 1, &kext) ||
      __builtin_sub_overflow(in, kext, &span))
    return err_set(GRAFT_ERR_SHAPE, "conv2d: dim %d of input %s and weight %s with stride %"
                   PRId64 " padding %" PRId64 "/%" PRId64 " dilation %" PRId64 " lhs dilation %"
                   PRId64 " overflows int64", 2 + d, SHP(a->ndim, a->shape),
                   SHP(w->ndim, w->shape), st, lo, hi, dil, ld), -1;
  if (span - 1 < 0)
    return err_set(GRAFT_ERR_SHAPE, "conv2d: kernel %s larger than padded input %s",
                   SHP(w->ndim, w->shape), SHP(a->ndim, a->shape)), -1;
  *out = (span - 1) / st + 1;
  return 0;
}

/* Dim i of reduce_window(a): (d + lo + hi - window) / stride + 1. */
static int ir_window_dim(const ir_node *a, const ir_attrs *at, int i, int64_t *out) {
  int64_t w = IR_ATTR_AT(*at, WINDOW, window, i), st = IR_ATTR_AT(*at, WINDOW, stride, i);
  int64_t lo = IR_ATTR_AT(*at, WINDOW, pad_lo, i), hi = IR_ATTR_AT(*at, WINDOW, pad_hi, i), padded;
  bool empty = a->shape[i] == 0; /* an empty batch stays empty, as PyTorch's pooling does */
  if (w < 1 || st < 1 || lo < 0 || hi < 0 || __builtin_add_overflow(a->shape[i], lo, &padded) ||
      __builtin_add_overflow(padded, hi, &padded) || (padded < w && !empty))
    return err_set(GRAFT_ERR_SHAPE, "reduce_window: window %" PRId64 " stride %" PRId64
                   " padding %" PRId64 "/%" PRId64 " invalid for dim %d of %s", w, st, lo, hi, i,
                   SHP(a->ndim, a->shape)), -1;
  *out = empty ? 0 : (padded - w) / st + 1;
  return 0;
}

/* Collectives: operands of one dtype flattened into one [total] buffer (ALL_GATHER: one row
 * per rank), so one MPI call moves them all. */
static int ir_collective_shape(ir_node *n) {
  const char *nm = ir_ops[n->op].name;
  int64_t total = 0, r = IR_ATTR(n->attr, COLLECTIVE, arg);
  for (int k = 0; k < n->nin; k++) {
    if (n->in[k]->dtype != n->dtype)
      return err_set(GRAFT_ERR_DTYPE, "%s: operands have different dtypes (%s vs %s): one "
                     "collective per dtype", nm, graft_dtype_name(n->dtype),
                     graft_dtype_name(n->in[k]->dtype)), -1;
    if (__builtin_add_overflow(total, n->in[k]->numel, &total))
      return err_set(GRAFT_ERR_SHAPE, "%s: %d operands overflow int64 elements", nm, n->nin), -1;
  }
  if (n->op == IR_ALL_REDUCE && (r < 0 || r > 3))
    return err_set(GRAFT_ERR_ARG, "all_reduce: unknown reduction %" PRId64, r), -1;
  if (n->op == IR_ALL_REDUCE && r <= 1 && n->dtype == GRAFT_BOOL)
    return err_set(GRAFT_ERR_DTYPE, "all_reduce: %s of bool (use max or min)",
                   r ? "mean" : "sum"), -1;
  if (n->op == IR_ALL_REDUCE && r == 1 && !dtype_is_float(n->dtype))
    return err_set(GRAFT_ERR_DTYPE, "all_reduce: mean of %s (needs a floating dtype)",
                   graft_dtype_name(n->dtype)), -1;
  if ((n->op == IR_RANK_BROADCAST && r < 0) || (n->op == IR_ALL_GATHER && r < 1))
    return err_set(GRAFT_ERR_ARG, "%s: invalid %s %" PRId64, nm,
                   n->op == IR_ALL_GATHER ? "world size" : "root rank", r), -1;
  n->ndim = n->op == IR_ALL_GATHER ? 2 : 1;
  n->shape[0] = n->op == IR_ALL_GATHER ? r : total;
  n->shape[n->ndim - 1] = total;
  return 0;
}

/* Shape inference for the ops whose shape follows from operands and attributes.
 * Fills n->dtype, n->ndim, n->shape; returns -1 with the error set. */
static int ir_infer(ir_node *n, graft_dtype out_dtype, int ndim, const int64_t *shape) {
  const char *nm = ir_ops[n->op].name;
  ir_node *a = n->nin ? n->in[0] : NULL;
  const ir_attrs *at = &n->attr;
  switch (n->op) {
  case IR_DATA:
    return err_set(GRAFT_ERR_INTERNAL, "data leaves are made by ir_make_data"), -1;
  case IR_CONSTANT: case IR_IOTA: case IR_RNG: case IR_BROADCAST: case IR_RESHAPE:
  case IR_HOST_CALL:
    if (ir_check_shape_arg(nm, ndim, shape)) return -1;
    n->ndim = ndim;
    if (ndim) memcpy(n->shape, shape, sizeof(int64_t) * (size_t)ndim);
    n->dtype = a && n->op != IR_RNG && n->op != IR_HOST_CALL ? a->dtype : out_dtype;
    if (!dtype_valid(n->dtype))
      return err_set(GRAFT_ERR_DTYPE, "%s: invalid dtype %d", nm, (int)n->dtype), -1;
    if (n->op == IR_CONSTANT) /* its dtype's value: i32 3.7 hashes, folds and prints as 3 */
      n->attr.f = dtype_round(n->dtype, n->attr.f);
    if (n->op == IR_IOTA && (IR_ATTR(*at, AXIS, axis) < 0 ||
                             IR_ATTR(*at, AXIS, axis) >= (ndim ? ndim : 1) || ndim == 0))
      return err_set(GRAFT_ERR_AXIS, "iota: axis %" PRId64 " out of range for %s", IR_ATTR(*at, AXIS, axis),
                     SHP(ndim, shape)), -1;
    if (n->op == IR_IOTA && !ir_dtype_ok(IR_D_NUM, n->dtype))
      return err_set(GRAFT_ERR_DTYPE, "iota: needs a numeric dtype, got %s",
                     graft_dtype_name(n->dtype)), -1;
    if (n->op == IR_RNG) {
      if (a->dtype != GRAFT_I64 || a->ndim != 0)
        return err_set(GRAFT_ERR_ARG, "rng: seed must be a 0-d i64"), -1;
      if (!dtype_is_float(n->dtype))
        return err_set(GRAFT_ERR_DTYPE, "rng: needs a floating dtype, got %s",
                       graft_dtype_name(n->dtype)), -1;
      if (IR_ATTR(*at, RNG, dist) != 0 && IR_ATTR(*at, RNG, dist) != 1)
        return err_set(GRAFT_ERR_ARG, "rng: unknown distribution %" PRId64, IR_ATTR(*at, RNG, dist)), -1;
    }
    if (n->op == IR_BROADCAST) {
      if (a->ndim > ndim)
        return err_set(GRAFT_ERR_SHAPE, "broadcast: cannot broadcast %s to %s (more dims)",
                       SHP(a->ndim, a->shape), SHP(ndim, shape)), -1;
      for (int i = 0; i < a->ndim; i++) {
        int64_t d = a->shape[a->ndim - 1 - i], o = shape[ndim - 1 - i];
        if (d != 1 && d != o)
          return err_set(GRAFT_ERR_SHAPE, "broadcast: cannot broadcast %s to %s",
                         SHP(a->ndim, a->shape), SHP(ndim, shape)), -1;
      }
    }
    if (n->op == IR_RESHAPE && ir_numel(ndim, shape) != a->numel)
      return err_set(GRAFT_ERR_SHAPE, "reshape: cannot reshape %s (%" PRId64
                     " elements) to %s", SHP(a->ndim, a->shape), a->numel,
                     SHP(ndim, shape)), -1;
    return 0;
  default: break;
  }

  n->dtype = a->dtype;
  n->ndim = a->ndim;
  memcpy(n->shape, a->shape, sizeof n->shape);
  switch (ir_ops[n->op].kind) {
  case IR_K_COLLECTIVE:
    return ir_collective_shape(n);
  case IR_K_UNARY:
    if (n->op == IR_CONVERT) {
      if (!dtype_valid(out_dtype))
        return err_set(GRAFT_ERR_DTYPE, "convert: invalid target dtype %d", (int)out_dtype), -1;
      n->dtype = out_dtype;
    }
    return 0;
  case IR_K_BINARY: case IR_K_COMPARE: case IR_K_SELECT: {
    int first = n->op == IR_SELECT ? 1 : 0;
    if (n->op == IR_SELECT) {
      if (a->dtype != GRAFT_BOOL)
        return err_set(GRAFT_ERR_DTYPE, "select: predicate must be bool, got %s",
                       graft_dtype_name(a->dtype)), -1;
      n->dtype = n->in[1]->dtype;
    }
    for (int i = first + 1; i < n->nin; i++)
      if (n->in[i]->dtype != n->in[first]->dtype)
        return err_set(GRAFT_ERR_DTYPE, "%s: dtypes differ (%s vs %s)", nm,
                       graft_dtype_name(n->in[first]->dtype),
                       graft_dtype_name(n->in[i]->dtype)), -1;
    for (int i = 1; i < n->nin; i++)
      if (n->in[i]->ndim != a->ndim ||
          memcmp(n->in[i]->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim))
        return err_set(GRAFT_ERR_SHAPE, "%s: shapes differ (%s vs %s)", nm,
                       SHP(a->ndim, a->shape), SHP(n->in[i]->ndim, n->in[i]->shape)), -1;
    if (ir_ops[n->op].kind == IR_K_COMPARE) n->dtype = GRAFT_BOOL;
    return 0;
  }
  default: break;
  }

  switch (n->op) {
  case IR_TRANSPOSE: {
    int seen = 0;
    for (int i = 0; i < a->ndim; i++) {
      int64_t p = IR_ATTR_AT(*at, TRANSPOSE, perm, i);
      if (p < 0 || p >= a->ndim || (seen >> p & 1))
        return err_set(GRAFT_ERR_AXIS, "transpose: invalid permutation for %s",
                       SHP(a->ndim, a->shape)), -1;
      seen |= 1 << p;
      n->shape[i] = a->shape[p];
    }
    return 0;
  }
  case IR_SLICE:
    for (int i = 0; i < a->ndim; i++) {
      int64_t s = IR_ATTR_AT(*at, SLICE, start, i), l = IR_ATTR_AT(*at, SLICE, limit, i);
      int64_t st = IR_ATTR_AT(*at, SLICE, stride, i);
      if (st < 1 || s < 0 || l < s || l > a->shape[i])
        return err_set(GRAFT_ERR_SHAPE, "slice: dim %d of %s: start %" PRId64 " limit %" PRId64
                       " stride %" PRId64 " invalid", i, SHP(a->ndim, a->shape), s, l, st), -1;
      n->shape[i] = l > s ? (l - s - 1) / st + 1 : 0; /* ceil((l-s)/st); st may be huge */
    }
    return 0;
  case IR_CONCAT: {
    int64_t ax = IR_ATTR(*at, AXIS, axis);
    if (ax < 0 || ax >= a->ndim)
      return err_set(GRAFT_ERR_AXIS, "concat: axis %" PRId64 " out of range for %s", ax,
                     SHP(a->ndim, a->shape)), -1;
    int64_t total = 0;
    for (int k = 0; k < n->nin; k++) {
      ir_node *b = n->in[k];
      if (b->dtype != a->dtype)
        return err_set(GRAFT_ERR_DTYPE, "concat: dtypes differ (%s vs %s)",
                       graft_dtype_name(a->dtype), graft_dtype_name(b->dtype)), -1;
      int ok = b->ndim == a->ndim;
      for (int i = 0; ok && i < a->ndim; i++) ok = i == ax || b->shape[i] == a->shape[i];
      if (!ok)
        return err_set(GRAFT_ERR_SHAPE, "concat: shapes %s and %s differ off axis %" PRId64,
                       SHP(a->ndim, a->shape), SHP(b->ndim, b->shape), ax), -1;
      if (__builtin_add_overflow(total, b->shape[ax], &total))
        return err_set(GRAFT_ERR_SHAPE, "concat: %d operands of %s along axis %" PRId64
                       " overflow int64 at operand %d", n->nin, SHP(a->ndim, a->shape), ax,
                       k), -1;
    }
    n->shape[ax] = total;
    return 0;
  }
  case IR_PAD:
    n->attr.f = dtype_round(n->dtype, n->attr.f); /* the fill as the dtype holds it */
    for (int i = 0; i < a->ndim; i++)
      if (ir_pad_dim(a, at, i, &n->shape[i])) return -1;
    return 0;
  case IR_REDUCE_SUM: case IR_REDUCE_MAX: case IR_REDUCE_MIN: case IR_REDUCE_PROD: {
    int64_t mask = IR_ATTR(*at, REDUCE, mask);
    if (mask < 0 || mask >= (INT64_C(1) << a->ndim))
      return err_set(GRAFT_ERR_AXIS, "%s: axes mask out of range for %s", nm,
                     SHP(a->ndim, a->shape)), -1;
    int k = 0;
    for (int i = 0; i < a->ndim; i++) {
      if (!(mask >> i & 1)) n->shape[k++] = a->shape[i];
      else if (IR_ATTR(*at, REDUCE, keepdim)) n->shape[k++] = 1;
    }
    n->ndim = k;
    return 0;
  }
  case IR_ARGMAX: case IR_ARGMIN: {
    int64_t ax = IR_ATTR(*at, ARG, axis);
    if (ax < 0 || ax >= a->ndim)
      return err_set(GRAFT_ERR_AXIS, "%s: axis %" PRId64 " out of range for %s", nm, ax,
                     SHP(a->ndim, a->shape)), -1;
    if (a->shape[ax] == 0)
      return err_set(GRAFT_ERR_SHAPE, "%s: empty axis in %s", nm, SHP(a->ndim, a->shape)), -1;
    int k = 0;
    for (int i = 0; i < a->ndim; i++) {
      if (i != ax) n->shape[k++] = a->shape[i];
      else if (IR_ATTR(*at, ARG, keepdim)) n->shape[k++] = 1;
    }
    n->ndim = k;
    n->dtype = GRAFT_I64;
    return 0;
  }
  case IR_DOT: {
    ir_node *b = n->in[1];
    if (b->dtype != a->dtype)
      return err_set(GRAFT_ERR_DTYPE, "dot: dtypes differ (%s vs %s)",
                     graft_dtype_name(a->dtype), graft_dtype_name(b->dtype)), -1;
    int ok = a->ndim >= 2 && a->ndim == b->ndim && a->shape[a->ndim - 1] == b->shape[b->ndim - 2];
    for (int i = 0; ok && i < a->ndim - 2; i++) ok = a->shape[i] == b->shape[i];
    if (!ok)
      return err_set(GRAFT_ERR_SHAPE, "dot: shapes %s and %s do not contract",
                     SHP(a->ndim, a->shape), SHP(b->ndim, b->shape)), -1;
    n->shape[a->ndim - 1] = b->shape[b->ndim - 1];
    return 0;
  }
  case IR_CONV2D: {
    ir_node *w = n->in[1];
    if (w->dtype != a->dtype)
      return err_set(GRAFT_ERR_DTYPE, "conv2d: dtypes differ (%s vs %s)",
                     graft_dtype_name(a->dtype), graft_dtype_name(w->dtype)), -1;
    int64_t g = IR_ATTR(*at, CONV2D, groups);
    if (a->ndim != 4 || w->ndim != 4 || g < 1 || a->shape[1] % g || w->shape[0] % g ||
        w->shape[1] * g != a->shape[1])
      return err_set(GRAFT_ERR_SHAPE, "conv2d: input %s and weight %s do not match (groups %"
                     PRId64 ")", SHP(a->ndim, a->shape), SHP(w->ndim, w->shape), g), -1;
    n->shape[1] = w->shape[0];
    for (int d = 0; d < 2; d++)
      if (ir_conv_dim(a, w, at, d, &n->shape[2 + d])) return -1;
    return 0;
  }
  case IR_GATHER: case IR_SCATTER_ADD: {
    ir_node *ix = n->in[1];
    int64_t ax = IR_ATTR(*at, AXIS, axis);
    if (ix->dtype != GRAFT_I32 && ix->dtype != GRAFT_I64)
      return err_set(GRAFT_ERR_DTYPE, "%s: index must be i32 or i64, got %s", nm,
                     graft_dtype_name(ix->dtype)), -1;
    if (ax < 0 || ax >= a->ndim)
      return err_set(GRAFT_ERR_AXIS, "%s: axis %" PRId64 " out of range for %s", nm, ax,
                     SHP(a->ndim, a->shape)), -1;
    int ok = ix->ndim == a->ndim;
    for (int i = 0; ok && i < a->ndim; i++) ok = i == ax || ix->shape[i] <= a->shape[i];
    if (n->op == IR_SCATTER_ADD) {
      ir_node *src = n->in[2];
      if (src->dtype != a->dtype)
        return err_set(GRAFT_ERR_DTYPE, "scatter_add: dtypes differ (%s vs %s)",
                       graft_dtype_name(a->dtype), graft_dtype_name(src->dtype)), -1;
      ok = ok && src->ndim == ix->ndim &&
           !memcmp(src->shape, ix->shape, sizeof(int64_t) * (size_t)ix->ndim);
    }
    if (!ok)
      return err_set(GRAFT_ERR_SHAPE, "%s: index %s does not fit input %s on axis %" PRId64, nm,
                     SHP(ix->ndim, ix->shape), SHP(a->ndim, a->shape), ax), -1;
    if (n->op == IR_GATHER) {
      n->ndim = ix->ndim;
      memcpy(n->shape, ix->shape, sizeof n->shape);
    }
    return 0;
  }
  case IR_MAX_POOL_GRAD: {
    const ir_node *dy = n->in[1];
    if (IR_ATTR(*at, WINDOW, kind) != 0)
      return err_set(GRAFT_ERR_ARG, "max_pool_grad: kind must be 0 (max)"), -1;
    if (dy->dtype != a->dtype)
      return err_set(GRAFT_ERR_DTYPE, "max_pool_grad: dtypes differ (%s vs %s)",
                     graft_dtype_name(a->dtype), graft_dtype_name(dy->dtype)), -1;
    bool fits = dy->ndim == a->ndim;
    for (int i = 0; i < a->ndim; i++) {
      int64_t o;
      if (ir_window_dim(a, at, i, &o)) return -1;
      fits = fits && dy->shape[i] == o;
    }
    if (!fits)
      return err_set(GRAFT_ERR_SHAPE, "max_pool_grad: dy %s is not the pooled shape of x %s",
                     SHP(dy->ndim, dy->shape), SHP(a->ndim, a->shape)), -1;
    return 0;
  }
  case IR_REDUCE_WINDOW:
    if (IR_ATTR(*at, WINDOW, kind) != 0 && IR_ATTR(*at, WINDOW, kind) != 1)
      return err_set(GRAFT_ERR_ARG, "reduce_window: unknown kind %" PRId64,
                     IR_ATTR(*at, WINDOW, kind)), -1;
    for (int i = 0; i < a->ndim; i++)
      if (ir_window_dim(a, at, i, &n->shape[i])) return -1;
    return 0;
  default:
    return err_set(GRAFT_ERR_INTERNAL, "%s: no shape rule", nm), -1;
  }
}

ir_node *ir_make(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                 graft_dtype out_dtype, int ndim, const int64_t *shape) {
  return ir_make_on(op, nin, in, attr, out_dtype, ndim, shape, 0);
}

ir_node *ir_make_on(ir_op op, int nin, ir_node *const *in, const ir_attrs *attr,
                    graft_dtype out_dtype, int ndim, const int64_t *shape, int device) {
  if ((unsigned)op >= IR_OP_COUNT) return err_set(GRAFT_ERR_INTERNAL, "unknown op %d", (int)op);
  char d0[200], d1[200];
  if (!device_valid(device))
    return err_set(GRAFT_ERR_DEVICE, "no device %d (devices: %s)", device,
                   device_list_str(d0, sizeof d0));
  const ir_opinfo *oi = &ir_ops[op];
  if ((oi->arity >= 0 && nin != oi->arity) || (oi->arity < 0 && nin < 1))
    return err_set(GRAFT_ERR_ARG, "%s: takes %d operands, got %d", oi->name, oi->arity, nin);
  for (int i = 0; i < nin; i++) {
    if (!in[i]) return err_set(GRAFT_ERR_NULL, "%s: operand %d is NULL", oi->name, i);
    if (in[i]->device != in[0]->device)
      return err_set(GRAFT_ERR_DEVICE, "%s: operands on different devices (%s vs %s; "
                     "graft_to_device moves a tensor)", oi->name,
                     device_str(in[0]->device, d0, sizeof d0), device_str(in[i]->device, d1, sizeof d1));
  }
  /* The op's dtype class applies to its value operand (select: the branches). */
  if (nin) {
    graft_dtype dt = in[op == IR_SELECT ? 1 : 0]->dtype;
    if (!ir_dtype_ok(oi->dtypes, dt))
      return err_set(GRAFT_ERR_DTYPE, "%s: needs %s, got %s", oi->name, ir_class_str(oi->dtypes),
                     graft_dtype_name(dt));
  }
  ir_node *n = ir_alloc(nin);
  if (!n) return NULL;
  n->op = op;
  if (attr) n->attr = *attr;
  for (int i = 0; i < nin; i++) n->in[i] = in[i];
  n->device = nin ? in[0]->device : device;
  if (ir_infer(n, out_dtype, ndim, shape)) {
    free(n);
    return NULL;
  }
  if (ir_numel(n->ndim, n->shape) < 0) {
    char s0[128];
    err_set(GRAFT_ERR_SHAPE, "%s: result shape %s (from operand %s) has more than 2^56 elements",
            oi->name, SHP(n->ndim, n->shape),
            nin ? ir_shape_str(in[0]->ndim, in[0]->shape, s0, sizeof s0) : "[]");
    free(n);
    return NULL;
  }
  for (int i = 0; i < nin; i++) ir_retain(in[i]);
  ir_finish(n);
  return n;
}

void ir_attr_str(const ir_node *n, char *buf, size_t size) {
  ir_attr_fmt(n->op, &n->attr, n->nin ? n->in[0]->ndim : n->ndim, buf, size);
}

void ir_attr_fmt(ir_op op, const ir_attrs *attr, int nd, char *buf, size_t size) {
  const ir_attrs *at = attr;
  size_t k = 0;
  buf[0] = 0;
#define PUT(...) (k += (size_t)snprintf(buf + k, k < size ? size - k : 0, __VA_ARGS__))
/* "field=[...]" for cnt entries of a per-dim or {h, w} field, by name */
#define LIST(layout, field, cnt)                                                                \
  do {                                                                                          \
    PUT("%s=[", #field);                                                                        \
    for (int i_ = 0; i_ < (cnt); i_++)                                                          \
      PUT("%s%" PRId64, i_ ? "," : "", IR_ATTR_AT(*at, layout, field, i_));                     \
    PUT("] ");                                                                                  \
  } while (0)
  switch (op) {
  case IR_CONSTANT: PUT("value=%.9g", attr->f); break;
  case IR_IOTA: case IR_CONCAT: case IR_GATHER: case IR_SCATTER_ADD:
    PUT("axis=%" PRId64, IR_ATTR(*at, AXIS, axis)); break;
  case IR_RNG: PUT("dist=%s", IR_ATTR(*at, RNG, dist) ? "normal" : "uniform"); break;
  case IR_HOST_CALL: PUT("key=%016" PRIx64, (uint64_t)IR_ATTR(*at, HOST_CALL, key)); break;
  case IR_ALL_REDUCE: {
    int64_t r = IR_ATTR(*at, COLLECTIVE, arg);
    PUT("op=%s", r == 0 ? "sum" : r == 1 ? "mean" : r == 2 ? "max" : "min");
    break;
  }
  case IR_RANK_BROADCAST: PUT("root=%" PRId64, IR_ATTR(*at, COLLECTIVE, arg)); break;
  case IR_ALL_GATHER: PUT("world=%" PRId64, IR_ATTR(*at, COLLECTIVE, arg)); break;
  case IR_TRANSPOSE: LIST(TRANSPOSE, perm, nd); break;
  case IR_SLICE: LIST(SLICE, start, nd); LIST(SLICE, limit, nd); LIST(SLICE, stride, nd); break;
  case IR_PAD:
    LIST(PAD, lo, nd); LIST(PAD, hi, nd); LIST(PAD, interior, nd); PUT("value=%.9g", attr->f); break;
  case IR_REDUCE_SUM: case IR_REDUCE_MAX: case IR_REDUCE_MIN: case IR_REDUCE_PROD:
    PUT("axes_mask=0x%" PRIx64 " keepdim=%" PRId64, IR_ATTR(*at, REDUCE, mask),
        IR_ATTR(*at, REDUCE, keepdim)); break;
  case IR_ARGMAX: case IR_ARGMIN:
    PUT("axis=%" PRId64 " keepdim=%" PRId64, IR_ATTR(*at, ARG, axis), IR_ATTR(*at, ARG, keepdim)); break;
  case IR_CONV2D:
    LIST(CONV2D, stride, 2); LIST(CONV2D, pad_lo, 2); LIST(CONV2D, pad_hi, 2);
    LIST(CONV2D, dilation, 2); LIST(CONV2D, lhs_dilation, 2);
    PUT("groups=%" PRId64, IR_ATTR(*at, CONV2D, groups)); break;
  case IR_MAX_POOL_GRAD: case IR_REDUCE_WINDOW:
    PUT("kind=%s ", IR_ATTR(*at, WINDOW, kind) ? "sum" : "max"); LIST(WINDOW, window, nd);
    LIST(WINDOW, stride, nd); LIST(WINDOW, pad_lo, nd); LIST(WINDOW, pad_hi, nd); break;
  default: break;
  }
#undef PUT
#undef LIST
}
