#define _GNU_SOURCE /* memmem */
/* Functions as files (graft_save / graft_load): a loaded function computes what the saved one
 * does, from its own copy of the constants; a missing, foreign, truncated, corrupted or
 * newer-version file, or one whose ops do not give their recorded shapes, is an error that
 * names the file and the problem, never a crash. */
#include "check.h"
#include "graft.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static char dir[64], path[128], bad[160];

static graft_tensor *mat(const float *v, int64_t r, int64_t c) {
  int64_t s[2] = {r, c};
  return graft_from_host(v, GRAFT_F32, 2, s, 0);
}

/* y = softmax(tanh(x w + c)) rows, s = sum(y * 2): w and c constants the file carries. */
static graft_function *make_function(graft_tensor **x_out, graft_tensor **ref) {
  float xv[12], wv[6], cv[2] = {0.25f, -0.5f};
  for (int i = 0; i < 12; i++) xv[i] = 0.1f * (float)(i % 5) - 0.2f;
  for (int i = 0; i < 6; i++) wv[i] = 0.3f * (float)(i % 4) - 0.4f;
  int64_t two = 2;
  graft_tensor *x = mat(xv, 4, 3), *w = mat(wv, 3, 2), *c = graft_from_host(cv, GRAFT_F32, 1, &two, 0);
  graft_tensor *mm = graft_matmul(x, w), *h = graft_add(mm, c), *t = graft_tanh(h);
  graft_tensor *y = graft_softmax(t, 1), *y2 = graft_mul_scalar(y, 2.0), *s = graft_sum(y2, NULL, 0, false);
  graft_tensor *in[1] = {x}, *out[2] = {y, s};
  graft_function *f = graft_function_capture(1, in, 2, out);
  CHECK(f != NULL);
  CHECK(graft_sync(out, 2) == GRAFT_OK);
  ref[0] = y, ref[1] = s;
  *x_out = x;
  graft_release(w), graft_release(c), graft_release(mm), graft_release(h), graft_release(t);
  graft_release(y2);
  return f;
}

static unsigned char *slurp(const char *p, size_t *n) {
  FILE *fp = fopen(p, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, fp);
  fclose(fp);
  return b;
}

static void spill(const char *p, const unsigned char *b, size_t n) {
  FILE *fp = fopen(p, "wb");
  fwrite(b, 1, n, fp);
  fclose(fp);
}

/* Loads the bytes as a file: must fail with GRAFT_ERR_FILE naming the file and `want`. */
static void refused(const unsigned char *b, size_t n, const char *want) {
  spill(bad, b, n);
  graft_function *g = graft_load(bad, 0);
  CHECK(g == NULL);
  CHECK(graft_last_status() == GRAFT_ERR_FILE);
  CHECK(strstr(graft_last_error(), bad) != NULL);
  if (!strstr(graft_last_error(), want)) {
    fprintf(stderr, "  want '%s' in: %s\n", want, graft_last_error());
    CHECK(0);
  }
  graft_function_free(g);
}

static void fix_crcs(unsigned char *b) { /* after editing the metadata: its and the header's CRC */
  uint64_t meta;
  memcpy(&meta, b + 32, 8);
  uint32_t mc = (uint32_t)crc32(0, b + 64, (uInt)meta), hc;
  memcpy(b + 48, &mc, 4);
  hc = (uint32_t)crc32(0, b, 56);
  memcpy(b + 56, &hc, 4);
}

