/* C API: creation, queries, sync, configuration and shutdown. */
#include "api.h"
#include "device.h"
#include "loc.h"
#include "trace.h"
#include "../graph/graph.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

graft_tensor *api_node(ir_node *n) {
  if (!n) return NULL;
  metrics.m.nodes_traced++;
  graft_tensor *t = tensor_wrap(n);
  if (t && ir_pending_count() > tensor_max_pending()) {
    metrics.m.auto_syncs++;
    if (api_step_locked() != GRAFT_OK) {
      /* The graph could not run; t stays valid for the caller to release, but report it. */
      return t;
    }
  }
  return t;
}

ir_node *api_in(const graft_tensor *t, const char *fn) {
  tensor_slot *c = tensor_check(t, fn);
  return c ? c->node : NULL;
}

int api_axis(const char *fn, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim) {
    err_set(GRAFT_ERR_AXIS, "%s: axis %d out of range for %d dims", fn, axis, ndim);
    return -1;
  }
  return a;
}

ir_node *api_scalar_node(double value, graft_dtype dt, int device) {
  exec_buffer *b = buffer_new(graft_dtype_size(dt), device, 0, "scalar");
  if (!b) return NULL;
  unsigned char host[16];
  dtype_store(host, dt, 0, value);
  if (buffer_upload(b, host, b->bytes)) {
    buffer_release(b);
    return NULL;
  }
  metrics.m.transfers_to_device++;
  metrics.m.bytes_to_device += b->bytes;
  ir_node *n = ir_make_data(b, dt, 0, NULL, device);
  buffer_release(b);
  return n;
}

static int check_dtype(const char *fn, graft_dtype dt) {
  if (dtype_valid(dt)) return 0;
  err_set(GRAFT_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dt);
  return -1;
}

static int check_device(const char *fn, int device) {
  if (device_valid(device)) return 0;
  char list[256];
  err_set(GRAFT_ERR_DEVICE, "%s: no device %d (devices: %s)", fn, device,
          device_list_str(list, sizeof list));
  return -1;
}

int graft_device_count(void) { return device_count(); }

int graft_device_find(const char *kind, int ordinal) {
  if (!kind) return err_set(GRAFT_ERR_NULL, "graft_device_find: kind is NULL"), -1;
  for (int i = 0; i < device_count(); i++) {
    const device_info *d = device_get(i);
    if (!strcmp(d->kind, kind) && d->ordinal == ordinal) return i;
  }
  char list[256];
  const char *why = device_absent(kind);
  char fewer[64];
  int have = 0;
  for (int i = 0; i < device_count(); i++) have += !strcmp(device_get(i)->kind, kind);
  snprintf(fewer, sizeof fewer, "%d %s device%s listed", have, kind, have == 1 ? "" : "s");
  int known = strcmp(kind, "cpu") && strcmp(kind, "opencl") && strcmp(kind, "cuda");
  err_set(GRAFT_ERR_DEVICE, "graft_device_find: no %s device %d (%s; devices: %s)", kind, ordinal,
          known ? "kinds are cpu, opencl, cuda"
          : !strcmp(kind, "cpu") ? "cpu devices are 0..3"
          : why ? why : fewer,
          device_list_str(list, sizeof list));
  return -1;
}

const char *graft_device_absent(const char *kind) {
  if (!kind) return err_set(GRAFT_ERR_NULL, "graft_device_absent: kind is NULL"), NULL;
  return device_absent(kind);
}

const char *graft_device_kind(int device) {
  const device_info *d = device_get(device);
  return d ? d->kind : NULL;
}

const char *graft_device_name(int device) {
  const device_info *d = device_get(device);
  return d ? d->name : NULL;
}

size_t graft_device_memory(int device) {
  const device_info *d = device_get(device);
  return d ? d->memory : 0;
}

graft_tensor *graft_from_host(const void *data, graft_dtype dt, int ndim, const int64_t *shape,
                              int device) {
  const char *fn = "graft_from_host";
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  if (ndim < 0 || ndim > GRAFT_MAX_DIMS)
    return err_set(GRAFT_ERR_SHAPE, "%s: ndim %d out of range [0, %d]", fn, ndim, GRAFT_MAX_DIMS);
  if (ndim && !shape) return err_set(GRAFT_ERR_NULL, "%s: shape is NULL", fn);
  int64_t numel = ir_numel(ndim, shape);
  if (numel < 0) return err_set(GRAFT_ERR_SHAPE, "%s: invalid shape (negative or too large)", fn);
  if (numel && !data) return err_set(GRAFT_ERR_NULL, "%s: data is NULL", fn);
  tensor_lock();
  size_t bytes = (size_t)numel * graft_dtype_size(dt);
  exec_buffer *b = buffer_new(bytes, device, 0, fn);
  graft_tensor *t = NULL;
  if (b && !buffer_upload(b, data, bytes)) {
    metrics.m.transfers_to_device++;
    metrics.m.bytes_to_device += bytes;
    t = tensor_wrap(ir_make_data(b, dt, ndim, shape, device));
  }
  buffer_release(b);
  tensor_unlock();
  return t;
}

