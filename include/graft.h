/* graft: a lazy-tensor graph compiler and runtime.
 *
 * Ops on graft tensors look eager but only record IR; work happens at a sync point
 * (graft_step, graft_sync, or a read such as graft_to_host / graft_item).
 *
 * Conventions:
 *  - Every function returning graft_tensor* returns a NEW reference (release it with
 *    graft_release, or let an enclosing scope do it). On error it returns NULL and sets a
 *    thread-local error (graft_last_status / graft_last_error).
 *  - A NULL tensor argument makes an op return NULL and keeps the first error, so a chain of
 *    ops is checked once at its end.
 *  - Binary ops broadcast numpy-style and require equal dtypes (no implicit promotion).
 *  - Axes may be negative (counted from the end).
 */
#ifndef GRAFT_H
#define GRAFT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Symbol visibility. The library is built with -fvisibility=hidden, so only what this header
 * declares is exported from libgraft.so (tests/check_exports.sh checks both directions).
 * GRAFT_API marks one declaration public; the declarations below are made public as a block
 * with `#pragma GCC visibility push(default)` ... `pop` instead, so that adding a function to
 * this header is enough to export it and the existing declaration lines stay as they are
 * (a GRAFT_API on each line would be a rewrite of every line, and a missed one a silently
 * hidden function). GRAFT_API stays available for a declaration outside the block. */
#if defined(__GNUC__) || defined(__clang__)
#define GRAFT_API __attribute__((visibility("default")))
#pragma GCC visibility push(default)
#else
#define GRAFT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define GRAFT_MAX_DIMS 8
#define GRAFT_CPU_DEVICES 4  /* ids 0..3: virtual CPU devices cpu:0..cpu:3 (host memory) */
#define GRAFT_MAX_DEVICES 16 /* device ids: the CPUs, then accelerators found (OpenCL, CUDA) */
#define GRAFT_VERSION "0.1.0"

typedef struct graft_tensor graft_tensor;

typedef enum {
  GRAFT_F32, GRAFT_F64, GRAFT_F16, GRAFT_BF16,
  GRAFT_I32, GRAFT_I64, GRAFT_U8, GRAFT_BOOL,
  GRAFT_NDTYPES
} graft_dtype;

typedef enum {
  GRAFT_OK = 0,
  GRAFT_ERR_NULL,      /* a NULL tensor or pointer argument */
  GRAFT_ERR_RELEASED,  /* a tensor handle that was already released */
  GRAFT_ERR_SHAPE,     /* incompatible or invalid shapes */
  GRAFT_ERR_DTYPE,     /* dtype not accepted or mismatched */
  GRAFT_ERR_DEVICE,    /* operands on different devices, or no such device */
  GRAFT_ERR_AXIS,      /* axis out of range or repeated */
  GRAFT_ERR_OOM,       /* allocation failed or memory limit reached */
  GRAFT_ERR_ARG,       /* any other invalid argument */
  GRAFT_ERR_COMPILE,   /* a backend failed to compile a graph */
  GRAFT_ERR_INTERNAL,
  GRAFT_ERR_DIST,      /* a collective failed: a rank failed, timed out or disagreed, or no MPI */
  GRAFT_ERR_FILE       /* a file that cannot be read or written, or is not a valid graft file */
} graft_status;

/* ---- errors ---- */
/** Status of the last failed call on this thread (GRAFT_OK after graft_clear_error). */
graft_status graft_last_status(void);
/** Message of the last failed call on this thread; "" when none. */
const char *graft_last_error(void);
/** Clears this thread's error. */
void graft_clear_error(void);

/* ---- dtypes ---- */
/** Bytes per element of a dtype (0 for an invalid dtype). */
size_t graft_dtype_size(graft_dtype dt);
/** Short name of a dtype ("f32", "i64", ...); "?" for an invalid one. */
const char *graft_dtype_name(graft_dtype dt);

/* ---- lifetime ---- */
/** Adds a reference; returns t (NULL if t is invalid). */
graft_tensor *graft_retain(graft_tensor *t);
/** Drops a reference; NULL is ignored; a released handle sets GRAFT_ERR_RELEASED. */
void graft_release(graft_tensor *t);
/** Opens a scope on this thread: tensors returned inside it are owned by the scope. */
void graft_scope_begin(void);
/** Closes the innermost scope, releasing every tensor it owns except the kept ones. */
void graft_scope_end(void);
/** Moves t out of the innermost scope to the caller (or the outer scope); returns t. */
graft_tensor *graft_keep(graft_tensor *t);
/** Frees every cache and pool; live tensors are released. Optional at exit. */
void graft_shutdown(void);

/* ---- creation ---- */
/** A tensor holding a copy of host data (device data; a graph parameter). device is 0..3. */
graft_tensor *graft_from_host(const void *data, graft_dtype dt, int ndim, const int64_t *shape,
                              int device);
/** A tensor over host memory without a copy: the caller keeps data valid and unchanged until
 *  graft calls release(ctx), once, from any thread, when it no longer reads it (with the last
 *  reference to the tensor and to every result that aliases it). graft never writes, frees or
 *  reuses it. data must be 64-byte aligned (graft's kernels assume it; graft_from_host copies
 *  from any address) and device a host device (cpu:N). On an error nothing is taken: NULL is
 *  returned and release is not called. release must not call graft (it may run inside graft,
 *  under its locks, on graft's executor thread). A framework's tensor passed to a compiled
 *  function without its copy (the PyTorch bridge's torch.compile on CPU tensors) comes in this
 *  way. */
graft_tensor *graft_from_host_borrowed(void *data, graft_dtype dt, int ndim, const int64_t *shape,
                                       int device, void (*release)(void *ctx), void *ctx);
