/* From a kernel object's source text to a loaded object: the system compiler ($GRAFT_CC,
 * default "cc"), a per-user disk cache, dlopen. Several objects may compile at once (the
 * kernel library's threads): the counters are atomic.
 *
 * Disk cache (src/backends/dcache.h: the folder, the entries and their checks, shared with the
 * OpenCL backend). An entry is <key>.so plus <key>.meta, key = hash of (source, compiler
 * identity = first line of `cc --version`, flags, target, graft version); it is compiled in a
 * work folder inside the cache and published by rename, and loaded from the very file
 * descriptor its checks read. Each body an object holds has an index entry b<body key>.idx
 * naming the object, so that a later process finds a body whatever object it was compiled in.
 * A refused, read-only, full or over-quota folder is said once on stderr, counted
 * (disk_refused), and compiling goes on in a private temporary folder; when that fails too,
 * native code is off and that is said. */
#include "cpu_internal.h"
#include "../dcache.h"
#include "../spawn.h"
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* -mprefer-vector-width=512: gcc's default on AVX-512 targets is 256-bit vectors; 512-bit ones
 * ran a 64x256x256 softmax (exp-bound) 2.56 -> 1.66 ms here (Sapphire Rapids), the kernels of a
 * GPT block's and resnet18's steps ~5% faster; targets without AVX-512 ignore it.
 * -fno-trapping-math: the inline exp/erf/tanh/log are branch-free selects, which gcc only turns
 * into vector blends when a float compare may not trap; without it every loop calling them ran
 * scalar ("control flow in loop"). Results are the same (exceptions are masked; no
 * reassociation): a GPT block's gelu backward 4.27 -> 1.43 ms, forward 1.98 -> 0.93. Clamp
 * chains need CPU C's own max/min form under it (render/rd_expr.c). */
#define CPU_CFLAG_LIST "-std=c11", "-fPIC", "-shared", "-fopenmp-simd", "-fno-math-errno", \
                       "-fno-trapping-math", "-ffp-contract=off", "-mprefer-vector-width=512", "-w"
/* The quick build vectorizes too: -O1 alone left every loop scalar, and a GPT block's gelu
 * backward (erf and exp inline) ran 8.6x slower than at -O3 (8.57 vs 1.02 ns an element);
 * with -ftree-vectorize, 1.00 ns, for ~25% more compiler time on that kernel. */
static const char *const cpu_opt_words[][3] = {[CPU_OPT_FULL] = {"-O3"},
                                               [CPU_OPT_QUICK] = {"-O1", "-ftree-vectorize"}};
static const char *const cpu_opt_flag[] = {[CPU_OPT_FULL] = "-O3", [CPU_OPT_QUICK] = "-O1 -ftree-vectorize"};
/* The flags as one string: part of the disk cache key, with the level's. */
#define CPU_CFLAGS "-std=c11 -fPIC -shared -fopenmp-simd -fno-math-errno -fno-trapping-math " \
                   "-ffp-contract=off -mprefer-vector-width=512 -w"
#define CPU_COUNT(field) __atomic_fetch_add(&cpu_stats.field, 1, __ATOMIC_RELAXED)

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
  char *save = NULL; /* kernel objects compile on several threads at once */
  for (char *tok = strtok_r(buf, " \t", &save); tok && k < CPU_CC_MAXW;
       tok = strtok_r(NULL, " \t", &save))
    w[k++] = tok;
  return k;
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
      if (spawn_run(argv, fd) == 0 && pread(fd, line, sizeof line - 1, 0) > 0) {
        line[strcspn(line, "\n")] = 0;
        snprintf(cpu_cc_id, sizeof cpu_cc_id, "%s|%s", cc, line);
      }
      close(fd);
    }
  }
  snprintf(out, n, "%s", cpu_cc_id);
  pthread_mutex_unlock(&cpu_cc_mu);
}

/* Each reason the disk cache, or native code, is not used is said once per process, on stderr. */
typedef enum {
  CPU_WARN_REFUSED,
  CPU_WARN_NOT_WRITABLE,
  CPU_WARN_NATIVE_OFF,
  CPU_WARN_COUNT
} cpu_warning;
static atomic_int cpu_warned[CPU_WARN_COUNT];

static bool cpu_first_warning(cpu_warning w) { return !atomic_exchange(&cpu_warned[w], 1); }

