/* Helpers the float math lines of ops.def (M1 / M2) call: double precision, NaN-aware. The
 * reference kernels and the first tier include this; the cpu backend emits the same text into
 * every generated source (OPS_MATH_EMIT keeps it as a string), so all three compute the same. */
#ifndef GRAFT_OPMATH_H
#define GRAFT_OPMATH_H
#include <math.h>

#define OPS_MATH_EMIT(...) __VA_ARGS__ static const char ops_math_src[] = #__VA_ARGS__;

OPS_MATH_EMIT(
/* 1/(1+e^-x) without overflow: for x < 0, e^x/(1+e^x). */
static inline double ops_sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}
/* Sign that keeps NaN and the sign of zero. */
static inline double ops_sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : x; }
/* max/min that return NaN when either side is NaN (the first NaN operand). */
static inline double ops_fmax_nan(double a, double b) {
  return isnan(a) ? a : isnan(b) ? b : a > b ? a : b;
}
static inline double ops_fmin_nan(double a, double b) {
  return isnan(a) ? a : isnan(b) ? b : a < b ? a : b;
}
)
#endif
