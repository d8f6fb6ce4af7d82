/* The disk cache of compiled code (dcache.h). */
#include "dcache.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t dcache_hash(const void *p, size_t n, uint64_t seed) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  h ^= h >> 33; /* a final mix: keys use the high bits too */
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

/* The end is read past too: a file still growing is not taken for the size fstat said. */
unsigned char *dcache_read_fd(int fd, size_t *n) {
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uintmax_t)st.st_size > DCACHE_MAX_BYTES)
    return NULL;
  size_t size = (size_t)st.st_size, len = 0;
  unsigned char *buf = malloc(size ? size : 1), extra;
  while (buf && len < size) {
    ssize_t k = pread(fd, buf + len, size - len, (off_t)len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    len += (size_t)k;
  }
  if (buf && (len != size || pread(fd, &extra, 1, (off_t)size) != 0)) {
    free(buf);
    return NULL;
  }
  *n = size;
  return buf;
}

int dcache_write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  const char *p = data;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      close(fd);
      errno = e;
      return -1;
    }
    p += k;
    n -= (size_t)k;
  }
  return close(fd);
}

static int dcache_mkdir_private(const char *path) {
  if (mkdir(path, 0700) && errno != EEXIST) return -1;
  return 0;
}

int dcache_dir(char *out, size_t n, const char **why) {
  out[0] = 0;
  *why = NULL;
  const char *off = getenv("GRAFT_DISK_CACHE");
  if (off && !strcmp(off, "0")) return 0;
  const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  char base[900];
  if (x && *x) snprintf(base, sizeof base, "%s", x);
  else if (h && *h) {
    snprintf(base, sizeof base, "%s/.cache", h);
    dcache_mkdir_private(base);
  } else return 0;
  char dir[1000];
  snprintf(dir, sizeof dir, "%s/graft", base);
  struct stat st;
  if (dcache_mkdir_private(dir)) *why = "cannot be created";
  else if (lstat(dir, &st) || !S_ISDIR(st.st_mode)) *why = "is not a directory";
  else if (st.st_uid != geteuid()) *why = "belongs to another user";
  else if (st.st_mode & 022) *why = "is writable by group or others";
  if (*why) {
    snprintf(out, n, "%s", dir); /* names the folder in the caller's warning */
    return -1;
  }
  snprintf(out, n, "%s", dir);
  return 0;
}

/* ---- entries: an object and the .meta that ties it to its name ---- */
#define DCACHE_META_TAG "graft-dcache"
#define DCACHE_META_VERSION 2
#define DCACHE_META_MAX 512

static atomic_int dcache_warned;

static void dcache_paths(const char *dir, const char *name, const char *ext, char *path,
                         char *meta, size_t n) {
  snprintf(path, n, "%s/%s.%s", dir, name, ext);
  snprintf(meta, n, "%s/%s.meta", dir, name);
}

/* 128 bits of digest as 32 hex digits: two differently seeded hashes of the bytes. */
static void dcache_digest(const void *data, size_t n, char out[33]) {
  snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, dcache_hash(data, n, 0x243f6a8885a308d3ull),
           dcache_hash(data, n, 0x13198a2e03707344ull));
}

static void dcache_meta_text(char *out, size_t cap, const char *name, const char *ext,
                             const void *data, size_t n) {
  char dig[33];
  dcache_digest(data, n, dig);
  snprintf(out, cap, "%s %d %s.%s %zu %s\n", DCACHE_META_TAG, DCACHE_META_VERSION, name, ext, n,
           dig);
}

/* Why st is not a file a load may read (NULL when it may). */
static const char *dcache_unfit(const struct stat *st, size_t max) {
  if (S_ISLNK(st->st_mode)) return "is a symbolic link";
  if (S_ISFIFO(st->st_mode)) return "is a FIFO";
  if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) return "is a device file";
  if (!S_ISREG(st->st_mode)) return "is not a regular file";
  if (st->st_uid != geteuid()) return "belongs to another user";
  if (st->st_mode & 022) return "is writable by group or others";
  if ((uintmax_t)st->st_size > max) return "is larger than a cache entry can be";
  return NULL;
}