/** A 0-d tensor holding a user scalar: a parameter, so changing the value never recompiles. */
graft_tensor *graft_scalar(double value, graft_dtype dt);
/** graft_scalar on a device (0..3). Every creator has such an _on form; the plain form is cpu:0.
 *  Pass graft_device(x) to make a value that combines with x. */
graft_tensor *graft_scalar_on(double value, graft_dtype dt, int device);
/** A constant filled with value (part of the graph, hashed by value). */
graft_tensor *graft_full(double value, graft_dtype dt, int ndim, const int64_t *shape);
/** graft_full on a device (0..3). */
graft_tensor *graft_full_on(double value, graft_dtype dt, int ndim, const int64_t *shape,
                            int device);
/** graft_full with 0. */
graft_tensor *graft_zeros(graft_dtype dt, int ndim, const int64_t *shape);
/** graft_zeros on a device (0..3). */
graft_tensor *graft_zeros_on(graft_dtype dt, int ndim, const int64_t *shape, int device);
/** graft_full with 1. */
graft_tensor *graft_ones(graft_dtype dt, int ndim, const int64_t *shape);
/** graft_ones on a device (0..3). */
graft_tensor *graft_ones_on(graft_dtype dt, int ndim, const int64_t *shape, int device);
/** Values 0,1,2,... along axis, broadcast along the other axes. */
graft_tensor *graft_iota(graft_dtype dt, int ndim, const int64_t *shape, int axis);
/** graft_iota on a device (0..3). */
graft_tensor *graft_iota_on(graft_dtype dt, int ndim, const int64_t *shape, int axis,
                            int device);
/** Seeds the generator used by graft_rand_* and graft_dropout (reproducible streams). */
void graft_manual_seed(uint64_t seed);
/** Uniform [0,1) samples from a counter-based generator; the seed is a parameter. */
graft_tensor *graft_rand_uniform(graft_dtype dt, int ndim, const int64_t *shape);
/** graft_rand_uniform on a device (0..3); one generator (graft_manual_seed) serves all devices. */
graft_tensor *graft_rand_uniform_on(graft_dtype dt, int ndim, const int64_t *shape, int device);
/** Standard normal samples (Box-Muller over the counter-based generator). */
graft_tensor *graft_rand_normal(graft_dtype dt, int ndim, const int64_t *shape);
/** graft_rand_normal on a device (0..3). */
graft_tensor *graft_rand_normal_on(graft_dtype dt, int ndim, const int64_t *shape, int device);
/** Devices known: the GRAFT_CPU_DEVICES CPUs, then accelerators (the first call looks for them:
 *  OpenCL platforms). Ids run 0..count-1. */
int graft_device_count(void);
/** The id of the ordinal-th device of kind ("cpu", "opencl", "cuda"), or -1 with GRAFT_ERR_DEVICE set
 *  (the message says what was looked for and which devices exist). */
int graft_device_find(const char *kind, int ordinal);
/** Why no device of kind ("opencl", "cuda") is listed: "no CUDA driver: libcuda.so.1 could not
 *  be opened (...)", "GRAFT_CUDA=0 hides CUDA devices"; NULL when one is (runs discovery). */
const char *graft_device_absent(const char *kind);
/** The device's kind ("cpu", "opencl", "cuda"), or NULL for no such device. */
const char *graft_device_kind(int device);
/** The device's name (for OpenCL: platform and device), or NULL for no such device. */
const char *graft_device_name(int device);
/** Bytes of the device's own memory (0 for the CPUs: host memory). */
size_t graft_device_memory(int device);
/** Copies t to another device (syncs t first). */
graft_tensor *graft_to_device(graft_tensor *t, int device);

/** dst takes src's value (same dtype, shape and device, else GRAFT_ERR_SHAPE naming both):
 *  the in-place update of a lazy tensor. Handles of dst keep working and read the new value;
 *  src stays valid. A buffer only the pending graph still reads is reused by it at the sync. */
graft_status graft_assign(graft_tensor *dst, graft_tensor *src);

/* ---- queries (never sync) ---- */
/** Number of dims, or -1 for an invalid handle. */
int graft_ndim(const graft_tensor *t);
/** Copies the shape into out[GRAFT_MAX_DIMS]; returns ndim or -1. */
int graft_shape(const graft_tensor *t, int64_t *out);
/** Size of one dim (negative axes allowed); -1 on error. */
int64_t graft_dim(const graft_tensor *t, int axis);
/** Element count, or -1. */
int64_t graft_numel(const graft_tensor *t);
/** The tensor's dtype (GRAFT_NDTYPES for an invalid handle). */
graft_dtype graft_get_dtype(const graft_tensor *t);
/** The tensor's device, or -1. */
int graft_device(const graft_tensor *t);
/** True while t holds pending IR rather than device data. */
bool graft_is_pending(const graft_tensor *t);

/* ---- sync ---- */
/** Marks a step: materializes every live tensor that holds pending IR, in one graph per device. */
graft_status graft_step(void);
/** Materializes the given tensors (one graph per device). */
graft_status graft_sync(graft_tensor *const *ts, int n);
/** Waits until every queued step has run; returns the first asynchronous failure that no sync
 *  has reported yet (once), else GRAFT_OK. Syncs return once their graph is queued. */
graft_status graft_wait(void);
/** Syncs t and copies its data to dst, which must hold exactly numel*dtype_size bytes. */
graft_status graft_to_host(graft_tensor *t, void *dst, size_t bytes);
/** Zero-copy read access to t's bytes (row-major, graft_numel(t) * dtype size) on a host-memory
 *  device: syncs t and returns a pointer valid, and its bytes unchanged by graft, until
 *  graft_host_ref_release(*ref), whatever happens to t meanwhile. *shared (if not NULL) says
 *  whether other tensors or values read the same bytes now (a caller that would write through
 *  the pointer copies then). NULL with the error set (a failed step; GRAFT_ERR_DEVICE on a device
 *  with its own memory: graft_to_host copies). */
