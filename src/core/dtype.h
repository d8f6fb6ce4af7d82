/* Dtypes: sizes, names, classes and element load/store through double / int64. */
#ifndef GRAFT_DTYPE_H
#define GRAFT_DTYPE_H
#include "graft.h"
#include <stdbool.h>
#include <stdint.h>

static inline bool dtype_valid(graft_dtype dt) { return (unsigned)dt < GRAFT_NDTYPES; }
static inline bool dtype_is_float(graft_dtype dt) {
  return dt == GRAFT_F32 || dt == GRAFT_F64 || dt == GRAFT_F16 || dt == GRAFT_BF16;
}
static inline bool dtype_is_int(graft_dtype dt) {
  return dt == GRAFT_I32 || dt == GRAFT_I64 || dt == GRAFT_U8;
}

/* IEEE half and bfloat16 <-> float, round to nearest even. */
float dtype_f16_to_f32(uint16_t h);
uint16_t dtype_f32_to_f16(float f);
float dtype_bf16_to_f32(uint16_t h);
uint16_t dtype_f32_to_bf16(float f);

/* Element i of a buffer of dtype dt, as double (exact for all but i64 past 2^53). */
double dtype_load(const void *p, graft_dtype dt, int64_t i);
/* Element i as int64 (floats truncate toward zero). */
int64_t dtype_load_i(const void *p, graft_dtype dt, int64_t i);
/* Store v into element i, converting as graft_convert does (float->int truncates; ->bool is !=0). */
void dtype_store(void *p, graft_dtype dt, int64_t i, double v);
/* v as a dtype-dt element holds it (stored then loaded): a constant's value is this. */
double dtype_round(graft_dtype dt, double v);
/* Store an integer exactly (for integer dtypes). */
void dtype_store_i(void *p, graft_dtype dt, int64_t i, int64_t v);
#endif
