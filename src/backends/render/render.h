/* The kernel renderer's shared layer, used by every generator of a C-like language (the CPU
 * backend's C, the GPU renderer's OpenCL C and CUDA C): a growable string and a string arena
 * (rd_str.c), and how each op's value is written as an expression over its operands' values
 * (rd_expr.c), so that integer wrap-around, float->int saturation, comparisons, NaN-propagating
 * max/min and the f32 math mean the same in every generated kernel; what a language spells
 * differently is its rd_dialect (rd_dialect.c). Private to the backends. */
#ifndef GRAFT_RENDER_H
#define GRAFT_RENDER_H
#include "program.h"
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- rd_str.c: a growable string, and strings owned by an arena, freed together ---- */
typedef struct {
  char *s;
  size_t n, cap;
  int oom;
} rd_sb;
void rd_sb_printf(rd_sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rd_sb_puts(rd_sb *b, const char *s);
void rd_sb_free(rd_sb *b);
typedef struct {
  char **v;          /* its chunks, freed together */
  int n, cap;
  char *cur;         /* where the current chunk's free bytes start */
  size_t left;       /* and how many */
} rd_arena;
char *rd_fmt(rd_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3), nonnull(2)));
void *rd_arena_alloc(rd_arena *a, size_t n); /* zeroed; NULL when out of memory */
void rd_arena_free(rd_arena *a);

/* ---- rd_dialect.c: what a language spells differently in expressions ---- */
typedef struct rd_dialect {
  const char *name;
  /* f32 / f64 infinity and NaN literals (-infinity is "(-" inf ")") */
  const char *inf32, *nan32, *inf64, *nan64;
  const char *u64_suffix;   /* of a 64-bit unsigned literal: "ull", "UL" */
  const char *round32;      /* an f32 rounding of a double: CPU C's gc_f32 (opaque to gcc) */
  const char *widen;        /* float -> double for the math computed in double (gc_wide) */
  const char *i2f32, *i2f64; /* an integer made f32 / f64 (CPU C: gc_f32i, gc_f64i) */
  const char *d2i_arg;      /* what gc_d2i's argument is cast with ("(double)", or none) */
  const char *sqrt64;       /* double sqrt, for rsqrt */
  bool minmax_unordered;    /* NaN-propagating max/min as __builtin_isunordered + select */
  const char *inf_acc, *ninf_acc, *nan_acc; /* infinity, -infinity, NaN of a float type (cast on) */
  /* Unary ops that are one call: f32 and f64 function names (NULL: not a call here). */
  const char *call32[IR_OP_COUNT], *call64[IR_OP_COUNT];
} rd_dialect;
extern const rd_dialect rd_dialect_c, rd_dialect_opencl, rd_dialect_cuda;

/* ---- rd_expr.c ---- */
/* Reductions: one table of semantics for every generator. Float sums and products accumulate
 * in double (wide: where the device has doubles; else in float), integer ones in uint64_t
 * (wrapping), max/min in the element type (int64_t for integers) with NaN recorded aside (a
 * float max/min with a NaN anywhere is NaN, as the reference's). */
typedef struct {
  const char *acc_t, *init; /* accumulator type and identity */
  const char *combine;      /* "+", "*", "max", "min" (an OpenMP reduction's spelling) */
  bool fl, mx, mn;
} rd_red;
rd_red rd_reduce(const rd_dialect *d, bool wide, const exec_instr *ins);
/* Appends "acc = acc (op) v;" (indented by indent); nf records a NaN seen by a float max/min. */
void rd_red_step(rd_sb *b, const char *indent, const rd_red *r, const char *acc, const char *nf, const char *v);
/* The result of dtype ins->dtype from the accumulator acc (and nf). */
const char *rd_red_final(rd_arena *ar, const rd_dialect *d, const exec_instr *ins, const rd_red *r,
                         const char *acc, const char *nf);

/* A literal of dtype dt holding v converted exactly as the reference stores it. */
const char *rd_literal(rd_arena *ar, const rd_dialect *d, graft_dtype dt, double v);
/* ins's unary / binary op on operand expressions (float math per the dialect; integers
 * wrapping); fp64: doubles are fast here (else f32 rsqrt stays in f32). NULL: no form. */
const char *rd_unary(rd_arena *ar, const rd_dialect *d, bool fp64, const exec_instr *ins, const char *a);
const char *rd_binary(rd_arena *ar, const rd_dialect *d, const exec_instr *ins, const char *a, const char *b);
/* a (of dtype from) converted to dtype to as the reference converts (saturating float->int). */
const char *rd_convert(rd_arena *ar, const rd_dialect *d, graft_dtype from, graft_dtype to, const char *a);
/* The C type of dt in generated code (int64_t, uint8_t...: each target defines these names). */
const char *rd_ctype(graft_dtype dt);
/* An int64 expression narrowed (wrapping) to dtype dt. */
const char *rd_narrow(rd_arena *ar, graft_dtype dt, const char *e64);
/* Integer (and bool) unary / binary ops, narrowed to dt; NULL when op has no integer form. */
const char *rd_int_unary(rd_arena *ar, ir_op op, graft_dtype dt, const char *a);
const char *rd_int_binary(rd_arena *ar, ir_op op, graft_dtype dt, const char *a, const char *b);
/* Float add/sub/mul/div/max/min (max/min return the first NaN); NULL for other ops. */
const char *rd_float_binary(rd_arena *ar, ir_op op, const char *a, const char *b);
/* A comparison as a uint8_t 0/1. */
const char *rd_compare(rd_arena *ar, ir_op op, const char *a, const char *b);
/* Row-major strides of shape. */
void rd_strides(int nd, const int64_t *shape, int64_t *st);
/* True when a and b differ only by dims of size 1 (a reshape that renames coordinates). */
bool rd_only_unit_dims_differ(const exec_instr *a, const exec_instr *b);
/* "(c0 * s0 + c1 * s1 ...)": the linear index of coordinates c over shape (size-1 dims skipped). */
const char *rd_lin(rd_arena *ar, int nd, const int64_t *shape, const char *const *c);
#endif