typedef struct graft_host_ref graft_host_ref;
const void *graft_host_view(graft_tensor *t, graft_host_ref **ref, int *shared);
void graft_host_ref_release(graft_host_ref *ref);
/** Syncs a one-element tensor and returns its value as a double. */
graft_status graft_item(graft_tensor *t, double *out);

/* ---- elementwise (broadcasting, equal dtypes) ---- */
graft_tensor *graft_neg(graft_tensor *a);        /**< -a */
graft_tensor *graft_abs(graft_tensor *a);        /**< |a| */
graft_tensor *graft_exp(graft_tensor *a);        /**< e^a (float dtypes) */
graft_tensor *graft_log(graft_tensor *a);        /**< natural log (float dtypes) */
graft_tensor *graft_sqrt(graft_tensor *a);       /**< square root (float dtypes) */
graft_tensor *graft_rsqrt(graft_tensor *a);      /**< 1/sqrt(a) (float dtypes) */
graft_tensor *graft_tanh(graft_tensor *a);       /**< tanh (float dtypes) */
graft_tensor *graft_erf(graft_tensor *a);        /**< error function (float dtypes) */
graft_tensor *graft_sigmoid(graft_tensor *a);    /**< 1/(1+e^-a) (float dtypes) */
graft_tensor *graft_sin(graft_tensor *a);        /**< sine (float dtypes) */
graft_tensor *graft_cos(graft_tensor *a);        /**< cosine (float dtypes) */
graft_tensor *graft_floor(graft_tensor *a);      /**< round down (float dtypes) */
graft_tensor *graft_ceil(graft_tensor *a);       /**< round up (float dtypes) */
graft_tensor *graft_round(graft_tensor *a);      /**< round half to even (float dtypes) */
graft_tensor *graft_trunc(graft_tensor *a);      /**< round toward zero (float dtypes) */
graft_tensor *graft_sign(graft_tensor *a);       /**< -1, 0 or 1 */
graft_tensor *graft_reciprocal(graft_tensor *a); /**< 1/a (float dtypes) */
graft_tensor *graft_log1p(graft_tensor *a);      /**< log(1+a) (float dtypes) */
graft_tensor *graft_expm1(graft_tensor *a);      /**< e^a-1 (float dtypes) */
graft_tensor *graft_atan(graft_tensor *a);       /**< arctangent, in (-pi/2, pi/2) (float dtypes) */
graft_tensor *graft_tan(graft_tensor *a);        /**< tangent (float dtypes) */
graft_tensor *graft_asin(graft_tensor *a);       /**< arcsine, in [-pi/2, pi/2] (float dtypes) */
graft_tensor *graft_acos(graft_tensor *a);       /**< arccosine, in [0, pi] (float dtypes) */
graft_tensor *graft_sinh(graft_tensor *a);       /**< hyperbolic sine (float dtypes) */
graft_tensor *graft_cosh(graft_tensor *a);       /**< hyperbolic cosine (float dtypes) */
graft_tensor *graft_asinh(graft_tensor *a);      /**< inverse hyperbolic sine (float dtypes) */
graft_tensor *graft_acosh(graft_tensor *a);      /**< inverse hyperbolic cosine, a >= 1 (float dtypes) */
graft_tensor *graft_atanh(graft_tensor *a);      /**< inverse hyperbolic tangent, |a| <= 1 (float dtypes) */
graft_tensor *graft_log2(graft_tensor *a);       /**< base-2 log (float dtypes) */
graft_tensor *graft_log10(graft_tensor *a);      /**< base-10 log (float dtypes) */
graft_tensor *graft_exp2(graft_tensor *a);       /**< 2^a (float dtypes) */
graft_tensor *graft_erfc(graft_tensor *a);       /**< 1-erf(a), without its cancellation (float dtypes) */
graft_tensor *graft_logical_not(graft_tensor *a);/**< !a (bool) or ~a (integers) */

graft_tensor *graft_add(graft_tensor *a, graft_tensor *b);     /**< a+b */
graft_tensor *graft_sub(graft_tensor *a, graft_tensor *b);     /**< a-b */
graft_tensor *graft_mul(graft_tensor *a, graft_tensor *b);     /**< a*b */
graft_tensor *graft_div(graft_tensor *a, graft_tensor *b);     /**< a/b (integers truncate; /0 is an error value 0) */
graft_tensor *graft_pow(graft_tensor *a, graft_tensor *b);     /**< a^b (float dtypes) */
graft_tensor *graft_maximum(graft_tensor *a, graft_tensor *b); /**< elementwise max (NaN propagates) */
graft_tensor *graft_minimum(graft_tensor *a, graft_tensor *b); /**< elementwise min (NaN propagates) */
graft_tensor *graft_rem(graft_tensor *a, graft_tensor *b);     /**< C fmod / % (sign of a) */
graft_tensor *graft_logical_and(graft_tensor *a, graft_tensor *b); /**< bool and, or integer & */
graft_tensor *graft_logical_or(graft_tensor *a, graft_tensor *b);  /**< bool or, or integer | */
graft_tensor *graft_logical_xor(graft_tensor *a, graft_tensor *b); /**< bool xor, or integer ^ */
graft_tensor *graft_eq(graft_tensor *a, graft_tensor *b); /**< a==b, bool result */
graft_tensor *graft_ne(graft_tensor *a, graft_tensor *b); /**< a!=b, bool result */
graft_tensor *graft_lt(graft_tensor *a, graft_tensor *b); /**< a<b, bool result */
graft_tensor *graft_le(graft_tensor *a, graft_tensor *b); /**< a<=b, bool result */
graft_tensor *graft_gt(graft_tensor *a, graft_tensor *b); /**< a>b, bool result */
graft_tensor *graft_ge(graft_tensor *a, graft_tensor *b); /**< a>=b, bool result */

