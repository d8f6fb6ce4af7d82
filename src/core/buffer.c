/* Device data allocation with exact accounting (bytes in use, peak, optional limit), and a
 * pool of released large blocks: a steady loop allocates the same sizes every step, and a
 * fresh 64 MB block costs ~16 ms of page faults here, more than the kernel that fills it. */
#include "buffer.h"
#include "trace.h"
#include "device.h"
#include "error.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POOL_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define POOL_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POOL_POISON(p, n) ((void)(p), (void)(n))
#define POOL_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Debug builds (the sanitizer flavours define GRAFT_DEBUG; the sanitizers' own macros count
 * too) hand out no memory that looks initialized: a block released to the pool, and a fresh
 * block nobody asked zeroed, are filled with 0xFF bytes (NaN as f32/f64, -1 as an integer), so a
 * kernel that reads memory it did not write fails loudly instead of reading the previous step's
 * plausible values. Release builds skip it (the constant folds the branches away). */
#if defined(GRAFT_DEBUG) || defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define POOL_FILL 1
#else
#define POOL_FILL 0
#endif
#define POOL_FILL_BYTE 0xFF

#define POOL_MIN_BYTES (64u << 10) /* smaller blocks come cheap from malloc */
/* A training step of a real CNN releases more than 64 large blocks (resnet18: its activations
 * and gradients); with 64 slots the rest were freed and the next step faulted fresh pages in
 * (resnet18 at 64 -> 512 slots: ~83 -> ~67 ms a step). The byte cap still bounds the pool. */
#define POOL_SLOTS 512
#define POOL_MAX_BYTES ((size_t)2 << 30)
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t size; int device; /* -1: host memory */ } pool[POOL_SLOTS];
static int pool_n;
static size_t pool_bytes;

/* Pooled blocks are whole pages; smaller ones only cache lines: a scalar parameter in a
 * page-sized block cost a fresh page (a fault, ~10 us) for each new optimizer factor. */
static size_t round_size(size_t bytes) {
  size_t page = (bytes + 4095) & ~(size_t)4095;
  return page >= POOL_MIN_BYTES || page < bytes ? page : (bytes + 63) & ~(size_t)63;
}

/* Frees a pooled block (host memory, or a device's). */
static void pool_free_block(void *p, int device) {
  if (device < 0) {
    free(p);
    return;
  }
  const device_info *d = device_get(device);
  d->mem->free(d->ctx, p);
}

/* A pooled block of exactly this rounded size in device's memory (-1: host), or NULL. */
static void *pool_take_on(size_t size, int device) {
  void *p = NULL;
  pthread_mutex_lock(&pool_mu);
  for (int i = pool_n - 1; i >= 0; i--)
    if (pool[i].size == size && pool[i].device == device) {
      p = pool[i].p;
      pool[i] = pool[--pool_n];
      pool_bytes -= size;
      break;
    }
  pthread_mutex_unlock(&pool_mu);
  if (p && device < 0) POOL_UNPOISON(p, size);
  return p;
}

static void *pool_take(size_t size) { return pool_take_on(size, -1); }

/* Keeps a released block for reuse; false if the pool is full (the caller frees it). */
static int pool_put_on(void *p, size_t size, int device) {
  int kept = 0;
  pthread_mutex_lock(&pool_mu);
  if (pool_bytes + size > POOL_MAX_BYTES && pool_n) { /* evict the oldest */
    pool_free_block(pool[0].p, pool[0].device);
    pool_bytes -= pool[0].size;
    pool[0] = pool[--pool_n];
  }
  if (pool_n < POOL_SLOTS && pool_bytes + size <= POOL_MAX_BYTES) {
    if (device < 0) POOL_POISON(p, size);
    pool[pool_n].p = p;
    pool[pool_n].device = device;
    pool[pool_n++].size = size;
    pool_bytes += size;
    kept = 1;
  }
  pthread_mutex_unlock(&pool_mu);
  return kept;
}

