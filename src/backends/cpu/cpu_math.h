/* Vectorizable float approximations of exp, expm1, log, log1p, tanh, sigmoid and erf, used by the generated
 * code (emitted as text: cpu_math_src) and by the host tests (the same functions, compiled).
 * Branch-free (selects, not branches) so gcc vectorizes them at plain -O3 without -ffast-math.
 * Accuracy against libm in double rounded to float: see tests/test_cpu_backend.c (math_sweep).
 * exp/log cores follow Cephes (range reduction + minimax polynomial); tanh is a clamped rational
 * x*P(x^2)/Q(x^2) (degrees 13/6, Eigen's coefficients; x itself below 4e-4; the input clamped
 * to +-7.9988, where tanh is within 3e-7 of 1): exhaustively over all 2^32 floats
 * against (float)tanh((double)x), max relative error 3.42e-7 (at x = 0.00817); one division,
 * no exp. erf is piecewise polynomials fitted by least squares on Chebyshev nodes (|x|<1:
 * x*P(x^2); [1,2),[2,3),[3,3.95) in t = x - midpoint; 1 beyond). The body below has no preprocessor
 * lines so that it can be stringified: CPU_MATH_EMIT defines the functions here and keeps their text. */
#ifndef GRAFT_CPU_MATH_H
#define GRAFT_CPU_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#define CPU_MATH_EMIT(...) __VA_ARGS__ static const char cpu_math_src[] = #__VA_ARGS__;

