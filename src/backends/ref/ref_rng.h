/* The counter-based bit generator behind IR_RNG, exactly specified so every backend can
 * reproduce the reference stream bit for bit. */
#ifndef GRAFT_REF_RNG_H
#define GRAFT_REF_RNG_H
#include <stdint.h>

/* 64 random bits for (seed, counter): a linear mix of both, then the splitmix64 finalizer
 * applied twice. */
static inline uint64_t ref_rng_bits(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter * 0xD1B54A32D192ED03ull +
               0x632BE59BD9B4E019ull;
  for (int r = 0; r < 2; r++) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    z ^= z >> 31;
  }
  return z;
}

/* The top 53 bits as a double in [0, 1). */
static inline double ref_rng_unit(uint64_t bits) { return (double)(bits >> 11) * 0x1.0p-53; }
#endif
