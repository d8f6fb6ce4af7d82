/* The op table against every backend. For each row of ops.def and each dtype the row accepts,
 * a one-op graph runs on the reference kernels, on the first tier and compiled by the cpu
 * backend; what each backend does must be what the row declares:
 *   ref    : the kernel exists and runs (a float op without its M1/M2 math line fails here);
 *   interp : cpu_interp_route() takes the declared path (LOOP / COPY / HOST / REF) and the
 *            first tier's result equals the reference kernel's;
 *   cpu    : the graph compiles (a missing render/rd_expr.c case fails the compile), runs without a
 *            reference fallback unless the row declares REF (or f16/bf16), and agrees with the
 *            reference kernel;
 *   device : with GRAFT_TEST_DEVICE=opencl (or cuda), the compiler of that device's kind builds
 *            and runs it on the device and agrees with the reference kernel.
 * Every failure names the op and dtype, so removing any backend's case for an op fails here. A
 * new row needs an example below (example()); a row without one fails, naming the op. */
#include "graft.h"
#include "ir.h"
#include "buffer.h"
#include "dtype.h"
#include "program.h"
#include "../src/graph/graph.h"
#include "../src/backends/ref/ref.h"
#include "../src/backends/cpu/cpu.h"
#include "backend.h"
#include "check.h"
#include "nvrtc_check.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ir_node *made[64];
static int nmade;
static uint64_t rng_state = 7;

static ir_node *keep(ir_node *n) {
  if (n && nmade < 64) made[nmade++] = n;
  else if (n) ir_release(n);
  return n;
}
static void release_all(void) {
  while (nmade) ir_release(made[--nmade]);
}
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* A data leaf of random values; index leaves (hi > 0) hold values in [0, hi). */
static ir_node *leaf(graft_dtype dt, int nd, const int64_t *shape, int64_t hi) {
  int64_t n = ir_numel(nd, shape);
  exec_buffer *b = buffer_new((size_t)n * graft_dtype_size(dt), 0, 0, "coverage");
  for (int64_t i = 0; i < n; i++) {
    double u = (double)(rnd() >> 11) * 0x1.0p-53;
    if (hi > 0) dtype_store_i(b->ptr, dt, i, (int64_t)(rnd() % (uint64_t)hi));
    else if (dtype_is_float(dt)) dtype_store(b->ptr, dt, i, u * 4 - 2);
    else if (dt == GRAFT_BOOL) dtype_store_i(b->ptr, dt, i, (int64_t)(rnd() & 1));
    else if (dt == GRAFT_U8) dtype_store_i(b->ptr, dt, i, (int64_t)(rnd() % 256));
    else dtype_store_i(b->ptr, dt, i, (int64_t)(rnd() % 101) - 50);
  }
  ir_node *l = ir_make_data(b, dt, nd, shape, 0);
  buffer_release(b);
  return keep(l);
}

static ir_node *node(ir_op op, int nin, ir_node *const *in, const ir_attrs *at, graft_dtype dt,
                     int nd, const int64_t *shape) {
  ir_attrs z = {0};
  return keep(ir_make(op, nin, in, at ? at : &z, dt, nd, shape));
}

/* The example shapes: rows R and batch B, set to 0 by the zero-size pass (every op must take
 * an empty operand on every backend; a reduction over an empty axis gives its identity). */
static int64_t R = 3, B = 1;
static bool reduce_empty_axis; /* reductions reduce axis 0 (empty in the zero-size pass) */
#define S2 ((const int64_t[]){R, 5})

/* Movement ops: each with attributes that make it do something. */
static ir_node *example_movement(ir_op op, graft_dtype dt) {
  ir_node *x = leaf(dt, 2, op == IR_BROADCAST ? (const int64_t[]){1, 5} : S2, 0);
  ir_attrs at = {0};
  switch (op) {
  case IR_BROADCAST: return node(op, 1, &x, NULL, dt, 3, (int64_t[]){2, R, 5});
  case IR_RESHAPE: return node(op, 1, &x, NULL, dt, 2, (int64_t[]){5, R});
  case IR_TRANSPOSE: at.a[0] = 1; at.a[1] = 0; return node(op, 1, &x, &at, dt, 0, NULL);
  case IR_SLICE:
    at.a[0] = R ? 1 : 0; at.a[1] = 0; at.a[8] = R; at.a[9] = 5; at.a[16] = 1; at.a[17] = 2;
    return node(op, 1, &x, &at, dt, 0, NULL);
  case IR_CONCAT: {
    ir_node *in[2] = {x, leaf(dt, 2, S2, 0)};
    at.a[0] = 1;
    return node(op, 2, in, &at, dt, 0, NULL);
  }
  case IR_PAD:
    at.a[0] = 1; at.a[9] = 2; at.a[17] = 1; at.f = 1;
    return node(op, 1, &x, &at, dt, 0, NULL);
  default: return NULL;
  }
}

