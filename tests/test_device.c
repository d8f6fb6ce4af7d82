/* Devices (include/graft.h): the device table and its queries, errors that name devices, copies
 * between host memory and a device with its own memory with their counters, and failures on
 * such a device that leave everything else usable. The OpenCL tests need an OpenCL device
 * (make test: pocl, OpenCL on the CPU); without one they check that graft says what is missing
 * and the rest is skipped, saying so. Two other modes, for the Makefile and for a fresh process:
 *   test_device --probe opencl   exit 0 when graft finds an OpenCL device, else 3 and graft's
 *                                reason on one line (make check-opencl skips on 3 only: a
 *                                crash in discovery is a failure, not a skip);
 *   test_device --hidden-opencl  the GRAFT_OPENCL=0 checks (test opencl_hidden_by_env runs it
 *                                with that variable set, before any graft call of its own);
 *   test_device --row-form DIR   the row form's checks (test opencl_row_form runs it with
 *                                GRAFT_COMPILE=sync and GRAFT_DUMP_DIR=DIR: the graphs must be
 *                                compiled for the device, whatever the suite's GRAFT_COMPILE). */
#include "graft.h"
#include "check.h"
#include "../src/backends/opencl/ocl.h" /* ocl_build: a kernel that does not build */
#include "../src/backends/cuda/cuda.h"   /* cuda_nvrtc_available */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int ocl_dev = -1; /* the first OpenCL device, or -1 when graft finds none */

/* The thread's error is st and its message contains s1 and s2 (when not NULL); clears it. */
static bool err_is(graft_status st, const char *s1, const char *s2) {
  graft_status got = graft_last_status();
  const char *m = graft_last_error();
  bool ok = got == st && (!s1 || strstr(m, s1)) && (!s2 || strstr(m, s2));
  if (!ok)
    fprintf(stderr, "  error: got %d \"%s\", want %d with \"%s\" \"%s\"\n", (int)got, m, (int)st,
            s1 ? s1 : "", s2 ? s2 : "");
  graft_clear_error();
  return ok;
}

/* Skips an OpenCL test (counted as passed) when there is no OpenCL device, saying so. */
#define NEED_OPENCL(name)                                                                   \
  do {                                                                                      \
    if (ocl_dev < 0) {                                                                          \
      printf("  %s: skipped (no OpenCL device)\n", name);                                  \
      return;                                                                               \
    }                                                                                       \
  } while (0)

static graft_tensor *f32_on(int device, int64_t n, const float *v) {
  return graft_from_host(v, GRAFT_F32, 1, &n, device);
}

/* Reads n floats of t into out and compares them with want. */
static bool reads(graft_tensor *t, int64_t n, const float *want) {
  float out[64];
  if (!t || n > 64 || graft_to_host(t, out, sizeof(float) * (size_t)n) != GRAFT_OK) {
    fprintf(stderr, "  read failed: %s\n", graft_last_error());
    return false;
  }
  return !memcmp(out, want, sizeof(float) * (size_t)n);
}

/* ---- the device table ---- */

TEST(cpu_devices) {
  CHECK(graft_device_count() >= GRAFT_CPU_DEVICES);
  for (int i = 0; i < GRAFT_CPU_DEVICES; i++) {
    const char *kind = graft_device_kind(i), *name = graft_device_name(i);
    CHECK(kind && !strcmp(kind, "cpu"));
    CHECK(name && strstr(name, "CPU")); /* "host CPU (virtual device i)" */
    CHECK(i == 0 || (name && strcmp(name, graft_device_name(i - 1)))); /* each names its own */
    CHECK(graft_device_memory(i) == 0); /* host memory: not reported */
    CHECK(graft_device_find("cpu", i) == i);
  }
  CHECK(graft_device_find("cpu", GRAFT_CPU_DEVICES) == -1);
  CHECK(err_is(GRAFT_ERR_DEVICE, "no cpu device 4", "cpu devices are 0..3"));
  /* ids past the table: no kind, no name, no memory */
  int ids[3] = {-1, graft_device_count(), GRAFT_MAX_DEVICES};
  for (int i = 0; i < 3; i++)
    CHECK(!graft_device_kind(ids[i]) && !graft_device_name(ids[i]) && !graft_device_memory(ids[i]));
}

/* The first OpenCL device is found with a kind, a name and memory, or graft says what is
 * missing for one. */
TEST(find_opencl) {
  int d = graft_device_find("opencl", 0);
  CHECK(d == ocl_dev);
  if (d < 0) {
    CHECK(err_is(GRAFT_ERR_DEVICE, "no opencl device 0", "OpenCL runtime"));
    printf("  no OpenCL device: the OpenCL tests below are skipped\n");
    return;
  }
  CHECK(d >= GRAFT_CPU_DEVICES && d < graft_device_count());
  CHECK(!strcmp(graft_device_kind(d), "opencl"));
  CHECK(graft_device_name(d) && strlen(graft_device_name(d)) > 0);
  CHECK(graft_device_memory(d) > 0);
  printf("  %s: %s, %zu MiB\n", "opencl:0", graft_device_name(d), graft_device_memory(d) >> 20);
}

