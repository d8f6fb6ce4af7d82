/* The dialects: how each GPU language spells kernels, pointers, indices and barriers, and the
 * helpers every generated source starts with. The CUDA dialect (part 2) fills the same fields. */
#include "gpu_render.h"

/* OpenCL C's vectors: the CPU math's gm_expf lane-wise, operation for operation (fma, rint and
 * the exponent bits are exact in every lane), so the row form's exp equals the scalar one. rint
 * is spelled (t + 1.5 * 2^23) - 1.5 * 2^23, the same value for |t| < 2^22 (here |t| <= 151) in
 * the default rounding (every f32 checked against the scalar gm_expf, bit for bit), because
 * pocl's vector rint cost ~30% of the 4096x4096 softmax kernel; t is its own statement, so the
 * sum is not contracted into an fma with it (that changes n for a few inputs). */
static const char gpu_vprelude_opencl[] =
    "#define GC_V2(t, w) t##w\n#define GC_V1(t, w) GC_V2(t, w)\n#define GC_V(t) GC_V1(t, GC_VW)\n"
    "typedef GC_V(float) gc_vf;\ntypedef GC_V(int) gc_vi;\n"
    "#ifdef GC_FP64\ntypedef GC_V(double) gc_vd;\n#define gc_vf2d(v) GC_V(convert_double)(v)\n#endif\n"
    "static inline gc_vf gm_expf_v(gc_vf x) {\n"
    "  gc_vf xc = x < -104.0f ? (gc_vf)(-104.0f) : x > 89.0f ? (gc_vf)(89.0f) : x;\n"
    "  gc_vf t = xc * 1.44269504088896341f;\n"
    "  gc_vf n = (t + 12582912.0f) - 12582912.0f;\n"
    "  gc_vf r = fma(n, (gc_vf)(-0.693359375f), xc);\n"
    "  r = fma(n, (gc_vf)(2.12194440e-4f), r);\n"
    "  gc_vf p = (gc_vf)(1.9875691500e-4f);\n"
    "  p = fma(p, r, (gc_vf)(1.3981999507e-3f));\n"
    "  p = fma(p, r, (gc_vf)(8.3334519073e-3f));\n"
    "  p = fma(p, r, (gc_vf)(4.1665795894e-2f));\n"
    "  p = fma(p, r, (gc_vf)(1.6666665459e-1f));\n"
    "  p = fma(p, r, (gc_vf)(5.0000001201e-1f));\n"
    "  p = fma(p, r * r, r) + 1.0f;\n"
    "  gc_vi ni = GC_V(convert_int)(n), n1 = ni / 2, n2 = ni - n1;\n"
    "  gc_vf s1 = GC_V(as_float)((n1 + 127) << 23), s2 = GC_V(as_float)((n2 + 127) << 23);\n"
    "  gc_vf res = p * s1 * s2;\n"
    "  return x != x ? x : res;\n}\n";

const gpu_dialect gpu_dialect_opencl = {
    .name = "OpenCL C",
    .expr = &rd_dialect_opencl,
    .ext = "cl",
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
    .vprelude = gpu_vprelude_opencl,
    .vload = "GC_V(vload)(0, %s)",
    .vstore = "GC_V(vstore)(%s, 0, %s)",
};

/* CUDA C++ (NVRTC): no headers, so the fixed-width types and limits are spelled here; every
 * helper of the shared math text is a device function (its `static inline` becomes `static
 * __device__ __forceinline__`); GCC's builtins map to CUDA's device math. Diagnostics 177
 * and 550 (declared, or set, but never used) are off: a source carries every helper and each
 * kernel names every coordinate of its index, used or not, as the CPU build's (-w) does; so
 * is 186 (an unsigned value compared with zero): one expression serves every dtype (min(x, 0)
 * on u8). */
const gpu_dialect gpu_dialect_cuda = {
    .name = "CUDA C",
    .expr = &rd_dialect_cuda,
    .ext = "cu",
    .prelude =
        "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\ntypedef int int32_t;\n"
        "typedef unsigned int uint32_t;\ntypedef unsigned char uint8_t;\n"
        "#define INT32_MAX 2147483647\n#define INT32_MIN (-2147483647 - 1)\n"
        "#define INT64_MAX 9223372036854775807LL\n#define INT64_MIN (-9223372036854775807LL - 1)\n"
        "#pragma nv_diag_suppress 177\n#pragma nv_diag_suppress 550\n#pragma nv_diag_suppress 186\n"
        "#define inline __device__ __forceinline__\n"
        "#define __builtin_fmaf(a, b, c) fmaf((float)(a), (float)(b), (float)(c))\n"
        "#define __builtin_rintf(x) rintf((float)(x))\n"
        "#define __builtin_fabsf(x) fabsf((float)(x))\n"
        "#define __builtin_copysignf(a, b) copysignf((float)(a), (float)(b))\n"
        "#define GC_INFF __int_as_float(0x7f800000)\n#define GC_NANF __int_as_float(0x7fc00000)\n"
        "#define __builtin_inff() GC_INFF\n#define __builtin_nanf(s) GC_NANF\n#define INFINITY GC_INFF\n"
        "#define __builtin_memcpy(d, s, n) memcpy(d, s, n)\n",
    .kernel = "extern \"C\" __global__ void",
    .global = "",
    .restrict_ = "__restrict__",
    .global_id = "((int64_t)blockIdx.x * blockDim.x + threadIdx.x)",
    .local_id = "(int)threadIdx.x",
    .group_id = "(int64_t)blockIdx.x",
    .local_size = "(int)blockDim.x",
    .local_decl = "  __shared__ %s %s[%d];\n",
    .barrier = "__syncthreads()",
};
