/* The expression dialects (render.h): CPU C (gcc), OpenCL C and CUDA C. The unary ops that are
 * one call share their f32 names (graft's own approximations, cpu_math.h's text, which every
 * language's generated source carries) and f64 names; a language's own spellings follow. A new
 * elementwise op needs a line here only when it is a call whose name differs per language: an op
 * with an M line in ops.def (math computed in double) needs none. */
#include "render.h"

#define RD_CALLS_COMMON                                                                          \
  [IR_EXP] = "gm_expf", [IR_EXPM1] = "gm_expm1f", [IR_LOG] = "gm_logf",                         \
  [IR_LOG1P] = "gm_log1pf", [IR_TANH] = "gm_tanhf", [IR_ERF] = "gm_erff",                       \
  [IR_SIGMOID] = "gm_sigmoidf"
#define RD_CALLS64_COMMON                                                                        \
  [IR_EXP] = "exp", [IR_EXPM1] = "expm1", [IR_LOG] = "log", [IR_LOG1P] = "log1p",               \
  [IR_TANH] = "tanh", [IR_ERF] = "erf", [IR_SIGMOID] = "gm_sigmoid"

/* gcc's builtins (no errno, inlined); the opaque helpers keep gcc from folding roundings. */
const rd_dialect rd_dialect_c = {
    .name = "C",
    .inf32 = "__builtin_inff()", .nan32 = "__builtin_nanf(\"\")",
    .inf64 = "__builtin_inf()", .nan64 = "__builtin_nan(\"\")",
    .u64_suffix = "ull", .round32 = "gc_f32", .widen = "gc_wide", .i2f32 = "gc_f32i", .i2f64 = "gc_f64i",
    .d2i_arg = "(double)", .sqrt64 = "__builtin_sqrt", .minmax_unordered = true,
    .inf_acc = "INFINITY", .ninf_acc = "-INFINITY", .nan_acc = "NAN",
    .call32 = {RD_CALLS_COMMON, [IR_ABS] = "__builtin_fabsf", [IR_SQRT] = "__builtin_sqrtf",
               [IR_FLOOR] = "__builtin_floorf", [IR_CEIL] = "__builtin_ceilf", [IR_ROUND] = "__builtin_rintf"},
    .call64 = {RD_CALLS64_COMMON, [IR_ABS] = "__builtin_fabs", [IR_SQRT] = "__builtin_sqrt",
               [IR_FLOOR] = "__builtin_floor", [IR_CEIL] = "__builtin_ceil", [IR_ROUND] = "__builtin_rint"},
};

/* OpenCL C and CUDA C: overloaded math (float and double); GC_INFF / GC_NANF are the dialects'
 * preludes' bit patterns; gc_d2i has a float overload where doubles are missing. */
#define RD_GPU_DIALECT(NAME)                                                                     \
  {.name = NAME,                                                                                 \
   .inf32 = "GC_INFF", .nan32 = "GC_NANF", .inf64 = "((double)GC_INFF)", .nan64 = "((double)GC_NANF)", \
   .u64_suffix = "UL", .round32 = "(float)", .widen = "(double)", .i2f32 = "(float)",          \
   .i2f64 = "(double)", .d2i_arg = "", .sqrt64 = "sqrt", .minmax_unordered = false,             \
   .inf_acc = "GC_INFF", .ninf_acc = "(-GC_INFF)", .nan_acc = "GC_NANF",                                                  \
   .call32 = {RD_CALLS_COMMON, [IR_ABS] = "fabs", [IR_SQRT] = "sqrt", [IR_FLOOR] = "floor",      \
              [IR_CEIL] = "ceil", [IR_ROUND] = "rint"},                                          \
   .call64 = {RD_CALLS64_COMMON, [IR_ABS] = "fabs", [IR_SQRT] = "sqrt", [IR_FLOOR] = "floor",    \
              [IR_CEIL] = "ceil", [IR_ROUND] = "rint"}}
const rd_dialect rd_dialect_opencl = RD_GPU_DIALECT("OpenCL C");
const rd_dialect rd_dialect_cuda = RD_GPU_DIALECT("CUDA C");
