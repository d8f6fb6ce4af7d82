/* From source text to a loaded object: the system compiler ($GRAFT_CC, default "cc"), a
 * per-user disk cache, dlopen.
 *
 * Disk cache (src/backends/dcache.h: the folder and its safety rules, shared with the OpenCL
 * backend); a refused or read-only folder is said once on stderr and compiling goes on in a
 * private temporary folder. An entry is <key>.so plus <key>.meta ("size checksum"),
 * key = hash of (source, compiler identity = first line of `cc --version`, flags, graft
 * version). Both files are written under temporary names and renamed into place; an entry whose
 * size or checksum does not match its .meta is recompiled, never loaded. */
#include "cpu_internal.h"
#include "../dcache.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* -mprefer-vector-width=512: gcc's default on AVX-512 targets is 256-bit vectors; 512-bit ones
 * ran a 64x256x256 softmax (exp-bound) 2.56 -> 1.66 ms here (Sapphire Rapids), the kernels of a
 * GPT block's and resnet18's steps ~5% faster; targets without AVX-512 ignore it.
 * -fno-trapping-math: the inline exp/erf/tanh/log are branch-free selects, which gcc only turns
 * into vector blends when a float compare may not trap; without it every loop calling them ran
 * scalar ("control flow in loop"). Results are the same (exceptions are masked; no
 * reassociation): a GPT block's gelu backward 4.27 -> 1.43 ms, forward 1.98 -> 0.93. Clamp
 * chains need cpu_expr.c's own max/min form under it. */
#define CPU_CFLAG_LIST "-std=c11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", \
                       "-fno-trapping-math", "-ffp-contract=off", "-mprefer-vector-width=512", "-w"
static const char *const cpu_opt_flag[] = {[CPU_OPT_FULL] = "-O3", [CPU_OPT_QUICK] = "-O1"};
/* The full build's flags as one string: part of the disk cache key (quick builds are not
 * cached). */
#define CPU_CFLAGS "-std=c11 -O3 -fPIC -shared -fopenmp-simd -fno-math-errno -fno-trapping-math " \
                   "-ffp-contract=off -mprefer-vector-width=512 -w"

/* The target: -march=native, or $GRAFT_MARCH (e.g. x86-64-v3 for code that must run under
 * valgrind, which has no AVX-512); anything but a plain name is taken as native. */
static const char *cpu_march(void) {
  const char *m = getenv("GRAFT_MARCH");
  if (!m || !*m || strlen(m) > 64) return "native";
  for (const char *c = m; *c; c++)
    if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.') return "native";
  return m;
}

static pthread_mutex_t cpu_cc_mu = PTHREAD_MUTEX_INITIALIZER;
static char cpu_cc_id[600], cpu_cc_for[256];

static const char *cpu_cc(void) {
  const char *c = getenv("GRAFT_CC");
  return c && *c ? c : "cc";
}

static double cpu_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* GRAFT_CC split on blanks into a command and its arguments (e.g. "ccache gcc"); never passed
 * to a shell, so no character of it, or of a path, is interpreted. Returns the word count. */
#define CPU_CC_MAXW 16
static int cpu_cc_words(char *buf, size_t n, char **w) {
  snprintf(buf, n, "%s", cpu_cc());
  int k = 0;
  for (char *tok = strtok(buf, " \t"); tok && k < CPU_CC_MAXW; tok = strtok(NULL, " \t"))
    w[k++] = tok;
  return k;
}

/* Runs argv[0] (searched in PATH) without a shell, its stdout and stderr on fd_out, stdin
 * /dev/null; returns the exit status, or -1 if it could not start or died of a signal. */
