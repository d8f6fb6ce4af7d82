/* A function as a file (graft_save / graft_load): a model traced once (from PyTorch by
 * graft.export, or by a C program) run later by a program that has only libgraft.
 *
 * Format, version 2 (version 1: the same without the names), little-endian:
 *   header, 64 bytes: magic "GRAFTFN\0"; u32 version; u32 inputs; u32 outputs; u32 entries;
 *     u32 constants; u32 0; u64 metadata bytes; u64 data bytes; u32 metadata CRC-32 (zlib's);
 *     u32 0; u32 CRC-32 of the header's first 56 bytes; u32 0.
 *   metadata: per input u32 dtype, u32 ndim, u32 same (the first input that was the same
 *     tensor), i64 shape[ndim]; per output u32 entry; per entry u32 kind (0 op, 1 input,
 *     2 constant, 3 random seed), u32 dtype, u32 ndim, i64 shape[ndim], then for an op u32 name
 *     length, the name (ops.def's, so a renumbered op table still reads), u32 attribute count,
 *     i64 attributes, f64 attribute, u32 operand count, u32 operands (earlier entries); for an
 *     input u32 its index; for a constant u32 its index; then u32 order[entries] (the order to
 *     make them in); per constant u64 offset (from the data's start, 64-byte aligned),
 *     u64 bytes, u32 CRC-32; per output u32 name length (0: unnamed) and the name's bytes
 *     (graft_function_set_output_name; graft_save_tensors names every output).
 *   data: from the first 64-byte boundary after the metadata, the constants' bytes.
 * graft_load checks all of it (sizes against the file's, checksums, indices, op names) and then
 * makes every op once through the checked constructor, comparing the dtype and shape it infers
 * with the recorded ones: a file that does not describe a valid graph is refused at load. */
#include "function.h"
#include "../core/device.h"
#include "../core/dtype.h"
#include "../graph/graph.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define FF_MAGIC "GRAFTFN"
#define FF_VERSION 2u
#define FF_HEADER 64
#define FF_ALIGN 64

/* ---- writing ---- */

typedef struct {
  unsigned char *p;
  size_t n, cap;
  bool oom;
} ff_buf;

/* Room for n more bytes; false (and b->oom) when there is none. */
static bool ff_room(ff_buf *b, size_t n) {
  if (b->oom) return false;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->n + n) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return b->oom = true, false;
    b->p = p, b->cap = cap;
  }
  return true;
}

static void ff_put(ff_buf *b, const void *v, size_t n) {
  if (!ff_room(b, n)) return;
  memcpy(b->p + b->n, v, n);
  b->n += n;
}

static void ff_u32(ff_buf *b, uint32_t v) { ff_put(b, &v, 4); }
static void ff_i64(ff_buf *b, int64_t v) { ff_put(b, &v, 8); }
static void ff_u64(ff_buf *b, uint64_t v) { ff_put(b, &v, 8); }

static void ff_shape(ff_buf *b, graft_dtype dt, int ndim, const int64_t *shape) {
  ff_u32(b, (uint32_t)dt), ff_u32(b, (uint32_t)ndim);
  for (int d = 0; d < ndim; d++) ff_i64(b, shape[d]);
}

static uint32_t ff_crc(const void *p, size_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const unsigned char *s = p;
  while (n) { /* zlib's length is a uInt */
    uInt k = n > (1u << 30) ? 1u << 30 : (uInt)n;
    c = crc32(c, s, k);
    s += k, n -= k;
  }
  return (uint32_t)c;
}

static size_t ff_round(size_t n) { return (n + FF_ALIGN - 1) / FF_ALIGN * FF_ALIGN; }

/* Grows b by n zero bytes; their start, or NULL out of memory. */
static unsigned char *ff_grow(ff_buf *b, size_t n) {
  if (!ff_room(b, n)) return NULL;
  unsigned char *at = b->p ? b->p + b->n : NULL;
  if (n) memset(at, 0, n);
  b->n += n;
  return at;
}

/* The constants' bytes, read from their buffers into data at 64-aligned offsets, and their
 * table (offset, bytes, CRC) into meta; -1 with the error set. */