/* Opens path read-only when it is a file dcache_unfit accepts: lstat first, so a FIFO or a
 * device is not even opened; O_NOFOLLOW and O_NONBLOCK, so a swap since cannot make the open
 * follow a link or block; fstat on the fd decides. The fd, or -1 with *why saying why (NULL
 * when there is no file). */
static int dcache_open_private(const char *path, size_t max, const char **why) {
  struct stat st;
  *why = NULL;
  if (lstat(path, &st)) {
    if (errno != ENOENT) *why = "cannot be examined";
    return -1;
  }
  if ((*why = dcache_unfit(&st, max))) return -1;
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ELOOP ? "is a symbolic link" : errno == ENOENT ? NULL : "cannot be opened";
    return -1;
  }
  *why = fstat(fd, &st) ? "cannot be examined" : dcache_unfit(&st, max);
  if (*why) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Why the .meta text txt does not prove data as entry name.<ext> (NULL when it does). */
static const char *dcache_disproof(const char *txt, const char *name, const char *ext,
                                   const unsigned char *data, size_t n) {
  char tag[16], key[300], dig[40], want_key[300], want_dig[33];
  unsigned ver;
  unsigned long long size;
  if (sscanf(txt, "%15s %u %299s %llu %39s", tag, &ver, key, &size, dig) != 5 ||
      strcmp(tag, DCACHE_META_TAG) || ver != DCACHE_META_VERSION)
    return "has a .meta of another format";
  snprintf(want_key, sizeof want_key, "%s.%s", name, ext);
  if (strcmp(key, want_key)) return "is another entry's (its .meta names another key)";
  if (size != n) return "is not the size its .meta says (truncated or replaced)";
  dcache_digest(data, n, want_dig);
  if (strcmp(dig, want_dig)) return "does not match the digest in its .meta";
  return NULL;
}

/* Why the .meta at meta does not prove data (NULL when it does); *file becomes meta when the
 * fault is that file's own. */
static const char *dcache_check_meta(const char *meta, const char *name, const char *ext,
                                     const unsigned char *data, size_t n, const char **file) {
  const char *why;
  int fd = dcache_open_private(meta, DCACHE_META_MAX, &why);
  if (fd < 0) {
    if (why) *file = meta;
    return why ? why : "has no .meta";
  }
  char txt[DCACHE_META_MAX + 1];
  ssize_t k = pread(fd, txt, DCACHE_META_MAX, 0);
  close(fd);
  txt[k > 0 ? k : 0] = 0;
  return dcache_disproof(txt, name, ext, data, n);
}

/* Removes an entry's files (a directory in the object's place too, when empty), and says the
 * first refusal of the process. */
static void dcache_refuse(const char *path, const char *meta, const char *file, const char *why) {
  if (unlink(path) && errno == EISDIR) rmdir(path);
  unlink(meta);
  if (!atomic_exchange(&dcache_warned, 1))
    fprintf(stderr, "graft: warning: disk cache entry %s %s; removed, compiling again\n", file,
            why);
}

void dcache_reject(const char *dir, const char *name, const char *ext, const char *why) {
  char path[1200], meta[1200];
  dcache_paths(dir, name, ext, path, meta, sizeof path);
  dcache_refuse(path, meta, path, why);
}

int dcache_open(const char *dir, const char *name, const char *ext, dcache_entry *e) {
  char path[1200], meta[1200];
  dcache_paths(dir, name, ext, path, meta, sizeof path);
  *e = (dcache_entry){.fd = -1};
  const char *bad, *file = path;
  int fd = dcache_open_private(path, DCACHE_MAX_BYTES, &bad);
  if (fd < 0 && !bad) return 0; /* no entry (a lone .meta is one being written) */
  if (fd >= 0 && !(e->data = dcache_read_fd(fd, &e->n))) bad = "could not be read whole";
  if (!bad) bad = dcache_check_meta(meta, name, ext, e->data, e->n, &file);
  if (bad) {
    if (fd >= 0) close(fd);
    free(e->data);
    *e = (dcache_entry){.fd = -1};
    dcache_refuse(path, meta, file, bad);
    return -1;
  }
  e->fd = fd;
  return 1;
}

