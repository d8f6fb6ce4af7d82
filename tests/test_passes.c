/* Graph passes: each rewrite happens where it should, and a program gives the same results
 * with and without passes (run on the reference backend). */
#include "check.h"
#include "graft.h"
#include "../src/graph/graph.h"
#include <stdlib.h>
#include <string.h>

static graph_capture cap;

/* Lowers the pending graph of roots twice: one copy as captured, one after passes. */
static void lower_both(graft_tensor **roots, int n, exec_program **raw, exec_program **opt,
                       passes_stats *ps) {
  ir_node *nodes[8];
  for (int i = 0; i < n; i++) nodes[i] = tensor_check(roots[i], "lower_both")->node;
  CHECK(capture_run(&cap, nodes, n) == 0);
  *raw = capture_lower(&cap);
  *opt = capture_lower(&cap);
  CHECK(*raw && *opt);
  CHECK(passes_run(*opt, ps) == 0);
}

/* Runs p on the reference backend and copies output k's bytes into out. */
static void run(const exec_program *p, int k, void *out, size_t bytes) {
  exec_buffer **params = malloc(sizeof *params * ((size_t)p->nparams + 1));
  exec_buffer **outs = calloc((size_t)p->noutputs + 1, sizeof *outs);
  for (int i = 0; i < p->nparams; i++) params[i] = cap.params[i]->data;
  CHECK(graph_backend(p->device, BACKEND_REFERENCE)->execute((void *)p, p, params, outs) == 0);
  CHECK(outs[k] && outs[k]->bytes == bytes);
  if (outs[k]) memcpy(out, outs[k]->ptr, bytes);
  for (int i = 0; i < p->noutputs; i++) buffer_release(outs[i]);
  free(params);
  free(outs);
}

/* Output 0 of both programs holds the same bytes; frees both programs. */
static void check_same_and_free(exec_program *raw, exec_program *opt, size_t bytes) {
  unsigned char *a = malloc(bytes), *b = malloc(bytes);
  run(raw, 0, a, bytes);
  run(opt, 0, b, bytes);
  CHECK(!memcmp(a, b, bytes));
  free(a);
  free(b);
  program_free(raw);
  program_free(opt);
}

static graft_tensor *data(int64_t n, float scale) {
  float *v = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = scale * (float)(i % 7) - 1.5f;
  graft_tensor *t = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  free(v);
  return t;
}

TEST(identities_are_removed) {
  graft_scope_begin();
  graft_tensor *x = data(6, 1);
  graft_tensor *one = graft_full(1, GRAFT_F32, 0, NULL), *zero = graft_full(0, GRAFT_F32, 0, NULL);
  graft_tensor *y = graft_reshape(graft_mul(x, one), 1, (int64_t[]){6}); /* x*1, same shape */
  graft_tensor *z = graft_exp(graft_add(y, zero));                          /* +0 */
  exec_program *raw, *opt;
  passes_stats ps;
  lower_both(&z, 1, &raw, &opt, &ps);
  CHECK(ps.simplified >= 3);
  /* What is left: x, exp(x). */
  CHECK(opt->ninstr == 2);
  CHECK(opt->instr[opt->output_slot[0]].op == IR_EXP);
  check_same_and_free(raw, opt, 6 * sizeof(float));
  graft_scope_end();
}

TEST(common_subexpressions_merge) {
  graft_scope_begin();
  graft_tensor *x = data(5, 0.5f);
  graft_tensor *s = graft_add(graft_tanh(x), graft_tanh(x)); /* two distinct tanh nodes */
  exec_program *raw, *opt;
  passes_stats ps;
  lower_both(&s, 1, &raw, &opt, &ps);
  CHECK(ps.cse == 1);
  int ntanh = 0;
  for (int i = 0; i < opt->ninstr; i++) ntanh += opt->instr[i].op == IR_TANH;
  CHECK(ntanh == 1);
  check_same_and_free(raw, opt, 5 * sizeof(float));
  graft_scope_end();
}

