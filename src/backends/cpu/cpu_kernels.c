/* Host-side kernels for ops the generator emits no code for: conv2d as im2col + GEMM, pooling
 * windows over the last two dims, gather and scatter_add, as typed loops instead of the
 * reference kernels' per-element dtype dispatch. Results equal the reference kernels' up to
 * the order of float summation. An instruction none of these covers runs on the reference. */
#include "cpu_internal.h"
#include "../ref/ref.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- conv2d: per image and group, W_g [Og, Cg*KH*KW] x col [Cg*KH*KW, OH*OW] ---- */
#define CONV_BODY(T, GEMM, TICKET)                                                               \
  do {                                                                                           \
    const T *x = in[0].data, *w = in[1].data;                                                    \
    T *y = out;                                                                                  \
    T *col = malloc(sizeof(T) * (size_t)(Cg * KH * KW * OH * OW));                               \
    if (!col) {                                                                                  \
      cpu_choice_end(TICKET); /* a measured run that failed still ends */                       \
      return err_set(GRAFT_ERR_OOM, "cpu: out of memory for conv2d columns"), -1;                \
    }                                                                                            \
    for (int64_t n = 0; n < N; n++)                                                              \
      for (int64_t g = 0; g < G; g++) {                                                          \
        T *c = col;                                                                              \
        for (int64_t ci = 0; ci < Cg; ci++) {                                                    \
          const T *xp = x + ((n * C) + g * Cg + ci) * H * W;                                     \
          for (int64_t kh = 0; kh < KH; kh++)                                                    \
            for (int64_t kw = 0; kw < KW; kw++)                                                  \
              for (int64_t oh = 0; oh < OH; oh++) {                                              \
                int64_t hd = oh * sh + kh * dh - ph; /* in the dilated, padded input */          \
                int64_t hi = hd / lh;                                                            \
                int hok = hd >= 0 && hd % lh == 0 && hi < H;                                     \
                for (int64_t ow = 0; ow < OW; ow++) {                                            \
                  int64_t wd = ow * sw + kw * dw - pw, wi = wd / lw;                             \
                  *c++ = hok && wd >= 0 && wd % lw == 0 && wi < W ? xp[hi * W + wi] : (T)0;      \
                }                                                                                \
              }                                                                                  \
        }                                                                                        \
        GEMM(101, 111, 111, (int)Og, (int)(OH * OW), (int)(Cg * KH * KW), 1,                     \
             w + g * Og * Cg * KH * KW, (int)(Cg * KH * KW), col, (int)(OH * OW), 0,             \
             y + (n * O + g * Og) * OH * OW, (int)(OH * OW));                                    \
      }                                                                                          \
    free(col);                                                                                   \
  } while (0)

/* ---- conv2d, direct: grouped convolutions with few output channels per group ----
 * Depthwise convolutions (mobilenet's: one channel per group) and their gradients make
 * per-group GEMMs of one row: im2col's copies and a BLAS call per group and image cost more
 * than the arithmetic (61% of mobilenet_v2's step). Here each output plane accumulates its
 * group's input planes shifted by the kernel offsets, the valid output range per offset
 * computed once so the inner loop is a plain strided multiply-add; planes are split over the
 * pool. */
typedef struct {
  const void *x, *w;
  void *y;
  int64_t C, H, W, O, KH, KW, Cg, Og, OH, OW, sh, sw, ph, pw, dh, dw, lh, lw;
} cpu_conv;

/* Where output plane `plane` (n * O + o) reads and writes, in elements: its group's first input
 * plane and its first kernel plane (input channel ci of the group adds ci planes to each), and
 * the output plane itself. */
typedef struct {
  int64_t x, w, y;
} cpu_conv_at;

static cpu_conv_at cpu_conv_plane(const cpu_conv *c, int64_t plane) {
  int64_t n = plane / c->O, o = plane % c->O, g = o / c->Og;
  return (cpu_conv_at){(n * c->C + g * c->Cg) * c->H * c->W, o * c->Cg * c->KH * c->KW,
                       plane * c->OH * c->OW};
}

/* [lo, hi) of outputs o whose input coordinate (o*s + k*d - p) / l is a whole index in [0, n). */
static void cpu_conv_range(int64_t n, int64_t on, int64_t s, int64_t k, int64_t d, int64_t p,
                           int64_t l, int64_t *lo, int64_t *hi) {
  int64_t off = k * d - p, last = (n - 1) * l; /* o*s + off in [0, last] */
  *lo = off >= 0 ? 0 : (-off + s - 1) / s;
  *hi = off > last ? 0 : (last - off) / s + 1;
  if (*hi > on) *hi = on;
  if (*lo > *hi) *lo = *hi;
}