/* The host function of the HOST_CALL example: its operand's elements in reverse order. */
static int reverse_elements(void *ctx, int nin, const graft_host_tensor *in, graft_host_tensor *out,
                            char *err, size_t errlen) {
  (void)ctx;
  if (nin != 1 || in[0].numel != out->numel || in[0].dtype != out->dtype) {
    snprintf(err, errlen, "reverse_elements: bad operands");
    return 1;
  }
  size_t es = graft_dtype_size(out->dtype);
  for (int64_t i = 0; i < out->numel; i++)
    memcpy((char *)out->data + (size_t)i * es, (const char *)in[0].data + (size_t)(out->numel - 1 - i) * es, es);
  return 0;
}

/* Contractions and the special ops. */
static ir_node *example_special(ir_op op, graft_dtype dt) {
  ir_attrs at = {0};
  switch (op) {
  case IR_HOST_CALL: { /* registered as graft_host_call would */
    static const uint64_t key = 0x7265766572736531ull;
    graft_tensor *probe = graft_zeros(GRAFT_F32, 0, NULL);
    graft_release(graft_host_call(reverse_elements, NULL, key, 1, &probe, GRAFT_F32, 0, NULL));
    graft_release(probe);
    ir_node *x = leaf(dt, 2, S2, 0);
    IR_ATTR(at, HOST_CALL, key) = (int64_t)key;
    return node(op, 1, &x, &at, dt, 2, S2);
  }
  case IR_RNG: { /* the seed is the operand; dt is the output's */
    ir_node *seed = leaf(GRAFT_I64, 0, NULL, 1000);
    return node(op, 1, &seed, &at, dt, 2, S2);
  }
  case IR_DOT: {
    int64_t k = R ? 5 : 0; /* the zero-size pass contracts over nothing: zeros */
    ir_node *in[2] = {leaf(dt, 2, (int64_t[]){3, k}, 0), leaf(dt, 2, (int64_t[]){k, 4}, 0)};
    return node(op, 2, in, NULL, dt, 0, NULL);
  }
  case IR_CONV2D: {
    ir_node *in[2] = {leaf(dt, 4, (int64_t[]){B, 2, 5, 5}, 0), leaf(dt, 4, (int64_t[]){3, 2, 3, 3}, 0)};
    at.a[0] = at.a[1] = 1; at.a[6] = at.a[7] = 1; at.a[8] = at.a[9] = 1; at.a[10] = 1;
    return node(op, 2, in, &at, dt, 0, NULL);
  }
  case IR_GATHER: {
    ir_node *in[2] = {leaf(dt, 2, S2, 0), leaf(GRAFT_I64, 2, (int64_t[]){R, 2}, 5)};
    at.a[0] = 1;
    return node(op, 2, in, &at, dt, 0, NULL);
  }
  case IR_SCATTER_ADD: {
    int64_t si[2] = {R, 2};
    ir_node *in[3] = {leaf(dt, 2, S2, 0), leaf(GRAFT_I64, 2, si, 5), leaf(dt, 2, si, 0)};
    at.a[0] = 1;
    return node(op, 3, in, &at, dt, 0, NULL);
  }
  case IR_REDUCE_WINDOW: { /* 2x2 max pool, stride 2 */
    ir_node *x = leaf(dt, 4, (int64_t[]){B, 2, 4, 4}, 0);
    for (int d = 0; d < 4; d++) at.a[8 + d] = at.a[16 + d] = d < 2 ? 1 : 2;
    return node(op, 1, &x, &at, dt, 0, NULL);
  }
  case IR_MAX_POOL_GRAD: { /* 3x3 windows, stride 2, padding 1: overlaps and pads */
    ir_node *in[2] = {leaf(dt, 4, (int64_t[]){B, 2, 5, 5}, 0), leaf(dt, 4, (int64_t[]){B, 2, 3, 3}, 0)};
    for (int d = 0; d < 4; d++) {
      at.a[8 + d] = d < 2 ? 1 : 3;
      at.a[16 + d] = d < 2 ? 1 : 2;
      at.a[24 + d] = at.a[32 + d] = d < 2 ? 0 : 1;
    }
    return node(op, 2, in, &at, dt, 0, NULL);
  }
  default: return example_movement(op, dt);
  }
}

