/* Device data: a reference-counted block of memory owned by one device. All allocations of
 * device data go through here so bytes in use, the peak and the memory limit are exact. */
#ifndef GRAFT_BUFFER_H
#define GRAFT_BUFFER_H
#include <stddef.h>
#include <stdint.h>

typedef struct exec_buffer {
  int refcnt;
  int device;
  size_t bytes;
  void *ptr; /* 64-byte aligned; NULL only when bytes == 0 */
  /* Set by the executor on a parameter it hands over with its reference (buffer donation): the
   * backend releases it at its last use, so an output allocated later can reuse the memory. */
  int donated;
} exec_buffer;

/* Allocates bytes (zero-filled only if zero is set). NULL with GRAFT_ERR_OOM set on failure;
 * what names the allocation in the error message. */
exec_buffer *buffer_new(size_t bytes, int device, int zero, const char *what);
void buffer_retain(exec_buffer *b);
void buffer_release(exec_buffer *b);
size_t buffer_bytes_in_use(void);
size_t buffer_bytes_peak(void);
void buffer_reset_peak(void);
void buffer_set_limit(size_t bytes);
size_t buffer_get_limit(void);
/* Frees the pool of released blocks kept for reuse (graft_shutdown, or when memory is short). */
void buffer_pool_trim(void);
/* Bytes held in the pool (not in use, not returned to the system). */
size_t buffer_pool_bytes(void);
#endif
