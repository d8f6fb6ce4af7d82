/* The dialects: how each GPU language spells kernels, pointers, indices and barriers, and the
 * helpers every generated source starts with. The CUDA dialect (part 2) fills the same fields. */
#include "gpu_render.h"

const gpu_dialect gpu_dialect_opencl = {
    .name = "OpenCL C",
    .prelude =
        "typedef long int64_t;\ntypedef ulong uint64_t;\ntypedef int int32_t;\n"
        "typedef uint uint32_t;\ntypedef uchar uint8_t;\n"
        "#define INT32_MAX 2147483647\n#define INT32_MIN (-2147483647 - 1)\n"
        "#define INT64_MAX 9223372036854775807L\n#define INT64_MIN (-9223372036854775807L - 1)\n"
        /* the CPU generator's math text uses GCC builtins: OpenCL's own functions here */
        "#define __builtin_fmaf(a, b, c) fma((float)(a), (float)(b), (float)(c))\n"
        "#define __builtin_rintf(x) rint((float)(x))\n"
        "#define __builtin_fabsf(x) fabs((float)(x))\n"
        "#define __builtin_copysignf(a, b) copysign((float)(a), (float)(b))\n"
        /* f32 infinity and quiet NaN by their bits (pocl's INFINITY did not resolve) */
        "#define GC_INFF as_float(0x7f800000u)\n#define GC_NANF as_float(0x7fc00000u)\n"
        "#define __builtin_inff() GC_INFF\n#define __builtin_nanf(s) GC_NANF\n"
        "#define __builtin_memcpy(d, s, n) (*(d) = *(__typeof__(*(d)) *)(s))\n"
        "#define nearbyint rint\n",
    .kernel = "__kernel void",
    .global = "__global",
    .restrict_ = "restrict",
    .global_id = "get_global_id(0)",
    .local_id = "(int)get_local_id(0)",
    .group_id = "get_group_id(0)",
    .local_size = "(int)get_local_size(0)",
    .local_decl = "  __local %s %s[%d];\n",
    .barrier = "barrier(CLK_LOCAL_MEM_FENCE)",
};
