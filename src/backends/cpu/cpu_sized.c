/* Size-generic kernel bodies. A body's text carries its sizes as literals (loop bounds,
 * strides, divisors: "L / 37 * 38"), so a loop whose batch or sequence length varies would
 * compile every kernel again for each size: the GPT block LM's step at 93 sequence lengths has
 * ~47 bodies, ~38 of them differing between two lengths only in their literals. Bodies whose
 * texts are equal once every numeric literal is masked share a skeleton. When a body misses the
 * library and an earlier body had its skeleton, the literals where the two differ are lifted
 * into an array the body takes at run time (its last parameter, gK), and that template is
 * compiled once: it serves every later body of the skeleton whose other literals equal the
 * first body's, with its own literals in gK. A size seen once keeps its specialised body
 * (constant bounds and divisors); only what was seen to vary becomes a run-time value.
 * What is lifted is exactly the literal's value, so a template computes what the specialised
 * body would: integers widen to int64_t (the generator's index type), floating constants pass
 * their bits (gc_lf/gc_ld in the prelude). Literals on preprocessor lines, in enum or case
 * lines, and in alignment attributes stay fixed (part of the skeleton); an array bound becomes
 * a variable-length array (its size was bounded when the specialised body was generated). */
#include "cpu_internal.h"
#include "../dcache.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SZ_INT, SZ_UINT, SZ_F32, SZ_F64 } sz_kind;

typedef struct {
  int32_t off, len;
  uint8_t kind;
} sz_lit;

/* A template: which literals of its family are lifted; the others equal the family's first. */
typedef struct sz_tpl {
  uint8_t *lifted;
  int nlift;
  char *text; /* the template's body, K_ with gK after the buffers */
  struct sz_tpl *next;
} sz_tpl;

/* Bodies of one skeleton: the first one seen (its text and literals) and the templates made. */
typedef struct sz_family {
  uint64_t skel;
  char *ref;
  sz_lit *lit;
  int nlit;
  bool broken; /* a template failed to compile: the skeleton's bodies stay specialised */
  sz_tpl *tpl;
  struct sz_family *next;
} sz_family;

enum { SZ_BUCKETS = 1024 };
/* GRAFT_SIZED=0 turns templates off; read once (the compile thread must not read the
 * environment a caller may be changing). -1: not read yet. */
static atomic_int sz_on = -1;

static bool sz_enabled(void) {
  int on = atomic_load(&sz_on);
  if (on < 0) {
    const char *env = getenv("GRAFT_SIZED");
    on = !(env && !strcmp(env, "0"));
    int unread = -1;
    if (!atomic_compare_exchange_strong(&sz_on, &unread, on)) on = atomic_load(&sz_on);
  }
  return on;
}

void cpu_sized_enable(bool on) { atomic_store(&sz_on, on ? 1 : 0); }

static atomic_bool sz_poison; /* tests: templates the compiler refuses */
void cpu_sized_test_poison(bool on) { atomic_store(&sz_poison, on); }
static pthread_mutex_t sz_mu = PTHREAD_MUTEX_INITIALIZER;
static sz_family *sz_tab[SZ_BUCKETS];

static bool sz_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static bool sz_digit(char c) { return c >= '0' && c <= '9'; }

/* Whether the line from s (its first character) keeps its literals: preprocessor, enum, case
 * and static lines need constants. */
static bool sz_fixed_line(const char *s) {
  while (*s == ' ' || *s == '\t') s++;
  if (*s == '#') return true;
  const char *e = strchr(s, '\n');
  size_t n = e ? (size_t)(e - s) : strlen(s);
  static const char *const words[] = {"enum", "case", "static", "switch"};
  for (size_t w = 0; w < sizeof words / sizeof words[0]; w++) {
    size_t wl = strlen(words[w]);
    for (const char *p = s; p + wl <= s + n; p++)
      if (!memcmp(p, words[w], wl) && (p == s || !sz_ident(p[-1])) && !sz_ident(p[wl])) {
        /* the body's own head "static void K_(" has no literals: harmless either way */
        return true;
      }
  }
  return false;
}