/* A graph whose root is one instruction of op with output (or operand) dtype dt; NULL when
 * this test has no example for the op. */
static ir_node *example(ir_op op, graft_dtype dt) {
  ir_attrs at = {0};
  switch (ir_ops[op].kind) {
  case IR_K_UNARY:
    if (op == IR_CONVERT) {
      ir_node *x = leaf(dt, 2, S2, 0);
      return node(op, 1, &x, NULL, dt == GRAFT_F32 ? GRAFT_I32 : GRAFT_F32, 0, NULL);
    }
    return node(op, 1, (ir_node *[]){leaf(dt, 2, S2, 0)}, NULL, dt, 0, NULL);
  case IR_K_BINARY: case IR_K_COMPARE: {
    ir_node *in[2] = {leaf(dt, 2, S2, 0), leaf(dt, 2, S2, 0)};
    return node(op, 2, in, NULL, dt, 0, NULL);
  }
  case IR_K_SELECT: {
    ir_node *in[3] = {leaf(GRAFT_BOOL, 2, S2, 0), leaf(dt, 2, S2, 0), leaf(dt, 2, S2, 0)};
    return node(op, 3, in, NULL, dt, 0, NULL);
  }
  case IR_K_REDUCE: {
    ir_node *x = leaf(dt, 2, S2, 0);
    bool arg = op == IR_ARGMAX || op == IR_ARGMIN;
    /* axis 1; reduce_*: the mask of axis 1, or of axis 0 */
    at.a[0] = arg ? 1 : reduce_empty_axis ? 1 : 2;
    return node(op, 1, &x, &at, dt, 0, NULL);
  }
  case IR_K_COLLECTIVE: { /* a world of one (no graft_dist_init): each is the identity */
    ir_node *in[2] = {leaf(dt, 2, S2, 0), leaf(dt, 1, (int64_t[]){2}, 0)};
    IR_ATTR(at, COLLECTIVE, arg) = op == IR_ALL_REDUCE ? 2 : op == IR_ALL_GATHER ? 1 : 0; /* max */
    return node(op, 2, in, &at, dt, 0, NULL);
  }
  case IR_K_LEAF:
    if (op == IR_CONSTANT) { at.f = 1.5; return node(op, 0, NULL, &at, dt, 2, S2); }
    if (op == IR_IOTA) { at.a[0] = 1; return node(op, 0, NULL, &at, dt, 2, S2); }
    return NULL;
  default: return example_special(op, dt);
  }
}

/* ---- running one graph on the three backends ---- */
static graph_capture cap;
static int failures;

#define COVER_FAIL(...)                                                                     \
  do {                                                                                      \
    fprintf(stderr, "op coverage: " __VA_ARGS__);                                           \
    fputc('\n', stderr);                                                                    \
    failures++;                                                                             \
  } while (0)

static bool same(double a, double b, double tol) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  if (isinf(a) || isinf(b)) return a == b;
  return fabs(a - b) <= tol * (1 + fabs(b));
}

/* Whether out agrees with want (ref's) element by element; names the first difference. */
static bool agree(const char *who, ir_op op, const exec_instr *o, const exec_buffer *out,
                  const exec_buffer *want) {
  double tol = o->dtype == GRAFT_F32 ? 1e-5 : o->dtype == GRAFT_F64 ? 1e-12 : 0;
  for (int64_t i = 0; i < o->numel; i++) {
    double a = dtype_load(out->ptr, o->dtype, i), b = dtype_load(want->ptr, o->dtype, i);
    bool ok = dtype_is_float(o->dtype)
                  ? same(a, b, tol)
                  : dtype_load_i(out->ptr, o->dtype, i) == dtype_load_i(want->ptr, o->dtype, i);
    if (!ok) {
      COVER_FAIL("%s on %s: %s differs from the reference kernel at [%lld]: %.9g vs %.9g",
                 ir_ops[op].name, graft_dtype_name(o->dtype), who, (long long)i, a, b);
      return false;
    }
  }
  return true;
}

static const char *interp_path_name(ops_interp_path p) {
  static const char *const nm[] = {"none", "a typed loop", "a strided copy", "a host kernel",
                                   "the reference kernel"};
  return nm[p];
}