TEST(constants_fold_and_dead_code_goes) {
  graft_scope_begin();
  graft_tensor *c2 = graft_full(2, GRAFT_F32, 1, (int64_t[]){4});
  graft_tensor *c3 = graft_full(3, GRAFT_F32, 0, NULL);
  graft_tensor *k = graft_div(graft_sub(graft_mul(c2, c3), c3), c2); /* (2*3-3)/2 = 1.5 */
  graft_tensor *x = data(4, 1);
  graft_tensor *y = graft_mul(x, k);
  exec_program *raw, *opt;
  passes_stats ps;
  lower_both(&y, 1, &raw, &opt, &ps);
  CHECK(ps.folded >= 3);
  CHECK(ps.dead >= 2);
  int found = 0;
  for (int i = 0; i < opt->ninstr; i++)
    found |= opt->instr[i].op == IR_CONSTANT && opt->instr[i].attr.f == 1.5;
  CHECK(found);
  CHECK(opt->ninstr == 3); /* x, the constant 1.5, the multiply */
  check_same_and_free(raw, opt, 4 * sizeof(float));
  graft_scope_end();
}

TEST(outputs_stay_distinct_and_never_alias_inputs) {
  graft_scope_begin();
  graft_tensor *x = data(3, 1);
  graft_tensor *one = graft_full(1, GRAFT_F32, 0, NULL);
  graft_tensor *r[3] = {graft_mul(x, one), graft_exp(x), graft_exp(x)};
  exec_program *raw, *opt;
  passes_stats ps;
  lower_both(r, 3, &raw, &opt, &ps);
  CHECK(opt->noutputs == 3);
  for (int k = 0; k < 3; k++) {
    CHECK(opt->instr[opt->output_slot[k]].op != IR_DATA);
    for (int j = 0; j < k; j++) CHECK(opt->output_slot[k] != opt->output_slot[j]);
  }
  for (int k = 0; k < 3; k++) {
    float a[3], b[3];
    run(raw, k, a, sizeof a);
    run(opt, k, b, sizeof b);
    CHECK(!memcmp(a, b, sizeof a));
  }
  program_free(raw);
  program_free(opt);
  graft_scope_end();
}

TEST(results_match_through_the_executor) {
  /* The same values with the real sync path (which runs passes) as computed by hand. */
  graft_scope_begin();
  graft_tensor *x = data(8, 1);
  graft_tensor *two = graft_full(2, GRAFT_F32, 0, NULL);
  graft_tensor *y = graft_add(graft_mul(graft_mul(x, graft_full(1, GRAFT_F32, 0, NULL)), two),
                              graft_neg(graft_neg(x)));
  float got[8];
  CHECK(graft_to_host(y, got, sizeof got) == GRAFT_OK);
  for (int i = 0; i < 8; i++) {
    float xi = (float)(i % 7) - 1.5f;
    CHECK(got[i] == xi * 2 + xi);
  }
  graft_scope_end();
}

/* The folded constant of graph y (one output over no inputs), after checking the folded
 * program gives the same bytes as the unfolded one on the reference kernels. */
static double folded_value(graft_tensor *y, size_t bytes) {
  exec_program *raw, *opt;
  passes_stats ps;
  lower_both(&y, 1, &raw, &opt, &ps);
  const exec_instr *out = &opt->instr[opt->output_slot[0]];
  CHECK(out->op == IR_CONSTANT && ps.folded >= 1);
  double v = out->attr.f;
  check_same_and_free(raw, opt, bytes);
  return v;
}

/* A constant's value is its dtype's value: convert folds from that, as the kernel converts. */
TEST(convert_folds_in_the_constants_dtype) {
  static const struct { double v; graft_dtype from, to; double want; } cs[] = {
      {3.7, GRAFT_I32, GRAFT_F32, 3},          {2, GRAFT_BOOL, GRAFT_F32, 1},
      {300, GRAFT_U8, GRAFT_F32, 44},          {0.1, GRAFT_F32, GRAFT_F64, (double)0.1f},
      {0.1, GRAFT_F16, GRAFT_F64, 0.0999755859375}, {0.1, GRAFT_BF16, GRAFT_F32, 0.10009765625},
      {3e9, GRAFT_I64, GRAFT_I32, 3e9 - 4294967296.0}, /* int -> int wraps */
      {1e10, GRAFT_F32, GRAFT_I32, 2147483647},       /* float -> int saturates */
      {-3.7, GRAFT_F64, GRAFT_U8, 253},        {-1, GRAFT_I32, GRAFT_BOOL, 1},
      {65519, GRAFT_F32, GRAFT_F16, 65504},    {-0.7, GRAFT_I32, GRAFT_F32, 0},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    graft_scope_begin();
    graft_tensor *y = graft_convert(graft_full(cs[i].v, cs[i].from, 1, (int64_t[]){3}), cs[i].to);
    size_t es = graft_dtype_size(cs[i].to);
    double got = folded_value(y, 3 * es);
    CHECK(got == cs[i].want);
    if (got != cs[i].want)
      fprintf(stderr, "  case %zu: folded %.17g, want %.17g\n", i, got, cs[i].want);
    double item;
    CHECK(graft_item(graft_reshape(graft_slice(y, (int64_t[]){1}, (int64_t[]){2}, NULL), 0, NULL),
                     &item) == GRAFT_OK && item == cs[i].want);
    graft_scope_end();
  }
}