static int ff_constants(const graft_function *f, ff_buf *meta, ff_buf *data) {
  for (int i = 0; i < f->n; i++) {
    const fn_entry *e = &f->tape[i];
    if (e->kind != FN_CONST) continue;
    size_t bytes = (size_t)e->leaf->numel * graft_dtype_size(e->dtype);
    ff_grow(data, ff_round(data->n) - data->n);
    size_t at = data->n;
    unsigned char *dst = ff_grow(data, bytes);
    if (data->oom) return err_set(GRAFT_ERR_OOM, "graft_save: out of memory"), -1;
    /* a constant made by a queued step: its bytes once that step has run (its failure, if any) */
    if (async_wait_buffer(e->leaf->data, "graft_save")) return -1;
    if (bytes && buffer_download(e->leaf->data, dst, bytes)) return -1;
    ff_u64(meta, at), ff_u64(meta, bytes), ff_u32(meta, bytes ? ff_crc(dst, bytes) : ff_crc(NULL, 0));
  }
  return 0;
}

/* The metadata of f (without the constants' table). */
static int ff_meta(const graft_function *f, ff_buf *b, int *nconst) {
  for (int k = 0; k < f->nin; k++) {
    const fn_entry *s = &f->in_sig[k];
    ff_shape(b, s->dtype, s->ndim, s->shape);
    ff_u32(b, (uint32_t)f->same[k]);
  }
  for (int k = 0; k < f->nout; k++) ff_u32(b, (uint32_t)f->out[k]);
  *nconst = 0;
  for (int i = 0; i < f->n; i++) {
    const fn_entry *e = &f->tape[i];
    ff_u32(b, (uint32_t)e->kind);
    ff_shape(b, e->dtype, e->ndim, e->shape);
    switch (e->kind) {
    case FN_OP: {
      const char *name = ir_ops[e->op].name;
      if (e->op == IR_HOST_CALL || ir_ops[e->op].kind == IR_K_COLLECTIVE) {
        err_set(GRAFT_ERR_ARG, "graft_save: the function calls %s (a host function or a "
                "collective belongs to this process): it cannot be saved", name);
        return -1;
      }
      ff_u32(b, (uint32_t)strlen(name)), ff_put(b, name, strlen(name));
      ff_u32(b, IR_MAX_ATTRS);
      for (int a = 0; a < IR_MAX_ATTRS; a++) ff_i64(b, e->attr.a[a]);
      ff_put(b, &e->attr.f, 8);
      ff_u32(b, (uint32_t)e->nin);
      for (int k = 0; k < e->nin; k++) ff_u32(b, (uint32_t)f->operand[e->in0 + k]);
      break;
    }
    case FN_PARAM: ff_u32(b, (uint32_t)e->param); break;
    case FN_CONST: ff_u32(b, (uint32_t)(*nconst)++); break;
    case FN_SEED: break;
    }
  }
  for (int j = 0; j < f->n; j++) ff_u32(b, (uint32_t)f->order[j]);
  return 0;
}

static int ff_write(const char *path, const ff_buf *meta, const ff_buf *data, int nconst,
                    const graft_function *f) {
  unsigned char h[FF_HEADER] = {0};
  memcpy(h, FF_MAGIC, 8);
  uint32_t u[6] = {FF_VERSION, (uint32_t)f->nin, (uint32_t)f->nout, (uint32_t)f->n, (uint32_t)nconst, 0};
  memcpy(h + 8, u, sizeof u);
  uint64_t sizes[2] = {meta->n, data->n};
  memcpy(h + 32, sizes, sizeof sizes);
  uint32_t mc = ff_crc(meta->p, meta->n), hc;
  memcpy(h + 48, &mc, 4);
  hc = ff_crc(h, 56);
  memcpy(h + 56, &hc, 4);
  size_t pad = ff_round(FF_HEADER + meta->n) - (FF_HEADER + meta->n);
  static const unsigned char zero[FF_ALIGN];
  /* written beside the target and renamed over it: a failed write leaves no partial file */
  size_t plen = strlen(path) + 16;
  char *tmp = malloc(plen);
  if (!tmp) { err_set(GRAFT_ERR_OOM, "graft_save: out of memory"); return -1; }
  snprintf(tmp, plen, "%s.tmp", path);
  FILE *fp = fopen(tmp, "wb");
  bool ok = fp && fwrite(h, 1, FF_HEADER, fp) == FF_HEADER &&
            fwrite(meta->p, 1, meta->n, fp) == meta->n && fwrite(zero, 1, pad, fp) == pad &&
            (data->n == 0 || fwrite(data->p, 1, data->n, fp) == data->n);
  int why = errno;
  if (fp && fclose(fp) && ok) ok = false, why = errno;
  if (ok && rename(tmp, path)) ok = false, why = errno;
  if (!ok) {
    if (fp) remove(tmp);
    err_set(GRAFT_ERR_FILE, "graft_save: cannot write %s: %s", path, strerror(why));
  }
  free(tmp);
  return ok ? 0 : -1;
}