TEST(find_unknown_kind) {
  CHECK(graft_device_find("nope", 0) == -1);
  CHECK(err_is(GRAFT_ERR_DEVICE, "no nope device 0", "kinds are cpu, opencl"));
  CHECK(graft_device_find(NULL, 0) == -1);
  CHECK(err_is(GRAFT_ERR_NULL, "kind is NULL", NULL));
}

/* t is NULL and the error is GRAFT_ERR_DEVICE naming fn, the id and the device list. */
static bool no_such_device(graft_tensor *t, const char *fn, int id, const char *list) {
  char what[32];
  snprintf(what, sizeof what, "no device %d", id);
  bool named = strstr(graft_last_error(), fn) != NULL;
  if (!named) fprintf(stderr, "  %s not named in: %s\n", fn, graft_last_error());
  return !t && named && err_is(GRAFT_ERR_DEVICE, what, list);
}

/* A device id that is not one: GRAFT_ERR_DEVICE from the creators, naming the id and the
 * devices there are. */
TEST(invalid_ids) {
  char list[128];
  if (ocl_dev >= 0) snprintf(list, sizeof list, "devices: 0..3 cpu, %d opencl:0", ocl_dev);
  else snprintf(list, sizeof list, "devices: 0..3 cpu; no accelerator found");
  const int ids[3] = {-1, GRAFT_MAX_DEVICES, graft_device_count()};
  const float v[2] = {1, 2};
  const int64_t n = 2;
  for (int i = 0; i < 3; i++) {
    graft_tensor *t = graft_from_host(v, GRAFT_F32, 1, &n, ids[i]);
    CHECK(no_such_device(t, "graft_from_host", ids[i], list));
    t = graft_full_on(1, GRAFT_F32, 1, &n, ids[i]);
    CHECK(no_such_device(t, "graft_full_on", ids[i], list));
  }
}

/* ---- an OpenCL device's memory ---- */

/* An op on an OpenCL tensor and a CPU tensor fails naming both devices, either way round. */
TEST(mixed_devices) {
  NEED_OPENCL("mixed_devices");
  graft_scope_begin();
  const float v[3] = {1, 2, 3};
  graft_tensor *a = f32_on(ocl_dev, 3, v), *b = f32_on(1, 3, v);
  CHECK(a && b && graft_device(a) == ocl_dev && graft_device(b) == 1);
  CHECK(!graft_add(a, b) && err_is(GRAFT_ERR_DEVICE, "opencl:0", "cpu:1"));
  CHECK(!graft_mul(b, a) && err_is(GRAFT_ERR_DEVICE, "cpu:1", "opencl:0"));
  graft_scope_end();
}

/* n bytes of a random pattern (bool: 0 or 1, its only values). */
static void pattern(unsigned char *p, size_t n, graft_dtype dt, uint64_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    p[i] = (unsigned char)(seed >> 56);
    if (dt == GRAFT_BOOL) p[i] &= 1;
  }
}

/* cpu:0 -> opencl -> cpu:2 keeps every bit of every dtype (NaN payloads, subnormals). */
TEST(round_trip_every_dtype) {
  NEED_OPENCL("round_trip_every_dtype");
  graft_scope_begin();
  const int64_t shape[2] = {5, 7};
  for (int d = 0; d < GRAFT_NDTYPES; d++) {
    graft_dtype dt = (graft_dtype)d;
    size_t bytes = 35 * graft_dtype_size(dt);
    unsigned char in[35 * 8], out[35 * 8];
    pattern(in, bytes, dt, 1000 + (uint64_t)d);
    graft_tensor *h = graft_from_host(in, dt, 2, shape, 0);
    graft_tensor *o = graft_to_device(h, ocl_dev);
    graft_tensor *back = graft_to_device(o, 2);
    CHECK(o && graft_device(o) == ocl_dev && graft_get_dtype(o) == dt && graft_numel(o) == 35);
    CHECK(back && graft_device(back) == 2);
    CHECK(graft_to_host(back, out, bytes) == GRAFT_OK && !memcmp(in, out, bytes));
    memset(out, 0, sizeof out); /* read straight from the device too */
    CHECK(graft_to_host(o, out, bytes) == GRAFT_OK && !memcmp(in, out, bytes));
    if (memcmp(in, out, bytes)) fprintf(stderr, "  %s changed on the way\n", graft_dtype_name(dt));
  }
  graft_scope_end();
}