static int cpu_spawn(char *const argv[], int fd_out) {
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa)) return -1;
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, fd_out, 1);
  posix_spawn_file_actions_adddup2(&fa, fd_out, 2);
  pid_t pid;
  int bad = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (bad) return -1;
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Compiler identity: first line of `cc --version` (cached per compiler string). */
static void cpu_compiler_id(char *out, size_t n) {
  const char *cc = cpu_cc();
  pthread_mutex_lock(&cpu_cc_mu);
  if (strcmp(cpu_cc_for, cc)) {
    snprintf(cpu_cc_for, sizeof cpu_cc_for, "%s", cc);
    snprintf(cpu_cc_id, sizeof cpu_cc_id, "unknown:%s", cc);
    char buf[256], *argv[CPU_CC_MAXW + 2];
    int k = cpu_cc_words(buf, sizeof buf, argv);
    char tmpl[] = "/tmp/graft-ccid-XXXXXX";
    int fd = k ? mkstemp(tmpl) : -1;
    if (fd >= 0) {
      unlink(tmpl);
      argv[k] = "--version";
      argv[k + 1] = NULL;
      char line[256] = {0};
      if (cpu_spawn(argv, fd) == 0 && pread(fd, line, sizeof line - 1, 0) > 0) {
        line[strcspn(line, "\n")] = 0;
        snprintf(cpu_cc_id, sizeof cpu_cc_id, "%s|%s", cc, line);
      }
      close(fd);
    }
  }
  snprintf(out, n, "%s", cpu_cc_id);
  pthread_mutex_unlock(&cpu_cc_mu);
}

/* Each reason the disk cache is not used is said once per process, on stderr. */
typedef enum { CPU_WARN_REFUSED, CPU_WARN_NOT_WRITABLE, CPU_WARN_COUNT } cpu_warning;
static atomic_int cpu_warned[CPU_WARN_COUNT];

static void cpu_warn_once(cpu_warning w, const char *dir, const char *why) {
  if (atomic_exchange(&cpu_warned[w], 1)) return;
  fprintf(stderr, "graft: warning: disk cache %s %s; compiling in a private temporary folder, "
          "nothing is cached\n", dir, why);
}

/* The cache directory, or "" when disabled or unsafe (counted in disk_refused, said once). */
static void cpu_cache_dir(char *out, size_t n) {
  const char *why;
  if (!dcache_dir(out, n, &why)) return;
  cpu_stats.disk_refused++;
  cpu_warn_once(CPU_WARN_REFUSED, out, why);
  out[0] = 0;
}

static int cpu_dlopen(const char *path, cpu_object *obj) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot load %s: %s", path, e ? e : "?");
    return -1;
  }
  void *sym = dlsym(h, "cpu_entry");
  if (!sym) {
    dlclose(h);
    err_set(GRAFT_ERR_COMPILE, "cpu: %s has no cpu_entry", path);
    return -1;
  }
  obj->dl = h;
  memcpy(&obj->entry, &sym, sizeof sym);
  return 0;
}

static void cpu_tail(const char *path, char *out, size_t n) {
  size_t len;
  unsigned char *b = dcache_read_file(path, &len);
  out[0] = 0;
  if (!b) return;
  size_t from = len > n - 1 ? len - (n - 1) : 0;
  memcpy(out, b + from, len - from);
  out[len - from] = 0;
  free(b);
}

/* A fresh 0700 folder under $TMPDIR (else /tmp); 1 on success. */
static int cpu_private_workdir(char *work, size_t n) {
  const char *t = getenv("TMPDIR");
  snprintf(work, n, "%s/graft-XXXXXX", t && *t ? t : "/tmp");
  return mkdtemp(work) != NULL;
}