void dcache_entry_free(dcache_entry *e) {
  if (e->fd >= 0) close(e->fd);
  free(e->data);
  *e = (dcache_entry){.fd = -1};
}

int dcache_publish(const char *dir, const char *name, const char *ext, const char *tmp,
                   const void *data, size_t n) {
  char path[1200], meta[1200], tmeta[1300], txt[DCACHE_META_MAX];
  dcache_paths(dir, name, ext, path, meta, sizeof path);
  snprintf(tmeta, sizeof tmeta, "%s.meta", tmp);
  dcache_meta_text(txt, sizeof txt, name, ext, data, n);
  /* the .meta first: an object in place always has its own beside it (a lone .meta is a miss) */
  if (dcache_write_file(tmeta, txt, strlen(txt)) || rename(tmeta, meta) || rename(tmp, path))
    return -1;
  return 0;
}

unsigned char *dcache_load(const char *dir, const char *name, const char *ext, size_t *n) {
  dcache_entry e;
  if (dcache_open(dir, name, ext, &e) != 1) return NULL;
  close(e.fd);
  *n = e.n;
  return e.data;
}

int dcache_store(const char *dir, const char *name, const char *ext, const void *data, size_t n) {
  char tmp[1300], tmeta[1400];
  snprintf(tmp, sizeof tmp, "%s/%s.%s.tmp%ld", dir, name, ext, (long)getpid());
  snprintf(tmeta, sizeof tmeta, "%s.meta", tmp);
  if (!dcache_write_file(tmp, data, n) && !dcache_publish(dir, name, ext, tmp, data, n)) return 0;
  int e = errno;
  unlink(tmp);
  unlink(tmeta);
  errno = e;
  return -1;
}

/* ---- leftovers of killed processes ---- */

/* Whether name is a temporary file of dcache_store: <...>.tmp<digits>, or its .meta. */
static bool dcache_temp_name(const char *name) {
  const char *t = strstr(name, ".tmp");
  if (!t) return false;
  const char *d = t + 4;
  if (!*d || *d < '0' || *d > '9') return false;
  while (*d >= '0' && *d <= '9') d++;
  return !*d || !strcmp(d, ".meta");
}

/* Removes the plain files of work folder name (in dirfd) and the folder; links and folders
 * inside are left (then the folder stays). */
static int dcache_remove_work(int dirfd, const char *name) {
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return 0;
  }
  for (struct dirent *x; (x = readdir(d));)
    if (strcmp(x->d_name, ".") && strcmp(x->d_name, "..")) unlinkat(fd, x->d_name, 0);
  closedir(d);
  return !unlinkat(dirfd, name, AT_REMOVEDIR);
}

int dcache_sweep(const char *dir, const char *work_prefix) {
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return 0;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return 0;
  }
  size_t np = strlen(work_prefix);
  time_t now = time(NULL);
  int removed = 0;
  for (struct dirent *x; (x = readdir(d));) {
    bool work = !strncmp(x->d_name, work_prefix, np) && strlen(x->d_name) == np + 6;
    if (!work && !dcache_temp_name(x->d_name)) continue;
    struct stat st;
    if (fstatat(dfd, x->d_name, &st, AT_SYMLINK_NOFOLLOW) || st.st_uid != geteuid() ||
        now - st.st_mtime < DCACHE_STALE_S)
      continue;
    if (work && S_ISDIR(st.st_mode)) removed += dcache_remove_work(dfd, x->d_name);
    else if (!work && S_ISREG(st.st_mode)) removed += !unlinkat(dfd, x->d_name, 0);
  }
  closedir(d);
  return removed;
}