/* A from_host of N bytes to the OpenCL device is one upload of N bytes, a read one download
 * of N bytes; on a CPU device neither counts. */
TEST(transfer_counters) {
  graft_scope_begin();
  float v[40], out[40];
  for (int i = 0; i < 40; i++) v[i] = (float)i;
  const size_t N = sizeof v;
  graft_metrics m0 = M();
  graft_tensor *c = f32_on(1, 40, v);
  CHECK(graft_to_host(c, out, N) == GRAFT_OK);
  graft_metrics m1 = M();
  CHECK(m1.device_uploads == m0.device_uploads && m1.device_upload_bytes == m0.device_upload_bytes);
  CHECK(m1.device_downloads == m0.device_downloads &&
        m1.device_download_bytes == m0.device_download_bytes);
  if (ocl_dev >= 0) {
    graft_tensor *o = f32_on(ocl_dev, 40, v);
    graft_metrics m2 = M();
    CHECK(m2.device_uploads == m1.device_uploads + 1 &&
          m2.device_upload_bytes == m1.device_upload_bytes + N);
    CHECK(m2.device_downloads == m1.device_downloads);
    CHECK(graft_to_host(o, out, N) == GRAFT_OK && !memcmp(out, v, N));
    graft_metrics m3 = M();
    CHECK(m3.device_downloads == m2.device_downloads + 1 &&
          m3.device_download_bytes == m2.device_download_bytes + N);
    CHECK(m3.device_uploads == m2.device_uploads);
  }
  graft_scope_end();
}

/* Under a memory limit an allocation on the device fails with GRAFT_ERR_OOM, at once (an
 * upload) or at the sync that needs it (a step's output), and every other tensor stays
 * usable; lifting the limit lets the same work through. */
TEST(memory_limit_on_device) {
  NEED_OPENCL("memory_limit_on_device");
  graft_scope_begin();
  const float v[4] = {1, 2, 3, 4}, w[4] = {2, 4, 6, 8};
  graft_tensor *keep = f32_on(ocl_dev, 4, v);
  graft_tensor *pending = graft_add(keep, keep);
  const int64_t big = 1 << 20; /* 4 MiB of f32 */
  float *host = calloc((size_t)big, sizeof(float));
  graft_set_memory_limit(M().bytes_in_use + 4096);
  CHECK(!graft_from_host(host, GRAFT_F32, 1, &big, ocl_dev));
  CHECK(err_is(GRAFT_ERR_OOM, "out of memory", "limit"));
  graft_tensor *full = graft_full_on(1.5, GRAFT_F32, 1, &big, ocl_dev);
  CHECK(full && graft_to_host(full, host, (size_t)big * sizeof(float)) == GRAFT_ERR_OOM);
  CHECK(err_is(GRAFT_ERR_OOM, "out of memory", NULL));
  CHECK(reads(keep, 4, v) && reads(pending, 4, w)); /* small work still fits */
  graft_set_memory_limit(0);
  CHECK(graft_to_host(full, host, (size_t)big * sizeof(float)) == GRAFT_OK);
  CHECK(host[0] == 1.5f && host[big - 1] == 1.5f);
  graft_tensor *up = graft_from_host(host, GRAFT_F32, 1, &big, ocl_dev);
  CHECK(up && graft_device(up) == ocl_dev);
  free(host);
  graft_scope_end();
}

/* A step that fails on the device (a gather index out of range) fails at its read with a
 * message naming the index; its inputs, other pending work and new work stay usable. */
TEST(failing_step_on_device) {
  NEED_OPENCL("failing_step_on_device");
  graft_scope_begin();
  const float v[4] = {10, 20, 30, 40}, sq[4] = {100, 400, 900, 1600}, g[3] = {40, 10, 20};
  const int64_t bad[3] = {0, 4, 1}, good[3] = {3, 0, 1}, n3 = 3;
  graft_tensor *a = f32_on(ocl_dev, 4, v);
  graft_tensor *other = graft_mul(a, a); /* pending, not part of the failing step */
  graft_tensor *ix = graft_from_host(bad, GRAFT_I64, 1, &n3, ocl_dev);
  graft_tensor *fail = graft_gather(a, 0, ix);
  CHECK(fail && graft_device(fail) == ocl_dev); /* recorded lazily; fails at the read */
  float out[3];
  CHECK(graft_to_host(fail, out, sizeof out) == GRAFT_ERR_ARG);
  CHECK(err_is(GRAFT_ERR_ARG, "4", NULL));
  CHECK(graft_numel(fail) == 3 && graft_get_dtype(fail) == GRAFT_F32);
  CHECK(reads(a, 4, v) && reads(other, 4, sq));
  CHECK(reads(graft_gather(a, 0, graft_from_host(good, GRAFT_I64, 1, &n3, ocl_dev)), 3, g));
  graft_scope_end();
}