/** a + s where s is a user scalar parameter of a's dtype (changing s never recompiles). */
graft_tensor *graft_add_scalar(graft_tensor *a, double s);
/** a * s, s a parameter. */
graft_tensor *graft_mul_scalar(graft_tensor *a, double s);
/** a / s, s a parameter. */
graft_tensor *graft_div_scalar(graft_tensor *a, double s);
/** a ^ s, s a parameter. */
graft_tensor *graft_pow_scalar(graft_tensor *a, double s);
/** cond ? a : b, broadcasting all three; cond must be bool. */
graft_tensor *graft_where(graft_tensor *cond, graft_tensor *a, graft_tensor *b);
/** Converts to another dtype (float->int truncates toward zero; ->bool is !=0). */
graft_tensor *graft_convert(graft_tensor *a, graft_dtype dt);

/* ---- movement (index arithmetic; no data is copied until a sync) ---- */
/** Broadcasts numpy-style to shape. */
graft_tensor *graft_broadcast_to(graft_tensor *a, int ndim, const int64_t *shape);
/** Same elements in a new shape; one dim may be -1. */
graft_tensor *graft_reshape(graft_tensor *a, int ndim, const int64_t *shape);
/** Permutes dims: out.shape[i] = a.shape[perm[i]]. */
graft_tensor *graft_transpose(graft_tensor *a, const int *perm);
/** Swaps the last two dims. */
graft_tensor *graft_t(graft_tensor *a);
/** Elements start[i] <= j < limit[i] with step stride[i] > 0 (stride may be NULL for 1s). */
graft_tensor *graft_slice(graft_tensor *a, const int64_t *start, const int64_t *limit,
                          const int64_t *stride);
/** Joins n tensors of equal dtype along axis. */
graft_tensor *graft_concat(graft_tensor *const *ts, int n, int axis);
/** Pads each dim with lo[i] before and hi[i] after (>= 0), filled with value. */
graft_tensor *graft_pad(graft_tensor *a, const int64_t *lo, const int64_t *hi, double value);
/** graft_pad plus interior[i] (>= 0) fill elements between neighbours on dim i (XLA pad). */
graft_tensor *graft_pad_ex(graft_tensor *a, const int64_t *lo, const int64_t *hi,
                           const int64_t *interior, double value);
/** Reverses the order of elements along each of the given axes. */
graft_tensor *graft_flip(graft_tensor *a, const int *axes, int naxes);

/* ---- reductions (axes == NULL with naxes == 0 reduces every axis) ---- */
graft_tensor *graft_sum(graft_tensor *a, const int *axes, int naxes, bool keepdim);  /**< sum */
graft_tensor *graft_max(graft_tensor *a, const int *axes, int naxes, bool keepdim);  /**< max */
graft_tensor *graft_min(graft_tensor *a, const int *axes, int naxes, bool keepdim);  /**< min */
graft_tensor *graft_prod(graft_tensor *a, const int *axes, int naxes, bool keepdim); /**< product */
graft_tensor *graft_mean(graft_tensor *a, const int *axes, int naxes, bool keepdim); /**< mean (float) */
/** Index (i64) of the first maximum along axis. */
graft_tensor *graft_argmax(graft_tensor *a, int axis, bool keepdim);
/** Index (i64) of the first minimum along axis. */
graft_tensor *graft_argmin(graft_tensor *a, int axis, bool keepdim);

/* ---- contraction ---- */
/** Matrix product of [..., M, K] and [..., K, N]; batch dims broadcast; 1-D operands as numpy. */
graft_tensor *graft_matmul(graft_tensor *a, graft_tensor *b);
/** 2-D convolution: x [N,C,H,W], w [O,C/groups,KH,KW]; stride/padding/dilation are {h,w}. */
graft_tensor *graft_conv2d(graft_tensor *x, graft_tensor *w, const int *stride, const int *padding,
                           const int *dilation, int groups);

/** conv2d with separate low/high padding and input (lhs) dilation, as the gradient of a strided
 *  convolution needs; NULL arrays take the defaults (stride/dilations 1, padding 0). */
graft_tensor *graft_conv2d_ex(graft_tensor *x, graft_tensor *w, const int *stride, const int *pad_lo,
                              const int *pad_hi, const int *dilation, const int *lhs_dilation,
                              int groups);
/** Gradient of graft_conv2d with respect to x, given dy and w; x_shape is x's [N,C,H,W]. */
graft_tensor *graft_conv2d_backward_input(graft_tensor *dy, graft_tensor *w, const int64_t *x_shape,
                                          const int *stride, const int *padding,
                                          const int *dilation, int groups);
/** Gradient of graft_conv2d with respect to w, given x and dy; w_shape is w's [O,C/g,KH,KW]. */
graft_tensor *graft_conv2d_backward_weight(graft_tensor *x, graft_tensor *dy,
                                           const int64_t *w_shape, const int *stride,
                                           const int *padding, const int *dilation, int groups);

/* ---- indexing ---- */
/** out[...i...] = a[...index[...i...]...] along axis (torch.gather); index is i32/i64. */
graft_tensor *graft_gather(graft_tensor *a, int axis, graft_tensor *index);
/** a copy of a with src added at index along axis (torch.scatter_add). */
graft_tensor *graft_scatter_add(graft_tensor *a, int axis, graft_tensor *index, graft_tensor *src);

/* ---- pooling over the last two dims of [N,C,H,W] ---- */
/** Max pooling; padding cells never win. */
graft_tensor *graft_max_pool2d(graft_tensor *x, const int *kernel, const int *stride,
                               const int *padding);
/** Gradient of graft_max_pool2d: each window's dy goes to its first maximum in x. */
graft_tensor *graft_max_pool2d_backward(graft_tensor *x, graft_tensor *dy, const int *kernel,
                                        const int *stride, const int *padding);
