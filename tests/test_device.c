/* Devices (include/graft.h): the device table and its queries, errors that name devices, copies
 * between host memory and a device with its own memory with their counters, and failures on
 * such a device that leave everything else usable. The OpenCL tests need an OpenCL device
 * (make test: pocl, OpenCL on the CPU); without one they check that graft says what is missing
 * and the rest is skipped, saying so. Two other modes, for the Makefile and for a fresh process:
 *   test_device --probe opencl   exit 0 when graft finds an OpenCL device, else 3 and graft's
 *                                reason on one line (make check-opencl skips on 3 only: a
 *                                crash in discovery is a failure, not a skip);
 *   test_device --hidden-opencl  the GRAFT_OPENCL=0 checks (test opencl_hidden_by_env runs it
 *                                with that variable set, before any graft call of its own). */
#include "graft.h"
#include "check.h"
#include "../src/backends/opencl/ocl.h" /* ocl_build: a kernel that does not build */
#include <stdint.h>
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

/* Runs this program again as `--hidden-opencl` with GRAFT_OPENCL=0: discovery runs once per
 * process, and this one has run it already. */
TEST(opencl_hidden_by_env) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    setenv("GRAFT_OPENCL", "0", 1);
    execl("/proc/self/exe", "test_device", "--hidden-opencl", (char *)NULL);
    _exit(127);
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
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
  RUN(no_live_tensors);
  graft_shutdown();
  return CHECK_DONE();
}
