/* Strided copies over the thread pool: the first tier's movement ops (broadcast, transpose,
 * slice, pad, concat) and the gathers of views its loops read. dst[dbase + sum c[d] * dst[d]] =
 * src[sbase + sum c[d] * sst[d]] over a shape, any dtype. The dims are coalesced first (those
 * of size 1 dropped, neighbours that step through both sides as one dim merged), so a
 * per-channel broadcast [1,C,1,1] -> [N,C,H,W] copies rows of H*W equal values, not rows of
 * W, and a scalar broadcast is one fill. */
#include "cpu_internal.h"
#include <string.h>
void cpu_copy_coalesce(cpu_copy *g, int nd, const int64_t *shape, const int64_t *sst,
                            const int64_t *dst) {
  g->nd = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    int k = g->nd - 1;
    if (k >= 0 && g->sst[k] == sst[d] * shape[d] && g->dst[k] == dst[d] * shape[d]) {
      g->shape[k] *= shape[d]; /* dim k steps like d, shape[d] times on */
      g->sst[k] = sst[d];
      g->dst[k] = dst[d];
      continue;
    }
    g->shape[g->nd] = shape[d];
    g->sst[g->nd] = sst[d];
    g->dst[g->nd++] = dst[d];
  }
  if (g->nd == 0) { /* one element */
    g->shape[0] = 1;
    g->sst[0] = g->dst[0] = 0;
    g->nd = 1;
  }
}

/* One row: inner elements from stride is (0: a fill) to stride os. Vectorized: the fill is
 * how a fused group gathers a broadcast operand (a channel's scale over its pixels), and its
 * scalar loop was 9.5% of mobilenet_v2's first-tier step. */
CPU_ISAS static void copy_row(char *o, int64_t os, const char *s, int64_t is, int64_t inner,
                              size_t es) {
  if (is == 1 && os == 1) {
    memcpy(o, s, (size_t)inner * es);
  } else if (es == 4) {
    const uint32_t *sp = (const uint32_t *)(const void *)s;
    uint32_t *op = (uint32_t *)(void *)o;
    if (is == 0 && os == 1) {
      uint32_t v = sp[0];
      _Pragma("omp simd") for (int64_t k = 0; k < inner; k++) op[k] = v;
    } else if (os == 1) {
      _Pragma("omp simd") for (int64_t k = 0; k < inner; k++) op[k] = sp[k * is];
    } else {
      for (int64_t k = 0; k < inner; k++) op[k * os] = sp[k * is];
    }
  } else if (es == 8 && os == 1) {
    const uint64_t *sp = (const uint64_t *)(const void *)s;
    uint64_t *op = (uint64_t *)(void *)o;
    _Pragma("omp simd") for (int64_t k = 0; k < inner; k++) op[k] = sp[k * is];
  } else {
    for (int64_t k = 0; k < inner; k++)
      memcpy(o + (size_t)(k * os) * es, s + (size_t)(k * is) * es, es);
  }
}

/* Rows [lo, hi) of the shape (a row: the innermost coalesced dim). */
static void copy_rows(void **S, int64_t lo, int64_t hi) {
  const cpu_copy *g = S[0];
  size_t es = g->es;
  int nd = g->nd;
  int64_t c[GRAFT_MAX_DIMS] = {0}, inner = g->shape[nd - 1], so = g->sbase, doff = g->dbase;
  for (int64_t d = nd - 2, r = lo; d >= 0; d--) { /* row lo's coordinates */
    c[d] = r % g->shape[d];
    r /= g->shape[d];
    so += c[d] * g->sst[d];
    doff += c[d] * g->dst[d];
  }
  char *o = g->out;
  const char *s = g->src;
  for (int64_t r = lo; r < hi; r++) {
    copy_row(o + (size_t)doff * es, g->dst[nd - 1], s + (size_t)so * es, g->sst[nd - 1],
                    inner, es);
    for (int d = nd - 2; d >= 0; d--) { /* odometer over the outer dims */
      so += g->sst[d];
      doff += g->dst[d];
      if (++c[d] < g->shape[d]) break;
      so -= g->sst[d] * g->shape[d];
      doff -= g->dst[d] * g->shape[d];
      c[d] = 0;
    }
  }
}

/* A transpose (the innermost coalesced dim read at a stride, another dim read contiguously)
 * copied in square tiles of those two dims, so both sides stay in L1: element by element, a
 * [512,4608] weight's transpose for a convolution's input gradient took 4.7 ms on the first
 * tier (each read a new cache line). Dim nd-2 is the one read contiguously (moved there). */
enum { COPY_TILE = 16 };

#define COPY_TILE_LOOP(T)                                                                      \
  for (int64_t a = a0; a < a1; a++)                                                              \
    for (int64_t b = b0; b < b1; b++)                                                            \
      ((T *)o)[a * ds + b] = ((const T *)s)[a + b * is];