/** Average pooling; padding counts in the divisor (count_include_pad). */
graft_tensor *graft_avg_pool2d(graft_tensor *x, const int *kernel, const int *stride,
                               const int *padding);

/* ---- composites (decomposed into primitives) ---- */
graft_tensor *graft_relu(graft_tensor *x);                  /**< max(x, 0) */
graft_tensor *graft_gelu(graft_tensor *x, bool tanh_approx); /**< GELU, erf or tanh form */
graft_tensor *graft_softmax(graft_tensor *x, int axis);     /**< numerically stable softmax */
graft_tensor *graft_log_softmax(graft_tensor *x, int axis); /**< numerically stable log-softmax */
/** Normalizes over the last dim [D]; weight and bias are [D], both given or both NULL. */
graft_tensor *graft_layer_norm(graft_tensor *x, graft_tensor *weight, graft_tensor *bias, double eps);
/** Batch norm over dim 1 of [N,C,...]: batch statistics when training, else running ones. */
graft_tensor *graft_batch_norm(graft_tensor *x, graft_tensor *weight, graft_tensor *bias,
                               graft_tensor *running_mean, graft_tensor *running_var,
                               bool training, double eps);
/** x @ w^T + b, with w [out,in] and b [out] or NULL. */
graft_tensor *graft_linear(graft_tensor *x, graft_tensor *w, graft_tensor *b);
/** Mean cross-entropy of logits [N,C] against class indices [N] (i32/i64). */
graft_tensor *graft_cross_entropy(graft_tensor *logits, graft_tensor *target);
/** Zeroes each element with probability p and scales the rest by 1/(1-p) when training. */
graft_tensor *graft_dropout(graft_tensor *x, double p, bool training);
/** Rows of weight [V,D] picked by index (any shape, i32/i64): shape index.shape + [D]. */
graft_tensor *graft_embedding(graft_tensor *weight, graft_tensor *index);

/* ---- recurrent layers (decomposed into primitives; PyTorch's nn.LSTM, gate order i,f,g,o) ---- */
/** One LSTM layer over a whole sequence: x [S,B,I] ([B,S,I] when batch_first), w_ih [4H,I],
 *  w_hh [4H,H], b_ih/b_hh [4H] or NULL, h0/c0 [B,H] or NULL (zeros); f32 or f64. Fills out[4]:
 *  y [S,B,H] ([B,S,H]), h_n [B,H], c_n [B,H], and the state graft_lstm_backward reads [S,B,5H]. */
graft_status graft_lstm(graft_tensor *x, graft_tensor *h0, graft_tensor *c0, graft_tensor *w_ih,
                        graft_tensor *w_hh, graft_tensor *b_ih, graft_tensor *b_hh,
                        bool batch_first, graft_tensor **out);
/** Gradients of graft_lstm (backpropagation through time) from dy, dh_n, dc_n (each NULL: zero),
 *  given its inputs and its y and state. Fills out[6]: dx, dh0, dc0, dw_ih, dw_hh and db [4H]
 *  (the gradient of b_ih and of b_hh alike). */
graft_status graft_lstm_backward(graft_tensor *x, graft_tensor *h0, graft_tensor *c0,
                                 graft_tensor *w_ih, graft_tensor *w_hh, graft_tensor *y,
                                 graft_tensor *state, graft_tensor *dy, graft_tensor *dh_n,
                                 graft_tensor *dc_n, bool batch_first, graft_tensor **out);

/* ---- gradients (reverse mode over the pending graph) ----
 * Gradients are lazy tensors like any op's results: a training step's forward pass, its
 * gradients and the update that reads them trace into one graph. Take them before the output
 * is synced (a sync turns the output into data and the graph behind it is gone). Each op of
 * the table has a rule (ops.def's grad column); floor/round/sign and comparisons pass none, as
 * in PyTorch; a host function or a collective on the way is an error naming it. */
/** grads[i] = d loss / d wrt[i] for a one-element float loss, with wrt[i]'s shape and dtype
 *  (zeros where wrt[i] does not reach loss; a value used twice sums both paths). wrt[i] may be
 *  any float tensor the loss depends on: a parameter, or an intermediate value. */
graft_status graft_grad(graft_tensor *loss, int n, graft_tensor *const *wrt, graft_tensor **grads);
/** The vector-Jacobian product: grads[i] = d sum(out * cotangent) / d wrt[i], for an output of
 *  any shape and a cotangent of its shape and dtype. */
graft_status graft_vjp(graft_tensor *out, graft_tensor *cotangent, int n, graft_tensor *const *wrt,
                       graft_tensor **grads);

/* ---- optimizers (torch.optim's formulas; the update is IR, fused into the step's graph) ---- */
typedef struct graft_optimizer graft_optimizer;
/** torch.optim.SGD's options (zero: plain SGD). */
typedef struct {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
} graft_sgd_options;
/** torch.optim.Adam's options; decoupled_weight_decay makes it AdamW. Typical:
 *  {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}. */
typedef struct {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled_weight_decay;
} graft_adam_options;
/** An optimizer over params[0..n) (f32/f64 tensors, retained): each step assigns their new
 *  values to these handles (graft_assign). NULL with the error set on bad options. */
graft_optimizer *graft_sgd(int n, graft_tensor *const *params, graft_sgd_options opt);
/** Adam or AdamW; its moments start as zeros on each parameter's device. */
graft_optimizer *graft_adam(int n, graft_tensor *const *params, graft_adam_options opt);
/** One update from grads[i] for params[i] (NULL: that parameter is left as it is). Pending like
 *  any op: the next sync runs forward, gradients and update as one graph. */