/* A program that does not build fails with GRAFT_ERR_COMPILE, and the message carries the
 * compiler's first error from the build log (the line and the reason), not just a status code. */
TEST(build_failure_names_the_log) {
  NEED_OPENCL("build_failure_names_the_log");
#ifdef GRAFT_HAVE_OPENCL_HEADERS
  ocl_device *d = ocl_device_get(ocl_dev);
  bool hit = true;
  CHECK(d && !ocl_build(d, "__kernel void k0(__global float *p) { p[0] = no_such_fn(1.0f); }\n",
                        "-cl-std=CL1.2", "a test kernel", &hit));
  CHECK(!hit);
  CHECK(err_is(GRAFT_ERR_COMPILE, "building a test kernel failed", "no_such_fn"));
  /* the device still builds and runs graphs */
  const float v[2] = {1, 2}, w[2] = {2, 4};
  graft_scope_begin();
  CHECK(reads(graft_add(f32_on(ocl_dev, 2, v), f32_on(ocl_dev, 2, v)), 2, w));
  graft_scope_end();
#endif
}

/* ---- GRAFT_OPENCL=0, in a fresh process ---- */

/* The checks of a process started with GRAFT_OPENCL=0: no OpenCL device listed, and
 * graft_device_find says why. Returns the number of failed checks. */
static int hidden_opencl_checks(void) {
  const float v[1] = {1};
  const int64_t n = 1;
  CHECK(graft_device_count() == GRAFT_CPU_DEVICES);
  CHECK(graft_device_find("opencl", 0) == -1);
  CHECK(err_is(GRAFT_ERR_DEVICE, "no opencl device 0", "no accelerator found"));
  CHECK(!graft_from_host(v, GRAFT_F32, 1, &n, GRAFT_CPU_DEVICES));
  CHECK(err_is(GRAFT_ERR_DEVICE, "no device 4", "no accelerator found"));
  /* the message says that GRAFT_OPENCL=0 hid it (not a missing runtime or driver) */
  CHECK(graft_device_find("opencl", 0) == -1);
  CHECK(err_is(GRAFT_ERR_DEVICE, "GRAFT_OPENCL=0", NULL));
  return check_failed_in_test;
}

/* Runs this program again as `test_device mode [arg]` with env's (name, value) pairs set (a NULL
 * name ends them): discovery runs once per process, and this one has run it already. True when
 * the child exits 0. */