graft_status graft_save(const graft_function *f, const char *path) {
  if (!f || !path) {
    err_set(GRAFT_ERR_NULL, "graft_save: the function or the path is NULL");
    return GRAFT_ERR_NULL;
  }
  graft_status st;
  tensor_lock();
  ff_buf meta = {0}, data = {0};
  int nconst = 0;
  int rc = ff_meta(f, &meta, &nconst);
  if (!rc) rc = ff_constants(f, &meta, &data);
  for (int k = 0; !rc && k < f->nout; k++) {
    const char *name = f->out_name ? f->out_name[k] : NULL;
    size_t len = name ? strlen(name) : 0;
    ff_u32(&meta, (uint32_t)len);
    if (len) ff_put(&meta, name, len);
  }
  if (!rc && (meta.oom || data.oom)) rc = -1, err_set(GRAFT_ERR_OOM, "graft_save: out of memory");
  if (!rc) rc = ff_write(path, &meta, &data, nconst, f);
  free(meta.p);
  free(data.p);
  st = rc ? (graft_last_status() ? graft_last_status() : GRAFT_ERR_INTERNAL) : GRAFT_OK;
  tensor_unlock();
  return st;
}

/* ---- reading ---- */

typedef struct {
  const unsigned char *p;
  size_t n, at;
  bool bad; /* read past the end */
} ff_cur;

static uint32_t ff_get_u32(ff_cur *c) {
  uint32_t v = 0;
  if (c->at + 4 > c->n) c->bad = true; else memcpy(&v, c->p + c->at, 4), c->at += 4;
  return v;
}

static int64_t ff_get_i64(ff_cur *c) {
  int64_t v = 0;
  if (c->at + 8 > c->n) c->bad = true; else memcpy(&v, c->p + c->at, 8), c->at += 8;
  return v;
}

typedef struct {
  const char *path;
  graft_function *f;
  uint64_t (*cons)[3]; /* per constant: offset, bytes, crc */
  int nconst;
  uint32_t version;
} ff_load;

static void *ff_fail(const ff_load *L, const char *fmt, const char *what) {
  char msg[600];
  snprintf(msg, sizeof msg, fmt, what ? what : "");
  return err_set(GRAFT_ERR_FILE, "graft_load: %s: %s", L->path, msg);
}

/* dtype, ndim and shape; false when out of range. */
static bool ff_get_shape(ff_cur *c, graft_dtype *dt, int *ndim, int64_t *shape) {
  uint32_t d = ff_get_u32(c), nd = ff_get_u32(c);
  if (c->bad || d >= GRAFT_NDTYPES || nd > GRAFT_MAX_DIMS) return false;
  *dt = (graft_dtype)d, *ndim = (int)nd;
  for (int k = 0; k < *ndim; k++)
    if ((shape[k] = ff_get_i64(c)) < 0) return false;
  return !c->bad && ir_numel(*ndim, shape) >= 0;
}

static int ff_op_named(const char *name, size_t len) {
  for (int op = 0; op < IR_OP_COUNT; op++)
    if (strlen(ir_ops[op].name) == len && !memcmp(ir_ops[op].name, name, len)) return op;
  return -1;
}

