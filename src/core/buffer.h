/* Device data: a reference-counted block of memory owned by one device. All allocations of
 * device data go through here so bytes in use, the peak and the memory limit are exact. */
#ifndef GRAFT_BUFFER_H
#define GRAFT_BUFFER_H
#include <stddef.h>
#include <stdint.h>

/* A buffer is ready, or pending (a placeholder for an output of a step queued for asynchronous
 * execution: its memory arrives when the step has run), or failed (that step failed; failure
 * says why). State changes only from pending, by the thread that runs the step. */
typedef enum { BUFFER_READY, BUFFER_PENDING, BUFFER_FAILED } buffer_state;

/* Why a step failed: shared by its outputs, freed with the last of them. */
typedef struct buffer_failure {
  int refcnt;
  int status;      /* a graft_status */
  uint64_t origin; /* the first failure this one follows from (a step that never ran because an
                    * input's step failed): its own id when none; a read that reports one
                    * reports them all */
  char msg[1024];
} buffer_failure;

typedef struct exec_buffer {
  int refcnt;
  int device; /* device.h: on a device with its own memory, ptr is the runtime's handle */
  size_t bytes;
  void *ptr; /* 64-byte aligned; NULL only when bytes == 0 */
  /* Set by the executor on a parameter it hands over with its reference (buffer donation): the
   * backend releases it at its last use, so an output allocated later can reuse the memory. */
  int donated;
  int state; /* buffer_state; read with buffer_get_state (another thread may set it) */
  size_t held; /* bytes counted as in use for it: bytes, or 0 for a placeholder not yet filled */
  buffer_failure *failure; /* BUFFER_FAILED only */
  /* Host memory graft does not own (graft_from_host_borrowed): never written, moved, donated or
   * pooled; release(release_ctx) at the last reference instead of a free. NULL: graft's own. */
  void (*release)(void *ctx);
  void *release_ctx;
} exec_buffer;

/* Allocates bytes (zero-filled only if zero is set). NULL with GRAFT_ERR_OOM set on failure;
 * what names the allocation in the error message. */
exec_buffer *buffer_new(size_t bytes, int device, int zero, const char *what);
void buffer_retain(exec_buffer *b);
/* References held now (an atomic read: another thread may release one). */
int buffer_refs(const exec_buffer *b);
/* A pending placeholder of bytes: no memory, counted as in use only once filled (the step's
 * own output buffer is counted meanwhile). */
exec_buffer *buffer_new_pending(size_t bytes, int device, const char *what);
buffer_state buffer_get_state(const exec_buffer *b);
/* Gives pending b the contents of src (same size; takes the caller's reference to src: its
 * memory moves when that is the only reference, else it is copied) and makes b ready. Returns
 * -1 with the error set when a copy cannot get memory (b is then left pending). */
int buffer_fill(exec_buffer *b, exec_buffer *src);
/* Makes pending b failed, for the reason f (b takes a reference to f). */
void buffer_fail(exec_buffer *b, buffer_failure *f);
buffer_failure *buffer_failure_new(int status, const char *msg);
void buffer_failure_release(buffer_failure *f);
void buffer_release(exec_buffer *b);
/* A ready buffer over bytes of host memory at ptr that the caller owns (see exec_buffer's
 * release); not counted as graft's memory. NULL with GRAFT_ERR_OOM when its record cannot be
 * allocated (release is then not called). */
exec_buffer *buffer_borrow(void *ptr, size_t bytes, int device, void (*release)(void *), void *ctx);
/* Copies bytes of host memory into b / b into host memory (a device with its own memory: a
 * transfer, counted in device_traffic). Returns 0, or -1 with the error set. */
int buffer_upload(exec_buffer *b, const void *src, size_t bytes);
int buffer_download(const exec_buffer *b, void *dst, size_t bytes);
/* A new buffer on device holding a copy of src (any devices); NULL with the error set. */
exec_buffer *buffer_to_device(const exec_buffer *src, int device, const char *what);
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
