/* The disk cache of compiled code (dcache.h). */
#include "dcache.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

unsigned char *dcache_read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t cap = 0, len = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 65536;
      unsigned char *b = realloc(buf, cap);
      if (!b) { free(buf); fclose(f); return NULL; }
      buf = b;
    }
    size_t k = fread(buf + len, 1, cap - len, f);
    len += k;
    if (k == 0) break;
  }
  fclose(f);
  *n = len;
  return buf;
}

int dcache_write_file(const char *path, const void *data, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  const char *p = data;
  while (n) {
    ssize_t k = write(fd, p, n);
    if (k <= 0) { close(fd); return -1; }
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

int dcache_valid(const char *data_path, const char *meta_path) {
  size_t mn, n;
  unsigned char *m = dcache_read_file(meta_path, &mn);
  if (!m) return 0;
  char txt[128];
  size_t k = mn < sizeof txt - 1 ? mn : sizeof txt - 1;
  memcpy(txt, m, k);
  txt[k] = 0;
  free(m);
  unsigned long long want_n, want_h;
  if (sscanf(txt, "%llu %llx", &want_n, &want_h) != 2) return 0;
  unsigned char *b = dcache_read_file(data_path, &n);
  if (!b) return 0;
  int ok = n == want_n && dcache_hash(b, n, 7) == want_h;
  free(b);
  return ok;
}

unsigned char *dcache_load(const char *dir, const char *name, const char *ext, size_t *n) {
  char path[1200], meta[1200];
  snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
  snprintf(meta, sizeof meta, "%s/%s.meta", dir, name);
  if (!dcache_valid(path, meta)) return NULL;
  return dcache_read_file(path, n); /* a writer renames whole files: still what was checked */
}

int dcache_store(const char *dir, const char *name, const char *ext, const void *data, size_t n) {
  char path[1200], meta[1200], tp[1300], tm[1300], txt[64];
  snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
  snprintf(meta, sizeof meta, "%s/%s.meta", dir, name);
  snprintf(tp, sizeof tp, "%s.tmp%ld", path, (long)getpid());
  snprintf(tm, sizeof tm, "%s.tmp%ld", meta, (long)getpid());
  snprintf(txt, sizeof txt, "%zu %" PRIx64 "\n", n, dcache_hash(data, n, 7));
  int rc = dcache_write_file(tp, data, n) || dcache_write_file(tm, txt, strlen(txt)) ||
           rename(tp, path) || rename(tm, meta);
  if (rc) {
    unlink(tp);
    unlink(tm);
  }
  return rc ? -1 : 0;
}