/* Entry i's fields after its kind; false (with the error set) when out of range. */
static bool ff_get_entry(ff_load *L, ff_cur *c, int i, int *at, int device) {
  graft_function *f = L->f;
  fn_entry *e = &f->tape[i];
  uint32_t kind = ff_get_u32(c);
  e->param = -1, e->device = device, e->in0 = *at;
  if (kind > FN_SEED || !ff_get_shape(c, &e->dtype, &e->ndim, e->shape))
    return ff_fail(L, "entry has an invalid kind, dtype or shape (a corrupted file)", NULL), false;
  e->kind = (fn_kind)kind;
  e->op = IR_DATA;
  if (e->kind == FN_SEED && (e->dtype != GRAFT_I64 || e->ndim != 0))
    return ff_fail(L, "a random seed entry is not a 0-d i64 (a corrupted file)", NULL), false;
  if (e->kind == FN_PARAM) {
    uint32_t k = ff_get_u32(c);
    const fn_entry *s = &f->in_sig[k < (uint32_t)f->nin ? k : 0];
    if (k >= (uint32_t)f->nin || s->dtype != e->dtype || s->ndim != e->ndim ||
        memcmp(s->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim))
      return ff_fail(L, "an input entry does not match the inputs (a corrupted file)", NULL), false;
    e->param = (int)k;
  } else if (e->kind == FN_CONST) {
    uint32_t k = ff_get_u32(c);
    if (k >= (uint32_t)L->nconst) return ff_fail(L, "a constant index is out of range", NULL), false;
    e->param = (int)k; /* the constant's index until it is made */
  } else if (e->kind == FN_OP) {
    uint32_t len = ff_get_u32(c);
    if (c->bad || len > 64 || c->at + len > c->n) return ff_fail(L, "an op name is cut", NULL), false;
    char name[65];
    memcpy(name, c->p + c->at, len), name[len] = 0, c->at += len;
    int op = ff_op_named(name, len);
    if (op < 0 || op == IR_DATA || op == IR_HOST_CALL || ir_ops[op].kind == IR_K_COLLECTIVE)
      return ff_fail(L, "op '%s' is not one this graft can load (written by another version?)", name), false;
    e->op = (ir_op)op;
    uint32_t na = ff_get_u32(c);
    if (na > IR_MAX_ATTRS) return ff_fail(L, "an op has more attributes than this graft's ops take", NULL), false;
    for (uint32_t a = 0; a < na; a++) e->attr.a[a] = ff_get_i64(c);
    int64_t fb = ff_get_i64(c);
    memcpy(&e->attr.f, &fb, 8);
    uint32_t nin = ff_get_u32(c);
    if (c->bad || nin > (uint32_t)i || *at + (int64_t)nin > f->noperand)
      return ff_fail(L, "an op has more operands than the file holds", NULL), false;
    e->nin = (int)nin;
    for (int k = 0; k < e->nin; k++) {
      uint32_t o = ff_get_u32(c);
      if (o >= (uint32_t)i) return ff_fail(L, "an operand is not an earlier entry", NULL), false;
      f->operand[(*at)++] = (int)o;
    }
  }
  if (c->bad) return ff_fail(L, "the metadata ends inside an entry", NULL), false;
  return true;
}

/* The whole file in memory; NULL with the error set. */
static unsigned char *ff_read_file(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return err_set(GRAFT_ERR_FILE, "graft_load: cannot open %s: %s", path, strerror(errno));
  unsigned char *p = NULL;
  long len = -1;
  if (!fseek(fp, 0, SEEK_END)) len = ftell(fp);
  if (len >= 0 && !fseek(fp, 0, SEEK_SET) && (p = malloc((size_t)len + 1)) &&
      fread(p, 1, (size_t)len, fp) == (size_t)len) {
    fclose(fp);
    *n = (size_t)len;
    return p;
  }
  int why = ferror(fp) ? errno : 0;
  fclose(fp);
  if (len >= 0 && !p) return err_set(GRAFT_ERR_OOM, "graft_load: %s: out of memory for %ld bytes", path, len);
  free(p);
  return err_set(GRAFT_ERR_FILE, "graft_load: cannot read %s: %s", path,
                 why ? strerror(why) : "the file ended early (changed while read?)");
}