static int pool_put(void *p, size_t size) { return pool_put_on(p, size, -1); }

void buffer_pool_trim(void) {
  pthread_mutex_lock(&pool_mu);
  for (int i = 0; i < pool_n; i++) {
    if (pool[i].device < 0) POOL_UNPOISON(pool[i].p, pool[i].size);
    pool_free_block(pool[i].p, pool[i].device);
  }
  pool_n = 0;
  pool_bytes = 0;
  pthread_mutex_unlock(&pool_mu);
}

size_t buffer_pool_bytes(void) {
  pthread_mutex_lock(&pool_mu);
  size_t n = pool_bytes;
  pthread_mutex_unlock(&pool_mu);
  return n;
}

static _Atomic size_t buf_in_use, buf_peak, buf_limit;

/* Device memory of bytes (rounded as host blocks are, so that released blocks pool); when the
 * device is short, the pool's blocks are given back first. */
static int buffer_device_alloc(const device_info *dev, size_t bytes, void **p) {
  size_t rounded = round_size(bytes);
  if (!dev->mem->alloc(dev->ctx, rounded, p)) return 0;
  if (!buffer_pool_bytes()) return -1;
  buffer_pool_trim();
  graft_clear_error();
  return dev->mem->alloc(dev->ctx, rounded, p);
}

/* Fills device memory with a byte through a host block (rare: zeroed device allocations). */
static int buffer_device_fill(const device_info *dev, void *handle, size_t bytes, int byte) {
  void *h = malloc(bytes);
  if (!h) {
    err_set(GRAFT_ERR_OOM, "out of memory: a %zu-byte host block to fill device memory", bytes);
    return -1;
  }
  memset(h, byte, bytes);
  int rc = dev->mem->upload(dev->ctx, handle, h, bytes);
  free(h);
  return rc;
}

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
  const device_info *dev = device_is_host(device) ? NULL : device_get(device);
  if (dev && b && bytes) p = pool_take_on(round_size(bytes), device); /* every size: see buffer_release */
  if (dev && b && bytes && !p && buffer_device_alloc(dev, bytes, &p)) { /* device memory */
    free(b);
    atomic_fetch_sub(&buf_in_use, bytes);
    return NULL; /* the device said why */
  }
  if (!dev && bytes) {
    size_t rounded = round_size(bytes);
    if (rounded >= bytes) {
      if (rounded >= POOL_MIN_BYTES) p = pool_take(rounded);
      if (!p) p = aligned_alloc(64, rounded);
      if (!p && buffer_pool_bytes()) { /* memory is short: give the pool back, try once more */
        buffer_pool_trim();
        p = aligned_alloc(64, rounded);
      }
    }
  }
  if (!b || (bytes && !p)) {
    free(b);
    free(p);
    atomic_fetch_sub(&buf_in_use, bytes);
    return err_set(GRAFT_ERR_OOM, "out of memory: %s needs %zu bytes", what, bytes);
  }
  if (dev) {
    if (zero && bytes && buffer_device_fill(dev, p, bytes, 0)) {
      dev->mem->free(dev->ctx, p);
      free(b);
      atomic_fetch_sub(&buf_in_use, bytes);
      return NULL;
    }
  } else if (zero && bytes) {
    memset(p, 0, bytes);
  } else if (POOL_FILL && bytes) {
    memset(p, POOL_FILL_BYTE, bytes);
  }
  size_t peak = atomic_load(&buf_peak);
  while (now > peak && !atomic_compare_exchange_weak(&buf_peak, &peak, now)) {
  }
  *b = (exec_buffer){.refcnt = 1, .device = device, .bytes = bytes, .ptr = p, .state = BUFFER_READY, .held = bytes};
  return b;
}

void buffer_retain(exec_buffer *b) {
  if (b) __atomic_add_fetch(&b->refcnt, 1, __ATOMIC_RELAXED);
}

int buffer_refs(const exec_buffer *b) { return __atomic_load_n(&b->refcnt, __ATOMIC_ACQUIRE); }