TEST(a_loaded_function_computes_what_the_saved_one_does) {
  graft_tensor *x, *ref[2];
  graft_function *f = make_function(&x, ref);
  CHECK(graft_save(f, path) == GRAFT_OK);
  graft_function_free(f); /* the file holds the constants now */
  graft_function *g = graft_load(path, 0);
  CHECK(g && graft_function_inputs(g) == 1 && graft_function_outputs(g) == 2);
  graft_dtype dt;
  int64_t sh[GRAFT_MAX_DIMS];
  CHECK(graft_function_input(g, 0, &dt, sh) == 2 && dt == GRAFT_F32 && sh[0] == 4 && sh[1] == 3);
  CHECK(graft_function_input(g, 1, &dt, sh) == -1 && graft_last_status() == GRAFT_ERR_ARG);
  graft_tensor *got[2];
  CHECK(graft_function_call(g, 1, &x, 2, got) == GRAFT_OK);
  float a[8], b[8];
  double sa = 0, sb = 0;
  CHECK(graft_to_host(got[0], a, sizeof a) == GRAFT_OK && graft_to_host(ref[0], b, sizeof b) == GRAFT_OK);
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK(graft_item(got[1], &sa) == GRAFT_OK && graft_item(ref[1], &sb) == GRAFT_OK && sa == sb);
  graft_release(got[0]), graft_release(got[1]);
  graft_function_free(g);
  /* on another device: the constants go there */
  graft_function *g1 = graft_load(path, 1);
  graft_tensor *x1 = graft_to_device(x, 1), *got1[2];
  CHECK(g1 && graft_function_call(g1, 1, &x1, 2, got1) == GRAFT_OK);
  CHECK(graft_to_host(got1[0], a, sizeof a) == GRAFT_OK && memcmp(a, b, sizeof a) == 0);
  graft_release(got1[0]), graft_release(got1[1]), graft_release(x1);
  graft_function_free(g1);
  graft_release(ref[0]), graft_release(ref[1]), graft_release(x);
}

TEST(bad_files_are_errors_that_name_the_problem) {
  size_t n = 0;
  unsigned char *b = slurp(path, &n), *c = malloc(n + 1);
  CHECK(b && n > 64);
  if (!b) return;
  CHECK(graft_load("/nonexistent/model.graft", 0) == NULL && graft_last_status() == GRAFT_ERR_FILE &&
        strstr(graft_last_error(), "/nonexistent/model.graft") && strstr(graft_last_error(), "No such file"));
  CHECK(graft_load(path, 99) == NULL && graft_last_status() == GRAFT_ERR_DEVICE);
  CHECK(graft_load(NULL, 0) == NULL && graft_last_status() == GRAFT_ERR_NULL);
  static const char foreign[] = "PK\3\4 not a graft file at all";
  refused((const unsigned char *)foreign, sizeof foreign - 1, "not a graft function file");
  refused(b, 0, "not a graft function file");
  refused(b, 40, "truncated");
  refused(b, 64 + 10, "truncated");
  refused(b, n - 1, "truncated");
  memcpy(c, b, n), c[20] ^= 1; /* a count in the header */
  refused(c, n, "header fails its checksum");
  memcpy(c, b, n), c[64 + 9] ^= 0x40; /* inside the metadata */
  refused(c, n, "metadata fails its checksum");
  memcpy(c, b, n), c[n - 3] ^= 1; /* the last constant's bytes */
  refused(c, n, "fails its checksum");
  uint32_t v = 7;
  memcpy(c, b, n), memcpy(c + 8, &v, 4), fix_crcs(c);
  refused(c, n, "format version 7");
  /* an op this graft lacks, and an op whose recorded shape its operands do not give */
  uint64_t meta;
  memcpy(&meta, b + 32, 8);
  unsigned char *m = memmem(b + 64, meta, "tanh", 4);
  CHECK(m != NULL);
  if (m) {
    memcpy(c, b, n), memcpy(c + (m - b), "tanx", 4), fix_crcs(c);
    refused(c, n, "op 'tanx'");
    /* tanh's entry: kind, dtype, ndim, shape[0] = 4 (the name's length field precedes it) */
    int64_t rows;
    size_t at = (size_t)(m - b) - 4 - 16;
    memcpy(&rows, b + at, 8);
    CHECK(rows == 4);
    rows = 5;
    memcpy(c, b, n), memcpy(c + at, &rows, 8), fix_crcs(c);
    refused(c, n, "tanh");
  }
  /* counts the metadata cannot hold (a 100-byte file claiming 2^26 entries): refused unallocated */
  uint32_t many = 1u << 26;
  memcpy(c, b, n), memcpy(c + 20, &many, 4), fix_crcs(c);
  refused(c, n, "counts are out of range");
  free(b), free(c);
}