static void copy_tiles(void **S, int64_t lo, int64_t hi) {
  const cpu_copy *g = S[0];
  int nd = g->nd;
  int64_t rows = g->shape[nd - 2], cols = g->shape[nd - 1], ds = g->dst[nd - 2], is = g->sst[nd - 1];
  int64_t blocks = (rows + COPY_TILE - 1) / COPY_TILE;
  for (int64_t w = lo; w < hi; w++) { /* one work item: a block of rows of one outer position */
    int64_t outer = w / blocks, so = g->sbase, doff = g->dbase;
    for (int d = nd - 3; d >= 0; d--) {
      so += (outer % g->shape[d]) * g->sst[d];
      doff += (outer % g->shape[d]) * g->dst[d];
      outer /= g->shape[d];
    }
    int64_t a0 = w % blocks * COPY_TILE, a1 = a0 + COPY_TILE < rows ? a0 + COPY_TILE : rows;
    const char *s = (const char *)g->src + (size_t)so * g->es;
    char *o = (char *)g->out + (size_t)doff * g->es;
    for (int64_t b0 = 0; b0 < cols; b0 += COPY_TILE) {
      int64_t b1 = b0 + COPY_TILE < cols ? b0 + COPY_TILE : cols;
      if (g->es == 4) COPY_TILE_LOOP(uint32_t) else COPY_TILE_LOOP(uint64_t)
    }
  }
}

/* Whether g is a transpose worth tiling; if so its contiguous-read dim is moved to nd-2. */
static bool copy_tiled(cpu_copy *g) {
  int nd = g->nd, j = -1;
  if (nd < 2 || (g->es != 4 && g->es != 8) || g->dst[nd - 1] != 1 || g->sst[nd - 1] == 1 ||
      g->shape[nd - 1] < COPY_TILE)
    return false;
  for (int d = 0; d < nd - 1; d++)
    if (g->sst[d] == 1 && g->shape[d] >= COPY_TILE) j = d;
  if (j < 0) return false;
  int64_t sh = g->shape[j], ss = g->sst[j], ds = g->dst[j];
  for (int d = j; d < nd - 2; d++) /* the odometer's order of the other dims is immaterial */
    g->shape[d] = g->shape[d + 1], g->sst[d] = g->sst[d + 1], g->dst[d] = g->dst[d + 1];
  g->shape[nd - 2] = sh, g->sst[nd - 2] = ss, g->dst[nd - 2] = ds;
  return true;
}


void cpu_copy_strided(int nd, const int64_t *shape, graft_dtype dt, const void *src,
                                int64_t sbase, const int64_t *sst, void *out, int64_t dbase,
                                const int64_t *dst) {
  int64_t numel = 1;
  for (int d = 0; d < nd; d++) numel *= shape[d];
  if (numel == 0) return;
  cpu_copy g = {.es = graft_dtype_size(dt), .src = src, .sbase = sbase, .out = out, .dbase = dbase};
  cpu_copy_coalesce(&g, nd, shape, sst, dst);
  if (g.nd == 1 && g.shape[0] >= CPU_COPY_PAR_MIN) /* one long row: rows of it for the pool */
    for (int64_t parts = 64; parts >= 2; parts /= 2)
      if (g.shape[0] % parts == 0) {
        g.shape[1] = g.shape[0] / parts, g.sst[1] = g.sst[0], g.dst[1] = g.dst[0];
        g.shape[0] = parts, g.sst[0] *= g.shape[1], g.dst[0] *= g.shape[1];
        g.nd = 2;
        break;
      }
  void *S[1] = {&g};
  if (copy_tiled(&g)) {
    int64_t items = numel / (g.shape[g.nd - 1] * g.shape[g.nd - 2]) *
                    ((g.shape[g.nd - 2] + COPY_TILE - 1) / COPY_TILE);
    if (numel >= CPU_COPY_PAR_MIN && items >= 2) cpu_parallel_run(copy_tiles, S, items);
    else copy_tiles(S, 0, items);
    return;
  }
  int64_t rows = numel / g.shape[g.nd - 1];
  if (numel >= CPU_COPY_PAR_MIN && rows >= 2) cpu_parallel_run(copy_rows, S, rows);
  else copy_rows(S, 0, rows);
}

void cpu_row_major(int nd, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    st[d] = s;
    s *= shape[d];
  }
}

/* The operand's elements of a padded row's segment [k0, k0 + m), over the fill already in o:
 * the first one on the lattice lo + j * step at or after k0, then one every step (a division
 * per segment, not per element: one per element was most of a convolution's input gradient's
 * gather on the first tier). */