static bool rerun(const char *const *env, const char *mode, const char *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; env[i]; i += 2) setenv(env[i], env[i + 1], 1);
    execl("/proc/self/exe", "test_device", mode, arg, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* `--hidden-opencl` with GRAFT_OPENCL=0. */
TEST(opencl_hidden_by_env) {
  CHECK(rerun((const char *[]){"GRAFT_OPENCL", "0", "GRAFT_CUDA", "0", NULL}, "--hidden-opencl", NULL));
}

/* ---- CUDA's discovery (src/backends/cuda): without a driver or device, graft says why ---- */

/* Run as `--cuda-absent TEXT`: no CUDA device is listed, and both graft_device_absent and
 * graft_device_find's error say why, with TEXT in it. */
static int cuda_absent_checks(const char *text) {
  const char *why = graft_device_absent("cuda");
  CHECK(why && strstr(why, text));
  if (why) printf("  cuda: %s\n", why);
  CHECK(graft_device_find("cuda", 0) == -1);
  CHECK(err_is(GRAFT_ERR_DEVICE, "no cuda device 0", text));
  CHECK(graft_device_count() == GRAFT_CPU_DEVICES + (ocl_dev >= 0)); /* OpenCL unaffected */
  return check_failed_in_test;
}

/* This program again as `--cuda-absent text` with the variable set. */
static bool cuda_absent_with(const char *var, const char *value, const char *text) {
  return rerun((const char *[]){var, value, NULL}, "--cuda-absent", text);
}

TEST(cuda_discovery) {
  const char *why = graft_device_absent("cuda");
  int d = graft_device_find("cuda", 0);
  if (!why) { /* a GPU machine: the device is listed, with its memory */
    CHECK(d >= GRAFT_CPU_DEVICES && !strcmp(graft_device_kind(d), "cuda") && graft_device_memory(d) > 0);
    printf("  cuda:0: %s, %zu MiB\n", graft_device_name(d), graft_device_memory(d) >> 20);
  } else {
    CHECK(d == -1 && err_is(GRAFT_ERR_DEVICE, "no cuda device 0", why));
    CHECK(strstr(why, "no CUDA driver") || strstr(why, "the CUDA driver lists no device"));
    printf("  no CUDA device here: %s\n", why);
  }
  CHECK(graft_device_absent("opencl") == NULL || ocl_dev < 0);
  CHECK(!graft_device_absent(NULL) && err_is(GRAFT_ERR_NULL, "kind is NULL", NULL));
  CHECK(cuda_absent_with("GRAFT_CUDA", "0", "GRAFT_CUDA=0 hides CUDA devices"));
  CHECK(cuda_absent_with("GRAFT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", "/nonexistent/libcuda.so.1 could not be opened"));
  /* a library that is not NVIDIA's driver */
  CHECK(cuda_absent_with("GRAFT_CUDA_DRIVER", "libdl.so.2", "libdl.so.2 lacks cuInit"));
}

/* ---- CUDA through a stand-in driver (tests/fake_cuda.c: host memory, kernels refused) ---- */

/* Run as `--cuda-fake`, with GRAFT_CUDA_DRIVER naming the stand-in and FAKE_CUDA_MEMORY = 64 MiB:
 * discovery, transfers of every dtype, the reference tier's graphs on the device, a copy to
 * another device, out of device memory, and (GRAFT_COMPILE=sync) a compiled graph whose launch
 * the driver refuses: an error naming the kernel, the device still usable. */
static int cuda_fake_checks(void) {
  int d = graft_device_find("cuda", 0);
  CHECK(d >= GRAFT_CPU_DEVICES && strstr(graft_device_name(d), "fake"));
  if (d < 0) return 1;
  CHECK(graft_device_memory(d) == (size_t)64 << 20 && !graft_device_absent("cuda"));
  static const graft_dtype dts[] = {GRAFT_F32, GRAFT_F64, GRAFT_I32, GRAFT_I64, GRAFT_U8, GRAFT_BOOL};
  unsigned char in[64], out[64];
  for (int i = 0; i < 64; i++) in[i] = (unsigned char)(i * 7 % 2);
  for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) { /* bytes up and back, every dtype */
    int64_t n = 64 / (int64_t)graft_dtype_size(dts[k]);
    graft_tensor *t = graft_from_host(in, dts[k], 1, &n, d);
    memset(out, 0xee, sizeof out);
    CHECK(t && graft_to_host(t, out, sizeof out) == GRAFT_OK && !memcmp(in, out, sizeof out));
    graft_release(t);
  }
  const float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
  graft_tensor *x = f32_on(d, 4, a), *y = f32_on(d, 4, b);
  graft_tensor *z = graft_add(x, y);
  const char *mode = getenv("GRAFT_COMPILE");
  if (mode && !strcmp(mode, "sync") && cuda_nvrtc_available(NULL)) {
    float o[4];
    CHECK(graft_to_host(z, o, sizeof o) != GRAFT_OK); /* compiled, loaded, launched, refused */
    CHECK(err_is(GRAFT_ERR_INTERNAL, "launching kernel k0", "CUDA_ERROR_NOT_SUPPORTED"));
    CHECK(reads(x, 4, a)); /* the inputs are intact */
  } else {
    CHECK(reads(z, 4, (const float[]){11, 22, 33, 44}));
    graft_tensor *h = graft_to_device(z, 1), *back = h ? graft_to_device(h, d) : NULL;
    CHECK(reads(h, 4, (const float[]){11, 22, 33, 44}) && reads(back, 4, (const float[]){11, 22, 33, 44}));
    graft_release(h);
    graft_release(back);
  }
  graft_release(z);
  int64_t big = (int64_t)80 << 20; /* bytes past the device's 64 MiB */
  unsigned char *hb = calloc((size_t)big, 1);
  graft_tensor *t = hb ? graft_from_host(hb, GRAFT_U8, 1, &big, d) : NULL;
  CHECK(!t && err_is(GRAFT_ERR_OOM, "out of memory on cuda device", "fake"));
  free(hb);
  CHECK(reads(y, 4, b)); /* still usable */
  graft_release(x);
  graft_release(y);
  return check_failed_in_test;
}

/* This program again as `--cuda-fake` with the stand-in driver beside it. */
static bool cuda_fake_with(const char *mode) {
  char self[4096], drv[4200];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return false;
  self[n] = 0;
  snprintf(drv, sizeof drv, "%.*s/libfakecuda.so", (int)(strrchr(self, '/') - self), self);
  if (access(drv, R_OK)) {
    printf("  cuda through a stand-in driver: skipped (%s not built)\n", drv);
    return true;
  }
  return rerun((const char *[]){"GRAFT_CUDA_DRIVER", drv, "FAKE_CUDA_MEMORY", "67108864", "GRAFT_COMPILE", mode,
                                NULL},
               "--cuda-fake", NULL);
}

TEST(cuda_fake_driver) {
  CHECK(cuda_fake_with("off"));
  CHECK(cuda_fake_with("sync"));
}

/* ---- the vector row form (CPU-type OpenCL devices: src/backends/gpu/gpu_row.c) ---- */

static float row_x(int64_t i) { return (float)((i * 37 % 101) / 25.0 - 2.0); }