/* gcd, for the column step of an input-dilated convolution. */
static int64_t cpu_gcd(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

/* One output row's taps of kernel column kw: y[ow] += wv * x[(ow*sw + kw*dw - pw) / lw] over the
 * ow in [ow0, ow1) whose input column is whole. With input dilation (a strided convolution's
 * input gradient) only every lw/gcd(sw,lw)-th column reads one: step over those rather than
 * test each (the test per column ran 4-8x slower than the forward). */
#define CONV_ROW(T)                                                                              \
  static inline void cpu_conv_row_##T(const cpu_conv *c, T *yr, const T *xr, T wv, int64_t kw,  \
                               int64_t ow0, int64_t ow1) {                                       \
    int64_t off = kw * c->dw - c->pw;                                                            \
    if (c->lw == 1 && c->sw == 1 && ow1 - ow0 >= 8) { /* contiguous: vectorized */               \
      const T *xs = xr + off;                                                                    \
      _Pragma("omp simd")                                                                        \
      for (int64_t ow = ow0; ow < ow1; ow++) yr[ow] += wv * xs[ow];                              \
      return;                                                                                    \
    }                                                                                            \
    if (c->lw == 1) {                                                                            \
      const T *xs = xr + off;                                                                    \
      for (int64_t ow = ow0; ow < ow1; ow++) yr[ow] += wv * xs[ow * c->sw];                      \
      return;                                                                                    \
    }                                                                                            \
    int64_t ow = ow0;                                                                            \
    while (ow < ow1 && (ow * c->sw + off) % c->lw) ow++;                                         \
    int64_t step = c->lw / cpu_gcd(c->sw, c->lw), xstep = c->sw * step / c->lw;                  \
    const T *xs = xr + (ow * c->sw + off) / c->lw;                                               \
    for (; ow < ow1; ow += step, xs += xstep) yr[ow] += wv * *xs;                                \
  }
CONV_ROW(float)
CONV_ROW(double)

/* [lo, hi) of inputs i (of n) whose output i*l + p - k lies in [0, on): an input-dilated,
 * unit-stride convolution seen from its input. */
static void cpu_conv_from_input(int64_t n, int64_t on, int64_t l, int64_t k, int64_t p,
                                int64_t *lo, int64_t *hi) {
  int64_t off = p - k; /* o = i*l + off */
  *lo = off >= 0 ? 0 : (-off + l - 1) / l;
  *hi = on - 1 - off < 0 ? 0 : (on - 1 - off) / l + 1;
  if (*hi > n) *hi = n;
  if (*lo > *hi) *lo = *hi;
}

/* An input-dilated convolution of unit stride and dilation (a strided convolution's input
 * gradient) walks its input instead: each input element, times a tap, adds to the output
 * l apart, with no test for the dilation's holes (mobilenet_v2's 4x576x2x2 -> 4x4 gradient
 * made ~80k row calls of a step search each). Taps in the same (ci, kh, kw) order as the row
 * form, so every output adds the same terms in the same order. */