static void copy_padded_row(const cpu_copy *g, int64_t k0, int64_t m, int64_t so, char *o) {
  const ref_padding *pd = g->pad;
  int in = g->nd - 1;
  int64_t st = pd->step[in], lo = pd->lo[in];
  int64_t j = k0 <= lo ? 0 : (k0 - lo + st - 1) / st; /* the first operand index */
  int64_t k = lo + j * st - k0, n = pd->src[in] - j;   /* its place in o; how many are left */
  if (k >= m || n <= 0) return;
  if ((m - 1 - k) / st + 1 < n) n = (m - 1 - k) / st + 1;
  int64_t ss = g->sst[in];
  if (g->es == 4) {
    const float *x = (const float *)g->src + so + j * ss;
    float *y = (float *)(void *)o + k;
    if (st == 1 && ss == 1) memcpy(y, x, (size_t)n * 4);
    else _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i * st] = x[i * ss];
  } else {
    const double *x = (const double *)g->src + so + j * ss;
    double *y = (double *)(void *)o + k;
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i * st] = x[i * ss];
  }
}

/* Fill, then the in-range operand elements of each row segment (cpu_copy_gather for a pad's
 * view; float data: 4 or 8 bytes). */
CPU_ISAS static void copy_gather_padded(const cpu_copy *g, int64_t lo, int64_t n, char *o) {
  const ref_padding *pd = g->pad;
  int nd = g->nd, in = nd - 1;
  int64_t c[GRAFT_MAX_DIMS], r = lo;
  for (int d = nd - 1; d >= 0; d--) {
    c[d] = r % g->shape[d];
    r /= g->shape[d];
  }
  float ff = (float)pd->fill;
  while (n > 0) {
    int64_t k0 = c[in], m = g->shape[in] - k0 < n ? g->shape[in] - k0 : n;
    if (g->es == 4)
      _Pragma("omp simd") for (int64_t k = 0; k < m; k++) ((float *)(void *)o)[k] = ff;
    else
      _Pragma("omp simd") for (int64_t k = 0; k < m; k++) ((double *)(void *)o)[k] = pd->fill;
    bool inside = true;
    int64_t so = g->sbase;
    for (int d = 0; d < in && inside; d++) {
      int64_t q = c[d] - pd->lo[d];
      inside = q >= 0 && q % pd->step[d] == 0 && q / pd->step[d] < pd->src[d];
      so += inside ? q / pd->step[d] * g->sst[d] : 0;
    }
    if (inside) copy_padded_row(g, k0, m, so, o);
    o += (size_t)m * g->es;
    n -= m;
    c[in] += m;
    for (int d = in; d > 0 && c[d] == g->shape[d]; d--) c[d] = 0, c[d - 1]++;
  }
}

/* Elements [lo, lo + n) in row-major order of g's shape (dst row-major: coalesced with it), read
 * at g's source strides into dst: a view's chunk for a loop that reads contiguous operands. */
void cpu_copy_gather(const cpu_copy *g, int64_t lo, int64_t n, void *dst) {
  if (g->pad) {
    copy_gather_padded(g, lo, n, dst);
    return;
  }
  int nd = g->nd;
  int64_t c[GRAFT_MAX_DIMS], so = g->sbase, r = lo, inner = g->shape[nd - 1];
  for (int d = nd - 1; d >= 0; d--) {
    c[d] = r % g->shape[d];
    r /= g->shape[d];
    so += c[d] * g->sst[d];
  }
  char *o = dst;
  while (n > 0) {
    int64_t m = inner - c[nd - 1] < n ? inner - c[nd - 1] : n;
    copy_row(o, 1, (const char *)g->src + (size_t)so * g->es, g->sst[nd - 1], m, g->es);
    o += (size_t)m * g->es;
    n -= m;
    so += m * g->sst[nd - 1];
    c[nd - 1] += m;
    for (int d = nd - 1; d > 0 && c[d] == g->shape[d]; d--) { /* carry */
      so += g->sst[d - 1] - g->shape[d] * g->sst[d];
      c[d] = 0;
      c[d - 1]++;
    }
  }
}

bool cpu_copy_view(cpu_copy *g, const ref_arg *x) {
  const ref_view *v = x->view;
  *g = (cpu_copy){0};
  if (!v) return false;
  if (v->pad) { /* not coalesced: the pad's dims each have their own bounds */
    *g = (cpu_copy){.nd = v->ndim, .es = graft_dtype_size(x->dtype), .src = x->data, .pad = v->pad};
    memcpy(g->shape, v->shape, sizeof(int64_t) * (size_t)v->ndim);
    memcpy(g->sst, v->strides, sizeof(int64_t) * (size_t)v->ndim);
    return true;
  }
  int64_t rm[GRAFT_MAX_DIMS]; /* the walk's row-major order is the operand's */
  cpu_row_major(v->ndim, v->shape, rm);
  *g = (cpu_copy){.es = graft_dtype_size(x->dtype), .src = x->data};
  cpu_copy_coalesce(g, v->ndim, v->shape, v->strides, rm);
  return true;
}
