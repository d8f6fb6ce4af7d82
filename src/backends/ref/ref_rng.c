/* Random number reference kernel. Element i of a uniform tensor uses counter i; element i of
 * a normal tensor uses counters 2i and 2i+1 (Box-Muller, cosine branch only). */
#include "ref_util.h"
#include "ref_rng.h"
#include <math.h>

#define REF_TWO_PI 6.283185307179586476925

/* Largest value below 1 in each narrow float dtype, as its bits. */
#define REF_F32_BELOW_ONE 0x1.fffffep-1
#define REF_F16_BELOW_ONE 0x3bffu
#define REF_BF16_BELOW_ONE 0x3f7fu

/* Stores a uniform sample u in [0,1) so that rounding never produces 1.0. */
static void ref_store_uniform(void *out, graft_dtype dt, int64_t i, double u) {
  switch (dt) {
  case GRAFT_F32: {
    float f = (float)u;
    ((float *)out)[i] = f < 1.0f ? f : (float)REF_F32_BELOW_ONE;
    break;
  }
  case GRAFT_F16: {
    uint16_t h = dtype_f32_to_f16((float)u);
    ((uint16_t *)out)[i] = h < 0x3c00u ? h : REF_F16_BELOW_ONE; /* 0x3c00 is 1.0 */
    break;
  }
  case GRAFT_BF16: {
    uint16_t h = dtype_f32_to_bf16((float)u);
    ((uint16_t *)out)[i] = h < 0x3f80u ? h : REF_BF16_BELOW_ONE; /* 0x3f80 is 1.0 */
    break;
  }
  default: dtype_store(out, dt, i, u); break; /* f64 holds u exactly */
  }
}

int ref_rng(const exec_instr *ins, const ref_arg *in, void *out) {
  uint64_t seed = (uint64_t)dtype_load_i(in[0].data, in[0].dtype, 0);
  graft_dtype dt = ins->dtype;
  for (int64_t i = 0; i < ins->numel; i++) {
    uint64_t c = (uint64_t)i;
    if (IR_ATTR(ins->attr, RNG, dist) == 0) {
      ref_store_uniform(out, dt, i, ref_rng_unit(ref_rng_bits(seed, c)));
    } else {
      double u1 = (double)((ref_rng_bits(seed, 2 * c) >> 11) + 1) * 0x1.0p-53; /* (0,1] */
      double u2 = ref_rng_unit(ref_rng_bits(seed, 2 * c + 1));
      dtype_store(out, dt, i, sqrt(-2.0 * log(u1)) * cos(REF_TWO_PI * u2));
    }
  }
  return 0;
}