graft_status graft_optimizer_step(graft_optimizer *opt, graft_tensor *const *grads);
/** Changes the learning rate (a schedule); no recompile follows. */
graft_status graft_optimizer_set_lr(graft_optimizer *opt, double lr);
/** Releases the optimizer's state and its references to the parameters (NULL: no-op). */
void graft_optimizer_free(graft_optimizer *opt);

/* ---- parameters: initialization and files ---- */
/** Uniform in [lo, hi) (torch.nn.init.uniform_), computed before it returns; f32 or f64. */
graft_tensor *graft_init_uniform(graft_dtype dt, int ndim, const int64_t *shape, double lo,
                                 double hi, int device);
/** Normal with mean and std (torch.nn.init.normal_). */
graft_tensor *graft_init_normal(graft_dtype dt, int ndim, const int64_t *shape, double mean,
                                double std, int device);
/** torch.nn.init.kaiming_uniform_ (fan-in, leaky ReLU slope a): bound sqrt(6 / ((1 + a^2)
 *  fan_in)); a = sqrt(5) is nn.Linear's and nn.Conv2d's default weight init. shape [out, in, ...]. */
graft_tensor *graft_init_kaiming_uniform(graft_dtype dt, int ndim, const int64_t *shape, double a,
                                         int device);
/** Writes tensors[0..n) under names[0..n) (unique, non-empty) to path, in the saved-function
 *  format (a function of no inputs whose outputs are the tensors): graft.save_tensors writes
 *  the same from Python. */
graft_status graft_save_tensors(const char *path, int n, const char *const *names,
                                graft_tensor *const *tensors);
/** Reads the tensors named names[0..n) from a file graft_save_tensors (or graft.save_tensors)
 *  wrote, onto device: out[i] new tensors. A name the file lacks is GRAFT_ERR_FILE listing the
 *  names it has; a bad file fails as graft_load does. */
graft_status graft_load_tensors(const char *path, int device, int n, const char *const *names,
                                graft_tensor **out);

/* ---- the timeline trace (Perfetto / chrome://tracing) ----
 * Spans of what each thread did: syncs (capture and hash, the cache's hit or miss, the first
 * tier's lowering), native builds, each step a thread ran with its kernels, GEMMs (shape,
 * FLOPs) and fallbacks, and waits. GRAFT_TRACE=path.json records from the start to
 * graft_shutdown (or exit). */
/** Starts recording to path (written, checked now: GRAFT_ERR_FILE if it cannot be). One trace at
 *  a time (GRAFT_ERR_ARG). */
graft_status graft_trace_begin(const char *path);
/** Stops recording and writes the trace (Chrome's trace-event JSON). */
graft_status graft_trace_end(void);

/* ---- configuration ---- */
/** Pending IR nodes past which the next op syncs every live tensor (default 100000); if that
 *  sync fails, the op still returns its (pending) result and the sync's error is set. */
void graft_set_max_pending_nodes(int64_t n);
/** Cap on bytes of device data (0 = none); allocations past it fail with GRAFT_ERR_OOM. */
void graft_set_memory_limit(size_t bytes);
/** Returns the released blocks graft keeps for reuse (its buffer pool) to the system, once the
 *  queued steps have run. */
void graft_empty_cache(void);

/* ---- metrics ---- */
/** The metrics, one row per field: X(type, name, label, meaning). graft_metrics below, the text
 *  report (graft_metrics_report) and the PyTorch bridge's graft.metrics() dict are generated from
 *  this list, in this order (the struct's layout is the ABI: new fields go at the end). */