/* Rows with what softmax must survive: -inf entries, a row of -inf only, a huge value, a NaN
 * (every few rows, the others row_x). */
static float row_special(int64_t i, int64_t len) {
  int64_t r = i / len, e = i % len;
  if (r % 5 == 1 && e % 3 == 0) return -INFINITY;
  if (r % 5 == 2) return -INFINITY;
  if (r % 5 == 3 && e == len - 1) return 1e30f;
  if (r % 5 == 4 && len > 1 && e == len / 2) return NAN;
  return row_x(i);
}

/* One case: y = f(x, g, b) on the OpenCL device (x rows x len of row_x, or row_special when
 * special, then g and b of len each) against want(rows, len, h: those inputs, w) computed here
 * in double, to 1e-5 (NaN where want is NaN). */
typedef struct {
  const char *name;
  graft_tensor *(*f)(graft_tensor **in);
  void (*want)(int64_t rows, int64_t len, const float *h, double *w);
  bool special;
} row_case;

static bool row_run(const row_case *c, int64_t rows, int64_t len) {
  int64_t n = rows * len, sh[2] = {rows, len};
  float *h = malloc(sizeof(float) * (size_t)(n + 2 * len)), *out = malloc(sizeof(float) * (size_t)n);
  double *w = malloc(sizeof(double) * (size_t)n);
  bool ok = h && out && w;
  for (int64_t i = 0; ok && i < n + 2 * len; i++)
    h[i] = c->special && i < n ? row_special(i, len) : row_x(i);
  graft_scope_begin();
  graft_tensor *in[3] = {ok ? graft_from_host(h, GRAFT_F32, 2, sh, ocl_dev) : NULL,
                         ok ? graft_from_host(h + n, GRAFT_F32, 1, sh + 1, ocl_dev) : NULL,
                         ok ? graft_from_host(h + n + len, GRAFT_F32, 1, sh + 1, ocl_dev) : NULL};
  graft_tensor *y = in[0] && in[1] && in[2] ? c->f(in) : NULL;
  ok = ok && y && graft_to_host(y, out, sizeof(float) * (size_t)n) == GRAFT_OK;
  graft_scope_end();
  if (!ok) fprintf(stderr, "  %s %lldx%lld: %s\n", c->name, (long long)rows, (long long)len,
                   graft_last_error());
  if (ok) c->want(rows, len, h, w);
  int64_t bad = 0;
  for (int64_t i = 0; ok && i < n; i++)
    if (!(isnan(w[i]) ? isnan(out[i]) : fabs(out[i] - w[i]) <= 1e-5 * (1 + fabs(w[i]))) &&
        bad++ < 3)
      fprintf(stderr, "  %s %lldx%lld [%lld]: %.9g, want %.9g\n", c->name, (long long)rows,
              (long long)len, (long long)i, out[i], w[i]);
  ok = ok && bad == 0;
  free(h), free(out), free(w);
  return ok;
}

static graft_tensor *row_softmax(graft_tensor **in) { return graft_softmax(in[0], -1); }
/* The row's max (NaN when it has one) and sum of exp(x - max); w = exp(x - max). */
static void softmax_row(const float *x, int64_t len, double *m, double *s, double *w) {
  *m = -INFINITY, *s = 0;
  for (int64_t e = 0; e < len; e++) *m = x[e] > *m || isnan(x[e]) ? x[e] : *m;
  for (int64_t e = 0; e < len; e++) *s += w[e] = exp(x[e] - *m);
}
static void want_softmax(int64_t rows, int64_t len, const float *h, double *w) {
  for (int64_t r = 0; r < rows; r++) {
    double m, s, *wr = w + r * len;
    softmax_row(h + r * len, len, &m, &s, wr);
    for (int64_t e = 0; e < len; e++) wr[e] /= s;
  }
}

/* y * sum(y * exp(x - max)) with y = softmax(x): exp(x - max) computed by the sum, the quotient
 * and the second sum (the row scratch keeps it for the members up to the one it is kept in; the
 * others compute it again). */
static graft_tensor *row_exp_reused(graft_tensor **in) {
  int last = -1;
  graft_tensor *e = graft_exp(graft_sub(in[0], graft_max(in[0], &last, 1, true)));
  graft_tensor *y = graft_div(e, graft_sum(e, &last, 1, true));
  return graft_mul(y, graft_sum(graft_mul(y, e), &last, 1, true));
}
static void want_exp_reused(int64_t rows, int64_t len, const float *h, double *w) {
  for (int64_t r = 0; r < rows; r++) {
    double m, s, t = 0, *wr = w + r * len;
    softmax_row(h + r * len, len, &m, &s, wr);
    for (int64_t e = 0; e < len; e++) t += wr[e] / s * wr[e];
    for (int64_t e = 0; e < len; e++) wr[e] = wr[e] / s * t;
  }
}

