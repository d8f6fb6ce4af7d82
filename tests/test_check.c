/* GRAFT_CHECK: every executed graph also runs on the reference kernels and each output is
 * compared. Correct graphs (first tier and compiled, with contractions, reductions, integer
 * outputs and donated inputs) report nothing; a deliberately broken kernel, made by a compiler
 * wrapper (GRAFT_CC) that rewrites the generated source before compiling it, is reported with
 * the right output and its kernel, and its program and source are dumped. The modes are set here
 * (the suite may run under any GRAFT_COMPILE). */
#define _DEFAULT_SOURCE
#include "check.h"
#include "graft.h"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[512]; /* this test's files: the compiler wrapper, a disk cache, stderr */

/* stderr into a file while a sync runs; the text comes back (and is echoed to the log). */
static int saved_fd = -1;
static void capture_begin(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/stderr.txt", tmp_dir);
  fflush(stderr);
  saved_fd = dup(2);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0 && saved_fd >= 0);
  dup2(fd, 2);
  close(fd);
}
static char *capture_end(void) {
  char path[600];
  snprintf(path, sizeof path, "%s/stderr.txt", tmp_dir);
  fflush(stderr);
  dup2(saved_fd, 2);
  close(saved_fd);
  FILE *f = fopen(path, "r");
  char *s = calloc(1, 1 << 16);
  if (f) {
    size_t n = fread(s, 1, (1 << 16) - 1, f);
    s[n] = 0;
    fclose(f);
  }
  fputs(s, stderr);
  return s;
}

static bool file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  char *s = calloc(1, 1 << 20);
  size_t n = fread(s, 1, (1 << 20) - 1, f);
  s[n] = 0;
  fclose(f);
  bool has = strstr(s, needle) != NULL;
  free(s);
  return has;
}

/* A small model step's worth of ops: matmul (BLAS on both tiers), softmax (exp, reductions),
 * layer norm, cross entropy, an argmax (integer output from inexact floats), a comparison
 * and a transpose (movement only: exact). */
static void model_graph(int64_t rows) {
  int64_t xs[2] = {rows, 96}, ws[2] = {96, 40};
  float *xv = ramp(rows * 96, 1), *wv = ramp(96 * 40, 0.2f);
  int32_t tv[64];
  for (int i = 0; i < rows; i++) tv[i] = (i * 7) % 40;
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 2, xs, 0);
  graft_tensor *w = graft_from_host(wv, GRAFT_F32, 2, ws, 0);
  graft_tensor *t = graft_from_host(tv, GRAFT_I32, 1, &rows, 0);
  graft_scope_begin();
  graft_tensor *logits = graft_matmul(graft_tanh(x), w);
  graft_tensor *out[6] = {
      graft_keep(graft_softmax(logits, -1)),
      graft_keep(graft_layer_norm(logits, NULL, NULL, 1e-5)),
      graft_keep(graft_cross_entropy(logits, t)),
      graft_keep(graft_argmax(logits, 1, false)),
      graft_keep(graft_gt(graft_sigmoid(x), graft_full(0.5, GRAFT_F32, 2, xs))),
      graft_keep(graft_t(x)),
  };
  graft_scope_end();
  CHECK(graft_sync(out, 6) == GRAFT_OK);
  for (int k = 0; k < 6; k++) graft_release(out[k]);
  graft_release(x);
  graft_release(w);
  graft_release(t);
  free(xv);
  free(wv);
}

TEST(correct_graphs_report_nothing) {
  setenv("GRAFT_CHECK", "1", 1);
  setenv("GRAFT_COMPILE", "sync", 1); /* compiled before the first run */
  graft_metrics_reset();
  model_graph(64);
  CHECK(M().compiled_executions == 1);
  CHECK(M().checked_executions == 1);
  CHECK(M().check_mismatches == 0);
  setenv("GRAFT_COMPILE", "async", 1); /* a new graph runs on the first tier */
  graft_metrics_reset();
  model_graph(48);
  CHECK(M().compiled_executions == 0);
  CHECK(M().checked_executions == 1);
  CHECK(M().check_mismatches == 0);
  setenv("GRAFT_COMPILE", "off", 1); /* the reference kernels: nothing to check them against */
  graft_metrics_reset();
  model_graph(32);
  CHECK(M().executions == 1 && M().checked_executions == 0);
  unsetenv("GRAFT_CHECK");
  graft_metrics_reset();
  setenv("GRAFT_COMPILE", "sync", 1);
  model_graph(16);
  CHECK(M().executions == 1 && M().checked_executions == 0);
}