/* The header's counts and sizes against the file's; the metadata's cursor. */
static bool ff_header(ff_load *L, const unsigned char *p, size_t n, ff_cur *meta, size_t *data_at,
                      uint32_t cnt[4]) {
  if (n < 8 || memcmp(p, FF_MAGIC, 8))
    return ff_fail(L, "not a graft function file (no GRAFTFN magic: written by graft_save or graft.export?)", NULL), false;
  if (n < FF_HEADER)
    return ff_fail(L, "truncated: the file ends inside its header", NULL), false;
  uint32_t version, hc, mc;
  uint64_t sizes[2];
  memcpy(&version, p + 8, 4), memcpy(cnt, p + 12, 16), memcpy(sizes, p + 32, 16);
  memcpy(&mc, p + 48, 4), memcpy(&hc, p + 56, 4);
  if (hc != ff_crc(p, 56)) return ff_fail(L, "corrupted: the header fails its checksum", NULL), false;
  if (version < 1 || version > FF_VERSION) {
    char v[64];
    snprintf(v, sizeof v, "%u (this graft reads versions 1 to %u)", version, FF_VERSION);
    return ff_fail(L, "written in format version %s", v), false;
  }
  uint64_t data_start = ff_round(FF_HEADER + sizes[0]);
  if (sizes[0] > n || data_start > n || sizes[1] > n - data_start) {
    char v[96];
    snprintf(v, sizeof v, "%zu bytes where the header says %llu", n,
             (unsigned long long)(data_start + sizes[1]));
    return ff_fail(L, "truncated: %s", v), false;
  }
  if (mc != ff_crc(p + FF_HEADER, sizes[0]))
    return ff_fail(L, "corrupted: the metadata fails its checksum", NULL), false;
  /* each input takes at least 12 bytes of metadata, an output 4, an entry 16 (with its place
   * in the order), a constant 20: counts the metadata cannot hold are refused before anything
   * is allocated for them */
  uint64_t least = (uint64_t)cnt[0] * 12 + (uint64_t)cnt[1] * (version > 1 ? 8 : 4) +
                   (uint64_t)cnt[2] * 16 + (uint64_t)cnt[3] * 20;
  if (cnt[2] == 0 || cnt[1] == 0 || cnt[3] > cnt[2] || least > sizes[0])
    return ff_fail(L, "the header's counts are out of range", NULL), false;
  *meta = (ff_cur){p + FF_HEADER, sizes[0], 0, false};
  *data_at = data_start;
  L->version = version;
  return true;
}

/* The outputs' names (version 2): each at most FN_NAME_MAX bytes, no NUL inside. */
static bool ff_get_names(ff_load *L, ff_cur *c) {
  graft_function *f = L->f;
  if (!(f->out_name = calloc((size_t)f->nout + 1, sizeof *f->out_name)))
    return err_set(GRAFT_ERR_OOM, "graft_load: %s: out of memory", L->path), false;
  for (int k = 0; k < f->nout; k++) {
    uint32_t len = ff_get_u32(c);
    if (c->bad || len > FN_NAME_MAX || len > c->n - c->at || memchr(c->p + c->at, 0, len))
      return ff_fail(L, "an output's name is invalid (a corrupted file)", NULL), false;
    if (len && !(f->out_name[k] = malloc(len + 1)))
      return err_set(GRAFT_ERR_OOM, "graft_load: %s: out of memory", L->path), false;
    if (len) memcpy(f->out_name[k], c->p + c->at, len), f->out_name[k][len] = 0;
    c->at += len;
  }
  return true;
}