#define CONV_SCATTER_PLANE(T)                                                                    \
  static inline void cpu_conv_scatter_##T(const cpu_conv *c, T *y, const T *xp, const T *wp) {   \
    for (int64_t kh = 0; kh < c->KH; kh++) {                                                     \
      int64_t h0, h1;                                                                            \
      cpu_conv_from_input(c->H, c->OH, c->lh, kh, c->ph, &h0, &h1);                              \
      for (int64_t kw = 0; kw < c->KW; kw++) {                                                   \
        int64_t w0, w1;                                                                          \
        cpu_conv_from_input(c->W, c->OW, c->lw, kw, c->pw, &w0, &w1);                            \
        T wv = wp[kh * c->KW + kw];                                                              \
        for (int64_t h = h0; h < h1; h++) {                                                      \
          T *yr = y + (h * c->lh + c->ph - kh) * c->OW + c->pw - kw;                             \
          const T *xr = xp + h * c->W;                                                           \
          for (int64_t w = w0; w < w1; w++) yr[w * c->lw] += wv * xr[w];                         \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }
CONV_SCATTER_PLANE(float)
CONV_SCATTER_PLANE(double)

#define CONV_DIRECT(T)                                                                           \
  static void cpu_conv_direct_##T(void **S, int64_t lo, int64_t hi) {                            \
    const cpu_conv *c = S[0];                                                                    \
    const T *x = c->x, *w = c->w;                                                                \
    const bool scatter = (c->lh > 1 || c->lw > 1) && c->sh == 1 && c->sw == 1 && c->dh == 1 &&    \
                         c->dw == 1;                                                             \
    for (int64_t plane = lo; plane < hi; plane++) { /* plane = n * O + o */                      \
      const cpu_conv_at at = cpu_conv_plane(c, plane);                                           \
      T *y = (T *)c->y + at.y;                                                                   \
      memset(y, 0, sizeof(T) * (size_t)(c->OH * c->OW));                                         \
      for (int64_t ci = 0; ci < c->Cg; ci++) {                                                   \
        const T *xp = x + at.x + ci * c->H * c->W, *wp = w + at.w + ci * c->KH * c->KW;          \
        if (scatter) {                                                                           \
          cpu_conv_scatter_##T(c, y, xp, wp);                                                    \
          continue;                                                                              \
        }                                                                                        \
        for (int64_t kh = 0; kh < c->KH; kh++) {                                                 \
          int64_t oh0, oh1;                                                                      \
          cpu_conv_range(c->H, c->OH, c->sh, kh, c->dh, c->ph, c->lh, &oh0, &oh1);               \
          for (int64_t kw = 0; kw < c->KW; kw++) {                                               \
            int64_t ow0, ow1;                                                                    \
            cpu_conv_range(c->W, c->OW, c->sw, kw, c->dw, c->pw, c->lw, &ow0, &ow1);             \
            T wv = wp[kh * c->KW + kw];                                                          \
            for (int64_t oh = oh0; oh < oh1; oh++) {                                             \
              int64_t hd = oh * c->sh + kh * c->dh - c->ph;                                      \
              if (hd % c->lh) continue;                                                          \
              cpu_conv_row_##T(c, y + oh * c->OW, xp + hd / c->lh * c->W, wv, kw, ow0, ow1);     \
            }                                                                                    \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }
CONV_DIRECT(float)
CONV_DIRECT(double)

/* Unit-stride 3x3 convolutions on planes under 8 wide (mobilenet_v2's last blocks: 4x4 and 2x2
 * depthwise planes) run output by output, the taps in range found by comparisons: the row form
 * made ~32 calls of 2-4 elements per plane, the dot form two range divisions per output
 * (4x960x2x2: 0.17 -> 0.08 ms a call; 8 wide, the row form's vector rows won: 0.20 against
 * 0.24). Per output the terms are added in the same (ci, kh, kw) order as the row form, from 0. */
static bool cpu_conv_small3(const cpu_conv *c) {
  return c->KH == 3 && c->KW == 3 && c->sh == 1 && c->sw == 1 && c->dh == 1 && c->dw == 1 &&
         c->lh == 1 && c->lw == 1 && c->OW < 8;
}

#define CONV_SMALL3(T)                                                                           \
  static void cpu_conv_small3_##T(void **S, int64_t lo, int64_t hi) {                            \
    const cpu_conv *c = S[0];                                                                    \
    const T *x = c->x, *w = c->w;                                                                \
    for (int64_t plane = lo; plane < hi; plane++) {                                              \
      const cpu_conv_at at = cpu_conv_plane(c, plane);                                           \
      T *y = (T *)c->y + at.y;                                                                   \
      for (int64_t oh = 0; oh < c->OH; oh++) {                                                   \
        int64_t h = oh - c->ph, kh0 = h < 0 ? -h : 0, kh1 = c->H - h < 3 ? c->H - h : 3;         \
        for (int64_t ow = 0; ow < c->OW; ow++) {                                                 \
          int64_t v = ow - c->pw, kw0 = v < 0 ? -v : 0, kw1 = c->W - v < 3 ? c->W - v : 3;       \
          T acc = 0;                                                                             \
          for (int64_t ci = 0; ci < c->Cg; ci++) {                                               \
            const T *xp = x + at.x + ci * c->H * c->W + h * c->W + v, *wp = w + at.w + ci * 9;   \
            for (int64_t kh = kh0; kh < kh1; kh++)                                               \
              for (int64_t kw = kw0; kw < kw1; kw++) acc += wp[kh * 3 + kw] * xp[kh * c->W + kw]; \
          }                                                                                      \
          *y++ = acc;                                                                            \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }
CONV_SMALL3(float)
CONV_SMALL3(double)

/* The same with the kernel offsets innermost: a weight gradient's "kernel" is the forward's
 * output plane (32x32) and its output the forward's kernel (3x3), so each output element is a
 * long dot product instead of many 3-long loops. No input dilation (the weight gradient has
 * none). */
#define CONV_DIRECT_DOT(T)                                                                       \
  static void cpu_conv_dot_##T(void **S, int64_t lo, int64_t hi) {                               \
    const cpu_conv *c = S[0];                                                                    \
    const T *x = c->x, *w = c->w;                                                                \
    for (int64_t plane = lo; plane < hi; plane++) {                                              \
      const cpu_conv_at at = cpu_conv_plane(c, plane);                                           \
      T *y = (T *)c->y + at.y;                                                                   \
      for (int64_t oh = 0; oh < c->OH; oh++)                                                     \
        for (int64_t ow = 0; ow < c->OW; ow++) {                                                 \
          int64_t kh0, kh1, kw0, kw1;                                                            \
          cpu_conv_range(c->H, c->KH, c->dh, oh, c->sh, c->ph, 1, &kh0, &kh1);                   \
          cpu_conv_range(c->W, c->KW, c->dw, ow, c->sw, c->pw, 1, &kw0, &kw1);                   \
          T acc = 0;                                                                             \
          for (int64_t ci = 0; ci < c->Cg; ci++) {                                               \
            const T *xp = x + at.x + ci * c->H * c->W, *wp = w + at.w + ci * c->KH * c->KW;      \
            for (int64_t kh = kh0; kh < kh1; kh++) {                                             \
              const T *xr = xp + (oh * c->sh + kh * c->dh - c->ph) * c->W + ow * c->sw - c->pw;  \
              const T *wr = wp + kh * c->KW;                                                     \
              if (c->dw == 1) {                                                                  \
                _Pragma("omp simd reduction(+:acc)")                                             \
                for (int64_t kw = kw0; kw < kw1; kw++) acc += wr[kw] * xr[kw];                   \
              } else {                                                                           \
                for (int64_t kw = kw0; kw < kw1; kw++) acc += wr[kw] * xr[kw * c->dw];           \
              }                                                                                  \
            }                                                                                    \
          }                                                                                      \
          y[oh * c->OW + ow] = acc;                                                              \
        }                                                                                        \
    }                                                                                            \
  }
CONV_DIRECT_DOT(float)
CONV_DIRECT_DOT(double)

/* Direct pays where a group's GEMM would have a row or few: grouped, few outputs per group. */
static bool cpu_conv_direct_pays(int64_t G, int64_t Og) { return G > 1 && Og <= 4; }

static int cpu_k_conv2d(const exec_instr *ins, const ref_arg *in, void *out) {
  const cpu_blas_fns *bl = cpu_blas();
  int64_t N = in[0].shape[0], C = in[0].shape[1], H = in[0].shape[2], W = in[0].shape[3];
  const ir_attrs *at = &ins->attr;
  int64_t O = in[1].shape[0], KH = in[1].shape[2], KW = in[1].shape[3], G = IR_ATTR(*at, CONV2D, groups);
  int64_t Cg = C / G, Og = O / G, OH = ins->shape[2], OW = ins->shape[3];
  int64_t sh = IR_ATTR_AT(*at, CONV2D, stride, 0), sw = IR_ATTR_AT(*at, CONV2D, stride, 1);
  int64_t ph = IR_ATTR_AT(*at, CONV2D, pad_lo, 0), pw = IR_ATTR_AT(*at, CONV2D, pad_lo, 1);
  int64_t dh = IR_ATTR_AT(*at, CONV2D, dilation, 0), dw = IR_ATTR_AT(*at, CONV2D, dilation, 1);
  int64_t lh = IR_ATTR_AT(*at, CONV2D, lhs_dilation, 0), lw = IR_ATTR_AT(*at, CONV2D, lhs_dilation, 1);
  /* Grouped: the rule's kernel or the other, a measured choice per class (cpu_choice.c). */
  bool direct = cpu_conv_direct_pays(G, Og);
  cpu_choice_ticket t = {.slot = -1};
  if (G > 1) {
    int64_t d[11] = {ins->dtype, KH, KW, sh, sw, dh, dw, lh > 1 || lw > 1, direct, Og, Cg * OH * OW * N};
    if (cpu_choice_begin("conv2d grouped (dtype, kh, kw, sh, sw, dh, dw, input-dilated, direct first, og, "
                         "cg*oh*ow*n)", d, 11, 9, 2, &t) == 1)
      direct = !direct;
  }
  if (direct) {
    cpu_conv c = {in[0].data, in[1].data, out, C, H, W, O, KH, KW, Cg, Og, OH, OW,
                  sh, sw, ph, pw, dh, dw, lh, lw};
    void *S[1] = {&c};
    bool f32 = ins->dtype == GRAFT_F32, dot = KH * KW > OH * OW && lh == 1 && lw == 1;
    cpu_kernel_fn fn = cpu_conv_small3(&c) ? (f32 ? cpu_conv_small3_float : cpu_conv_small3_double)
                       : dot ? (f32 ? cpu_conv_dot_float : cpu_conv_dot_double)
                             : (f32 ? cpu_conv_direct_float : cpu_conv_direct_double);
    cpu_parallel_run(fn, S, N * O);
  } else if (ins->dtype == GRAFT_F32) {
    CONV_BODY(float, bl->sgemm, &t);
  } else {
    CONV_BODY(double, bl->dgemm, &t);
  }
  cpu_choice_end(&t);
  return 0;
}

/* ---- pooling over the last two dims; leading dims are planes ---- */
typedef struct {
  int64_t H, W, OH, OW, KH, KW, SH, SW, PH, PW, planes;
} cpu_window;

/* The window geometry of x (input) pooled to pooled's shape. */
static cpu_window cpu_window_of(const exec_instr *ins, const ref_arg *x, const int64_t *pooled) {
  const ir_attrs *a = &ins->attr;
  int nd = x->ndim;
  cpu_window w = {x->shape[nd - 2], x->shape[nd - 1], pooled[nd - 2], pooled[nd - 1],
                  IR_ATTR_AT(*a, WINDOW, window, nd - 2), IR_ATTR_AT(*a, WINDOW, window, nd - 1),
                  IR_ATTR_AT(*a, WINDOW, stride, nd - 2), IR_ATTR_AT(*a, WINDOW, stride, nd - 1),
                  IR_ATTR_AT(*a, WINDOW, pad_lo, nd - 2), IR_ATTR_AT(*a, WINDOW, pad_lo, nd - 1), 0};
  w.planes = w.H && w.W ? x->numel / (w.H * w.W) : 0;
  return w;
}

/* reduce_window: max or sum pooling; windows inside the plane skip the bounds checks, planes
 * run over the pool. A NaN in a max window gives NaN. */
typedef struct {
  const void *x;
  void *y;
  cpu_window w;
  int is_max;
} cpu_pool_job;

/* Every window inside the plane (no pad on either side reaches it). */
static bool cpu_windows_inside(const cpu_window *w) {
  return w->PH == 0 && w->PW == 0 && (w->OH - 1) * w->SH + w->KH <= w->H &&
         (w->OW - 1) * w->SW + w->KW <= w->W;
}

/* Square 2x2 and 3x3 windows all inside the plane (most CNNs' pooling; resnet's 3x3/2 max pool
 * reads an input padded beforehand): straight-line taps, no per-window bounds, in the generic
 * order, so ties and NaNs come out the same. The demo CNN's 2x2/2 max pool 0.113 -> 0.036 ms.
 * Returns K, or 0 for the generic loop. */
static int cpu_window_fixed(const cpu_window *w) {
  int k = w->KH == w->KW && (w->KH == 2 || w->KH == 3) ? (int)w->KH : 0;
  return k && cpu_windows_inside(w) ? k : 0;
}

#define POOL_FIXED(T, K)                                                                        \
  do {                                                                                          \
    for (int64_t p = lo; p < hi; p++) {                                                         \
      const T *x = (const T *)j->x + p * win.H * win.W;                                         \
      T *y = (T *)j->y + p * win.OH * win.OW;                                                   \
      for (int64_t oh = 0; oh < win.OH; oh++) {                                                 \
        const T *r = x + oh * win.SH * win.W;                                                   \
        for (int64_t ow = 0; ow < win.OW; ow++) {                                               \
          const T *t = r + ow * win.SW;                                                         \
          T acc = is_max ? t[0] : (T)0 + t[0];                                                  \
          int nan = t[0] != t[0];                                                               \
          for (int kh = 0; kh < K; kh++)                                                        \
            for (int kw = kh == 0; kw < K; kw++) {                                              \
              T v = t[kh * win.W + kw];                                                         \
              nan |= v != v;                                                                    \
              acc = is_max ? (v > acc ? v : acc) : acc + v;                                     \
            }                                                                                   \
          *y++ = is_max && nan ? (T)NAN : acc;                                                  \
        }                                                                                       \
      }                                                                                         \
    }                                                                                           \
  } while (0)

#define POOL_PLANES(T)                                                                          \
  do {                                                                                          \
    const cpu_pool_job *j = S[0];                                                               \
    const cpu_window win = j->w;                                                                \
    const int is_max = j->is_max;                                                               \
    const int fixed = cpu_window_fixed(&win);                                                   \
    if (fixed) {                                                                                \
      if (fixed == 2) POOL_FIXED(T, 2);                                                         \
      else POOL_FIXED(T, 3);                                                                    \
      break;                                                                                    \
    }                                                                                           \
    for (int64_t p = lo; p < hi; p++) {                                                         \
      const T *x = (const T *)j->x + p * win.H * win.W;                                         \
      T *y = (T *)j->y + p * win.OH * win.OW;                                                   \
      for (int64_t oh = 0; oh < win.OH; oh++)                                                   \
        for (int64_t ow = 0; ow < win.OW; ow++) {                                               \
          int64_t h0 = oh * win.SH - win.PH, w0 = ow * win.SW - win.PW;                         \
          int64_t kh0 = h0 < 0 ? -h0 : 0, kw0 = w0 < 0 ? -w0 : 0;                               \
          int64_t kh1 = h0 + win.KH > win.H ? win.H - h0 : win.KH;                              \
          int64_t kw1 = w0 + win.KW > win.W ? win.W - w0 : win.KW;                              \
          T acc = is_max ? (T)-INFINITY : (T)0;                                                 \
          int nan = 0;                                                                          \
          for (int64_t kh = kh0; kh < kh1; kh++) {                                              \
            const T *xr = x + (h0 + kh) * win.W + w0;                                           \
            for (int64_t kw = kw0; kw < kw1; kw++) {                                            \
              T v = xr[kw];                                                                     \
              if (is_max) {                                                                     \
                nan |= v != v;                                                                  \
                acc = v > acc ? v : acc;                                                        \
              } else {                                                                          \
                acc += v;                                                                       \
              }                                                                                 \
            }                                                                                   \
          }                                                                                     \
          *y++ = nan ? (T)NAN : acc;                                                            \
        }                                                                                       \
    }                                                                                           \
  } while (0)

static void cpu_pool_float(void **S, int64_t lo, int64_t hi) { POOL_PLANES(float); }
static void cpu_pool_double(void **S, int64_t lo, int64_t hi) { POOL_PLANES(double); }

/* ---- max_pool_grad: each window's dy to its first maximum (ref_max_pool_grad's rule) ----
 * One pass per window: the first tap is the candidate, a strictly greater one replaces it, so
 * the first maximum wins; pads are -inf (what they receive is dropped); a NaN selects nothing.
 * Windows inside the plane skip the bounds checks; planes run over the pool. */
typedef struct {
  const void *x, *g;
  void *y;
  cpu_window w;
} cpu_pool_grad_job;

/* 2x2 stride 2, every window inside the plane: windows do not overlap. Writing each window's
 * four outputs instead of clearing the plane first ran 4x slower. */
#define POOL_GRAD_2X2(T)                                                                        \
  do {                                                                                          \
    for (int64_t p = lo; p < hi; p++) {                                                         \
      const T *x = (const T *)j->x + p * win.H * win.W, *g = (const T *)j->g + p * win.OH * win.OW; \
      T *y = (T *)j->y + p * win.H * win.W;                                                     \
      memset(y, 0, sizeof(T) * (size_t)(win.H * win.W));                                        \
      for (int64_t oh = 0; oh < win.OH; oh++)                                                   \
        for (int64_t ow = 0; ow < win.OW; ow++, g++) {                                          \
          int64_t i0 = 2 * oh * win.W + 2 * ow, i[4] = {i0, i0 + 1, i0 + win.W, i0 + win.W + 1}; \
          T m = x[i0];                                                                          \
          int64_t best = i0;                                                                    \
          int nan = m != m;                                                                     \
          for (int t = 1; t < 4; t++) {                                                         \
            T v = x[i[t]];                                                                      \
            nan |= v != v;                                                                      \
            best = v > m ? i[t] : best;                                                         \
            m = v > m ? v : m;                                                                  \
          }                                                                                     \
          if (!nan) y[best] += *g;                                                              \
        }                                                                                       \
    }                                                                                           \
  } while (0)

#define POOL_GRAD_PLANES(T)                                                                     \
  do {                                                                                          \
    const cpu_pool_grad_job *j = S[0];                                                          \
    const cpu_window win = j->w;                                                                \
    if (cpu_window_fixed(&win) == 2 && win.SH == 2 && win.SW == 2) {                          \
      POOL_GRAD_2X2(T);                                                                         \
      break;                                                                                    \
    }                                                                                           \
    for (int64_t p = lo; p < hi; p++) {                                                         \
      const T *x = (const T *)j->x + p * win.H * win.W, *g = (const T *)j->g + p * win.OH * win.OW; \
      T *y = (T *)j->y + p * win.H * win.W;                                                     \
      memset(y, 0, sizeof(T) * (size_t)(win.H * win.W));                                        \
      for (int64_t oh = 0; oh < win.OH; oh++)                                                   \
        for (int64_t ow = 0; ow < win.OW; ow++, g++) {                                          \
          int64_t h0 = oh * win.SH - win.PH, w0 = ow * win.SW - win.PW, best = -1;              \
          int nan = 0;                                                                          \
          if (h0 >= 0 && w0 >= 0 && h0 + win.KH <= win.H && w0 + win.KW <= win.W) {            \
            const T *xw = x + h0 * win.W + w0; /* inside: no checks, no branches */             \
            T m = xw[0];                                                                        \
            best = 0;                                                                           \
            for (int64_t kh = 0; kh < win.KH; kh++)                                             \
              for (int64_t kw = 0; kw < win.KW; kw++) {                                         \
                T v = xw[kh * win.W + kw];                                                      \
                int gt = v > m;                                                                 \
                nan |= v != v;                                                                  \
                m = gt ? v : m;                                                                 \
                best = gt ? kh * win.W + kw : best;                                             \
              }                                                                                 \
            best += h0 * win.W + w0;                                                            \
          } else {                                                                              \
            T m = 0;                                                                            \
            for (int64_t kh = 0, first = 1; kh < win.KH; kh++)                                  \
              for (int64_t kw = 0; kw < win.KW; kw++) {                                         \
                int64_t h = h0 + kh, w = w0 + kw;                                               \
                bool in_ = h >= 0 && h < win.H && w >= 0 && w < win.W;                          \
                T v = in_ ? x[h * win.W + w] : (T)-INFINITY;                                    \
                nan |= v != v;                                                                  \
                if (first || v > m) { m = v; best = in_ ? h * win.W + w : -1; first = 0; }      \
              }                                                                                 \
          }                                                                                     \
          if (!nan && best >= 0) y[best] += *g;                                                 \
        }                                                                                       \
    }                                                                                           \
  } while (0)

static void cpu_pool_grad_float(void **S, int64_t lo, int64_t hi) { POOL_GRAD_PLANES(float); }
static void cpu_pool_grad_double(void **S, int64_t lo, int64_t hi) { POOL_GRAD_PLANES(double); }

static int cpu_k_pool(const exec_instr *ins, const ref_arg *in, void *out) {
  cpu_pool_job j = {in[0].data, out, cpu_window_of(ins, &in[0], ins->shape),
                    IR_ATTR(ins->attr, WINDOW, kind) == 0};
  void *S[1] = {&j};
  cpu_parallel_run(ins->dtype == GRAFT_F32 ? cpu_pool_float : cpu_pool_double, S, j.w.planes);
  return 0;
}

static int cpu_k_pool_grad(const exec_instr *ins, const ref_arg *in, void *out) {
  cpu_pool_grad_job j = {in[0].data, in[1].data, out, cpu_window_of(ins, &in[0], in[1].shape)};
  void *S[1] = {&j};
  cpu_parallel_run(ins->dtype == GRAFT_F32 ? cpu_pool_grad_float : cpu_pool_grad_double, S,
                   j.w.planes);
  return 0;
}

/* Windows only over the last two dims, no reduction across leading ones. */
static bool cpu_pool_ok(const exec_instr *ins, const ref_arg *in) {
  int nd = in[0].ndim;
  if (nd < 2) return false;
  for (int d = 0; d < nd - 2; d++)
    if (IR_ATTR_AT(ins->attr, WINDOW, window, d) != 1 || IR_ATTR_AT(ins->attr, WINDOW, stride, d) != 1 ||
        IR_ATTR_AT(ins->attr, WINDOW, pad_lo, d) || IR_ATTR_AT(ins->attr, WINDOW, pad_hi, d))
      return false;
  return true;
}

/* ---- gather / scatter_add: an odometer over the index's coordinates ---- */
static int cpu_bad_index(const char *op, int64_t v, int64_t n, int axis) {
  err_set(GRAFT_ERR_ARG, "%s: index %lld out of range [0, %lld) on axis %d", op, (long long)v,
          (long long)n, axis);
  return -1;
}

static int64_t cpu_idx(const ref_arg *ix, int64_t i) {
  return ix->dtype == GRAFT_I64 ? ((const int64_t *)ix->data)[i] : ((const int32_t *)ix->data)[i];
}

/* Calls body(i, src_offset) for each element i of the index, with the source offset in x. */
#define ODOMETER(ix, xshape, xnd, axis, body)                                                    \
  do {                                                                                           \
    int64_t st_[GRAFT_MAX_DIMS], c_[GRAFT_MAX_DIMS] = {0}, base_ = 0;                            \
    st_[(xnd) - 1] = 1;                                                                          \
    for (int d_ = (xnd) - 2; d_ >= 0; d_--) st_[d_] = st_[d_ + 1] * (xshape)[d_ + 1];            \
    for (int64_t i_ = 0; i_ < (ix)->numel; i_++) {                                               \
      int64_t v_ = cpu_idx(ix, i_);                                                              \
      if (v_ < 0 || v_ >= (xshape)[axis]) return cpu_bad_index(nm, v_, (xshape)[axis], axis);    \
      int64_t off_ = base_ + v_ * st_[axis];                                                     \
      body(i_, off_);                                                                            \
      for (int d_ = (xnd) - 1; d_ >= 0; d_--) { /* next coordinate; base skips the axis */       \
        if (++c_[d_] < (ix)->shape[d_]) { if (d_ != (axis)) base_ += st_[d_]; break; }           \
        if (d_ != (axis)) base_ -= (c_[d_] - 1) * st_[d_];                                       \
        c_[d_] = 0;                                                                              \
      }                                                                                          \
    }                                                                                            \
  } while (0)

/* An embedding's gather (and its gradient's scatter_add) picks whole rows: a 2-D index along
 * axis 0 whose rows each repeat one value (graft_embedding broadcasts [n,1] to [n,D]). Such a
 * row moves as one block; the element-wise odometer took 0.28 ms for a GPT block's 256x256
 * lookup. Returns the row's value, or -1 when the row is not uniform (it takes the odometer). */
static int64_t cpu_uniform_row(const ref_arg *ix, int64_t row) {
  int64_t d = ix->shape[1], v = cpu_idx(ix, row * d);
  if (ix->dtype == GRAFT_I64) {
    const int64_t *r = (const int64_t *)ix->data + row * d;
    int64_t diff = 0;
    for (int64_t j = 1; j < d; j++) diff |= r[j] ^ v;
    return diff ? -1 : v;
  }
  const int32_t *r = (const int32_t *)ix->data + row * d;
  int32_t diff = 0;
  for (int64_t j = 1; j < d; j++) diff |= r[j] ^ (int32_t)v;
  return diff ? -1 : v;
}

static bool cpu_rows_case(const ref_arg *x, const ref_arg *ix, int axis) {
  return axis == 0 && x->ndim == 2 && ix->ndim == 2 && ix->shape[1] > 0;
}

/* The rows an index of cpu_rows_case picks, each checked against V (-1 with the error set for
 * one out of range); *rows is NULL when a row is not uniform (or memory is short: the odometer
 * needs none), and the caller frees it. */
static int cpu_index_rows(const char *nm, const ref_arg *ix, int64_t V, int64_t **rows) {
  int64_t n = ix->shape[0], *r = malloc(sizeof *r * (size_t)(n + 1));
  *rows = NULL;
  for (int64_t i = 0; r && i < n; i++) {
    r[i] = cpu_uniform_row(ix, i);
    if (r[i] >= V) {
      int64_t v = r[i];
      free(r);
      return cpu_bad_index(nm, v, V, 0);
    }
    if (r[i] < 0) { /* not uniform, or negative: the odometer says which */
      free(r);
      return 0;
    }
  }
  *rows = r;
  return 0;
}

static int cpu_k_gather(const exec_instr *ins, const ref_arg *in, void *out) {
  const char *nm = "gather";
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  size_t es = graft_dtype_size(ins->dtype);
  const char *x = in[0].data;
  char *y = out;
  if (!ins->numel) return 0;
  if (cpu_rows_case(&in[0], &in[1], axis)) {
    int64_t *rows, d = in[1].shape[1], xd = in[0].shape[1];
    if (cpu_index_rows(nm, &in[1], in[0].shape[0], &rows)) return -1;
    if (rows) {
      for (int64_t i = 0; i < in[1].shape[0]; i++)
        memcpy(y + (size_t)(i * d) * es, x + (size_t)(rows[i] * xd) * es, (size_t)d * es);
      free(rows);
      return 0;
    }
  }
#define GATHER_EL(i, off) memcpy(y + (size_t)(i) * es, x + (size_t)(off) * es, es)
  ODOMETER(&in[1], in[0].shape, in[0].ndim, axis, GATHER_EL);
#undef GATHER_EL
  return 0;
}

/* scatter_add of uniform rows (cpu_index_rows): src row i added to out row rows[i]. */
#define SCATTER_ROWS(T)                                                                         \
  do {                                                                                          \
    T *y_ = out;                                                                                \
    const T *s_ = in[2].data;                                                                   \
    for (int64_t i = 0; i < n; i++) {                                                           \
      T *restrict yr = y_ + rows[i] * xd;                                                       \
      const T *restrict sr = s_ + i * d;                                                        \
      for (int64_t j = 0; j < d; j++) yr[j] += sr[j];                                           \
    }                                                                                           \
  } while (0)

static int cpu_k_scatter_add(const exec_instr *ins, const ref_arg *in, void *out) {
  const char *nm = "scatter_add";
  int axis = (int)IR_ATTR(ins->attr, AXIS, axis);
  if (out != in[0].data) /* in place when the input dies here (cpu_backend.c) */
    memcpy(out, in[0].data, (size_t)ins->numel * graft_dtype_size(ins->dtype));
  if (!in[1].numel) return 0;
  if (cpu_rows_case(&in[0], &in[1], axis)) {
    int64_t *rows, n = in[1].shape[0], d = in[1].shape[1], xd = ins->shape[1];
    if (cpu_index_rows(nm, &in[1], ins->shape[0], &rows)) return -1;
    if (rows) {
      if (ins->dtype == GRAFT_F32) SCATTER_ROWS(float);
      else SCATTER_ROWS(double);
      free(rows);
      return 0;
    }
  }
  if (ins->dtype == GRAFT_F32) {
    float *y = out;
    const float *s = in[2].data;
#define SCATTER_F(i, off) (y[off] += s[i])
    ODOMETER(&in[1], ins->shape, ins->ndim, axis, SCATTER_F);
  } else {
    double *y = out;
    const double *s = in[2].data;
    ODOMETER(&in[1], ins->shape, ins->ndim, axis, SCATTER_F);
#undef SCATTER_F
  }
  return 0;
}

/* ---- dot: the batch of row-major products as one (batched) BLAS call ---- */
/* How BLAS reads operand x [..., R, C]: row-major, or a view (the first tier's) that is its
 * matrices transposed in memory ([..., C, R] row-major: *trans), the batch either one after
 * another or one matrix for all (*bstride 0). False for any other view. */
static bool cpu_dot_layout(const ref_arg *x, bool *trans, int64_t *bstride) {
  int nd = x->ndim;
  int64_t R = x->shape[nd - 2], C = x->shape[nd - 1];
  *trans = false, *bstride = R * C;
  if (!x->view) return true;
  if (x->view->pad || !cpu_view_plain(x->view, nd, x->shape)) return false;
  const int64_t *st = x->view->strides;
  if (st[nd - 1] == 1 && (st[nd - 2] == C || R == 1)) *trans = false;
  else if (st[nd - 2] == 1 && (st[nd - 1] == R || C == 1)) *trans = true;
  else return false;
  bool zero = true, dense = true;
  int64_t want = R * C;
  for (int d = nd - 3; d >= 0; d--) {
    zero &= st[d] == 0 || x->shape[d] == 1;
    dense &= st[d] == want || x->shape[d] == 1;
    want *= x->shape[d];
  }
  if (!dense) *bstride = 0;
  return zero || dense;
}

static int cpu_k_dot(const exec_instr *ins, const ref_arg *in, void *out) {
  const ref_arg *a = &in[0];
  int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = ins->shape[ins->ndim - 1];
  int64_t batch = M && N ? ins->numel / (M * N) : 0, sa, sb;
  size_t es = graft_dtype_size(ins->dtype);
  bool ta, tb;
  if (K == 0) {
    memset(out, 0, (size_t)ins->numel * es);
    return 0;
  }
  if (!cpu_dot_layout(&in[0], &ta, &sa) || !cpu_dot_layout(&in[1], &tb, &sb))
    return err_set(GRAFT_ERR_INTERNAL, "dot: an operand view BLAS cannot read"), -1;
  if (batch)
    cpu_blas()->gemm(ins->dtype == GRAFT_F64, ta ? CPU_CBLAS_TRANS : CPU_CBLAS_NO_TRANS,
                     tb ? CPU_CBLAS_TRANS : CPU_CBLAS_NO_TRANS, (int)M, (int)N, (int)K, a->data,
                     (int)(ta ? M : K), sa, in[1].data, (int)(tb ? K : N), sb, out, (int)N, M * N, batch);
  return 0;
}

bool cpu_host_takes_view(const exec_instr *ins, const ref_arg *in, int k, const ref_view *v) {
  if (ins->op != IR_DOT || cpu_host_kernel(ins, in) != cpu_k_dot) return false;
  ref_arg x = in[k];
  bool t;
  int64_t bs;
  x.view = v;
  return cpu_dot_layout(&x, &t, &bs);
}

static bool cpu_dot_ok(const exec_instr *ins, const ref_arg *in) {
  const cpu_blas_fns *bl = cpu_blas();
  if (!bl->gemm) return false;
  for (int d = 0; d < ins->ndim; d++)
    if (ins->shape[d] > 0x7fffffff) return false;
  return in[0].shape[in[0].ndim - 1] <= 0x7fffffff;
}

cpu_host_fn cpu_host_kernel(const exec_instr *ins, const ref_arg *in) {
  bool fl = ins->dtype == GRAFT_F32 || ins->dtype == GRAFT_F64;
  switch (ins->op) {
  case IR_DOT: return fl && cpu_dot_ok(ins, in) ? cpu_k_dot : NULL;
  case IR_CONV2D: {
    const cpu_blas_fns *bl = cpu_blas();
    return fl && bl->sgemm && bl->dgemm ? cpu_k_conv2d : NULL;
  }
  case IR_REDUCE_WINDOW: return fl && cpu_pool_ok(ins, in) ? cpu_k_pool : NULL;
  case IR_MAX_POOL_GRAD: return fl && cpu_pool_ok(ins, in) ? cpu_k_pool_grad : NULL;
  case IR_GATHER: return in[0].ndim ? cpu_k_gather : NULL;
  case IR_SCATTER_ADD: return fl && in[0].ndim ? cpu_k_scatter_add : NULL;
  default: return NULL;
  }
}