/* p = p * 0.5 + 1 on 1M floats, the old p released: its buffer is donated to the step, which
 * frees it at its last use. The reference runs before that, from the same input. */
TEST(donated_inputs_are_read_by_the_reference_first) {
  const char *modes[2] = {"1", "strict"};
  for (int m = 0; m < 2; m++) {
    setenv("GRAFT_CHECK", modes[m], 1);
    setenv("GRAFT_COMPILE", m ? "async" : "sync", 1);
    int64_t n = 1 << 20;
    float *host = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) host[i] = (float)(i % 100);
    graft_tensor *p = graft_from_host(host, GRAFT_F32, 1, &n, 0);
    free(host);
    graft_metrics_reset();
    for (int step = 0; step < 3; step++) {
      graft_scope_begin();
      graft_tensor *next = graft_keep(graft_add_scalar(graft_mul_scalar(p, 0.5), 1));
      graft_scope_end();
      graft_release(p);
      p = next;
      CHECK(graft_step() == GRAFT_OK);
    }
    /* strict donates nothing: a failed check must leave the tensors usable */
    CHECK(M().donated_buffers == (m ? 0u : 3u));
    CHECK(M().checked_executions == 3 && M().check_mismatches == 0);
    float v[2];
    graft_tensor *two = graft_slice(p, (int64_t[]){98}, (int64_t[]){100}, NULL);
    CHECK(graft_to_host(two, v, sizeof v) == GRAFT_OK);
    CHECK(v[0] == 14 && v[1] == 14.125f);
    graft_release(two);
    graft_release(p);
  }
  unsetenv("GRAFT_CHECK");
}

/* The graph the broken compiler miscompiles: three outputs in one row kernel; only output 1
 * goes through exp. */
static graft_status broken_graph(graft_tensor *x, graft_tensor *y, float *o1) {
  graft_scope_begin();
  graft_tensor *out[3] = {
      graft_keep(graft_add(x, y)),
      graft_keep(graft_mul_scalar(graft_exp(x), 2)),
      graft_keep(graft_sum(graft_mul(x, y), (int[]){1}, 1, false)),
  };
  graft_scope_end();
  graft_status st = graft_sync(out, 3);
  if (st == GRAFT_OK)
    CHECK(graft_to_host(out[1], o1, (size_t)graft_numel(x) * sizeof(float)) == GRAFT_OK);
  for (int k = 0; k < 3; k++) graft_release(out[k]);
  return st;
}