/* The end of the numeric literal starting at s, and its kind. */
static const char *sz_number(const char *s, sz_kind *kind) {
  const char *e = s;
  bool fl = false, hex = e[0] == '0' && (e[1] == 'x' || e[1] == 'X');
  if (hex) e += 2;
  for (;; e++) { /* the mantissa */
    char c = *e;
    if (sz_digit(c) || (hex && ((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))) continue;
    if (c != '.') break;
    fl = true;
  }
  if ((hex && (*e == 'p' || *e == 'P')) || (!hex && (*e == 'e' || *e == 'E'))) { /* exponent */
    fl = true;
    e++;
    if (*e == '+' || *e == '-') e++;
    while (sz_digit(*e)) e++;
  }
  bool f = false, u = false;
  for (; *e == 'f' || *e == 'F' || *e == 'u' || *e == 'U' || *e == 'l' || *e == 'L'; e++) {
    f = f || *e == 'f' || *e == 'F';
    u = u || *e == 'u' || *e == 'U';
  }
  *kind = fl ? (f ? SZ_F32 : SZ_F64) : u ? SZ_UINT : SZ_INT;
  return e;
}

/* The liftable literals of text, and the hash of its skeleton (the text with each of them
 * masked). 0, or -1 when out of memory. */
static int sz_scan(const char *text, sz_lit **lits, int *nlit, uint64_t *skel) {
  int n = 0, cap = 0;
  sz_lit *v = NULL;
  uint64_t h = 0x5a17;
  bool fixed = sz_fixed_line(text);
  const char *seg = text, *s = text;
  while (*s) {
    if (*s == '\n') {
      fixed = sz_fixed_line(++s);
      continue;
    }
    if (sz_ident(*s) && !sz_digit(*s)) {
      while (sz_ident(*s)) s++;
      continue;
    }
    if (!sz_digit(*s)) {
      s++;
      continue;
    }
    sz_kind kind;
    const char *e = sz_number(s, &kind);
    bool attr = s - text >= 8 && !memcmp(s - 8, "aligned(", 8);
    if (!fixed && !attr) {
      if (n == cap) {
        int nc = cap ? cap * 2 : 32;
        sz_lit *nv = realloc(v, sizeof *v * (size_t)nc);
        if (!nv) {
          free(v);
          return -1;
        }
        v = nv;
        cap = nc;
      }
      v[n++] = (sz_lit){(int32_t)(s - text), (int32_t)(e - s), (uint8_t)kind};
      h = dcache_hash(seg, (size_t)(s - seg), h);
      h = dcache_hash("#", 1, h);
      seg = e;
    }
    s = e;
  }
  *skel = dcache_hash(seg, (size_t)(s - seg), h);
  *lits = v;
  *nlit = n;
  return 0;
}

static bool sz_lit_eq(const char *a, const sz_lit *la, const char *b, const sz_lit *lb) {
  return la->kind == lb->kind && la->len == lb->len && !memcmp(a + la->off, b + lb->off, (size_t)la->len);
}

/* Whether a and b have the same skeleton (not only the same hash). */
static bool sz_same(const char *a, const sz_lit *la, int na, const char *b, const sz_lit *lb,
                    int nb) {
  if (na != nb) return false;
  int32_t pa = 0, pb = 0;
  for (int k = 0; k <= na; k++) {
    int32_t ea = k < na ? la[k].off : (int32_t)strlen(a), eb = k < nb ? lb[k].off : (int32_t)strlen(b);
    if (ea - pa != eb - pb || memcmp(a + pa, b + pb, (size_t)(ea - pa))) return false;
    if (k < na && la[k].kind != lb[k].kind) return false; /* gK holds what the template reads */
    if (k < na) pa = ea + la[k].len, pb = eb + lb[k].len;
  }
  return true;
}

/* The literal's value as gK holds it: integers as int64_t, floats and doubles by their bits. */
static int64_t sz_value(const char *t, const sz_lit *l) {
  char buf[96];
  int n = l->len < (int)sizeof buf - 1 ? l->len : (int)sizeof buf - 1;
  memcpy(buf, t + l->off, (size_t)n);
  buf[n] = 0;
  switch ((sz_kind)l->kind) {
  case SZ_F32: {
    float f = strtof(buf, NULL);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (int64_t)u;
  }
  case SZ_F64: {
    double d = strtod(buf, NULL);
    int64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
  }
  default: {
    bool hex = buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X');
    return (int64_t)strtoull(buf, NULL, hex ? 16 : 10);
  }
  }
}

/* The template's text: ref with its lifted literals read from gK, and gK after the buffers. */
static char *sz_template_text(const char *ref, const sz_lit *lit, int nlit, const uint8_t *lifted) {
  const char *head = strstr(ref, ") {\n");
  if (!head) return NULL;
  rd_sb out = {0};
  int32_t pos = 0, head_at = (int32_t)(head - ref);
  rd_sb_printf(&out, "%.*s, const int64_t *restrict gK", head_at, ref);
  pos = head_at;
  for (int k = 0, j = 0; k < nlit; k++) {
    if (!lifted[k]) continue;
    if (lit[k].off < head_at) { /* a literal in the parameter list cannot be lifted */
      rd_sb_free(&out);
      return NULL;
    }
    rd_sb_printf(&out, "%.*s", (int)(lit[k].off - pos), ref + pos);
    switch ((sz_kind)lit[k].kind) {
    case SZ_INT: rd_sb_printf(&out, "gK[%d]", j); break;
    case SZ_UINT: rd_sb_printf(&out, "((unsigned long long)gK[%d])", j); break;
    case SZ_F32: rd_sb_printf(&out, "gc_lf(gK[%d])", j); break;
    case SZ_F64: rd_sb_printf(&out, "gc_ld(gK[%d])", j); break;
    }
    j++;
    pos = lit[k].off + lit[k].len;
  }
  rd_sb_puts(&out, ref + pos);
  if (atomic_load(&sz_poison)) rd_sb_puts(&out, "\n#error a template the compiler refuses (test)\n");
  if (out.oom) {
    rd_sb_free(&out);
    return NULL;
  }
  return out.s;
}

static sz_family *sz_family_of(uint64_t skel, const char *text, const sz_lit *lit, int nlit) {
  for (sz_family *f = sz_tab[skel % SZ_BUCKETS]; f; f = f->next)
    if (f->skel == skel && sz_same(f->ref, f->lit, f->nlit, text, lit, nlit)) return f;
  return NULL;
}

/* The newest template of f that body text (literals lit) fits, or NULL. */
static sz_tpl *sz_fit(const sz_family *f, const char *text, const sz_lit *lit) {
  for (sz_tpl *t = f->tpl; t; t = t->next) {
    bool ok = true;
    for (int k = 0; k < f->nlit && ok; k++)
      ok = t->lifted[k] || sz_lit_eq(f->ref, &f->lit[k], text, &lit[k]);
    if (ok) return t;
  }
  return NULL;
}

/* A new template of f lifting what text's literals differ in, and what every earlier
 * template lifted (the newest is the most general). NULL when out of memory. */
static sz_tpl *sz_new_template(sz_family *f, const char *text, const sz_lit *lit) {
  sz_tpl *t = calloc(1, sizeof *t);
  if (!t || !(t->lifted = calloc((size_t)f->nlit + 1, 1))) {
    free(t);
    return NULL;
  }
  for (int k = 0; k < f->nlit; k++) {
    bool any = !sz_lit_eq(f->ref, &f->lit[k], text, &lit[k]);
    for (const sz_tpl *o = f->tpl; o && !any; o = o->next) any = o->lifted[k];
    t->lifted[k] = any;
    t->nlift += any;
  }
  t->text = sz_template_text(f->ref, f->lit, f->nlit, t->lifted);
  if (!t->text) {
    free(t->lifted);
    free(t);
    return NULL;
  }
  t->next = f->tpl;
  f->tpl = t;
  return t;
}

/* gK of body text for template t. */
static int64_t *sz_values(const sz_family *f, const sz_tpl *t, const char *text, const sz_lit *lit) {
  int64_t *v = malloc(sizeof *v * ((size_t)t->nlift + 1));
  if (!v) return NULL;
  for (int k = 0, j = 0; k < f->nlit; k++)
    if (t->lifted[k]) v[j++] = sz_value(text, &lit[k]);
  return v;
}

/* The family of text (literals lit, skeleton skel), recorded with text as its first body when
 * there is none (sz_mu held); NULL when out of memory. *fresh: it was recorded now. */
static sz_family *sz_family_get(uint64_t skel, const char *text, sz_lit **lit, int nlit, bool *fresh) {
  sz_family *f = sz_family_of(skel, text, *lit, nlit);
  *fresh = f == NULL;
  if (f) return f;
  f = calloc(1, sizeof *f);
  if (!f || !(f->ref = strdup(text))) {
    free(f);
    return NULL;
  }
  f->skel = skel;
  f->lit = *lit;
  f->nlit = nlit;
  *lit = NULL;
  f->next = sz_tab[skel % SZ_BUCKETS];
  sz_tab[skel % SZ_BUCKETS] = f;
  return f;
}

int cpu_sized_note(const cpu_body *b) {
  sz_lit *lit;
  int nlit;
  uint64_t skel;
  if (!sz_enabled()) return 0;
  if (sz_scan(b->text, &lit, &nlit, &skel)) return -1;
  bool fresh;
  pthread_mutex_lock(&sz_mu);
  sz_family *f = sz_family_get(skel, b->text, &lit, nlit, &fresh);
  pthread_mutex_unlock(&sz_mu);
  free(lit);
  return f ? 0 : -1;
}

/* What a body missing from the library may run instead. */
typedef enum {
  SZ_SERVE_MAKE,      /* a template, made if none fits (b recorded as the first if new) */
  SZ_SERVE_MAKE_ALL,  /* the same, and the skeleton's first body too (when a template exists) */
  SZ_SERVE_EXISTING   /* only a template made before; nothing recorded */
} sz_serve_mode;

/* The skeleton's first body compiles as it is (a family's first size, often its most frequent,
 * keeps specialised code); in a build from compiled kernels only (SZ_SERVE_MAKE_ALL) it runs the
 * newest template, which every one fits: a varying LM's first length had compiled 36 bodies of
 * its own when it ran again after the templates made for its siblings. */
static int sz_serve(const cpu_body *b, sz_serve_mode mode, cpu_body *tpl, int64_t **vals) {
  sz_lit *lit;
  int nlit;
  uint64_t skel;
  tpl->text = NULL;
  *vals = NULL;
  if (!sz_enabled()) return 0;
  if (sz_scan(b->text, &lit, &nlit, &skel)) return -1;
  int rc = 0;
  bool fresh = false; /* the first of its skeleton: it is the reference, compiled as it is */
  sz_tpl *t = NULL;
  pthread_mutex_lock(&sz_mu);
  sz_family *f = mode == SZ_SERVE_EXISTING ? sz_family_of(skel, b->text, lit, nlit)
                                           : sz_family_get(skel, b->text, &lit, nlit, &fresh);
  if (!f) {
    rc = mode == SZ_SERVE_EXISTING ? 0 : -1;
  } else if (mode == SZ_SERVE_EXISTING) {
    t = f->broken ? NULL : sz_fit(f, b->text, lit);
  } else if (!fresh && !f->broken &&
             (strcmp(f->ref, b->text) || (mode == SZ_SERVE_MAKE_ALL && f->tpl))) {
    t = sz_fit(f, b->text, lit);
    if (!t && !(t = sz_new_template(f, b->text, lit))) rc = -1;
  }
  if (t) {
    if ((tpl->text = strdup(t->text)) && (*vals = sz_values(f, t, b->text, lit))) {
      tpl->nparam = b->nparam + 1;
    } else {
      free(tpl->text);
      tpl->text = NULL;
      rc = -1;
    }
  }
  pthread_mutex_unlock(&sz_mu);
  free(lit);
  return rc;
}

int cpu_sized_template(const cpu_body *b, bool first_too, cpu_body *tpl, int64_t **vals) {
  return sz_serve(b, first_too ? SZ_SERVE_MAKE_ALL : SZ_SERVE_MAKE, tpl, vals);
}

int cpu_sized_existing(const cpu_body *b, cpu_body *tpl, int64_t **vals) {
  return sz_serve(b, SZ_SERVE_EXISTING, tpl, vals);
}

void cpu_sized_broken(const char *tpl_text) {
  pthread_mutex_lock(&sz_mu);
  for (int b = 0; b < SZ_BUCKETS; b++)
    for (sz_family *f = sz_tab[b]; f; f = f->next)
      for (sz_tpl *t = f->tpl; t; t = t->next)
        if (!strcmp(t->text, tpl_text)) f->broken = true;
  pthread_mutex_unlock(&sz_mu);
}

void cpu_sized_forget(void) {
  pthread_mutex_lock(&sz_mu);
  for (int b = 0; b < SZ_BUCKETS; b++) {
    for (sz_family *f = sz_tab[b], *nf; f; f = nf) {
      nf = f->next;
      for (sz_tpl *t = f->tpl, *nt; t; t = nt) {
        nt = t->next;
        free(t->lifted);
        free(t->text);
        free(t);
      }
      free(f->ref);
      free(f->lit);
      free(f);
    }
    sz_tab[b] = NULL;
  }
  pthread_mutex_unlock(&sz_mu);
}