/* The first tier's path for the op's instruction must be the declared one (the typed loops are
 * f32/f64 only, but the logical ops' on bool; other dtypes take the reference kernel; some host
 * kernels are float-only). */
static void check_interp_route(ir_op op, graft_dtype dt, const exec_program *p) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    if (ins->op != op) continue;
    ref_arg a[8];
    for (int k = 0; k < ins->nin && k < 8; k++) {
      const exec_instr *x = &p->instr[ins->in[k]];
      a[k] = (ref_arg){NULL, x->dtype, x->ndim, x->shape, x->numel, NULL};
    }
    ops_interp_path want = ir_ops[op].interp, got = cpu_interp_route(ins, a);
    bool fl = dt == GRAFT_F32 || dt == GRAFT_F64;
    bool typed = fl || (dt == GRAFT_BOOL && ir_ops[op].dtypes == IR_D_INTBOOL); /* logic on bool */
    if (!typed && want == OPS_INTERP_LOOP) want = OPS_INTERP_REF;
    if (!fl && want == OPS_INTERP_HOST && got == OPS_INTERP_REF) got = want; /* some are float-only */
    if (got != want)
      COVER_FAIL("%s on %s: ops.def declares the first tier runs it as %s, cpu_interp.c runs "
                 "it as %s", ir_ops[op].name, graft_dtype_name(dt), interp_path_name(want),
                 interp_path_name(got));
  }
}

/* The cpu backend: compiles, runs without an undeclared reference fallback, agrees. */
static void check_cpu(ir_op op, graft_dtype dt, const exec_program *p, exec_buffer **params,
                      exec_buffer *want) {
  void *exe = cpu_backend.compile(p);
  if (!exe) {
    static const char *const nm[] = {"NONE", "EXPR", "WIDE", "MOVE", "REDUCE", "GEMM", "HOST", "REF"};
    COVER_FAIL("%s on %s: the cpu backend failed to compile it (ops.def's cpu column: %s): %s",
               ir_ops[op].name, graft_dtype_name(dt), nm[ir_ops[op].cpu], graft_last_error());
    graft_clear_error();
    return;
  }
  uint64_t before = cpu_stats.fallback[op];
  exec_buffer *out[1] = {0};
  if (cpu_backend.execute(exe, p, params, out)) {
    COVER_FAIL("%s on %s: the compiled code failed: %s", ir_ops[op].name, graft_dtype_name(dt),
               graft_last_error());
    graft_clear_error();
  } else {
    ops_cpu_path c = ir_ops[op].cpu;
    bool declared_ref = c == OPS_CPU_REF || (c == OPS_CPU_GEMM && !dtype_is_float(dt)) ||
                        (c == OPS_CPU_HOST && !dtype_is_float(dt));
    if (cpu_stats.fallback[op] != before && !declared_ref)
      COVER_FAIL("%s on %s: ran on the reference kernel inside compiled code, but ops.def "
                 "declares the cpu backend generates it or has a host kernel for it",
                 ir_ops[op].name, graft_dtype_name(dt));
    agree("the compiled code", op, &p->instr[p->output_slot[0]], out[0], want);
    buffer_release(out[0]);
  }
  cpu_backend.free_exe(exe);
}

/* ---- the device kinds' compilers (OpenCL, CUDA): with GRAFT_TEST_DEVICE naming a device with
 * its own memory (make check-opencl: opencl; scripts/gpu-check.sh: cuda), every op and dtype also
 * runs through the compiler registered for that device's kind, its operands uploaded, and must
 * agree with the reference kernel; an instruction its renderer does not lower runs as a host
 * fallback (counted, and summed in the summary: ops.def's cpu column is the CPU's, not a
 * device's). Without such a device the matrix is skipped, saying why. ---- */
static int cover_dev = -1;           /* the device, or -1 */
static const backend *cover_dev_be;  /* its kind's compiler */
static int dev_runs, dev_fallback_runs;