TEST(a_broken_kernel_is_reported) {
  /* A compiler that turns each f32 exp in the generated kernels into 1 + x (a use reads
   * "tN = gm_expf(tM)"; the math prelude's own definition stays intact); GRAFT_CC is one path to
   * an executable with no arguments (whether graft runs it through sh -c or directly). */
  char cc[600];
  snprintf(cc, sizeof cc, "%s/badcc.sh", tmp_dir);
  FILE *f = fopen(cc, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs("#!/bin/sh\n"
        "# test_check: rewrites graft's generated source (the last argument), then compiles it\n"
        "for a in \"$@\"; do last=\"$a\"; done\n"
        "case \"$last\" in *.c) sed -i 's/= gm_expf(t/= (1.0f+t/g' \"$last\" || exit 1 ;; esac\n"
        "exec cc \"$@\"\n", f);
  fclose(f);
  chmod(cc, 0700);
  setenv("GRAFT_CC", cc, 1);
  setenv("GRAFT_COMPILE", "sync", 1);
  setenv("GRAFT_CHECK", "1", 1);
  unsetenv("GRAFT_DUMP_DIR"); /* the report names the private folder it made */
  int64_t sh[2] = {8, 64};
  float xv[512], yv[512], o1[512];
  for (int i = 0; i < 512; i++) {
    xv[i] = (float)((i * 37) % 101 - 50) / 50.0f;
    yv[i] = (float)((i * 11) % 13) / 7.0f;
  }
  graft_tensor *x = graft_from_host(xv, GRAFT_F32, 2, sh, 0);
  graft_tensor *y = graft_from_host(yv, GRAFT_F32, 2, sh, 0);
  graft_metrics_reset();
  capture_begin();
  graft_status st = broken_graph(x, y, o1);
  char *err = capture_end();
  CHECK(st == GRAFT_OK); /* GRAFT_CHECK=1 observes: the backend's result stands */
  CHECK(M().compiled_executions == 1 && M().checked_executions == 1);
  CHECK(M().check_mismatches == 1);
  CHECK(o1[3] == 2 * (1 + xv[3])); /* what the broken code computed */
  CHECK(strstr(err, "graft check: graph ") != NULL);
  CHECK(strstr(err, "on the cpu backend (compiled code) differs") != NULL);
  CHECK(strstr(err, "output 1 of 3: f32[8,64] = %") != NULL);
  CHECK(strstr(err, "output 0 of 3") == NULL && strstr(err, "output 2 of 3") == NULL);
  CHECK(strstr(err, "computed by: generated kernel k0") != NULL);
  CHECK(strstr(err, " exp") != NULL);              /* the inlined instruction that broke */
  CHECK(strstr(err, "max abs error ") != NULL);
  CHECK(strstr(err, "loose after exp") != NULL);
  const char *d = strstr(err, "dumped: ");
  CHECK(d != NULL);
  if (d) {
    char txt[700], csrc[700];
    sscanf(d + 8, "%699s", txt);
    CHECK(strstr(txt, ".check.txt") != NULL);
    CHECK(file_has(txt, "output 1 of 3"));        /* the report */
    CHECK(file_has(txt, "= exp f32[8,64]"));      /* the program as it ran */
    const char *c = strstr(d, ", ");
    CHECK(c && sscanf(c + 2, "%699s", csrc) == 1 && strstr(csrc, ".c") != NULL);
    if (c) CHECK(file_has(csrc, "gm_expf(")); /* graft's source, before the wrapper broke it */
  }
  free(err);

  /* Later runs of the same graph are counted, not reported again. */
  capture_begin();
  st = broken_graph(x, y, o1);
  err = capture_end();
  CHECK(st == GRAFT_OK && M().check_mismatches == 2 && strstr(err, "graft check") == NULL);
  free(err);

  /* strict: the sync fails, naming the output; the tensors stay pending */
  setenv("GRAFT_CHECK", "strict", 1);
  capture_begin();
  st = broken_graph(x, y, o1);
  free(capture_end());
  CHECK(st == GRAFT_ERR_INTERNAL);
  CHECK(strstr(graft_last_error(), "GRAFT_CHECK=strict: output 1 (%") != NULL);
  graft_clear_error();
  CHECK(M().check_mismatches == 3);

  /* GRAFT_DUMP_DIR chooses the folder; the broken code, once compiled, stays cached in memory,
   * so a new graph of another shape shows it (and is reported, being another graph) */
  char dump[600];
  snprintf(dump, sizeof dump, "%s/dumps", tmp_dir);
  setenv("GRAFT_DUMP_DIR", dump, 1);
  setenv("GRAFT_CHECK", "1", 1);
  int64_t sh2[2] = {4, 64};
  graft_tensor *x2 = graft_from_host(xv, GRAFT_F32, 2, sh2, 0);
  graft_tensor *y2 = graft_from_host(yv, GRAFT_F32, 2, sh2, 0);
  capture_begin();
  st = broken_graph(x2, y2, o1);
  err = capture_end();
  CHECK(st == GRAFT_OK && strstr(err, "output 1 of 3: f32[4,64]") != NULL);
  d = strstr(err, "dumped: ");
  CHECK(d && !strncmp(d + 8, dump, strlen(dump)));
  free(err);
  unsetenv("GRAFT_DUMP_DIR");
  unsetenv("GRAFT_CHECK");
  unsetenv("GRAFT_CC");
  graft_release(x2);
  graft_release(y2);
  graft_release(x);
  graft_release(y);
}

int main(void) {
  const char *t = getenv("TMPDIR");
  snprintf(tmp_dir, sizeof tmp_dir, "%s/graft-test-check-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(tmp_dir)) return 1;
  setenv("TMPDIR", tmp_dir, 1); /* the check's private dump folder and compile work dirs */
  char cache[600];
  snprintf(cache, sizeof cache, "%s/cache", tmp_dir);
  setenv("XDG_CACHE_HOME", cache, 1); /* a fresh disk cache: no good object of the graph */
  unsetenv("GRAFT_DISK_CACHE");
  RUN(correct_graphs_report_nothing);
  RUN(donated_inputs_are_read_by_the_reference_first);
  RUN(a_broken_kernel_is_reported);
  graft_shutdown();
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_dir);
  return CHECK_DONE();
}