/* Parses the metadata into L->f; false with the error set. */
static bool ff_parse(ff_load *L, ff_cur *c, const uint32_t cnt[4], int device) {
  graft_function *f = L->f;
  f->nin = (int)cnt[0], f->nout = (int)cnt[1], f->n = (int)cnt[2], L->nconst = (int)cnt[3];
  f->noperand = (int)(c->n / 4 + 1);
  f->in_sig = calloc((size_t)f->nin + 1, sizeof *f->in_sig);
  f->same = calloc((size_t)f->nin + 1, sizeof(int));
  f->out = calloc((size_t)f->nout + 1, sizeof(int));
  f->tape = calloc((size_t)f->n + 1, sizeof *f->tape);
  f->order = calloc((size_t)f->n + 1, sizeof(int));
  f->operand = calloc((size_t)f->noperand + 1, sizeof(int));
  L->cons = calloc((size_t)L->nconst + 1, sizeof *L->cons);
  if (!f->in_sig || !f->same || !f->out || !f->tape || !f->order || !f->operand || !L->cons)
    return err_set(GRAFT_ERR_OOM, "graft_load: %s: out of memory", L->path), false;
  for (int k = 0; k < f->nin; k++) {
    fn_entry *s = &f->in_sig[k];
    s->device = device;
    uint32_t same;
    if (!ff_get_shape(c, &s->dtype, &s->ndim, s->shape) || (same = ff_get_u32(c)) > (uint32_t)k)
      return ff_fail(L, "an input's dtype, shape or alias is invalid (a corrupted file)", NULL), false;
    f->same[k] = (int)same;
  }
  for (int k = 0; k < f->nout; k++)
    if ((uint32_t)(f->out[k] = (int)ff_get_u32(c)) >= (uint32_t)f->n)
      return ff_fail(L, "an output is not an entry", NULL), false;
  int at = 0;
  for (int i = 0; i < f->n; i++)
    if (!ff_get_entry(L, c, i, &at, device)) return false;
  f->noperand = at;
  for (int j = 0; j < f->n; j++) f->order[j] = (int)ff_get_u32(c);
  for (int k = 0; k < L->nconst; k++) {
    L->cons[k][0] = (uint64_t)ff_get_i64(c), L->cons[k][1] = (uint64_t)ff_get_i64(c);
    L->cons[k][2] = ff_get_u32(c);
  }
  if (L->version > 1 && !ff_get_names(L, c)) return false;
  if (c->bad || c->at != c->n) return ff_fail(L, "the metadata's length does not match its contents", NULL), false;
  return true;
}

/* order must be a permutation with each entry after its operands. */
static bool ff_check_order(ff_load *L) {
  graft_function *f = L->f;
  int *pos = malloc(sizeof(int) * ((size_t)f->n + 1));
  if (!pos) return err_set(GRAFT_ERR_OOM, "graft_load: out of memory"), false;
  for (int i = 0; i < f->n; i++) pos[i] = -1;
  bool ok = true;
  for (int j = 0; j < f->n && ok; j++) {
    int i = f->order[j];
    ok = i >= 0 && i < f->n && pos[i] < 0;
    if (ok) pos[i] = j;
  }
  for (int i = 0; i < f->n && ok; i++)
    for (int k = 0; k < f->tape[i].nin && ok; k++) ok = pos[f->operand[f->tape[i].in0 + k]] < pos[i];
  free(pos);
  if (!ok) ff_fail(L, "the order to make the entries in is not valid", NULL);
  return ok;
}

/* Each constant's bytes (in range, the right size, the CRC) into a data leaf on device. */
static bool ff_make_constants(ff_load *L, const unsigned char *data, size_t ndata, int device) {
  graft_function *f = L->f;
  for (int i = 0; i < f->n; i++) {
    fn_entry *e = &f->tape[i];
    if (e->kind != FN_CONST) continue;
    const uint64_t *k = L->cons[e->param];
    size_t bytes = (size_t)ir_numel(e->ndim, e->shape) * graft_dtype_size(e->dtype);
    char what[160], sh[128];
    snprintf(what, sizeof what, "constant %d (%s %s)", e->param, graft_dtype_name(e->dtype),
             ir_shape_str(e->ndim, e->shape, sh, sizeof sh));
    if (k[1] != bytes || k[0] > ndata || k[1] > ndata - k[0])
      return ff_fail(L, "%s lies outside the file's data or has the wrong size", what), false;
    if ((uint32_t)k[2] != ff_crc(data + k[0], bytes))
      return ff_fail(L, "corrupted: %s fails its checksum", what), false;
    exec_buffer *b = buffer_new(bytes, device, 0, "graft_load");
    if (!b || buffer_upload(b, data + k[0], bytes)) {
      buffer_release(b);
      return false;
    }
    e->leaf = ir_make_data(b, e->dtype, e->ndim, e->shape, device);
    buffer_release(b);
    if (!e->leaf) return false;
    e->param = -1;
  }
  return true;
}

/* Makes every op once through the checked constructor (inputs and seeds stand in as
 * constants): its operands must be valid for it and give the recorded dtype and shape. */