/* cc <flags> -march=M -o out src, diagnostics into errf; the exit status (or -1). */
static int cpu_run_compiler(const char *src, cpu_opt opt, const char *out, const char *errf) {
  static const char *flags[] = {CPU_CFLAG_LIST};
  enum { NFLAGS = sizeof flags / sizeof *flags };
  char buf[256], march[80], *argv[CPU_CC_MAXW + NFLAGS + 6];
  int k = cpu_cc_words(buf, sizeof buf, argv);
  if (!k) return -1;
  argv[k++] = (char *)cpu_opt_flag[opt];
  for (int i = 0; i < NFLAGS; i++) argv[k++] = (char *)flags[i];
  snprintf(march, sizeof march, "-march=%s", cpu_march());
  argv[k++] = march;
  argv[k++] = "-o";
  argv[k++] = (char *)out;
  argv[k++] = (char *)src;
  argv[k] = NULL;
  int fd = open(errf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  int st = cpu_spawn(argv, fd);
  close(fd);
  return st;
}

/* Source -> loaded object: the disk cache lookup, a private work folder, the compile, the
 * atomic publish and the load. One function (~80 lines): each step's paths and its cleanup on
 * failure share the same buffers, and the order is the safety argument (README, Disk cache). */
int cpu_compile_source(const char *src, cpu_opt *opt, cpu_object *obj) {
  memset(obj, 0, sizeof *obj);
  char id[600], dir[1000], key[40], so[1200], meta[1200], work[1100], tmp[1300], errf[1300];
  cpu_compiler_id(id, sizeof id);
  size_t sn = strlen(src);
  uint64_t h1 = cpu_hash_bytes(src, sn, 1), h2 = cpu_hash_bytes(src, sn, 2);
  const char *tags[] = {id, CPU_CFLAGS, cpu_march(), GRAFT_VERSION};
  for (int t = 0; t < 4; t++) {
    h1 = cpu_hash_bytes(tags[t], strlen(tags[t]), h1);
    h2 = cpu_hash_bytes(tags[t], strlen(tags[t]), h2 ^ 0x5bd1e995);
  }
  snprintf(key, sizeof key, "%016" PRIx64 "%016" PRIx64, h1, h2);
  cpu_cache_dir(dir, sizeof dir);
  if (dir[0]) {
    snprintf(so, sizeof so, "%s/%s.so", dir, key);
    snprintf(meta, sizeof meta, "%s/%s.meta", dir, key);
    if (access(so, F_OK) == 0) {
      if (dcache_valid(so, meta) && !cpu_dlopen(so, obj)) {
        cpu_stats.disk_hits++;
        *opt = CPU_OPT_FULL;
        return 0;
      }
      cpu_stats.disk_corrupt++;
      unlink(so);
    }
    if (*opt == CPU_OPT_QUICK) dir[0] = 0; /* not cached: the full build replaces it */
  }
  if (dir[0]) {
    snprintf(work, sizeof work, "%s/tmp-XXXXXX", dir);
    if (!mkdtemp(work)) { /* a read-only cache: compile elsewhere, cache nothing */
      cpu_stats.disk_refused++;
      cpu_warn_once(CPU_WARN_NOT_WRITABLE, dir, "is not writable");
      dir[0] = 0;
    }
  }
  if (!dir[0] && !cpu_private_workdir(work, sizeof work)) {
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot create a work directory %s: %s", work, strerror(errno));
    return -1;
  }
  snprintf(tmp, sizeof tmp, "%s/k.c", work);
  snprintf(errf, sizeof errf, "%s/err.txt", work);
  char out[1300];
  snprintf(out, sizeof out, "%s/k.so", work);
  int rc = -1;
  if (dcache_write_file(tmp, src, sn)) {
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot write %s: %s", tmp, strerror(errno));
    goto done;
  }
  double t0 = cpu_now_ms();
  int st = cpu_run_compiler(tmp, *opt, out, errf);
  cpu_stats.compile_ms += cpu_now_ms() - t0;
  if (st != 0) {
    char tail[1200];
    cpu_tail(errf, tail, sizeof tail);
    cpu_stats.compile_fail++;
    err_set(GRAFT_ERR_COMPILE, "cpu: compiler '%s' failed (status %d): %s", cpu_cc(), st,
            tail[0] ? tail : "(no output)");
    goto done;
  }
  cpu_stats.compiles++;
  if (dir[0]) {
    size_t n;
    unsigned char *b = dcache_read_file(out, &n);
    char mtxt[96], mtmp[1300];
    if (b) {
      snprintf(mtxt, sizeof mtxt, "%zu %" PRIx64 "\n", n, cpu_hash_bytes(b, n, 7));
      free(b);
      snprintf(mtmp, sizeof mtmp, "%s/meta", work);
      if (!dcache_write_file(mtmp, mtxt, strlen(mtxt)) && !rename(out, so) && !rename(mtmp, meta)) {
        rc = cpu_dlopen(so, obj);
        goto done;
      }
    }
  }
  rc = cpu_dlopen(out, obj); /* no cache: load from the work dir, then delete the files */
done:
  unlink(tmp);
  unlink(errf);
  unlink(out);
  char mtmp2[1300];
  snprintf(mtmp2, sizeof mtmp2, "%s/meta", work);
  unlink(mtmp2);
  rmdir(work);
  return rc;
}

void cpu_object_close(cpu_object *obj) {
  if (obj->dl) dlclose(obj->dl);
  obj->dl = NULL;
  obj->entry = NULL;
}