/* Unused and repeated inputs (more inputs than entries), an empty constant: saved and loaded. */
TEST(unused_inputs_and_empty_constants_round_trip) {
  float av[4] = {1, 2, 3, 4};
  int64_t four = 4, zero = 0;
  graft_tensor *a = graft_from_host(av, GRAFT_F32, 1, &four, 0), *u = graft_from_host(av, GRAFT_F32, 1, &four, 0);
  graft_tensor *e = graft_from_host(NULL, GRAFT_F32, 1, &zero, 0);
  graft_tensor *y = graft_mul_scalar(a, 2.0), *ye = graft_neg(e);
  graft_tensor *in[4] = {u, u, e, a}, *out[2] = {ye, y};
  graft_function *f = graft_function_capture(4, in, 2, out);
  CHECK(f != NULL);
  CHECK(graft_save(f, path) == GRAFT_OK);
  graft_function *g = graft_load(path, 0);
  CHECK(g && graft_function_inputs(g) == 4);
  graft_tensor *got[2] = {NULL, NULL};
  CHECK(g && graft_function_call(g, 4, in, 2, got) == GRAFT_OK);
  float r[4];
  CHECK(got[1] && graft_to_host(got[1], r, sizeof r) == GRAFT_OK && r[0] == 2 && r[3] == 8);
  CHECK(got[0] && graft_numel(got[0]) == 0);
  graft_release(got[0]), graft_release(got[1]);
  graft_function_free(g), graft_function_free(f);
  /* an empty constant: the graph reads e, which is not an input */
  graft_tensor *se = graft_sum(e, NULL, 0, false), *sa = graft_sum(a, NULL, 0, false), *z = graft_add(se, sa);
  graft_release(se), graft_release(sa);
  graft_function *h = graft_function_capture(1, &a, 1, &z);
  CHECK(h && graft_save(h, path) == GRAFT_OK);
  graft_function *h2 = graft_load(path, 0);
  graft_tensor *gz = NULL;
  double dz = 0;
  CHECK(h2 && graft_function_call(h2, 1, &a, 1, &gz) == GRAFT_OK && graft_item(gz, &dz) == GRAFT_OK && dz == 10);
  graft_release(gz), graft_release(z);
  graft_function_free(h), graft_function_free(h2);
  graft_release(a), graft_release(u), graft_release(e), graft_release(y), graft_release(ye);
}

TEST(unsavable_functions_and_unwritable_paths) {
  graft_tensor *x, *ref[2];
  graft_function *f = make_function(&x, ref);
  CHECK(graft_save(f, "/nonexistent/dir/model.graft") == GRAFT_ERR_FILE &&
        strstr(graft_last_error(), "/nonexistent/dir/model.graft"));
  CHECK(graft_save(NULL, path) == GRAFT_ERR_NULL);
  CHECK(graft_save(f, NULL) == GRAFT_ERR_NULL);
  graft_function_free(f);
  graft_release(ref[0]), graft_release(ref[1]), graft_release(x);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/graft_fnfile_XXXXXX");
  if (!mkdtemp(dir)) return 1;
  snprintf(path, sizeof path, "%s/model.graft", dir);
  snprintf(bad, sizeof bad, "%s/bad.graft", dir);
  RUN(a_loaded_function_computes_what_the_saved_one_does);
  RUN(bad_files_are_errors_that_name_the_problem);
  RUN(unsavable_functions_and_unwritable_paths);
  RUN(unused_inputs_and_empty_constants_round_trip);
  remove(path), remove(bad), rmdir(dir);
  graft_shutdown();
  return CHECK_DONE();
}