static bool ff_verify(ff_load *L, int device) {
  graft_function *f = L->f;
  ir_node **made = calloc((size_t)f->n + 1, sizeof *made);
  if (!made) return err_set(GRAFT_ERR_OOM, "graft_load: out of memory"), false;
  bool ok = true;
  for (int j = 0; j < f->n && ok; j++) {
    int i = f->order[j];
    const fn_entry *e = &f->tape[i];
    ir_node *ops[16], **in = ops;
    if (e->kind == FN_CONST) {
      ir_retain(e->leaf);
      made[i] = e->leaf;
      continue;
    }
    if (e->kind != FN_OP) {
      ir_attrs zero = {0};
      ok = (made[i] = ir_make_on(IR_CONSTANT, 0, NULL, &zero, e->dtype, e->ndim, e->shape, device)) != NULL;
      continue;
    }
    if (e->nin > 16 && !(in = malloc(sizeof *in * (size_t)e->nin))) {
      err_set(GRAFT_ERR_OOM, "graft_load: out of memory");
      ok = false;
      break;
    }
    for (int k = 0; k < e->nin; k++) in[k] = made[f->operand[e->in0 + k]];
    made[i] = ir_make_on(e->op, e->nin, in, &e->attr, e->dtype, e->ndim, e->shape, device);
    if (in != ops) free(in);
    char why[400], a[128], b[128];
    if (!made[i]) {
      snprintf(why, sizeof why, "%s (entry %d): %s", ir_ops[e->op].name, i, graft_last_error());
      ff_fail(L, "an op is not valid for its operands: %s", why);
      ok = false;
    } else if (made[i]->dtype != e->dtype || made[i]->ndim != e->ndim ||
               memcmp(made[i]->shape, e->shape, sizeof(int64_t) * (size_t)e->ndim)) {
      snprintf(why, sizeof why, "%s (entry %d) records %s %s; its operands give %s %s",
               ir_ops[e->op].name, i, graft_dtype_name(e->dtype), ir_shape_str(e->ndim, e->shape, a, sizeof a),
               graft_dtype_name(made[i]->dtype), ir_shape_str(made[i]->ndim, made[i]->shape, b, sizeof b));
      ff_fail(L, "an op's recorded result does not match: %s", why);
      ok = false;
    }
  }
  for (int i = 0; i < f->n; i++)
    if (made[i]) ir_release(made[i]);
  free(made);
  return ok;
}

graft_function *graft_load(const char *path, int device) {
  if (!path) return err_set(GRAFT_ERR_NULL, "graft_load: path is NULL");
  if (!device_valid(device)) return err_set(GRAFT_ERR_DEVICE, "graft_load: no device %d", device);
  size_t n = 0;
  unsigned char *p = ff_read_file(path, &n);
  if (!p) return NULL;
  tensor_lock();
  ff_load L = {path, calloc(1, sizeof(graft_function)), NULL, 0, 0};
  ff_cur meta;
  size_t data_at = 0;
  uint32_t cnt[4];
  bool ok = L.f != NULL;
  if (!ok) err_set(GRAFT_ERR_OOM, "graft_load: out of memory");
  ok = ok && ff_header(&L, p, n, &meta, &data_at, cnt) && ff_parse(&L, &meta, cnt, device) &&
       ff_check_order(&L) && ff_make_constants(&L, p + data_at, n - data_at, device) &&
       ff_verify(&L, device);
  free(L.cons);
  free(p);
  if (!ok) {
    if (L.f) /* constants not made yet hold an index, not a leaf */
      for (int i = 0; i < L.f->n; i++)
        if (L.f->tape && L.f->tape[i].kind == FN_CONST && L.f->tape[i].param >= 0) L.f->tape[i].leaf = NULL;
    fn_free(L.f);
    L.f = NULL;
  }
  tensor_unlock();
  return L.f;
}

int graft_function_input(const graft_function *f, int k, graft_dtype *dtype, int64_t *shape) {
  if (!f) return err_set(GRAFT_ERR_NULL, "graft_function_input: the function is NULL"), -1;
  if (k < 0 || k >= f->nin)
    return err_set(GRAFT_ERR_ARG, "graft_function_input: input %d of a function of %d inputs", k, f->nin), -1;
  const fn_entry *s = &f->in_sig[k];
  if (dtype) *dtype = s->dtype;
  if (shape) memcpy(shape, s->shape, sizeof(int64_t) * (size_t)s->ndim);
  return s->ndim;
}
