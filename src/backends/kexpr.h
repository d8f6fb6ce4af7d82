/* Kernel expression semantics shared by the code generators (the CPU's C, the GPU renderer's
 * OpenCL C): how each op's value is written as a C expression over its operands' values, so that
 * integer wrap-around, comparisons and NaN-propagating max/min mean the same in every generated
 * kernel. Spelling that differs between targets (float math, literals) stays in each generator.
 * Private to the backends. */
#ifndef GRAFT_KEXPR_H
#define GRAFT_KEXPR_H
#include "cpu/cpu_internal.h" /* the generators' string arena (cpu_str.c) */

/* The C type of dt in generated code (int64_t, uint8_t...: each target defines these names). */
const char *kx_ctype(graft_dtype dt);
/* An int64 expression narrowed (wrapping) to dtype dt. */
const char *kx_narrow(cpu_arena *ar, graft_dtype dt, const char *e64);
/* Integer (and bool) unary / binary ops, narrowed to dt; NULL when op has no integer form. */
const char *kx_int_unary(cpu_arena *ar, ir_op op, graft_dtype dt, const char *a);
const char *kx_int_binary(cpu_arena *ar, ir_op op, graft_dtype dt, const char *a, const char *b);
/* Float add/sub/mul/div/max/min (max/min return the first NaN); NULL for other ops. */
const char *kx_float_binary(cpu_arena *ar, ir_op op, const char *a, const char *b);
/* A comparison as a uint8_t 0/1. */
const char *kx_compare(cpu_arena *ar, ir_op op, const char *a, const char *b);
/* Row-major strides of shape. */
void kx_strides(int nd, const int64_t *shape, int64_t *st);
/* True when a and b differ only by dims of size 1 (a reshape that renames coordinates). */
bool kx_only_unit_dims_differ(const exec_instr *a, const exec_instr *b);
/* "(c0 * s0 + c1 * s1 ...)": the linear index of coordinates c over shape (size-1 dims skipped). */
const char *kx_lin(cpu_arena *ar, int nd, const int64_t *shape, const char *const *c);
#endif
