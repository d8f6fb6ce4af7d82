/* Kernels with the same code share one body. A model repeats its blocks (resnet18's layers,
 * mobilenet_v2's 17 inverted residuals, their gradients and the optimizer's update per weight
 * shape), so most of a training step's fused kernels differ from an earlier one only in the
 * buffers they read and write: in resnet18's step 898 kernel bodies had 566 distinct texts
 * (half the kernel source), and the compiler's time grows with the source. A kernel's
 * definition is compared after renaming the names that carry an instance number (buffer
 * parameters p<slot>, temporaries t<n>, accumulators, row scratches) in order of first
 * appearance; the parameter list comes first, so equal texts take the same buffers in the same
 * positions, and the later kernel runs the earlier body with its own buffers. The canonical
 * text is also the body's identity in the kernel library (cpu_klib.c), across graphs. */
#include "cpu_internal.h"
#include "../dcache.h"
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Prefixes of the generator's numbered names (cpu_codegen.c, render/rd_value.c). */
static const char *const dedup_prefixes[] = {"p", "t", "acc", "nfa", "ob", "rc"};

static bool dedup_ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The prefix index of identifier s[0..n) if it is <prefix><digits>, else -1. */
static int dedup_numbered(const char *s, size_t n) {
  for (size_t k = 0; k < sizeof dedup_prefixes / sizeof dedup_prefixes[0]; k++) {
    size_t pl = strlen(dedup_prefixes[k]);
    if (n <= pl || memcmp(s, dedup_prefixes[k], pl)) continue;
    size_t d = pl;
    while (d < n && isdigit((unsigned char)s[d])) d++;
    if (d == n) return (int)k;
  }
  return -1;
}

/* The kernel's own name, k<digits>_. */
static bool dedup_kernel_name(const char *s, size_t n) {
  if (n < 3 || s[0] != 'k' || s[n - 1] != '_') return false;
  for (size_t d = 1; d + 1 < n; d++)
    if (!isdigit((unsigned char)s[d])) return false;
  return true;
}

typedef struct {
  const char *s;
  size_t n;
} dedup_name;

/* The canonical number of name s[0..n): its index among the distinct numbered names so far. */
static int dedup_number(dedup_name **seen, int *nseen, int *cap, const char *s, size_t n) {
  for (int k = 0; k < *nseen; k++)
    if ((*seen)[k].n == n && !memcmp((*seen)[k].s, s, n)) return k;
  if (*nseen == *cap) {
    int nc = *cap ? *cap * 2 : 64;
    dedup_name *v = realloc(*seen, sizeof *v * (size_t)nc);
    if (!v) return -1;
    *seen = v;
    *cap = nc;
  }
  (*seen)[*nseen] = (dedup_name){s, n};
  return (*nseen)++;
}

/* The canonical text of a kernel definition: numbered names become <prefix>_<k> in order of
 * first appearance, the kernel's own name k<N>_ becomes K_. NULL when out of memory. */
static char *dedup_canon(const char *def) {
  rd_sb out = {0};
  dedup_name *seen = NULL;
  int nseen = 0, cap = 0, bad = 0;
  for (const char *s = def; *s && !bad;) {
    if (isdigit((unsigned char)*s)) { /* a number, hex float included: copied whole */
      const char *e = s;
      while (dedup_ident_char(*e) || *e == '.') e++;
      rd_sb_printf(&out, "%.*s", (int)(e - s), s);
      s = e;
    } else if (dedup_ident_char(*s)) {
      const char *e = s;
      while (dedup_ident_char(*e)) e++;
      size_t n = (size_t)(e - s);
      int pre = dedup_numbered(s, n);
      if (dedup_kernel_name(s, n)) rd_sb_puts(&out, "K_");
      else if (pre < 0) rd_sb_printf(&out, "%.*s", (int)n, s);
      else {
        int k = dedup_number(&seen, &nseen, &cap, s, n);
        if (k < 0) bad = 1;
        else rd_sb_printf(&out, "%s_%d", dedup_prefixes[pre], k);
      }
      s = e;
    } else {
      const char *e = s;
      while (*e && !dedup_ident_char(*e)) e++;
      rd_sb_printf(&out, "%.*s", (int)(e - s), s);
      s = e;
    }
  }
  free(seen);
  if (bad || out.oom) {
    rd_sb_free(&out);
    return NULL;
  }
  return out.s ? out.s : strdup("");
}

int cpu_dedup_find(cpu_dedup *d, const char *def, bool *fresh) {
  *fresh = false;
  char *c = dedup_canon(def);
  if (!c) return -1;
  uint64_t h = dcache_hash(c, strlen(c), 0);
  for (int k = 0; k < d->n; k++)
    if (d->v[k].hash == h && !strcmp(d->v[k].text, c)) {
      free(c);
      return k;
    }
  if (d->n == d->cap) {
    int nc = d->cap ? d->cap * 2 : 64;
    cpu_dedup_entry *v = realloc(d->v, sizeof *v * (size_t)nc);
    if (!v) {
      free(c);
      return -1;
    }
    d->v = v;
    d->cap = nc;
  }
  d->v[d->n] = (cpu_dedup_entry){h, c};
  *fresh = true;
  return d->n++;
}

void cpu_dedup_free(cpu_dedup *d) {
  for (int k = 0; k < d->n; k++) free(d->v[k].text);
  free(d->v);
  memset(d, 0, sizeof *d);
}