buffer_state buffer_get_state(const exec_buffer *b) {
  return (buffer_state)__atomic_load_n(&b->state, __ATOMIC_ACQUIRE);
}

exec_buffer *buffer_new_pending(size_t bytes, int device, const char *what) {
  exec_buffer *b = buffer_new(0, device, 0, what);
  if (!b) return NULL;
  b->bytes = bytes;
  b->state = BUFFER_PENDING;
  return b;
}

int buffer_fill(exec_buffer *b, exec_buffer *src) {
  void *p = NULL;
  if (buffer_refs(src) == 1 && !src->release) { /* ours alone: the memory moves, with its accounting */
    p = src->ptr;
    src->ptr = NULL;
    src->held = src->bytes = 0;
  } else if (b->bytes && !device_is_host(b->device)) { /* shared, on a device: copy there */
    const device_info *dev = device_get(b->device);
    if (buffer_device_alloc(dev, b->bytes, &p) || dev->mem->copy(dev->ctx, p, src->ptr, b->bytes)) {
      if (p) dev->mem->free(dev->ctx, p);
      buffer_release(src);
      return -1;
    }
    size_t now = atomic_fetch_add(&buf_in_use, b->bytes) + b->bytes, peak = atomic_load(&buf_peak);
    while (now > peak && !atomic_compare_exchange_weak(&buf_peak, &peak, now)) {
    }
  } else if (b->bytes) { /* shared (an output that aliases an input, or another output) */
    size_t rounded = round_size(b->bytes);
    if (rounded >= POOL_MIN_BYTES) p = pool_take(rounded);
    if (!p) p = aligned_alloc(64, rounded);
    if (!p) {
      buffer_release(src);
      err_set(GRAFT_ERR_OOM, "out of memory: copying a step's output needs %zu bytes", b->bytes);
      return -1;
    }
    memcpy(p, src->ptr, b->bytes);
    size_t now = atomic_fetch_add(&buf_in_use, b->bytes) + b->bytes, peak = atomic_load(&buf_peak);
    while (now > peak && !atomic_compare_exchange_weak(&buf_peak, &peak, now)) {
    }
  }
  buffer_release(src);
  b->held = b->bytes;
  b->ptr = p;
  __atomic_store_n(&b->state, BUFFER_READY, __ATOMIC_RELEASE);
  return 0;
}

buffer_failure *buffer_failure_new(int status, const char *msg) {
  buffer_failure *f = malloc(sizeof *f);
  if (!f) return NULL;
  static uint64_t next_id;
  f->refcnt = 1;
  f->status = status;
  f->origin = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
  snprintf(f->msg, sizeof f->msg, "%s", msg);
  return f;
}

void buffer_failure_release(buffer_failure *f) {
  if (f && __atomic_sub_fetch(&f->refcnt, 1, __ATOMIC_ACQ_REL) == 0) free(f);
}

void buffer_fail(exec_buffer *b, buffer_failure *f) {
  if (f) __atomic_add_fetch(&f->refcnt, 1, __ATOMIC_RELAXED);
  b->failure = f;
  __atomic_store_n(&b->state, BUFFER_FAILED, __ATOMIC_RELEASE);
}

void buffer_release(exec_buffer *b) {
  if (!b || __atomic_sub_fetch(&b->refcnt, 1, __ATOMIC_ACQ_REL) != 0) return;
  buffer_failure_release(b->failure);
  if (b->release) { /* the owner's memory: given back, not freed */
    b->release(b->release_ctx);
    free(b);
    return;
  }
  atomic_fetch_sub(&buf_in_use, b->held);
  if (!device_is_host(b->device)) {
    const device_info *dev = device_get(b->device);
    size_t rounded = round_size(b->bytes);
    /* pooled at every size: a device's free can wait for the whole device (cuMemFree does),
     * and a graph frees its small operands (biases, BN parameters) as it goes */
    if (b->ptr && !pool_put_on(b->ptr, rounded, b->device)) dev->mem->free(dev->ctx, b->ptr);
    free(b);
    return;
  }
  size_t rounded = round_size(b->bytes);
  if (POOL_FILL && b->ptr && rounded >= POOL_MIN_BYTES) memset(b->ptr, POOL_FILL_BYTE, rounded);
  if (!b->ptr || rounded < POOL_MIN_BYTES || !pool_put(b->ptr, rounded)) free(b->ptr);
  free(b);
}