graft_tensor *graft_from_host_borrowed(void *data, graft_dtype dt, int ndim, const int64_t *shape,
                                       int device, void (*release)(void *ctx), void *ctx) {
  const char *fn = "graft_from_host_borrowed";
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  if (!device_is_host(device)) {
    char d[64];
    return err_set(GRAFT_ERR_DEVICE, "%s: %s is not a host device (graft_from_host copies to it)", fn,
                   device_str(device, d, sizeof d));
  }
  if (ndim < 0 || ndim > GRAFT_MAX_DIMS)
    return err_set(GRAFT_ERR_SHAPE, "%s: ndim %d out of range [0, %d]", fn, ndim, GRAFT_MAX_DIMS);
  if (ndim && !shape) return err_set(GRAFT_ERR_NULL, "%s: shape is NULL", fn);
  if (!release) return err_set(GRAFT_ERR_NULL, "%s: release is NULL", fn);
  int64_t numel = ir_numel(ndim, shape);
  if (numel < 0) return err_set(GRAFT_ERR_SHAPE, "%s: invalid shape (negative or too large)", fn);
  if (!data) return err_set(GRAFT_ERR_NULL, "%s: data is NULL", fn);
  if ((uintptr_t)data % 64)
    return err_set(GRAFT_ERR_ARG, "%s: data %p is not 64-byte aligned (graft_from_host copies it)", fn, data);
  tensor_lock();
  exec_buffer *b = buffer_borrow(data, (size_t)numel * graft_dtype_size(dt), device, release, ctx);
  graft_tensor *t = NULL;
  if (b) {
    t = tensor_wrap(ir_make_data(b, dt, ndim, shape, device));
    if (!t) b->release = NULL, b->ptr = NULL, b->bytes = 0; /* nothing taken: the record alone goes */
  }
  buffer_release(b);
  tensor_unlock();
  return t;
}

/* The creators below each have a cpu:0 form (the original API) and an _on form taking the
 * device; both share one body that names the function the user called in its errors. */

