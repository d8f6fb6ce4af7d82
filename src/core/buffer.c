/* Device data allocation with exact accounting (bytes in use, peak, optional limit). */
#include "buffer.h"
#include "error.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic size_t buf_in_use, buf_peak, buf_limit;

exec_buffer *buffer_new(size_t bytes, int device, int zero, const char *what) {
  size_t limit = atomic_load(&buf_limit);
  size_t now = atomic_fetch_add(&buf_in_use, bytes) + bytes;
  if (limit && now > limit) {
    atomic_fetch_sub(&buf_in_use, bytes);
    return err_set(GRAFT_ERR_OOM, "out of memory: %s needs %zu bytes, %zu in use, limit %zu",
                   what, bytes, now - bytes, limit);
  }
  exec_buffer *b = malloc(sizeof *b);
  void *p = NULL;
  if (bytes) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    p = rounded < bytes ? NULL : aligned_alloc(64, rounded);
  }
  if (!b || (bytes && !p)) {
    free(b);
    free(p);
    atomic_fetch_sub(&buf_in_use, bytes);
    return err_set(GRAFT_ERR_OOM, "out of memory: %s needs %zu bytes", what, bytes);
  }
  if (zero && bytes) memset(p, 0, bytes);
  size_t peak = atomic_load(&buf_peak);
  while (now > peak && !atomic_compare_exchange_weak(&buf_peak, &peak, now)) {
  }
  b->refcnt = 1;
  b->device = device;
  b->bytes = bytes;
  b->ptr = p;
  return b;
}

void buffer_retain(exec_buffer *b) {
  if (b) __atomic_add_fetch(&b->refcnt, 1, __ATOMIC_RELAXED);
}

void buffer_release(exec_buffer *b) {
  if (!b || __atomic_sub_fetch(&b->refcnt, 1, __ATOMIC_ACQ_REL) != 0) return;
  atomic_fetch_sub(&buf_in_use, b->bytes);
  free(b->ptr);
  free(b);
}

size_t buffer_bytes_in_use(void) { return atomic_load(&buf_in_use); }
size_t buffer_bytes_peak(void) { return atomic_load(&buf_peak); }
void buffer_reset_peak(void) { atomic_store(&buf_peak, atomic_load(&buf_in_use)); }
void buffer_set_limit(size_t bytes) { atomic_store(&buf_limit, bytes); }