static const char *cpu_tmpdir(void) {
  const char *t = getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

/* A compile's work folder in the cache folder: CPU_WORK_PREFIX and mkdtemp's 6 characters. */
#define CPU_WORK_PREFIX "tmp-"
static atomic_bool cpu_swept; /* the cache folder's leftovers were removed (once an init) */

/* The cache directory, or "" when disabled or unsafe (counted in disk_refused, said once). The
 * first time a process compiles into it, the leftovers of killed processes go (dcache_sweep). */
static void cpu_cache_dir(char *out, size_t n) {
  const char *why;
  if (!dcache_dir(out, n, &why)) {
    if (out[0] && !atomic_exchange(&cpu_swept, true)) dcache_sweep(out, CPU_WORK_PREFIX);
    return;
  }
  CPU_COUNT(disk_refused);
  if (cpu_first_warning(CPU_WARN_REFUSED))
    fprintf(stderr, "graft: warning: disk cache %s %s; compiling in a private temporary folder, "
            "nothing is cached\n", out, why);
  out[0] = 0;
}

/* The cache folder could not take a file (read-only, full, over quota): counted, said once;
 * the caller compiles in a private temporary folder. */
static void cpu_cache_unwritable(const char *dir, int err) {
  CPU_COUNT(disk_refused);
  if (cpu_first_warning(CPU_WARN_NOT_WRITABLE))
    fprintf(stderr, "graft: warning: disk cache %s: %s; compiling in a private temporary folder, "
            "nothing is cached\n", dir, strerror(err));
}

/* Not even a private temporary folder takes the compiler's files: every graph stays on the
 * first tier, which must not go unsaid. */
static void cpu_native_off(int err) {
  err_set(GRAFT_ERR_COMPILE, "cpu: native code is off: a private temporary folder under %s: %s",
          cpu_tmpdir(), strerror(err));
  if (cpu_first_warning(CPU_WARN_NATIVE_OFF))
    fprintf(stderr, "graft: warning: native code is off: a private temporary folder under %s: "
            "%s; graphs run on the first tier (slower)\n", cpu_tmpdir(), strerror(err));
}

/* dlopen of load; errors name shown. */
static int cpu_dlopen(const char *load, const char *shown, cpu_object *obj) {
  void *h = dlopen(load, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot load %s: %s", shown, e ? e : "?");
    return -1;
  }
  const int *n = dlsym(h, CPU_OBJ_N);
  const uint64_t *key = dlsym(h, CPU_OBJ_KEY);
  const cpu_kernel_fn *fn = dlsym(h, CPU_OBJ_FN);
  if (!n || !key || !fn || *n < 0) {
    dlclose(h);
    err_set(GRAFT_ERR_COMPILE, "cpu: %s is not a kernel object (no %s table)", shown, CPU_OBJ_N);
    return -1;
  }
  *obj = (cpu_object){h, *n, key, fn, false, {0, 0}};
  return 0;
}

/* "/proc/self/fd/<fd>", spelled differently at each call: glibc takes an object already
 * loaded under the same name for the one asked for, and fd numbers are reused, so the plain
 * name could load an earlier graph's code. A counter is written as "./" (1) and "/" (0)
 * segments, which the kernel skips; no two counts give the same string. */
static void cpu_fd_name(int fd, char *out, size_t n) {
  static atomic_uint count;
  unsigned c = atomic_fetch_add(&count, 1) + 1;
  size_t k = (size_t)snprintf(out, n, "/proc/self/fd/"); /* n >= 100: 32 segments and fd fit */
  for (; c; c >>= 1) k += (size_t)snprintf(out + k, n - k, "%s", c & 1 ? "./" : "/");
  snprintf(out + k, n - k, "%d", fd);
}

/* Loads the open file fd (path names it): through /proc, so what loads are the bytes that
 * were checked on fd even if path is replaced meanwhile; by path where /proc is missing. */
static int cpu_dlopen_fd(int fd, const char *path, cpu_object *obj) {
  char name[160];
  cpu_fd_name(fd, name, sizeof name);
  struct stat a, b;
  bool same = !fstat(fd, &a) && !stat(name, &b) && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  return cpu_dlopen(same ? name : path, path, obj);
}

/* The last n-1 bytes of what the compiler said on fd. */
static void cpu_tail(int fd, char *out, size_t n) {
  off_t end = lseek(fd, 0, SEEK_END), from = end > (off_t)(n - 1) ? end - (off_t)(n - 1) : 0;
  ssize_t k = end > 0 ? pread(fd, out, (size_t)(end - from), from) : 0;
  out[k > 0 ? k : 0] = 0;
}

/* An unlinked file for the compiler's diagnostics: under $TMPDIR, so that a full cache folder
 * does not swallow the "No space left on device" that says it is full; else in work. */
static int cpu_diag_fd(const char *work) {
  char p[1200];
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/graft-cc-XXXXXX", i ? work : cpu_tmpdir());
    int fd = mkstemp(p);
    if (fd >= 0) {
      unlink(p);
      return fd;
    }
  }
  return -1;
}

