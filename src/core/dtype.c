/* Dtype element conversions: half/bfloat16 bit conversions and load/store through double or
 * int64. Every conversion is defined for every input (no UB): NaN and out-of-range floats
 * going to integers are clamped before the cast. */
#include "dtype.h"
#include <math.h>
#include <string.h>

/* Public API (graft.h), defined here because every layer uses them. */
size_t graft_dtype_size(graft_dtype dt) {
  static const size_t sz[GRAFT_NDTYPES] = {4, 8, 2, 2, 4, 8, 1, 1};
  return dtype_valid(dt) ? sz[dt] : 0;
}

const char *graft_dtype_name(graft_dtype dt) {
  static const char *nm[GRAFT_NDTYPES] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8", "bool"};
  return dtype_valid(dt) ? nm[dt] : "?";
}

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float dtype_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
    float v = ldexpf((float)m, -24);
    return sign ? -v : v;
  }
  if (e == 31) /* inf, or NaN keeping its payload */
    return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
}

uint16_t dtype_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
    return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  /* 65520 (half-way between 65504 and 65536) and above round to inf (tie goes to even = inf) */
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (x < 0x38800000u) { /* below the smallest normal half 2^-14: subnormal or zero */
    int e = (int)(x >> 23) - 127;
    if (e < -25) return sign; /* below a quarter of the smallest subnormal: rounds to 0 */
    uint32_t m = (x & 0x7fffffu) | 0x800000u; /* value = m * 2^(e-23) */
    int shift = -(e + 1);                      /* result = round(m * 2^(e+1)), 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++; /* may carry into the min normal */
    return (uint16_t)(sign | q);
  }
  uint32_t he = (x >> 23) - 127 + 15, m = x & 0x7fffffu;
  uint32_t q = (he << 10) | (m >> 13), rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1))) q++; /* a carry bumps the exponent */
  return (uint16_t)(sign | q);
}

float dtype_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dtype_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  /* round to nearest even on the dropped 16 bits; overflow lands on inf naturally */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

/* Float -> int64 truncating toward zero; NaN -> 0; out of range clamps (no UB). */
static int64_t d2i64(double v) {
  if (isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v <= -9223372036854775808.0) return INT64_MIN;
  return (int64_t)v;
}

double dtype_load(const void *p, graft_dtype dt, int64_t i) {
  switch (dt) {
  case GRAFT_F32: return ((const float *)p)[i];
  case GRAFT_F64: return ((const double *)p)[i];
  case GRAFT_F16: return dtype_f16_to_f32(((const uint16_t *)p)[i]);
  case GRAFT_BF16: return dtype_bf16_to_f32(((const uint16_t *)p)[i]);
  case GRAFT_I32: return ((const int32_t *)p)[i];
  case GRAFT_I64: return (double)((const int64_t *)p)[i];
  case GRAFT_U8: return ((const uint8_t *)p)[i];
  case GRAFT_BOOL: return ((const uint8_t *)p)[i] != 0;
  default: return 0;
  }
}

int64_t dtype_load_i(const void *p, graft_dtype dt, int64_t i) {
  switch (dt) {
  case GRAFT_I32: return ((const int32_t *)p)[i];
  case GRAFT_I64: return ((const int64_t *)p)[i];
  case GRAFT_U8: return ((const uint8_t *)p)[i];
  case GRAFT_BOOL: return ((const uint8_t *)p)[i] != 0;
  default: return d2i64(dtype_load(p, dt, i));
  }
}

void dtype_store(void *p, graft_dtype dt, int64_t i, double v) {
  switch (dt) {
  case GRAFT_F32: ((float *)p)[i] = (float)v; break;
  /* double -> float -> half/bf16 rounds correctly: float has > 2x+2 their precision bits */
  case GRAFT_F64: ((double *)p)[i] = v; break;
  case GRAFT_F16: ((uint16_t *)p)[i] = dtype_f32_to_f16((float)v); break;
  case GRAFT_BF16: ((uint16_t *)p)[i] = dtype_f32_to_bf16((float)v); break;
  case GRAFT_I32: {
    int64_t x = d2i64(v); /* saturate to the int32 range */
    ((int32_t *)p)[i] = (int32_t)(x > INT32_MAX ? INT32_MAX : x < INT32_MIN ? INT32_MIN : x);
    break;
  }
  case GRAFT_I64: ((int64_t *)p)[i] = d2i64(v); break;
  case GRAFT_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)d2i64(v); break; /* wraps mod 256 */
  case GRAFT_BOOL: ((uint8_t *)p)[i] = v != 0; break; /* NaN != 0: true, as C's bool */
  default: break;
  }
}

void dtype_store_i(void *p, graft_dtype dt, int64_t i, int64_t v) {
  switch (dt) {
  /* narrowing wraps: go through the unsigned type so the low bits are kept */
  case GRAFT_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
  case GRAFT_I64: ((int64_t *)p)[i] = v; break;
  case GRAFT_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)v; break;
  case GRAFT_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  case GRAFT_F32: ((float *)p)[i] = (float)v; break; /* single rounding from the integer */
  default: dtype_store(p, dt, i, (double)v); break;
  }
}

double dtype_round(graft_dtype dt, double v) {
  union { double d; int64_t i; unsigned char b[8]; } u; /* aligned for every dtype */
  dtype_store(&u, dt, 0, v);
  return dtype_load(&u, dt, 0);
}