exec_buffer *buffer_borrow(void *ptr, size_t bytes, int device, void (*release)(void *), void *ctx) {
  exec_buffer *b = malloc(sizeof *b);
  if (!b) return err_set(GRAFT_ERR_OOM, "out of memory: a borrowed buffer's record");
  *b = (exec_buffer){.refcnt = 1, .device = device, .bytes = bytes, .ptr = ptr, .state = BUFFER_READY,
                     .release = release, .release_ctx = ctx}; /* held 0: not graft's memory */
  return b;
}

size_t buffer_bytes_in_use(void) { return atomic_load(&buf_in_use); }
size_t buffer_bytes_peak(void) { return atomic_load(&buf_peak); }
void buffer_reset_peak(void) { atomic_store(&buf_peak, atomic_load(&buf_in_use)); }
void buffer_set_limit(size_t bytes) { atomic_store(&buf_limit, bytes); }
size_t buffer_get_limit(void) { return atomic_load(&buf_limit); }

/* A copy to or from a device as a span of the trace. */
static void buffer_trace_copy(const char *what, int device, size_t bytes, uint64_t t0) {
  char name[96], dev[64], args[48];
  snprintf(name, sizeof name, "%s %s", what, device_str(device, dev, sizeof dev));
  snprintf(args, sizeof args, "\"bytes\": %zu", bytes);
  trace_span("transfer", name, t0, trace_now(), args);
}

int buffer_upload(exec_buffer *b, const void *src, size_t bytes) {
  if (!bytes) return 0;
  if (device_is_host(b->device)) {
    memcpy(b->ptr, src, bytes);
    return 0;
  }
  const device_info *dev = device_get(b->device);
  uint64_t t0 = trace_on() ? trace_now() : 0;
  if (dev->mem->upload(dev->ctx, b->ptr, src, bytes)) return -1;
  device_count_upload(bytes);
  if (t0) buffer_trace_copy("upload", b->device, bytes, t0);
  return 0;
}

int buffer_download(const exec_buffer *b, void *dst, size_t bytes) {
  if (!bytes) return 0;
  if (device_is_host(b->device)) {
    memcpy(dst, b->ptr, bytes);
    return 0;
  }
  const device_info *dev = device_get(b->device);
  uint64_t t0 = trace_on() ? trace_now() : 0;
  if (dev->mem->download(dev->ctx, b->ptr, dst, bytes)) return -1;
  device_count_download(bytes);
  if (t0) buffer_trace_copy("download", b->device, bytes, t0);
  return 0;
}

exec_buffer *buffer_to_device(const exec_buffer *src, int device, const char *what) {
  exec_buffer *b = buffer_new(src->bytes, device, 0, what);
  if (!b || !src->bytes) return b;
  int rc;
  if (device_is_host(src->device)) {
    rc = buffer_upload(b, src->ptr, src->bytes);
  } else if (device_is_host(device)) {
    rc = buffer_download(src, b->ptr, src->bytes);
  } else if (src->device == device) {
    const device_info *dev = device_get(device);
    rc = dev->mem->copy(dev->ctx, b->ptr, src->ptr, src->bytes);
  } else { /* between two accelerators: through the host */
    exec_buffer *h = buffer_new(src->bytes, 0, 0, what);
    rc = !h || buffer_download(src, h->ptr, src->bytes) || buffer_upload(b, h->ptr, src->bytes);
    buffer_release(h);
  }
  if (rc) {
    buffer_release(b);
    return NULL;
  }
  return b;
}