/* The errno behind a compiler failure when it was its folder that could not take a file
 * (another folder may do), else 0: from its diagnostics, or a folder with no room left. */
static int cpu_storage_errno(const char *said, const char *work) {
  static const int errs[] = {ENOSPC, EDQUOT, EFBIG, EROFS};
  for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
    if (strstr(said, strerror(errs[i]))) return errs[i];
  struct statvfs fs;
  if (!statvfs(work, &fs) && ((fs.f_blocks && !fs.f_bavail) || (fs.f_files && !fs.f_favail)))
    return ENOSPC;
  return 0;
}

/* cc <flags> -march=M -o out src, diagnostics onto fd_err; the exit status (or -1). */
static int cpu_run_compiler(const char *src, cpu_opt opt, const char *out, int fd_err) {
  static const char *flags[] = {CPU_CFLAG_LIST};
  enum { NFLAGS = sizeof flags / sizeof *flags };
  char buf[256], march[80], *argv[CPU_CC_MAXW + NFLAGS + 8];
  int k = cpu_cc_words(buf, sizeof buf, argv);
  if (!k) return -1;
  for (int i = 0; i < 3 && cpu_opt_words[opt][i]; i++) argv[k++] = (char *)cpu_opt_words[opt][i];
  for (int i = 0; i < NFLAGS; i++) argv[k++] = (char *)flags[i];
  snprintf(march, sizeof march, "-march=%s", cpu_march());
  argv[k++] = march;
  argv[k++] = "-o";
  argv[k++] = (char *)out;
  argv[k++] = (char *)src;
  argv[k] = NULL;
  return spawn_run(argv, fd_err);
}

/* Compiles cfile into out (in folder work), adding the compiler's wall time to *ms; 0, or -1
 * with the error set and *room the errno when the failure was work's folder not taking the
 * compiler's files. */
static int cpu_compile_file(const char *cfile, cpu_opt opt, const char *out, const char *work,
                            int *room, double *ms) {
  int fd = cpu_diag_fd(work);
  if (fd < 0) {
    *room = errno;
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot create a file in %s: %s", work, strerror(errno));
    return -1;
  }
  double t0 = cpu_now_ms();
  int st = cpu_run_compiler(cfile, opt, out, fd);
  *ms += cpu_now_ms() - t0;
  if (st == 0) {
    close(fd);
    CPU_COUNT(compiles);
    return 0;
  }
  char tail[1200];
  cpu_tail(fd, tail, sizeof tail);
  close(fd);
  CPU_COUNT(compile_fail);
  *room = cpu_storage_errno(tail, work);
  err_set(GRAFT_ERR_COMPILE, "cpu: compiler '%s' failed (status %d): %s", cpu_cc(), st,
          tail[0] ? tail : "(no output)");
  return -1;
}

/* Publishes the compiled out as entry key of dir, and loads it from the same open file: the
 * bytes the .meta describes. A folder that cannot take the .meta is said; the object loads
 * all the same. */
