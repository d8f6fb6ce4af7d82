/* The per-user disk cache of compiled code, shared by the compiling backends (dcache.c):
 * $XDG_CACHE_HOME/graft, else $HOME/.cache/graft, created 0700 and used only when it is a
 * directory owned by this user that neither group nor others can write (GRAFT_DISK_CACHE=0
 * turns it off). An entry is written under temporary names and renamed into place, with a
 * .meta ("size checksum") that a load checks: a damaged entry is rebuilt, never loaded. */
#ifndef GRAFT_DCACHE_H
#define GRAFT_DCACHE_H
#include <stddef.h>
#include <stdint.h>

/* The cache folder into out ("" when off). -1 when it exists but is unsafe or cannot be made:
 * *why says so (the caller counts and warns). */
int dcache_dir(char *out, size_t n, const char **why);
/* FNV-1a over bytes, from seed (cache keys and checksums). */
uint64_t dcache_hash(const void *p, size_t n, uint64_t seed);
/* A whole file (malloc'd, size in *n), or NULL. */
unsigned char *dcache_read_file(const char *path, size_t *n);
/* Writes a file 0600; 0 or -1. */
int dcache_write_file(const char *path, const void *data, size_t n);
/* 1 when data_path holds exactly what meta_path ("size checksum") describes. */
int dcache_valid(const char *data_path, const char *meta_path);
/* The bytes of entry dir/name.<ext> when its .meta matches, else NULL. */
unsigned char *dcache_load(const char *dir, const char *name, const char *ext, size_t *n);
/* Stores bytes as entry dir/name.<ext> (+ .meta), atomically; 0 or -1. */
int dcache_store(const char *dir, const char *name, const char *ext, const void *data, size_t n);
#endif
