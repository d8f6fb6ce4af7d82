/* The per-user disk cache of compiled code, shared by the compiling backends (dcache.c):
 * $XDG_CACHE_HOME/graft, else $HOME/.cache/graft, created 0700 and used only when it is a
 * directory owned by this user that neither group nor others can write (GRAFT_DISK_CACHE=0
 * turns it off). An entry is <name>.<ext> plus <name>.meta, written under temporary names and
 * renamed into place (the .meta first). The .meta ("graft-dcache 2 <name>.<ext> <size>
 * <128-bit digest>") ties the object to its name: a load opens both files without following
 * links or blocking (O_NOFOLLOW, O_NONBLOCK), takes them only when fstat says they are regular
 * files of this user that group and others cannot write, no bigger than DCACHE_MAX_BYTES, and
 * checks tag, name, size and digest against the bytes it read. Anything else (another entry's
 * pair, a link, a FIFO, a device, another owner, a truncated file) is removed, said once per
 * process on stderr, and rebuilt, never loaded. */
#ifndef GRAFT_DCACHE_H
#define GRAFT_DCACHE_H
#include <stddef.h>
#include <stdint.h>

/* The most bytes a load reads from an entry's object. */
#define DCACHE_MAX_BYTES ((size_t)256 << 20)

/* A proven entry (dcache_open): the bytes that were checked, and the object still open, so a
 * loader can map that very file (the CPU backend dlopens /proc/self/fd/<fd>) however the path
 * changes meanwhile. */
typedef struct {
  int fd;              /* the object, open read-only; -1 when none */
  unsigned char *data; /* its bytes (malloc'd) */
  size_t n;
} dcache_entry;

/* The cache folder into out ("" when off). -1 when it exists but is unsafe or cannot be made:
 * *why says so (the caller counts and warns). */
int dcache_dir(char *out, size_t n, const char **why);
/* FNV-1a over bytes, from seed (cache keys and checksums). */
uint64_t dcache_hash(const void *p, size_t n, uint64_t seed);
/* Exactly the bytes of regular file fd (at most DCACHE_MAX_BYTES; malloc'd, size in *n), or
 * NULL (not one, too big, or it changed size while read). */
unsigned char *dcache_read_fd(int fd, size_t *n);
/* Writes a new file 0600 (not through a link); 0, or -1 with errno set. */
int dcache_write_file(const char *path, const void *data, size_t n);
/* Entry dir/name.<ext>: 1 when it is there and proven (*e filled; dcache_entry_free), 0 when
 * there is none, -1 when it was refused (its files removed, the reason said once per process). */
int dcache_open(const char *dir, const char *name, const char *ext, dcache_entry *e);
void dcache_entry_free(dcache_entry *e);
/* Removes entry dir/name.<ext> for reason why (said once per process, like a refusal). */
void dcache_reject(const char *dir, const char *name, const char *ext, const char *why);
/* Moves file tmp, holding data (n bytes), into place as entry dir/name.<ext>, after its .meta
 * (written beside tmp as <tmp>.meta); 0, or -1 with errno set (tmp and <tmp>.meta are then
 * the caller's to remove). */
int dcache_publish(const char *dir, const char *name, const char *ext, const char *tmp,
                   const void *data, size_t n);
/* The bytes of entry dir/name.<ext> when it is proven, else NULL (a refused one is removed). */
unsigned char *dcache_load(const char *dir, const char *name, const char *ext, size_t *n);
/* Stores bytes as entry dir/name.<ext> (+ .meta), atomically; 0, or -1 with errno set. */
int dcache_store(const char *dir, const char *name, const char *ext, const void *data, size_t n);
/* A process killed mid-compile (Ctrl-C during a build) leaves its work folder (a compiler's
 * work_prefix + 6 characters, as mkdtemp makes them: its source and object) and temporary
 * files (<name>.<ext>.tmp<pid>, with their .meta) in dir; those of this user older than
 * DCACHE_STALE_S are removed (a live build rewrites its files within seconds). Returns how
 * many it removed. */
#define DCACHE_STALE_S (60 * 60)
int dcache_sweep(const char *dir, const char *work_prefix);
#endif
