/* Small utilities for code generation (render.h): a growable string, a string arena. */
#include "render.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  va_list ap;
  va_start(ap, fmt);
  char tmp[512];
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->oom = 1;
    return;
  }
  rd_sb_grow(b, (size_t)k);
  if (b->oom) return;
  if ((size_t)k < sizeof tmp) {
    memcpy(b->s + b->n, tmp, (size_t)k + 1);
  } else {
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
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

char *rd_fmt(rd_arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char one[1];
  int k = vsnprintf(one, sizeof one, fmt, ap);
  va_end(ap);
  if (k < 0) k = 0;
  char *s = malloc((size_t)k + 1);
  if (!s) return (char *)"0"; /* codegen checks the arena's health through the output size */
  va_start(ap, fmt);
  vsnprintf(s, (size_t)k + 1, fmt, ap);
  va_end(ap);
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 256;
    char **v = realloc(a->v, sizeof *v * (size_t)cap);
    if (!v) return s; /* leaks s on OOM only */
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = s;
  return s;
}

void *rd_arena_alloc(rd_arena *a, size_t n) {
  char *s = calloc(1, n);
  if (!s) return NULL;
  if (a->n == a->cap) {
    int cap = a->cap ? a->cap * 2 : 256;
    char **v = realloc(a->v, sizeof *v * (size_t)cap);
    if (!v) { free(s); return NULL; }
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = s;
  return s;
}

void rd_arena_free(rd_arena *a) {
  for (int i = 0; i < a->n; i++) free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof *a);
}