#define GRAFT_METRICS_FIELDS(X)                                                                   \
  X(uint64_t, graphs_compiled, "graphs compiled", "cache misses that built an executable")        \
  X(uint64_t, cache_hits, "cache hits", "syncs served by the in-memory cache")                    \
  X(uint64_t, executions, "executions", "graphs executed")                                        \
  X(uint64_t, auto_syncs, "auto syncs", "syncs forced by the pending-node limit")                 \
  X(uint64_t, nodes_traced, "nodes traced", "IR nodes recorded")                                  \
  X(uint64_t, last_graph_nodes, "last graph nodes", "size of the last executed graph")            \
  X(uint64_t, max_graph_nodes, "max graph nodes", "largest executed graph")                       \
  X(uint64_t, live_tensors, "live tensors", "tensor handles alive now")                           \
  X(uint64_t, pending_nodes, "pending nodes", "IR nodes not yet materialized")                    \
  X(uint64_t, bytes_in_use, "bytes in use", "device data bytes now")                              \
  X(uint64_t, bytes_peak, "bytes peak", "high-water mark of bytes_in_use")                        \
  X(uint64_t, bytes_pooled, "bytes pooled", "released blocks kept for reuse (graft_empty_cache frees them)") \
  X(uint64_t, donated_buffers, "donated buffers", "inputs only a graph referenced, whose memory outputs reused") \
  X(uint64_t, transfers_to_device, "transfers to device", "uploads to device data")             \
  X(uint64_t, bytes_to_device, "bytes to device", "bytes uploaded")                               \
  X(uint64_t, transfers_to_host, "transfers to host", "reads of device data")                   \
  X(uint64_t, bytes_to_host, "bytes to host", "bytes read")                                       \
  X(double, compile_ms, "graph build ms", "total time building executables (capture miss, lowering, passes)") \
  X(double, execute_ms, "execute ms", "total time running graphs")                                \
  X(uint64_t, native_compiles, "native compiles", "graphs compiled to native code (background or sync), fully optimized") \
  X(uint64_t, quick_compiles, "quick compiles", "quick native builds that ran until the full one landed (GRAFT_COMPILE_QUICK)") \
  X(uint64_t, native_compile_failures, "native compile failures", "compiles that failed: those graphs stay on the first tier") \
  X(double, native_compile_ms, "native compile ms", "time in the native compiler (mostly off the critical path)") \
  X(uint64_t, compiled_executions, "compiled executions", "executions that ran native code (the rest: first tier)") \
  X(uint64_t, partial_executions, "partial executions", "of those, runs of a graph whose build was still landing: the kernels compiled so far native, the others on the first tier's loops") \
  X(uint64_t, native_disk_hits, "disk cache hits", "native code loaded from the disk cache, not compiled (the cpu backend: kernel objects)") \
  X(uint64_t, kernels_compiled, "kernels compiled", "distinct kernel bodies compiled (each once for every graph, and for later processes through the disk cache)") \
  X(uint64_t, kernels_reused, "kernels reused", "kernel bodies a build found compiled already, in memory or on disk") \
  X(uint64_t, kernels_sized, "kernels size-generic", "of the bodies builds used, those run as a template whose varying sizes are run-time values (a batch or sequence length seen to vary)") \
  X(uint64_t, compiler_runs, "compiler runs", "native compiler invocations (a build compiles its missing kernels as up to one object per core; a background first build as pieces that switch its kernels to native code as each lands)") \
  X(uint64_t, library_builds, "library builds", "graphs given native code at their first run, every kernel compiled before (a new size of a graph seen at another)") \
  X(uint64_t, native_disk_refused, "disk cache refused", "compiles that could not use the disk cache folder (warned once)") \
  X(uint64_t, fallback_ops, "reference fallbacks", "instructions of compiled graphs run on the reference kernels") \
  X(uint64_t, syncs, "syncs", "syncs that had pending work")                                      \
  X(double, sync_overhead_ms, "sync overhead ms", "sync time outside compile and execute: capture, hash, lookup, bind") \
  X(uint64_t, cache_collisions, "hash collisions", "lookups whose hash matched a cached graph of another structure (the graph was then found or compiled on its own, never run as that one)") \
  X(uint64_t, checked_executions, "checked executions", "GRAFT_CHECK: executions also run on the reference kernels") \
  X(uint64_t, check_mismatches, "check mismatches", "GRAFT_CHECK: outputs that differed from the reference kernels") \
  X(uint64_t, async_steps, "async steps", "graphs queued for asynchronous execution (GRAFT_ASYNC)") \
  X(uint64_t, async_waits, "async waits", "reads that waited for a queued graph to finish")      \
  X(double, async_wait_ms, "async wait ms", "time those reads waited")                            \
  X(uint64_t, inline_runs, "inline runs", "reads of small graphs of computed inputs that the reading thread ran at once, not queued behind running steps (GRAFT_INLINE)") \
  X(uint64_t, collectives, "collectives", "collectives graphs ran: one per dtype per graft_dist_* call, each one MPI call in a job of more than one process") \
  X(uint64_t, collective_bytes, "collective bytes", "bytes those collectives moved from this rank") \
  X(double, collective_ms, "collective ms", "time in them, waiting for the other ranks included") \
  X(uint64_t, device_uploads, "device uploads", "copies into an accelerator's own memory (uploads, fallbacks' inputs back)") \
  X(uint64_t, device_upload_bytes, "device upload bytes", "bytes those copies moved") \
  X(uint64_t, device_downloads, "device downloads", "copies out of an accelerator's memory (reads, fallbacks' inputs)") \
  X(uint64_t, device_download_bytes, "device download bytes", "bytes those copies moved") \
  X(uint64_t, kernel_choices, "kernel choices", "classes of products/convolutions whose kernel was picked by timing the candidates on their first runs") \
  X(uint64_t, kernels_demoted, "kernels demoted", "of those, classes where the library's kernel (or another of graft's) beat the default and now runs (GRAFT_PROFILE lists them)")

#define GRAFT_METRICS_MEMBER_(type, name, label, meaning) type name;
typedef struct {
  GRAFT_METRICS_FIELDS(GRAFT_METRICS_MEMBER_)
} graft_metrics;
#undef GRAFT_METRICS_MEMBER_

/** Fills m with the current counters. */
void graft_metrics_get(graft_metrics *m);
/** Resets counters (not the gauges: live tensors, pending nodes, bytes in use). */
void graft_metrics_reset(void);
/** A text report of every counter and recent compile reasons; free() it. */
char *graft_metrics_report(void);
/** Compiles every cached graph not yet native (graphs run once included; normally a graph is
 *  compiled when it runs again) and blocks until background compiles have finished. */
void graft_wait_compiles(void);
/** Why the last graph was compiled ("" before any compile); valid until the next compile.
 *  A reason names the source line of the first op that differs from the nearest cached graph
 *  when the ops were traced with a location set (graft_set_location). */
const char *graft_last_compile_reason(void);
/** Sets the calling thread's source location: ops traced after it, on this thread, are
 *  recorded as made at file:line (not hashed: graphs from different lines still match), so a
 *  recompile can name the line whose op differs; graft_metrics_report lists the lines with
 *  the most recompiles. file must stay valid and unchanged (a string literal such as
 *  __FILE__); NULL clears. A wrapper calls it per op, e.g. as a macro around each call. */
void graft_set_location(const char *file, int line);
/** Names the framework op ("aten::convolution") the ops traced next on the calling thread come
 *  from, for the pictures of compiled graphs and the trace's kernel spans (not hashed). name
 *  must stay valid and unchanged, as graft_set_location's file; NULL clears. */
void graft_set_op_name(const char *name);

/* ---- functions: a traced computation called again ----
 * Tracing runs the caller's code for every op, every time (in PyTorch: Python, the dispatcher
 * and graft's bridge). A function records once how some outputs are computed from some inputs
 * and makes the same graph again over other inputs at each call, with no op calls: the graph
 * is the one recorded, so the compile cache finds its compiled code. */