static int cpu_publish_load(const char *dir, const char *key, const char *out, cpu_object *obj) {
  int fd = open(out, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  size_t n = 0;
  /* 0700: a umask that leaves it group-writable would get it refused on every load */
  unsigned char *b = fd >= 0 && !fchmod(fd, 0700) ? dcache_read_fd(fd, &n) : NULL;
  if (!b) {
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot read the compiled %s: %s", out, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  char so[1200];
  snprintf(so, sizeof so, "%s/%s.so", dir, key);
  bool published = !dcache_publish(dir, key, "so", out, b, n);
  if (!published) cpu_cache_unwritable(dir, errno);
  free(b);
  int rc = cpu_dlopen_fd(fd, published ? so : out, obj);
  close(fd);
  obj->published = !rc && published;
  return rc;
}

/* A fresh 0700 work folder: in the cache folder dir, or under $TMPDIR (else /tmp) when dir is
 * ""; 1 on success. */
static int cpu_make_workdir(const char *dir, char *work, size_t n) {
  if (dir[0]) snprintf(work, n, "%s/" CPU_WORK_PREFIX "XXXXXX", dir);
  else snprintf(work, n, "%s/graft-XXXXXX", cpu_tmpdir());
  return mkdtemp(work) != NULL;
}

/* One compile of src in a fresh work folder: in the cache folder dir, the object published
 * there as entry key, or in a private temporary folder when dir is "". 0 with obj loaded; -1
 * with the error set, and *room the errno when the folder could not take the files (then
 * another may do), else 0. */
static int cpu_compile_in(const char *dir, const char *key, const char *src, cpu_opt opt,
                          cpu_object *obj, int *room, double *ms) {
  char work[1100], cfile[1200], out[1200], meta[1300];
  *room = 0;
  if (!cpu_make_workdir(dir, work, sizeof work)) {
    *room = errno;
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot create a work directory %s: %s", work, strerror(errno));
    return -1;
  }
  snprintf(cfile, sizeof cfile, "%s/k.c", work);
  snprintf(out, sizeof out, "%s/k.so", work);
  snprintf(meta, sizeof meta, "%s.meta", out); /* dcache_publish's, when it stopped half way */
  int rc = -1;
  if (dcache_write_file(cfile, src, strlen(src))) {
    *room = errno;
    err_set(GRAFT_ERR_COMPILE, "cpu: cannot write %s: %s", cfile, strerror(errno));
  } else if (!cpu_compile_file(cfile, opt, out, work, room, ms)) {
    rc = dir[0] ? cpu_publish_load(dir, key, out, obj) : cpu_dlopen(out, out, obj);
  }
  unlink(cfile);
  unlink(out);
  unlink(meta);
  rmdir(work);
  return rc;
}

/* The prelude every object starts with, hashed once: a body's key covers it. */
static uint64_t cpu_prelude_hash(void) {
  static _Atomic uint64_t h;
  uint64_t v = atomic_load(&h);
  if (v) return v;
  rd_sb b = {0};
  cpu_gen_prelude(&b);
  v = b.s ? dcache_hash(b.s, b.n, 7) | 1 : 1;
  rd_sb_free(&b);
  atomic_store(&h, v);
  return v;
}

void cpu_cache_key(const char *text, cpu_opt opt, uint64_t key[2]) {
  char id[600], pre[24];
  cpu_compiler_id(id, sizeof id);
  snprintf(pre, sizeof pre, "%016" PRIx64, cpu_prelude_hash());
  size_t sn = strlen(text);
  uint64_t h1 = dcache_hash(text, sn, 1), h2 = dcache_hash(text, sn, 2);
  const char *tags[] = {id, CPU_CFLAGS, cpu_opt_flag[opt], cpu_march(), pre, GRAFT_VERSION};
  for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) {
    h1 = dcache_hash(tags[t], strlen(tags[t]), h1);
    h2 = dcache_hash(tags[t], strlen(tags[t]), h2 ^ 0x5bd1e995);
  }
  key[0] = h1;
  key[1] = h2;
}

static void cpu_key_hex(const uint64_t key[2], const char *prefix, char *out, size_t n) {
  snprintf(out, n, "%s%016" PRIx64 "%016" PRIx64, prefix, key[0], key[1]);
}

/* Entry key of the cache folder dir into obj: 1 on a hit; 0 when there is none, or it was
 * refused or would not load (then counted in disk_corrupt, removed and said). */
static int cpu_cache_lookup(const char *dir, const char *key, cpu_object *obj) {
  dcache_entry e;
  int found = dcache_open(dir, key, "so", &e);
  if (found < 0) CPU_COUNT(disk_corrupt);
  if (found <= 0) return 0;
  char so[1200];
  snprintf(so, sizeof so, "%s/%s.so", dir, key);
  int rc = cpu_dlopen_fd(e.fd, so, obj);
  dcache_entry_free(&e);
  if (rc == 0) {
    CPU_COUNT(disk_hits);
    return 1;
  }
  CPU_COUNT(disk_corrupt);
  dcache_reject(dir, key, "so", "cannot be loaded");
  return 0;
}

/* Source -> loaded object: the disk cache lookup, else a compile in the cache's work folder
 * published there; a cache folder that cannot take the files (read-only, full, over quota) is
 * said and the compile done again in a private temporary folder; when that fails too, native
 * code is off, and said (README, Disk cache). */
int cpu_compile_source(const char *src, cpu_opt opt, cpu_object *obj, double *ms) {
  memset(obj, 0, sizeof *obj);
  *ms = 0;
  char dir[1000], key[40];
  uint64_t k[2];
  cpu_cache_key(src, opt, k);
  cpu_key_hex(k, "", key, sizeof key);
  cpu_cache_dir(dir, sizeof dir);
  int room = 0, rc = 0;
  if (dir[0] && cpu_cache_lookup(dir, key, obj)) {
    obj->published = true; /* an entry: its bodies are indexed (again, if a process died first) */
  } else {
    rc = cpu_compile_in(dir, key, src, opt, obj, &room, ms);
    if (rc && room && dir[0]) {
      cpu_cache_unwritable(dir, room);
      rc = cpu_compile_in("", key, src, opt, obj, &room, ms);
    }
    if (rc && room) cpu_native_off(room);
  }
  if (!rc) memcpy(obj->okey, k, sizeof k);
  return rc;
}

int cpu_object_find(const uint64_t key[2], cpu_object *obj) {
  char dir[1000], name[48];
  const char *why;
  memset(obj, 0, sizeof *obj);
  if (dcache_dir(dir, sizeof dir, &why) || !dir[0]) return 0; /* a refusal is said by compiles */
  cpu_key_hex(key, "b", name, sizeof name);
  size_t n = 0;
  char *idx = (char *)dcache_load(dir, name, "idx", &n);
  char okey[40];
  bool good = idx && n == 32;
  for (size_t i = 0; good && i < n; i++) good = isxdigit((unsigned char)idx[i]);
  if (good) snprintf(okey, sizeof okey, "%.32s", idx);
  free(idx);
  return good && cpu_cache_lookup(dir, okey, obj);
}

enum { OBJECT_ANY_UNKNOWN, OBJECT_ANY_NO, OBJECT_ANY_YES };
static atomic_int object_any; /* asked once between inits (two threads may both look) */

/* A cold cache's folder is empty; a warm one's is mostly index entries, so the scan stops
 * early. What this process compiles counts in the library instead. */
static bool object_look(void) {
  char dir[1000];
  const char *why;
  if (dcache_dir(dir, sizeof dir, &why) || !dir[0]) return false;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool any = false;
  for (struct dirent *x; !any && (x = readdir(d));) {
    size_t n = strlen(x->d_name);
    any = n > 4 && !strcmp(x->d_name + n - 4, ".idx");
  }
  closedir(d);
  return any;
}

bool cpu_object_any(void) {
  int a = atomic_load_explicit(&object_any, memory_order_relaxed);
  if (a == OBJECT_ANY_UNKNOWN) {
    a = object_look() ? OBJECT_ANY_YES : OBJECT_ANY_NO;
    atomic_store_explicit(&object_any, a, memory_order_relaxed);
  }
  return a == OBJECT_ANY_YES;
}

void cpu_object_forget(void) {
  atomic_store(&object_any, OBJECT_ANY_UNKNOWN);
  atomic_store(&cpu_swept, false);
}

void cpu_object_index(const cpu_object *obj) {
  char dir[1000], name[48], okey[40];
  const char *why;
  if (!obj->published || dcache_dir(dir, sizeof dir, &why) || !dir[0]) return;
  cpu_key_hex(obj->okey, "", okey, sizeof okey);
  for (int k = 0; k < obj->n; k++) {
    cpu_key_hex(&obj->key[2 * k], "b", name, sizeof name);
    size_t n = 0;
    char *had = (char *)dcache_load(dir, name, "idx", &n);
    bool same = had && n == 32 && !memcmp(had, okey, 32);
    free(had);
    if (!same) (void)dcache_store(dir, name, "idx", okey, 32); /* best effort: else a recompile */
  }
}

void cpu_object_close(cpu_object *obj) {
  if (obj->dl) dlclose(obj->dl);
  memset(obj, 0, sizeof *obj);
}