static graft_tensor *row_layer_norm(graft_tensor **in) {
  return graft_layer_norm(in[0], in[1], in[2], 1e-5);
}
static void want_layer_norm(int64_t rows, int64_t len, const float *h, double *w) {
  int64_t n = rows * len;
  for (int64_t r = 0; r < rows; r++) {
    double mu = 0, var = 0;
    for (int64_t e = 0; e < len; e++) mu += h[r * len + e] / (double)len;
    for (int64_t e = 0; e < len; e++) var += pow(h[r * len + e] - mu, 2) / (double)len;
    for (int64_t e = 0; e < len; e++)
      w[r * len + e] = (h[r * len + e] - mu) / sqrt(var + 1e-5) * h[n + e] + h[n + len + e];
  }
}

/* x * the row sums laid along a row (square x: y[r][e] = x[r][e] * sum(x[e])): the product
 * reads other rows' sums, so it must not join the sums' kernel (a work-item per row would read
 * sums not written yet). */
static graft_tensor *row_other_rows(graft_tensor **in) {
  int last = -1;
  int64_t sh[2] = {1, graft_dim(in[0], 0)};
  return graft_mul(in[0], graft_reshape(graft_sum(in[0], &last, 1, true), 2, sh));
}
static void want_other_rows(int64_t rows, int64_t len, const float *h, double *w) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t e = 0; e < len; e++) {
      double s = 0;
      for (int64_t k = 0; k < len; k++) s += h[e * len + k];
      w[r * len + e] = h[r * len + e] * s;
    }
}

/* exp(x + 0 * max(x)) (= exp(x), computed in the max's row group: gm_expf_v) on the OpenCL
 * device against the same on cpu:0 (the CPU backend's gm_expf), bit for bit, with inputs where
 * rounding x * log2(e) and then rint gives another integer than one fused rounding (an fma). */
static graft_tensor *row_exp(graft_tensor *x) {
  int last = -1;
  return graft_exp(graft_add(x, graft_mul_scalar(graft_max(x, &last, 1, true), 0.0)));
}
static bool row_exp_bits(void) {
  static const uint32_t near[] = {0x40d2b77c, 0x40ff1402, 0x414214ca, 0x4158430d, 0x416e7150,
                                  0x4192f27c, 0x41a920bf, 0x4227bddb, 0x423dec1e, 0x4283013c,
                                  0x428cb579, 0x426fd435, 0xc2490340, 0xc2541a61, 0xc25f3183,
                                  0xc26a48a4, 0xc2a2e3bc};
  enum { N = sizeof near / sizeof *near };
  int64_t sh[2] = {2, 37}; /* two rows of two lane groups and a tail */
  float h[74], out[2][74];
  for (int i = 0; i < 74; i++) h[i] = row_x(i);
  for (int i = 0; i < N; i++) memcpy(&h[i], &near[i], 4), memcpy(&h[37 + 16 + i % 16], &near[i], 4);
  bool ok = true;
  for (int k = 0; k < 2; k++) {
    graft_scope_begin();
    graft_tensor *x = graft_from_host(h, GRAFT_F32, 2, sh, k ? 0 : ocl_dev);
    graft_tensor *y = x ? row_exp(x) : NULL;
    ok = ok && y && graft_to_host(y, out[k], sizeof out[k]) == GRAFT_OK;
    graft_scope_end();
  }
  for (int i = 0; ok && i < 74; i++)
    if (memcmp(&out[0][i], &out[1][i], 4)) {
      fprintf(stderr, "  exp(%.9g): %.9g on the device, %.9g on cpu:0\n", h[i], out[0][i], out[1][i]);
      ok = false;
    }
  return ok;
}

/* Whether the kernel text k loads vectors from a buffer it writes (the row scratch: a value
 * kept in a member's output rows; the kernel's inputs are const). */
static bool row_scratch_in(const char *k) {
  for (const char *at = k; (at = strstr(at, "GC_V(vload)(0, p")); at++) {
    char decl[64];
    snprintf(decl, sizeof decl, "__global float *restrict p%d,", atoi(at + 16));
    if (strstr(k, decl)) return true;
  }
  return false;
}

/* Whether a rendered program in dir has the row form (its vector loads) and a row group (a
 * kernel writing the group's reductions and their consumers), and with scratch one that keeps
 * a value in the row scratch. */