static void check_device(ir_op op, graft_dtype dt, const exec_program *p, exec_buffer **params,
                         exec_buffer *want) {
  if (cover_dev < 0) return;
  exec_program q = *p; /* the same program for the device: its buffers are made there */
  q.device = cover_dev;
  exec_buffer *dp[8] = {0}, *out[1] = {0}, *host = NULL;
  const char *kind = graft_device_kind(cover_dev);
  bool ok = true;
  for (int k = 0; k < p->nparams && k < 8 && ok; k++)
    ok = (dp[k] = buffer_to_device(params[k], cover_dev, "a coverage operand")) != NULL;
  backend_stats before = {0}, after = {0};
  if (cover_dev_be->stats) cover_dev_be->stats(&before);
  void *exe = ok ? cover_dev_be->compile(&q) : NULL;
  if (!exe || cover_dev_be->execute(exe, &q, dp, out) ||
      !(host = buffer_to_device(out[0], 0, "a coverage result"))) {
    COVER_FAIL("%s on %s: the %s compiler %s: %s", ir_ops[op].name, graft_dtype_name(dt), kind,
               exe ? "ran it and failed" : "failed to build it", graft_last_error());
    graft_clear_error();
  } else {
    agree(kind, op, &p->instr[p->output_slot[0]], host, want);
    if (cover_dev_be->stats) cover_dev_be->stats(&after);
    dev_fallback_runs += after.fallbacks[op] != before.fallbacks[op];
    dev_runs++;
  }
  if (exe) cover_dev_be->free_exe(exe);
  buffer_release(host);
  buffer_release(out[0]);
  for (int k = 0; k < 8; k++) buffer_release(dp[k]);
}

/* The device of GRAFT_TEST_DEVICE when it has its own memory and a compiler; else says why not. */
static int cover_device_init(void) {
  const char *e = getenv("GRAFT_TEST_DEVICE");
  int d = e && *e ? check_test_device_for("test_op_coverage") : 0;
  if (d < 0) return -1; /* a device asked for and missing: said why */
  const char *kind = d > 0 ? graft_device_kind(d) : NULL;
  if (!kind || !strcmp(kind, "cpu")) {
    /* (no discovery here: make check-asan's run must not load pocl, see the Makefile) */
    printf("  device compilers: skipped (GRAFT_TEST_DEVICE=%s names no device with its own memory: "
           "make check-opencl sets opencl, scripts/gpu-check.sh cuda)\n", e ? e : "");
    return 0;
  }
  cover_dev_be = graph_backend(d, BACKEND_COMPILER);
  if (cover_dev_be) cover_dev = d;
  return 0;
}

static void check_cuda_render(ir_op op, graft_dtype dt, const exec_program *p) {
  char why[1800];
  if (nvrtc_check(p, why, sizeof why))
    COVER_FAIL("%s on %s: %s", ir_ops[op].name, graft_dtype_name(dt), why);
}

static void cover_one(ir_op op, graft_dtype dt) {
  ir_node *root = example(op, dt);
  if (!root) {
    COVER_FAIL("%s on %s: no graph (%s); a new op needs an example in tests/test_op_coverage.c",
               ir_ops[op].name, graft_dtype_name(dt), graft_last_error());
    graft_clear_error();
    release_all();
    return;
  }
  exec_program *p = capture_run(&cap, &root, 1) ? NULL : capture_lower(&cap);
  exec_buffer *params[8] = {0}, *want[1] = {0}, *got[1] = {0};
  for (int k = 0; p && k < p->nparams && k < 8; k++) params[k] = cap.params[k]->data;
  if (!p) {
    COVER_FAIL("%s on %s: could not lower the graph", ir_ops[op].name, graft_dtype_name(dt));
  } else if (ref_backend.execute(NULL, p, params, want)) {
    COVER_FAIL("%s on %s: the reference kernel (%s) failed: %s", ir_ops[op].name,
               graft_dtype_name(dt), ir_ops[op].ref, graft_last_error());
    graft_clear_error();
  } else {
    const exec_instr *o = &p->instr[p->output_slot[0]];
    check_interp_route(op, dt, p);
    void *first = cpu_interp_backend.compile(p); /* its plan: views, fused groups */
    if (!first || cpu_interp_backend.execute(first, p, params, got)) {
      COVER_FAIL("%s on %s: the first tier failed: %s", ir_ops[op].name, graft_dtype_name(dt),
                 graft_last_error());
      graft_clear_error();
    } else {
      agree("the first tier", op, o, got[0], want[0]);
    }
    if (first) cpu_interp_backend.free_exe(first);
    check_cpu(op, dt, p, params, want[0]);
    check_device(op, dt, p, params, want[0]);
    check_cuda_render(op, dt, p);
  }
  buffer_release(want[0]);
  buffer_release(got[0]);
  if (p) program_free(p);
  release_all();
}