typedef struct graft_function graft_function;
/** Records how outputs[0..nout) are computed from inputs[0..nin). Each input must be
 *  materialized (not pending: graft_sync it before tracing the computation) and distinct; any
 *  other materialized tensor the computation reads is kept as a constant (by reference); a
 *  random draw gets a new seed at each call. Nothing is run and no tensor changes. NULL with
 *  the error set on bad arguments. */
graft_function *graft_function_capture(int nin, graft_tensor *const *inputs, int nout,
                                       graft_tensor *const *outputs);
/** Calls f on inputs of the recorded dtypes, shapes and devices (pending ones too): outputs
 *  receive nout new tensors, pending like any op's results. On error (a shape that differs
 *  names the input and both shapes) no output is made. */
graft_status graft_function_call(graft_function *f, int nin, graft_tensor *const *inputs,
                                 int nout, graft_tensor **outputs);
int graft_function_inputs(const graft_function *f);  /**< nin, or -1 for NULL */
int graft_function_outputs(const graft_function *f); /**< nout, or -1 for NULL */
/** Names output k (kept in its file by graft_save); 1 to 4096 bytes. */
graft_status graft_function_set_output_name(graft_function *f, int k, const char *name);
/** Output k's name, or NULL when it has none. */
const char *graft_function_output_name(const graft_function *f, int k);
/** Frees f and the constants it holds (NULL is a no-op). */
void graft_function_free(graft_function *f);
/** Input k's dtype and shape (shape holds GRAFT_MAX_DIMS); returns its ndim, -1 on error. */
int graft_function_input(const graft_function *f, int k, graft_dtype *dtype, int64_t *shape);
/** Writes f to path: its graph (ops by name, attributes, dtypes, shapes) and its constants'
 *  bytes, in a versioned format with checksums (src/api/function_file.c describes it); written
 *  beside path and renamed over it. A function that calls a host function or a collective
 *  cannot be saved (GRAFT_ERR_ARG). graft.export writes one from a PyTorch model. */
graft_status graft_save(const graft_function *f, const char *path);
/** Reads a function graft_save wrote, its constants on device (0: cpu:0), checked whole: a
 *  file that is missing, foreign, truncated, corrupted (a checksum fails), of another format
 *  version, or whose ops do not give the recorded shapes is NULL with GRAFT_ERR_FILE naming the
 *  file and the problem. Run it with graft_function_call; free it with graft_function_free. */
graft_function *graft_load(const char *path, int device);

/* ---- host functions inside a graph ----
 * A graph can call a function of the caller's on the host, at its place in the step: no cut,
 * no sync. The PyTorch bridge runs an op it has no lowering for through PyTorch's CPU kernel
 * this way. */
/** One operand or the result of a host function: contiguous, row-major, host memory. */
typedef struct {
  void *data;
  graft_dtype dtype;
  int ndim;
  const int64_t *shape;
  int64_t numel;
} graft_host_tensor;
/** Computes out (allocated, dtype and shape as declared) from in[0..nin); returns 0, or nonzero
 *  after writing why into err (errlen bytes): the sync that ran it fails with that message. It
 *  runs on graft's executor thread, any time after the call that traced it; it must be a pure
 *  function of its operands (a cached graph calls it again with new operands). */
typedef int (*graft_host_fn)(void *ctx, int nin, const graft_host_tensor *in,
                             graft_host_tensor *out, char *err, size_t errlen);
/** A tensor of dtype and shape computed by fn(ctx, in...) when the graph runs. key identifies
 *  the function for graph hashing and caching: the first (fn, ctx) registered under a key is
 *  the one every graph with that key calls, so ctx must stay valid for the process and a key
 *  must not name two computations. CPU devices only (the operands' device, at least one). */
graft_tensor *graft_host_call(graft_host_fn fn, void *ctx, uint64_t key, int nin,
                              graft_tensor *const *in, graft_dtype dtype, int ndim,
                              const int64_t *shape);

/* ---- data-parallel collectives (Open MPI; src/dist) ----
 * Collectives are graph nodes: a training step with its all_reduce is one cached graph, run
 * at the next sync. Every rank must trace the same collectives in the same order; a rank
 * whose shapes or dtypes differ gets GRAFT_ERR_DIST naming both, and a rank that fails or
 * stalls makes the others fail with GRAFT_ERR_DIST within GRAFT_DIST_TIMEOUT seconds (30). */
typedef enum { GRAFT_REDUCE_SUM, GRAFT_REDUCE_MEAN, GRAFT_REDUCE_MAX, GRAFT_REDUCE_MIN } graft_reduce_op;
/** True when graft was built with Open MPI (else only a world of one process exists). */
bool graft_dist_available(void);
/** Joins the job mpirun started (or, not under a launcher, a world of one); idempotent. */
graft_status graft_dist_init(void);
/** This process's rank in [0, world size); 0 before graft_dist_init. */
int graft_dist_rank(void);
/** Processes in the job; 1 before graft_dist_init. */
int graft_dist_world_size(void);
/** Leaves the job (MPI_Finalize); after a failed collective it aborts the job instead. */
graft_status graft_dist_finalize(void);
/** Ends the whole job now (MPI_Abort), so no rank waits for this one: for fatal errors. */
void graft_dist_abort(int exit_code);
/** out[i] = in[i] reduced over all ranks (sum, mean, max, min); one MPI call per dtype. */
graft_status graft_dist_all_reduce(graft_tensor *const *in, int n, graft_reduce_op op,
                                   graft_tensor **out);
/** out[i] = rank root's in[i] on every rank (shapes and dtypes must agree). */
graft_status graft_dist_broadcast(graft_tensor *const *in, int n, int root, graft_tensor **out);
/** out[i] = every rank's in[i] stacked: shape [world size, ...in[i]'s shape]. */
graft_status graft_dist_all_gather(graft_tensor *const *in, int n, graft_tensor **out);

#ifdef __cplusplus
}
#endif

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif
#endif