static bool row_form_dumped(const char *dir, bool scratch) {
  DIR *dp = opendir(dir);
  bool found = false;
  for (struct dirent *de; dp && !found && (de = readdir(dp));) {
    char path[4096], buf[1 << 16];
    if (!strstr(de->d_name, ".cl")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    found = strstr(buf, "GC_V(vload)") && strstr(buf, "reduce_sum over the row") &&
            strstr(buf, "GC_V(vstore)") && (!scratch || row_scratch_in(buf));
  }
  if (dp) closedir(dp);
  return found;
}

/* The checks of `--row-form DIR` (GRAFT_COMPILE=sync, GRAFT_DUMP_DIR=DIR): rows of 1 (no row
 * form), 5 (all tail), 17 and 40 (vectors and a tail) and 48 (vectors only) on 7 rows (a launch
 * no work-group size divides) and on 10 rows with -inf, huge and NaN entries; the vector exp
 * bit for bit; the group's kernel and one with the row scratch must have been rendered.
 * Returns the failed checks. */
static int row_form_checks(const char *dir) {
  static const row_case cases[] = {
      {"softmax", row_softmax, want_softmax, false},
      {"layer_norm", row_layer_norm, want_layer_norm, false},
      {"exp reused", row_exp_reused, want_exp_reused, false},
      {"softmax, special values", row_softmax, want_softmax, true},
      {"exp reused, special values", row_exp_reused, want_exp_reused, true}};
  static const int64_t lens[] = {1, 5, 17, 40, 48};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
    for (size_t k = 0; k < sizeof lens / sizeof *lens; k++)
      CHECK(row_run(&cases[c], cases[c].special ? 10 : 7, lens[k]));
  const row_case other = {"other rows' sums", row_other_rows, want_other_rows, false};
  CHECK(row_run(&other, 40, 40));
  CHECK(row_exp_bits());
  CHECK(row_form_dumped(dir, false));
  CHECK(row_form_dumped(dir, true));
  return check_failed_in_test;
}

/* Runs this program again as `--row-form DIR`: compiling in the foreground, dumping sources. */
TEST(opencl_row_form) {
  NEED_OPENCL("opencl_row_form");
  char dir[] = "/tmp/graft_rowform_XXXXXX";
  CHECK(mkdtemp(dir));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("GRAFT_COMPILE", "sync", 1);
    setenv("GRAFT_DUMP_DIR", dir, 1);
    /* this child builds OpenCL programs: pocl's own leaks at exit (a cold pocl cache leaks
     * more) are suppressed as in make check-opencl */
    const char *supp = "tests/lsan-opencl.supp", *lo = getenv("LSAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%ssuppressions=%s", lo ? lo : "", lo && *lo ? ":" : "", supp);
    if (access(supp, R_OK) == 0) setenv("LSAN_OPTIONS", opts, 1);
    execl("/proc/self/exe", "test_device", "--row-form", dir, (char *)NULL);
    _exit(127);
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  DIR *dp = opendir(dir);
  for (struct dirent *de; dp && (de = readdir(dp));) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (de->d_name[0] != '.') unlink(path);
  }
  if (dp) closedir(dp);
  rmdir(dir);
}

TEST(no_live_tensors) { CHECK(M().live_tensors == 0); }

/* --probe KIND: whether graft finds a device of that kind (0) or not (3, and why; not 1, which
 * is what a sanitizer's report exits with). */
static int probe(const char *kind) {
  int d = graft_device_find(kind, 0);
  if (d < 0) fprintf(stderr, "%s\n", graft_last_error());
  else printf("%s device %d: %s\n", kind, d, graft_device_name(d));
  graft_shutdown();
  return d < 0 ? 3 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--probe")) return probe(argv[2]);
  if (argc == 2 && !strcmp(argv[1], "--hidden-opencl")) {
    int failed = hidden_opencl_checks();
    graft_shutdown();
    return failed != 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--cuda-absent")) {
    ocl_dev = graft_device_find("opencl", 0);
    graft_clear_error();
    int failed = cuda_absent_checks(argv[2]);
    graft_shutdown();
    return failed != 0;
  }
  if (argc == 2 && !strcmp(argv[1], "--cuda-fake")) {
    int failed = cuda_fake_checks();
    graft_shutdown();
    return failed != 0;
  }
  if (argc == 3 && !strcmp(argv[1], "--row-form")) {
    ocl_dev = graft_device_find("opencl", 0);
    int failed = ocl_dev < 0 || row_form_checks(argv[2]);
    graft_shutdown();
    return failed != 0;
  }
  ocl_dev = graft_device_find("opencl", 0);
  graft_clear_error();
  RUN(cpu_devices);
  RUN(find_opencl);
  RUN(find_unknown_kind);
  RUN(invalid_ids);
  RUN(mixed_devices);
  RUN(round_trip_every_dtype);
  RUN(transfer_counters);
  RUN(memory_limit_on_device);
  RUN(failing_step_on_device);
  RUN(build_failure_names_the_log);
  RUN(opencl_hidden_by_env);
  RUN(opencl_row_form);
  RUN(cuda_discovery);
  RUN(cuda_fake_driver);
  RUN(no_live_tensors);
  graft_shutdown();
  return CHECK_DONE();
}