CPU_MATH_EMIT(
static inline float gm_bits_f(uint32_t u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline uint32_t gm_f_bits(float f) { uint32_t u; __builtin_memcpy(&u, &f, 4); return u; }

/* x = n ln2 + r, |r| <= ln2/2 (ln2 in two parts, so r is exact enough); n returned in *n. */
static inline float gm_exp_reduce(float xc, float *n) {
  *n = __builtin_rintf(xc * 1.44269504088896341f);
  float r = __builtin_fmaf(*n, -0.693359375f, xc);
  return __builtin_fmaf(*n, 2.12194440e-4f, r);
}

/* 2^n as two factors s1 * s2 (each in range where 2^n alone would not be). */
static inline void gm_exp2_split(float n, float *s1, float *s2) {
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;
  *s1 = gm_bits_f((uint32_t)(n1 + 127) << 23);
  *s2 = gm_bits_f((uint32_t)(n2 + 127) << 23);
}

static inline float gm_expf(float x) {
  float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;
  float n, r = gm_exp_reduce(xc, &n);
  float p = 1.9875691500e-4f;
  p = __builtin_fmaf(p, r, 1.3981999507e-3f);
  p = __builtin_fmaf(p, r, 8.3334519073e-3f);
  p = __builtin_fmaf(p, r, 4.1665795894e-2f);
  p = __builtin_fmaf(p, r, 1.6666665459e-1f);
  p = __builtin_fmaf(p, r, 5.0000001201e-1f);
  p = __builtin_fmaf(p, r * r, r) + 1.0f;
  float s1, s2;
  gm_exp2_split(n, &s1, &s2);
  float res = p * s1 * s2;
  return x != x ? x : res;
}

/* expm1: the same reduction, x = n ln2 + r; expm1(r) by its Taylor series to r^8 (|r| <= ln2/2:
 * truncation under 6e-10 of r), then 2^n (expm1(r) + 1) - 1 as one fma where 2^n - 1 is exact
 * (|n| < 25), so a small result keeps its digits; overflow to inf from x > 88.72. */
static inline float gm_expm1f(float x) {
  float xc = x < -88.0f ? -88.0f : x > 89.0f ? 89.0f : x;
  float n, r = gm_exp_reduce(xc, &n);
  float p = 2.48015873e-5f;
  p = __builtin_fmaf(p, r, 1.98412698e-4f);
  p = __builtin_fmaf(p, r, 1.38888889e-3f);
  p = __builtin_fmaf(p, r, 8.33333333e-3f);
  p = __builtin_fmaf(p, r, 4.16666667e-2f);
  p = __builtin_fmaf(p, r, 1.66666667e-1f);
  p = __builtin_fmaf(p, r, 0.5f);
  float em = __builtin_fmaf(p, r * r, r);
  int32_t ni = (int32_t)n;
  float s1, s2;
  gm_exp2_split(n, &s1, &s2);
  float s = s1 * s2;
  float mid = __builtin_fmaf(em, s, s - 1.0f);
  float big = (em + 1.0f) * s1 * s2;
  float res = ni == 0 ? em : ni < 25 ? mid : big;
  return x != x || x == 0.0f ? x : res; /* NaN, and -0's sign */
}

static inline float gm_logf(float x) {
  int den = x < 1.17549435e-38f;
  float xs = den ? x * 8388608.0f : x;
  uint32_t u = gm_f_bits(xs);
  int32_t e = (int32_t)(u >> 23 & 0xffu) - 126 - (den ? 23 : 0);
  float m = gm_bits_f((u & 0x007fffffu) | 0x3f000000u);
  int lt = m < 0.707106781186547524f;
  float f = (lt ? m + m : m) - 1.0f;
  e -= lt;
  float z = f * f;
  float y = 7.0376836292e-2f;
  y = __builtin_fmaf(y, f, -1.1514610310e-1f);
  y = __builtin_fmaf(y, f, 1.1676998740e-1f);
  y = __builtin_fmaf(y, f, -1.2420140846e-1f);
  y = __builtin_fmaf(y, f, 1.4249322787e-1f);
  y = __builtin_fmaf(y, f, -1.6668057665e-1f);
  y = __builtin_fmaf(y, f, 2.0000714765e-1f);
  y = __builtin_fmaf(y, f, -2.4999993993e-1f);
  y = __builtin_fmaf(y, f, 3.3333331174e-1f);
  y = y * f * z;
  float fe = (float)e;
  y = __builtin_fmaf(fe, -2.12194440e-4f, y);
  y = __builtin_fmaf(z, -0.5f, y);
  float r = __builtin_fmaf(fe, 0.693359375f, f + y);
  float pinf = __builtin_inff();
  return x > 0 ? (x == pinf ? x : r) : x == 0 ? -pinf : (x != x ? x : __builtin_nanf(""));
}

/* log1p(x) = log(u) - ((u - 1) - x) / u with u = 1 + x rounded: the second term puts back what
 * rounding u lost (Goldberg's correction); x itself where u rounds to 1. */
static inline float gm_log1pf(float x) {
  float u = 1.0f + x;
  float l = gm_logf(u);
  float r = l - ((u - 1.0f) - x) / u;
  float res = u == 1.0f ? x : (u == __builtin_inff() || u == 0.0f) ? l : r;
  return x != x ? x : res;
}

static inline float gm_tanhf(float x) {
  float xc = x > 7.99881172180175781f ? 7.99881172180175781f : x < -7.99881172180175781f ? -7.99881172180175781f : x;
  float x2 = xc * xc;
  float p = -2.76076847742355e-16f;
  p = __builtin_fmaf(p, x2, 2.00018790482477e-13f);
  p = __builtin_fmaf(p, x2, -8.60467152213735e-11f);
  p = __builtin_fmaf(p, x2, 5.12229709037114e-08f);
  p = __builtin_fmaf(p, x2, 1.48572235717979e-05f);
  p = __builtin_fmaf(p, x2, 6.37261928875436e-04f);
  p = __builtin_fmaf(p, x2, 4.89352455891786e-03f);
  float q = 1.19825839466702e-06f;
  q = __builtin_fmaf(q, x2, 1.18534705686654e-04f);
  q = __builtin_fmaf(q, x2, 2.26843463243900e-03f);
  q = __builtin_fmaf(q, x2, 4.89352518554385e-03f);
  float r = (p * xc) / q;
  r = __builtin_fabsf(x) < 0.0004f ? x : r;
  return x != x ? x : r;
}

static inline float gm_sigmoidf(float x) {
  float e = gm_expf(-__builtin_fabsf(x));
  float r = 1.0f / (1.0f + e);
  float res = x >= 0 ? r : e * r;
  return x != x ? x : res;
}

static inline float gm_erff(float x) {
  float a = __builtin_fabsf(x);
  float z = x * x;
  float p = 7.933485950e-05f;
  p = __builtin_fmaf(p, z, -8.034843969e-04f);
  p = __builtin_fmaf(p, z, 5.191218026e-03f);
  p = __builtin_fmaf(p, z, -2.685539923e-02f);
  p = __builtin_fmaf(p, z, 1.128362572e-01f);
  p = __builtin_fmaf(p, z, -3.761262988e-01f);
  p = __builtin_fmaf(p, z, 1.128379167e+00f);
  float small = x * p;
  float ac = a > 3.95f ? 3.95f : a;
  float t = ac - 1.5f;
  float q1 = 1.540411502e-03f;
  q1 = __builtin_fmaf(q1, t, -2.401930232e-03f);
  q1 = __builtin_fmaf(q1, t, -4.701163608e-03f);
  q1 = __builtin_fmaf(q1, t, 1.933342954e-02f);
  q1 = __builtin_fmaf(q1, t, -1.487084248e-02f);
  q1 = __builtin_fmaf(q1, t, -4.459944827e-02f);
  q1 = __builtin_fmaf(q1, t, 1.387522068e-01f);
  q1 = __builtin_fmaf(q1, t, -1.783954165e-01f);
  q1 = __builtin_fmaf(q1, t, 1.189302867e-01f);
  q1 = __builtin_fmaf(q1, t, 9.661051464e-01f);
  t = ac - 2.5f;
  float q2 = 3.063119003e-04f;
  q2 = __builtin_fmaf(q2, t, 4.030424825e-04f);
  q2 = __builtin_fmaf(q2, t, -2.808211984e-03f);
  q2 = __builtin_fmaf(q2, t, 6.143381438e-03f);
  q2 = __builtin_fmaf(q2, t, -8.621518743e-03f);
  q2 = __builtin_fmaf(q2, t, 8.348285293e-03f);
  q2 = __builtin_fmaf(q2, t, -5.445737118e-03f);
  q2 = __builtin_fmaf(q2, t, 2.178318018e-03f);
  q2 = __builtin_fmaf(q2, t, 9.995930481e-01f);
  t = ac - 3.475f;
  float q3 = -1.062800413e-04f;
  q3 = __builtin_fmaf(q3, t, 1.222913462e-04f);
  q3 = __builtin_fmaf(q3, t, -7.621316280e-05f);
  q3 = __builtin_fmaf(q3, t, 4.640716869e-05f);
  q3 = __builtin_fmaf(q3, t, -2.245227689e-05f);
  q3 = __builtin_fmaf(q3, t, 6.519242232e-06f);
  q3 = __builtin_fmaf(q3, t, 9.999991102e-01f);
  float big = a >= 3.95f ? 1.0f : ac < 2.0f ? q1 : ac < 3.0f ? q2 : q3;
  float r = a < 1.0f ? small : __builtin_copysignf(big, x);
  return x != x ? x : r;
}

static inline double gm_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}
)
#endif