/* The dtypes a row accepts (f16/bf16 aside: every backend but the reference declares them
 * reference fallbacks). RNG's column is its seed's; its outputs are float. */
static int dtypes_of(ir_op op, graft_dtype *dts) {
  int cls = op == IR_RNG ? IR_D_FLOAT : ir_ops[op].dtypes, n = 0;
  if (cls & IR_D_FLOAT) { dts[n++] = GRAFT_F32; dts[n++] = GRAFT_F64; }
  if (cls & IR_D_INT) { dts[n++] = GRAFT_I32; dts[n++] = GRAFT_I64; dts[n++] = GRAFT_U8; }
  if (cls & IR_D_BOOL) dts[n++] = GRAFT_BOOL;
  return n;
}

/* Every row on every dtype it accepts; the number of failures. */
static int cover_all(int *ops, int *runs) {
  int before_all = failures;
  for (int op = 0; op < IR_OP_COUNT; op++) {
    if (op == IR_DATA) continue; /* bound, not computed: every graph above has data leaves */
    if (!ref_kernels[op]) {
      COVER_FAIL("%s: no reference kernel (ops.def's ref column)", ir_ops[op].name);
      continue;
    }
    graft_dtype dts[8];
    int n = dtypes_of((ir_op)op, dts);
    int before = failures;
    for (int k = 0; k < n; k++, (*runs)++) cover_one((ir_op)op, dts[k]);
    if (failures != before)
      fprintf(stderr, "  (%s: gradient %s)\n", ir_ops[op].name,
              (const char *[]){"vjp", "zero", "leaf", "none"}[ir_ops[op].grad]);
    (*ops)++;
  }
  return failures - before_all;
}

TEST(every_op_on_every_backend) {
  int ops = 0, runs = 0, bad = cover_all(&ops, &runs);
  printf("  %d ops, %d op/dtype graphs on ref, first tier and compiled: %d failures\n", ops, runs,
         bad);
  if (cover_dev >= 0)
    printf("  on %s (%s), compiled by %s: %d graphs agree with the reference, %d of them with a host "
           "fallback\n", graft_device_kind(cover_dev), graft_device_name(cover_dev), cover_dev_be->name, dev_runs,
           dev_fallback_runs);
  nvrtc_summary();
  CHECK(bad == 0);
}

/* The same graphs with an empty rows/batch dim (and DOT over an empty contraction). */
TEST(every_op_on_a_zero_size_dim) {
  R = 0;
  B = 0;
  int ops = 0, runs = 0, bad = cover_all(&ops, &runs);
  int before = failures;
  reduce_empty_axis = true; /* empty inputs to non-empty outputs: each reduction's identity */
  for (int op = 0; op < IR_OP_COUNT; op++) {
    graft_dtype dts[8];
    if (ir_ops[op].kind != IR_K_REDUCE || op == IR_ARGMAX || op == IR_ARGMIN) continue;
    for (int k = 0, n = dtypes_of((ir_op)op, dts); k < n; k++, runs++) cover_one((ir_op)op, dts[k]);
  }
  bad += failures - before;
  reduce_empty_axis = false;
  R = 3;
  B = 1;
  printf("  %d ops, %d op/dtype graphs with a zero-size dim: %d failures\n", ops, runs, bad);
  CHECK(bad == 0);
}

/* The rows ops.c generates C API functions for are the rows the table says (a spot check that
 * the generated wrappers record the row's op). */
TEST(generated_api_records_the_row) {
  int64_t sh[1] = {4};
  float v[4] = {0.5f, 1, 2, 3};
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, sh, 0);
  graft_tensor *y = graft_log1p(x), *z = graft_maximum(x, x);
  CHECK(y && z);
  float out[4];
  CHECK(graft_to_host(y, out, sizeof out) == GRAFT_OK);
  CHECK_NEAR(out[0], log1p(0.5), 1e-6);
  graft_release(y);
  graft_release(z);
  graft_release(x);
}

static char cache_root[256];

int main(void) {
  snprintf(cache_root, sizeof cache_root, "/tmp/graft-coverage-cache-%d", (int)getpid());
  mkdir(cache_root, 0700);
  setenv("XDG_CACHE_HOME", cache_root, 1);
  if (cover_device_init()) return 2;
  RUN(every_op_on_every_backend);
  RUN(every_op_on_a_zero_size_dim);
  RUN(generated_api_records_the_row);
  capture_free(&cap);
  cpu_pool_shutdown();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_root);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", cache_root);
  return CHECK_DONE();
}