static graft_tensor *scalar_on(const char *fn, double value, graft_dtype dt, int device) {
  unsigned mark = err_count();
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  tensor_lock();
  graft_tensor *t = tensor_wrap(api_scalar_node(value, dt, device));
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_scalar(double value, graft_dtype dt) {
  return scalar_on("graft_scalar", value, dt, 0);
}

graft_tensor *graft_scalar_on(double value, graft_dtype dt, int device) {
  return scalar_on("graft_scalar_on", value, dt, device);
}

static graft_tensor *full_on(const char *fn, double value, graft_dtype dt, int ndim,
                             const int64_t *shape, int device) {
  unsigned mark = err_count();
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  ir_attrs at = {.f = value};
  tensor_lock();
  graft_tensor *t = api_node(ir_make_on(IR_CONSTANT, 0, NULL, &at, dt, ndim, shape, device));
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_full(double value, graft_dtype dt, int ndim, const int64_t *shape) {
  return full_on("graft_full", value, dt, ndim, shape, 0);
}

graft_tensor *graft_full_on(double value, graft_dtype dt, int ndim, const int64_t *shape,
                            int device) {
  return full_on("graft_full_on", value, dt, ndim, shape, device);
}

graft_tensor *graft_zeros(graft_dtype dt, int ndim, const int64_t *shape) {
  return full_on("graft_zeros", 0, dt, ndim, shape, 0);
}

graft_tensor *graft_zeros_on(graft_dtype dt, int ndim, const int64_t *shape, int device) {
  return full_on("graft_zeros_on", 0, dt, ndim, shape, device);
}

graft_tensor *graft_ones(graft_dtype dt, int ndim, const int64_t *shape) {
  return full_on("graft_ones", 1, dt, ndim, shape, 0);
}

graft_tensor *graft_ones_on(graft_dtype dt, int ndim, const int64_t *shape, int device) {
  return full_on("graft_ones_on", 1, dt, ndim, shape, device);
}

static graft_tensor *iota_on(const char *fn, graft_dtype dt, int ndim, const int64_t *shape,
                             int axis, int device) {
  unsigned mark = err_count();
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  if (ndim < 1 || ndim > GRAFT_MAX_DIMS)
    return err_set(GRAFT_ERR_SHAPE, "%s: ndim %d out of range [1, %d]", fn, ndim, GRAFT_MAX_DIMS);
  int ax = api_axis(fn, axis, ndim);
  if (ax < 0) return NULL;
  ir_attrs at = {.a[IR_ATTR_AXIS_axis] = ax};
  tensor_lock();
  graft_tensor *t = api_node(ir_make_on(IR_IOTA, 0, NULL, &at, dt, ndim, shape, device));
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_iota(graft_dtype dt, int ndim, const int64_t *shape, int axis) {
  return iota_on("graft_iota", dt, ndim, shape, axis, 0);
}

graft_tensor *graft_iota_on(graft_dtype dt, int ndim, const int64_t *shape, int axis,
                            int device) {
  return iota_on("graft_iota_on", dt, ndim, shape, axis, device);
}

static uint64_t rng_state = 0x853c49e6748fea9bull, rng_counter;

void graft_manual_seed(uint64_t seed) {
  tensor_lock();
  rng_state = seed;
  rng_counter = 0;
  tensor_unlock();
}

ir_node *api_rng_seed(int device) {
  uint64_t z = rng_state + 0x9e3779b97f4a7c15ull * ++rng_counter;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  ir_node *seed = api_scalar_node(0, GRAFT_I64, device);
  int64_t zz = (int64_t)z;
  if (seed && buffer_upload(seed->data, &zz, sizeof zz)) {
    ir_release(seed);
    return NULL;
  }
  return seed;
}

/* Each draw gets a fresh seed as a parameter, so a loop that draws every step compiles once. */
static graft_tensor *rand_draw(const char *fn, int dist, graft_dtype dt, int ndim,
                               const int64_t *shape, int device) {
  unsigned mark = err_count();
  if (check_dtype(fn, dt) || check_device(fn, device)) return NULL;
  tensor_lock();
  ir_node *seed = api_rng_seed(device);
  graft_tensor *t = NULL;
  if (seed) {
    ir_attrs at = {.a[IR_ATTR_RNG_dist] = dist};
    t = api_node(ir_make(IR_RNG, 1, &seed, &at, dt, ndim, shape));
    ir_release(seed);
  }
  tensor_unlock();
  return err_named(t, mark, fn);
}

graft_tensor *graft_rand_uniform(graft_dtype dt, int ndim, const int64_t *shape) {
  return rand_draw("graft_rand_uniform", 0, dt, ndim, shape, 0);
}

graft_tensor *graft_rand_uniform_on(graft_dtype dt, int ndim, const int64_t *shape, int device) {
  return rand_draw("graft_rand_uniform_on", 0, dt, ndim, shape, device);
}

graft_tensor *graft_rand_normal(graft_dtype dt, int ndim, const int64_t *shape) {
  return rand_draw("graft_rand_normal", 1, dt, ndim, shape, 0);
}

graft_tensor *graft_rand_normal_on(graft_dtype dt, int ndim, const int64_t *shape, int device) {
  return rand_draw("graft_rand_normal_on", 1, dt, ndim, shape, device);
}

graft_tensor *graft_to_device(graft_tensor *t, int device) {
  const char *fn = "graft_to_device";
  tensor_lock();
  graft_tensor *r = NULL;
  tensor_slot *s = tensor_check(t, fn);
  if (s && !check_device(fn, device) && exec_read_locked(&s, 1) == GRAFT_OK &&
      async_wait_buffer(s->node->data, fn) == GRAFT_OK) {
    ir_node *n = s->node;
    exec_buffer *b = buffer_to_device(n->data, device, fn);
    if (b) {
      metrics.m.transfers_to_device++;
      metrics.m.bytes_to_device += b->bytes;
      r = tensor_wrap(ir_make_data(b, n->dtype, n->ndim, n->shape, device));
      buffer_release(b);
    }
  }
  tensor_unlock();
  return r;
}

/* dst takes src's value: its slot holds src's node from now on (what an in-place update is
 * for a lazy tensor). dst's old value stays with whatever already reads it; a buffer only the
 * pending graph still reads is donated to it at the sync (an optimizer's old parameters). */
graft_status graft_assign(graft_tensor *dst, graft_tensor *src) {
  const char *fn = "graft_assign";
  tensor_lock();
  tensor_slot *d = tensor_check(dst, fn);
  tensor_slot *s = d ? tensor_check(src, fn) : NULL;
  graft_status st = GRAFT_OK;
  if (!s) {
    st = graft_last_status();
  } else if (d->node != s->node) {
    ir_node *a = d->node, *b = s->node;
    char x[128], y[128];
    if (a->dtype != b->dtype || a->device != b->device || a->ndim != b->ndim ||
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim)) {
      err_set(GRAFT_ERR_SHAPE, "%s: dst is %s %s on device %d, src %s %s on device %d", fn,
                   graft_dtype_name(a->dtype), ir_shape_str(a->ndim, a->shape, x, sizeof x),
                   a->device, graft_dtype_name(b->dtype), ir_shape_str(b->ndim, b->shape, y, sizeof y),
                   b->device);
      st = GRAFT_ERR_SHAPE;
    } else {
      ir_retain(b);
      tensor_set_node(d, b);
    }
  }
  tensor_unlock();
  return st;
}

/* ---- queries ---- */
#define QUERY(expr, bad)                   \
  tensor_lock();                            \
  ir_node *n = api_in(t, __func__);        \
  __typeof__(bad) r = n ? (expr) : (bad);  \
  tensor_unlock();                          \
  return r;

int graft_ndim(const graft_tensor *t) { QUERY(n->ndim, -1) }
int64_t graft_numel(const graft_tensor *t) { QUERY(n->numel, (int64_t)-1) }
graft_dtype graft_get_dtype(const graft_tensor *t) { QUERY(n->dtype, GRAFT_NDTYPES) }
int graft_device(const graft_tensor *t) { QUERY(n->device, -1) }
bool graft_is_pending(const graft_tensor *t) { QUERY(n->op != IR_DATA, false) }

int graft_shape(const graft_tensor *t, int64_t *out) {
  if (!out) return err_set(GRAFT_ERR_NULL, "graft_shape: out is NULL"), -1;
  tensor_lock();
  ir_node *n = api_in(t, __func__);
  if (n) memcpy(out, n->shape, sizeof(int64_t) * (size_t)n->ndim);
  int r = n ? n->ndim : -1;
  tensor_unlock();
  return r;
}

int64_t graft_dim(const graft_tensor *t, int axis) {
  tensor_lock();
  ir_node *n = api_in(t, __func__);
  int ax = n ? api_axis(__func__, axis, n->ndim) : -1;
  int64_t r = ax >= 0 ? n->shape[ax] : -1;
  tensor_unlock();
  return r;
}

/* ---- sync ---- */
graft_status api_step_locked(void) { return exec_step_locked(); }

graft_status graft_step(void) {
  tensor_lock();
  uint64_t before = async_last_seq();
  graft_status st = api_step_locked();
  if (st == GRAFT_OK) st = async_take_failure("graft_step", before); /* an earlier step's */
  tensor_unlock();
  return st;
}

/* The slots of n handles (lock held), or NULL with the error set; free() it. */
static tensor_slot **decode_list(graft_tensor *const *ts, int n, const char *fn) {
  if (n < 0) return err_set(GRAFT_ERR_ARG, "%s: negative count %d", fn, n);
  if (n && !ts) return err_set(GRAFT_ERR_NULL, "%s: tensor array is NULL", fn);
  tensor_slot **s = malloc(sizeof *s * ((size_t)n + 1));
  if (!s) return err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
  for (int i = 0; i < n; i++)
    if (!(s[i] = tensor_check(ts[i], fn))) {
      free(s);
      return NULL;
    }
  return s;
}

graft_status graft_sync(graft_tensor *const *ts, int n) {
  tensor_lock();
  tensor_slot **s = decode_list(ts, n, "graft_sync");
  uint64_t before = async_last_seq();
  graft_status st = s ? exec_sync_locked(s, n) : graft_last_status();
  if (st == GRAFT_OK) st = async_take_failure("graft_sync", before); /* an earlier step's */
  free(s);
  tensor_unlock();
  return st;
}

/* Syncs t (lock held) and returns its data leaf, its data computed; or NULL with the error
 * set. */
static ir_node *sync_one(graft_tensor *t, const char *fn) {
  tensor_slot *s = tensor_check(t, fn);
  if (!s || exec_read_locked(&s, 1) != GRAFT_OK || async_wait_buffer(s->node->data, fn))
    return NULL;
  return s->node;
}

graft_status graft_to_host(graft_tensor *t, void *dst, size_t bytes) {
  const char *fn = "graft_to_host";
  tensor_lock();
  ir_node *n = sync_one(t, fn);
  graft_status st = n ? GRAFT_OK : graft_last_status();
  if (n) {
    size_t need = (size_t)n->numel * graft_dtype_size(n->dtype);
    char shp[128];
    if (bytes != need) {
      err_set(GRAFT_ERR_ARG, "%s: destination holds %zu bytes, tensor %s%s needs %zu", fn,
              bytes, graft_dtype_name(n->dtype), ir_shape_str(n->ndim, n->shape, shp, sizeof shp),
              need);
      st = GRAFT_ERR_ARG;
    } else if (need && !dst) {
      err_set(GRAFT_ERR_NULL, "%s: destination is NULL", fn);
      st = GRAFT_ERR_NULL;
    } else {
      if (buffer_download(n->data, dst, need)) st = graft_last_status();
      metrics.m.transfers_to_host++;
      metrics.m.bytes_to_host += need;
    }
  }
  tensor_unlock();
  return st;
}

/* The handle of a host view is the buffer itself, retained. */
const void *graft_host_view(graft_tensor *t, graft_host_ref **ref, int *shared) {
  const char *fn = "graft_host_view";
  if (!ref) return err_set(GRAFT_ERR_NULL, "%s: ref is NULL", fn);
  *ref = NULL;
  if (shared) *shared = 0;
  tensor_lock();
  ir_node *n = sync_one(t, fn);
  const void *p = NULL;
  if (n && !device_is_host(n->device)) {
    char d[64];
    err_set(GRAFT_ERR_DEVICE, "%s: the tensor is on %s, not in host memory (graft_to_host copies "
            "it)", fn, device_str(n->device, d, sizeof d));
  } else if (n) {
    static const char empty[64];
    /* other tensors of this value, or other values over its buffer (a reshape's output) */
    if (shared) /* borrowed memory is its owner's: a view of it would alias their tensor */
      *shared = __atomic_load_n(&n->refcnt, __ATOMIC_ACQUIRE) > 1 || buffer_refs(n->data) > 1 || n->data->release;
    buffer_retain(n->data); /* a buffer with another reference is never donated (exec.c) */
    *ref = (graft_host_ref *)n->data;
    p = n->data->ptr ? n->data->ptr : empty;
  }
  tensor_unlock();
  return p;
}

void graft_host_ref_release(graft_host_ref *ref) { buffer_release((exec_buffer *)ref); }

graft_status graft_item(graft_tensor *t, double *out) {
  const char *fn = "graft_item";
  tensor_lock();
  ir_node *n = sync_one(t, fn);
  graft_status st = n ? GRAFT_OK : graft_last_status();
  if (n && n->numel != 1) {
    char shp[128];
    err_set(GRAFT_ERR_SHAPE, "%s: tensor %s has %lld elements, not 1", fn,
            ir_shape_str(n->ndim, n->shape, shp, sizeof shp), (long long)n->numel);
    st = GRAFT_ERR_SHAPE;
  } else if (n && !out) {
    err_set(GRAFT_ERR_NULL, "%s: out is NULL", fn);
    st = GRAFT_ERR_NULL;
  } else if (n) {
    unsigned char host[16];
    if (buffer_download(n->data, host, graft_dtype_size(n->dtype))) st = graft_last_status();
    else *out = dtype_load(host, n->dtype, 0);
    metrics.m.transfers_to_host++;
    metrics.m.bytes_to_host += graft_dtype_size(n->dtype);
  }
  tensor_unlock();
  return st;
}

void graft_set_memory_limit(size_t bytes) { buffer_set_limit(bytes); }

/* After the queued steps: a step that has published its outputs still releases its
 * intermediates, into the pool this empties (test_core's pool check saw them come back). */
void graft_empty_cache(void) {
  async_drain();
  buffer_pool_trim();
}

void graft_shutdown(void) {
  async_shutdown(); /* runs what is queued: the executables must outlive it */
  tier_shutdown();
  trace_shutdown(); /* a trace being recorded is written (its last steps and compiles ran) */
  tensor_lock();
  tensor_free_all();
  cache_clear();
  graph_backends_shutdown(); /* after the graphs: their code may live in a backend's objects */
  exec_shutdown();
  buffer_pool_trim();
  tensor_unlock();
  loc_free_all();
}