/* Passes read a constant in its dtype even when the program holds a value the dtype rounds. */
TEST(passes_round_a_raw_constant_to_its_dtype) {
  graft_scope_begin();
  graft_tensor *y = graft_convert(graft_full(3, GRAFT_I32, 0, NULL), GRAFT_F64);
  ir_node *root = tensor_check(y, "test")->node;
  CHECK(capture_run(&cap, &root, 1) == 0);
  exec_program *p = capture_lower(&cap);
  CHECK(p && p->instr[0].op == IR_CONSTANT);
  p->instr[0].attr.f = 3.7; /* as a program built before constants were canonical would hold */
  CHECK(passes_run(p, NULL) == 0);
  CHECK(p->ninstr == 1 && p->instr[0].op == IR_CONSTANT && p->instr[0].attr.f == 3);
  program_free(p);
  graft_scope_end();
}

/* Arithmetic folds read operands in their dtype and round (or wrap) the result to it. */
TEST(arithmetic_folds_in_the_dtype) {
  static const struct { double a, b; graft_dtype dt; int op; double want; } cs[] = {
      {1.004, 1.004, GRAFT_BF16, 2, 1.015625}, /* bf16(1.004)^2, not bf16(1.004^2) = 1.0078125 */
      {2.5, 2.5, GRAFT_I32, 0, 4},          /* 2 + 2 */
      {200, 100, GRAFT_U8, 0, 44},          /* wraps mod 256 */
      {3, 5, GRAFT_U8, 1, 254},             /* 3 - 5 wraps */
      {7, -2, GRAFT_I32, 3, -3},            /* truncating division */
      {7, 0, GRAFT_I64, 3, 0},              /* integer /0 is 0, as the kernel */
      {65536, 65536, GRAFT_I32, 2, 0},      /* 2^32 wraps to 0 */
      {0.1, 0.2, GRAFT_F32, 0, (double)(0.1f + 0.2f)},
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    graft_scope_begin();
    graft_tensor *a = graft_full(cs[i].a, cs[i].dt, 1, (int64_t[]){2});
    graft_tensor *b = graft_full(cs[i].b, cs[i].dt, 1, (int64_t[]){2});
    graft_tensor *y = cs[i].op == 0 ? graft_add(a, b) : cs[i].op == 1 ? graft_sub(a, b)
                      : cs[i].op == 2 ? graft_mul(a, b) : graft_div(a, b);
    double got = folded_value(y, 2 * graft_dtype_size(cs[i].dt));
    CHECK(got == cs[i].want);
    if (got != cs[i].want)
      fprintf(stderr, "  case %zu: folded %.17g, want %.17g\n", i, got, cs[i].want);
    graft_scope_end();
  }
}

/* A pad with interior fill only (a strided convolution's gradient) is no identity. */
TEST(interior_pad_is_kept) {
  graft_scope_begin();
  float v[3] = {1, 2, 3}, out[5];
  int64_t n = 3, zero = 0, one = 1;
  graft_tensor *x = graft_from_host(v, GRAFT_F32, 1, &n, 0);
  graft_tensor *y = graft_mul_scalar(graft_pad_ex(x, &zero, &zero, &one, 0), 2);
  CHECK(graft_numel(y) == 5);
  CHECK(graft_to_host(y, out, sizeof out) == GRAFT_OK);
  CHECK(out[0] == 2 && out[1] == 0 && out[2] == 4 && out[3] == 0 && out[4] == 6);
  graft_scope_end();
}

int main(void) {
  RUN(identities_are_removed);
  RUN(common_subexpressions_merge);
  RUN(constants_fold_and_dead_code_goes);
  RUN(outputs_stay_distinct_and_never_alias_inputs);
  RUN(results_match_through_the_executor);
  RUN(convert_folds_in_the_constants_dtype);
  RUN(passes_round_a_raw_constant_to_its_dtype);
  RUN(arithmetic_folds_in_the_dtype);
  RUN(interior_pad_is_kept);
  capture_free(&cap);
  graft_shutdown();
  return CHECK_DONE();
}
