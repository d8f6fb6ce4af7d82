/* Contraction reference kernels: batched matmul (dot) and 2-D convolution. Floats accumulate
 * in double and round once; integers accumulate in wrapping int64. */
#include "ref_util.h"

int ref_dot(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *a = &in[0], *b = &in[1];
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
  int64_t batch = 1;
  for (int d = 0; d < a->ndim - 2; d++) batch *= a->shape[d];
  graft_dtype dt = ins->dtype;
  bool fl = dtype_is_float(dt);
  for (int64_t p = 0; p < batch; p++) {
    int64_t ao = p * M * K, bo = p * K * N, oo = p * M * N;
    for (int64_t m = 0; m < M; m++) {
      for (int64_t n = 0; n < N; n++) {
        double sf = 0;
        int64_t si = 0;
        for (int64_t k = 0; k < K; k++) {
          int64_t ai = ao + m * K + k, bi = bo + k * N + n;
          if (fl) sf += dtype_load(a->data, dt, ai) * dtype_load(b->data, dt, bi);
          else si = ref_wrap_add(si, ref_wrap_mul(dtype_load_i(a->data, dt, ai),
                                                  dtype_load_i(b->data, dt, bi)));
        }
        if (fl) dtype_store(out, dt, oo + m * N + n, sf);
        else dtype_store_i(out, dt, oo + m * N + n, si);
      }
    }
  }
  return 0;
}

/* Maps output position o (along one spatial dim) and kernel tap k to an input index, or -1
 * when the tap falls on padding or on a zero inserted by input (lhs) dilation. */
static int64_t ref_conv_src(int64_t o, int64_t k, int64_t stride, int64_t pad_lo, int64_t dil,
                            int64_t lhs_dil, int64_t size) {
  if (lhs_dil < 1) lhs_dil = 1; /* 0 would mean "no dilation"; never divide by it */
  int64_t dilated = size > 0 ? (size - 1) * lhs_dil + 1 : 0;
  int64_t p = o * stride + k * dil - pad_lo; /* position in the dilated, unpadded input */
  if (p < 0 || p >= dilated || p % lhs_dil != 0) return -1;
  return p / lhs_dil;
}

int ref_conv2d(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *x = &in[0], *w = &in[1];
  const ir_attrs *a = &ins->attr;
  const int64_t *st = &IR_ATTR_AT(*a, CONV2D, stride, 0), *lo = &IR_ATTR_AT(*a, CONV2D, pad_lo, 0);
  const int64_t *dil = &IR_ATTR_AT(*a, CONV2D, dilation, 0);
  const int64_t *ld = &IR_ATTR_AT(*a, CONV2D, lhs_dilation, 0);
  int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
  int64_t O = w->shape[0], CG = w->shape[1], KH = w->shape[2], KW = w->shape[3];
  int64_t OH = ins->shape[2], OW = ins->shape[3];
  int64_t groups = IR_ATTR(*a, CONV2D, groups) > 0 ? IR_ATTR(*a, CONV2D, groups) : 1;
  int64_t OG = O / groups > 0 ? O / groups : 1; /* output channels per group */
  graft_dtype xt = x->dtype, wt = w->dtype;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < O; o++) {
      int64_t g = o / OG;
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double s = 0;
          for (int64_t cg = 0; cg < CG; cg++) {
            int64_t c = g * CG + cg; /* input channel of this group */
            for (int64_t kh = 0; kh < KH; kh++) {
              int64_t ih = ref_conv_src(oh, kh, st[0], lo[0], dil[0], ld[0], H);
              if (ih < 0) continue;
              for (int64_t kw = 0; kw < KW; kw++) {
                int64_t iw = ref_conv_src(ow, kw, st[1], lo[1], dil[1], ld[1], W);
                if (iw < 0) continue;
                s += dtype_load(x->data, xt, ((n * C + c) * H + ih) * W + iw) *
                     dtype_load(w->data, wt, ((o * CG + cg) * KH + kh) * KW + kw);
              }
            }
          }
          dtype_store(out, ins->dtype, ((n * O + o) * OH + oh) * OW + ow, s);
        }
    }
  return 0;
}
