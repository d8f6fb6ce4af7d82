/* Small utilities for code generation (render.h): a growable string, a string arena, and a
 * formatter for the conversions code generation uses. Generating a graph's kernels formats
 * hundreds of thousands of short strings (statements, names, the memo's keys). Through glibc's
 * vsnprintf, printf's machinery was ~20% of the tracing thread's samples while a varying-length
 * LM generated each new size's step: a process that has loaded libquadmath (numpy's and
 * OpenBLAS's gfortran runtime) has a printf modifier registered, and from then on every glibc
 * printf call takes its slow positional path; and rd_fmt formatted twice (to measure, then to
 * write) into a malloc of its own. Here: 4x faster on codegen's strings; the varying LM's code
 * generation on the tracing thread 1.74-1.90 -> 0.99-1.25 s for its 93 sizes. Other
 * conversions (precision, width, floats) go to vsnprintf. */
#include "render.h"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Appends the decimal or hex digits of v (neg: a '-' first) at o[*n], counting past cap. */
static void rd_put_u(char *o, size_t cap, size_t *n, uint64_t v, bool neg, unsigned base) {
  char d[24];
  int k = 0;
  do {
    unsigned r = (unsigned)(v % base);
    d[k++] = (char)(r < 10 ? '0' + r : 'a' + r - 10);
    v /= base;
  } while (v);
  if (neg) d[k++] = '-';
  while (k--) {
    if (*n + 1 < cap) o[*n] = d[k];
    (*n)++;
  }
}

/* vsnprintf's result for formats of %s, %c, %%, and %d/%u/%x with the l, ll or z length
 * (no flags, width or precision); -1 at any other conversion (nothing consumed from ap then
 * matters: the caller formats again from a copy). */
static int rd_vfmt(char *o, size_t cap, const char *fmt, va_list *ap) {
  size_t n = 0;
  for (const char *f = fmt; *f; f++) {
    if (*f != '%') {
      if (n + 1 < cap) o[n] = *f;
      n++;
      continue;
    }
    f++;
    int len = 0; /* 0 int, 1 long, 2 long long, 3 size_t */
    if (f[0] == 'l' && f[1] == 'l') len = 2, f += 2;
    else if (f[0] == 'l') len = 1, f++;
    else if (f[0] == 'z') len = 3, f++;
    switch (*f) {
    case '%':
      if (len) return -1;
      if (n + 1 < cap) o[n] = '%';
      n++;
      break;
    case 's': {
      if (len) return -1;
      const char *s = va_arg(*ap, const char *);
      if (!s) s = "(null)"; /* as glibc writes it */
      size_t k = strlen(s);
      if (n + 1 < cap) memcpy(o + n, s, k < cap - 1 - n ? k : cap - 1 - n);
      n += k;
      break;
    }
    case 'c': {
      if (len) return -1;
      int c = va_arg(*ap, int);
      if (n + 1 < cap) o[n] = (char)c;
      n++;
      break;
    }
    case 'd': {
      int64_t v = len == 0 ? va_arg(*ap, int) : len == 1 ? va_arg(*ap, long)
                : len == 2 ? va_arg(*ap, long long) : (int64_t)va_arg(*ap, size_t);
      rd_put_u(o, cap, &n, v < 0 ? 0 - (uint64_t)v : (uint64_t)v, v < 0, 10);
      break;
    }
    case 'u': case 'x': {
      uint64_t v = len == 0 ? va_arg(*ap, unsigned) : len == 1 ? va_arg(*ap, unsigned long)
                 : len == 2 ? va_arg(*ap, unsigned long long) : va_arg(*ap, size_t);
      rd_put_u(o, cap, &n, v, false, *f == 'x' ? 16 : 10);
      break;
    }
    default: return -1;
    }
  }
  if (cap) o[n < cap ? n : cap - 1] = 0;
  return n > INT32_MAX ? -1 : (int)n;
}

/* Formats into o[cap] as vsnprintf does (its result), the common conversions without it. */
static int rd_vsnprintf(char *o, size_t cap, const char *fmt, va_list ap) {
  va_list a;
  va_copy(a, ap);
  int k = rd_vfmt(o, cap, fmt, &a);
  va_end(a);
  if (k >= 0) return k;
  va_copy(a, ap);
  k = vsnprintf(o, cap, fmt, a);
  va_end(a);
  return k;
}

static void rd_sb_grow(rd_sb *b, size_t need) {
  if (b->oom || b->n + need + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->n + need + 1) cap *= 2;
  char *s = realloc(b->s, cap);
  if (!s) {
    b->oom = 1;
    return;
  }
  b->s = s;
  b->cap = cap;
}

void rd_sb_printf(rd_sb *b, const char *fmt, ...) {
  rd_sb_grow(b, 256); /* most statements fit: formatted in place, once */
  if (b->oom) return;
  va_list ap;
  va_start(ap, fmt);
  int k = rd_vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->oom = 1;
    return;
  }
  if (b->n + (size_t)k + 1 > b->cap) { /* longer: again, with the room it needs */
    rd_sb_grow(b, (size_t)k);
    if (b->oom) return;
    va_start(ap, fmt);
    rd_vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
  }
  b->n += (size_t)k;
}

void rd_sb_puts(rd_sb *b, const char *s) {
  size_t k = strlen(s);
  rd_sb_grow(b, k);
  if (b->oom) return;
  memcpy(b->s + b->n, s, k + 1);
  b->n += k;
}

void rd_sb_free(rd_sb *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}

/* Arena chunks: strings are carved from them (a malloc per string was a third of the cost of
 * a short one); a request larger than a quarter chunk gets a chunk of its own. */
enum { RD_CHUNK = 64 * 1024, RD_ALIGN = 16 };

static bool rd_arena_keep(rd_arena *a, char *c) {
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 64;
    char **v = realloc(a->v, sizeof *v * (size_t)cap);
    if (!v) return false;
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = c;
  return true;
}

/* n bytes aligned to RD_ALIGN, or NULL when out of memory. */
static char *rd_arena_take(rd_arena *a, size_t n) {
  n = (n + RD_ALIGN - 1) & ~(size_t)(RD_ALIGN - 1);
  if (n > a->left) {
    bool own = n > RD_CHUNK / 4;
    char *c = malloc(own ? n : RD_CHUNK);
    if (!c || !rd_arena_keep(a, c)) {
      free(c);
      return NULL;
    }
    if (own) return c;
    a->cur = c;
    a->left = RD_CHUNK;
  }
  char *p = a->cur;
  a->cur += n;
  a->left -= n;
  return p;
}

char *rd_fmt(rd_arena *a, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int k = rd_vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k < 0) k = 0, tmp[0] = 0;
  char *s = rd_arena_take(a, (size_t)k + 1);
  if (!s) return (char *)"0"; /* codegen checks the arena's health through the output size */
  if ((size_t)k < sizeof tmp) {
    memcpy(s, tmp, (size_t)k + 1);
  } else {
    va_start(ap, fmt);
    rd_vsnprintf(s, (size_t)k + 1, fmt, ap);
    va_end(ap);
  }
  return s;
}

void *rd_arena_alloc(rd_arena *a, size_t n) {
  char *s = rd_arena_take(a, n);
  if (s) memset(s, 0, n);
  return s;
}

void rd_arena_free(rd_arena *a) {
  for (int i = 0; i < a->n; i++) free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}
