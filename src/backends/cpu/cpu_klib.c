/* The kernel library: every kernel body compiled in this process, by its key (a hash of its
 * canonical text, the compiler, flags, level and target: cpu_cache_key). A graph compiles only
 * the bodies no earlier graph had (a training loop's first step and its steady step share most
 * of theirs; so do a model's training and evaluation graphs, and its graphs at two batch
 * sizes where the kernels do not depend on it), and finds the others in memory or, through
 * the disk cache's per-body index, in an object an earlier process compiled. The missing
 * bodies compile as up to one object per core, in parallel (the calling thread's niceness is
 * inherited: the tier's compile thread runs below the steps). Objects stay loaded until
 * graft_shutdown, so a body's function outlives the graphs that run it. */
#include "cpu_internal.h"
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  uint64_t key[2];
  cpu_kernel_fn fn; /* NULL: an empty slot */
} klib_entry;

static pthread_mutex_t klib_mu = PTHREAD_MUTEX_INITIALIZER;
static klib_entry *klib_tab; /* open addressing by key[0]; a power of two of slots */
static size_t klib_slots, klib_used;
static _Atomic size_t klib_last_bytes;
static _Atomic size_t klib_objects_taken; /* cpu_klib_version */
static cpu_object *klib_obj;
static int klib_nobj, klib_capobj;

/* Bytes of new bodies' source per object, at least, before a second object is started: an
 * object's fixed cost (the compiler's start and the prelude) is ~0.04 s. A progressive build
 * compiles pieces of KLIB_PIECE_BYTES or more (at -O1, ~0.25 s of compiler each), one per core
 * at a time, so that a running graph switches its kernels to native code as each lands and a
 * process that exits mid-build leaves the pieces that landed on disk (mobilenet_v2's steady
 * step as two objects of 181 KB each: 1.3 s apiece at -O1, neither landed within its 30 first
 * steps). */
enum { KLIB_CHUNK_MIN_BYTES = 24 << 10, KLIB_MAX_CHUNKS = 8, KLIB_PIECE_BYTES = 32 << 10,
       KLIB_MAX_PIECES = 64 };

static klib_entry *klib_slot(const uint64_t key[2]) {
  size_t m = klib_slots - 1;
  for (size_t h = (size_t)key[0] & m;; h = (h + 1) & m)
    if (!klib_tab[h].fn || (klib_tab[h].key[0] == key[0] && klib_tab[h].key[1] == key[1]))
      return &klib_tab[h];
}

static cpu_kernel_fn klib_get(const uint64_t key[2]) {
  if (!klib_slots) return NULL;
  return klib_slot(key)->fn;
}

/* Adds (lock held) each body of obj; obj is kept (closed at cpu_klib_shutdown). */
static int klib_add(const cpu_object *obj) {
  if (klib_nobj == klib_capobj) {
    int nc = klib_capobj ? klib_capobj * 2 : 16;
    cpu_object *v = realloc(klib_obj, sizeof *v * (size_t)nc);
    if (!v) return -1;
    klib_obj = v;
    klib_capobj = nc;
  }
  if ((klib_used + (size_t)obj->n) * 2 >= klib_slots) { /* grow: at most half full */
    size_t ns = klib_slots ? klib_slots : 256;
    while ((klib_used + (size_t)obj->n) * 2 >= ns) ns *= 2;
    klib_entry *old = klib_tab;
    size_t on = klib_slots;
    klib_tab = calloc(ns, sizeof *klib_tab);
    if (!klib_tab) {
      klib_tab = old;
      return -1;
    }
    klib_slots = ns;
    for (size_t i = 0; i < on; i++)
      if (old[i].fn) *klib_slot(old[i].key) = old[i];
    free(old);
  }
  klib_obj[klib_nobj++] = *obj;
  atomic_fetch_add(&klib_objects_taken, 1);
  for (int i = 0; i < obj->n; i++) {
    klib_entry *e = klib_slot(&obj->key[2 * i]);
    if (e->fn) continue;
    e->key[0] = obj->key[2 * i];
    e->key[1] = obj->key[2 * i + 1];
    e->fn = obj->fn[i];
    klib_used++;
  }
  return 0;
}

/* klib_add under the lock; an object that cannot be recorded (out of memory) is closed. */
static int klib_add_locked(cpu_object *obj) {
  pthread_mutex_lock(&klib_mu);
  int rc = klib_add(obj);
  pthread_mutex_unlock(&klib_mu);
  if (rc) cpu_object_close(obj);
  return rc;
}

/* An object's source: the prelude, then each body under its own name with a run function
 * that passes P's buffers as its parameters, and the exported table. */
static void klib_source(const cpu_body *b, const uint64_t (*key)[2], const int *pick, int n,
                        rd_sb *out) {
  cpu_gen_prelude(out);
  for (int j = 0; j < n; j++) {
    const cpu_body *x = &b[pick[j]];
    rd_sb_printf(out, "#define K_ gkb_%d\n%s#undef K_\n", j, x->text);
    rd_sb_printf(out, "static void gkt_%d(void **P, int64_t lo, int64_t hi) { gkb_%d(lo, hi", j, j);
    for (int q = 0; q < x->nparam; q++) rd_sb_printf(out, ", P[%d]", q);
    rd_sb_puts(out, "); }\n");
  }
  rd_sb_printf(out, "const int " CPU_OBJ_N " = %d;\nconst uint64_t " CPU_OBJ_KEY "[] = {", n);
  for (int j = 0; j < n; j++)
    rd_sb_printf(out, "0x%" PRIx64 "ull, 0x%" PRIx64 "ull, ", key[pick[j]][0], key[pick[j]][1]);
  rd_sb_puts(out, "0};\nconst cpu_kernel_fn " CPU_OBJ_FN "[] = {");
  for (int j = 0; j < n; j++) rd_sb_printf(out, "gkt_%d, ", j);
  rd_sb_puts(out, "0};\n");
}

typedef struct {
  rd_sb src;
  cpu_opt opt;
  cpu_object obj;
  double ms;
  int rc;
  graft_status status;
  bool has_tpl; /* it holds a size-generic template (a body at index >= the build's first_tpl) */
  char err[1100];
} klib_job;

/* The objects of one build, compiled by up to one thread per core, each taking the next. */
typedef struct {
  klib_job *job;
  int nj;
  atomic_int next;
} klib_work;

static int klib_add_locked(cpu_object *obj);

/* Compiles the build's objects until none is left; each joins the disk index and the library
 * as it lands (a process may exit, and a progressive build's runner looks, before the others
 * land). */
static void *klib_compile(void *arg) {
  klib_work *w = arg;
  for (int q; (q = atomic_fetch_add(&w->next, 1)) < w->nj;) {
    klib_job *j = &w->job[q];
    klib_last_bytes = j->src.n;
    j->rc = j->src.oom ? -1 : cpu_compile_source(j->src.s, j->opt, &j->obj, &j->ms);
    j->status = j->src.oom ? GRAFT_ERR_OOM : graft_last_status();
    snprintf(j->err, sizeof j->err, "%s", j->src.oom ? "cpu: out of memory" : graft_last_error());
    if (j->rc) continue;
    cpu_object_index(&j->obj);
    if (klib_add_locked(&j->obj)) { /* closed */
      j->rc = -1;
      j->status = GRAFT_ERR_OOM;
      snprintf(j->err, sizeof j->err, "cpu: out of memory recording compiled kernels");
    }
  }
  return NULL;
}

/* How many objects nm bodies of `bytes` source compile as: one per KLIB_CHUNK_MIN_BYTES, at
 * most one per core and KLIB_MAX_CHUNKS, at least one; a progressive build's one per
 * KLIB_PIECE_BYTES, at most KLIB_MAX_PIECES. */
static int klib_objects(size_t bytes, int nm, bool pieces) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nj = (int)(bytes / (pieces ? KLIB_PIECE_BYTES : KLIB_CHUNK_MIN_BYTES));
  if (!pieces && nj > cores) nj = (int)cores;
  if (nj > (pieces ? KLIB_MAX_PIECES : KLIB_MAX_CHUNKS)) nj = pieces ? KLIB_MAX_PIECES : KLIB_MAX_CHUNKS;
  if (nj > nm) nj = nm;
  return nj < 1 ? 1 : nj;
}

/* Each of bodies miss[0..nm) to the lightest of nj objects so far, in order (in_order: the
 * first objects take the first bodies, each up to an equal share of the bytes); each job's
 * source. 0, or -1 (error set). */
static int klib_partition(const cpu_body *b, const uint64_t (*key)[2], const int *miss, int nm,
                          int first_tpl, bool in_order, klib_job *job, int nj) {
  int *pick = malloc(sizeof(int) * (size_t)nm), *sel = malloc(sizeof(int) * (size_t)nm);
  size_t *load = calloc((size_t)nj, sizeof(size_t));
  if (!pick || !sel || !load) {
    free(pick);
    free(sel);
    free(load);
    err_set(GRAFT_ERR_OOM, "cpu: out of memory compiling kernels");
    return -1;
  }
  size_t total = 0;
  for (int k = 0; k < nm && in_order; k++) total += strlen(b[miss[k]].text) + 1;
  for (int k = 0, q = 0; k < nm; k++) {
    int best = 0;
    for (int o = 1; o < nj && !in_order; o++)
      if (load[o] < load[best]) best = o;
    if (in_order) { /* the next object once this one has its share (every object gets some) */
      if (q < nj - 1 && load[q] && (load[q] >= total / (size_t)nj || nm - k <= nj - 1 - q)) q++;
      best = q;
    }
    load[best] += strlen(b[miss[k]].text) + 1;
    pick[k] = best;
  }
  for (int q = 0; q < nj; q++) {
    int ns = 0;
    for (int k = 0; k < nm; k++)
      if (pick[k] == q) {
        sel[ns++] = miss[k];
        job[q].has_tpl = job[q].has_tpl || miss[k] >= first_tpl;
      }
    klib_source(b, key, sel, ns, &job[q].src);
  }
  free(pick);
  free(sel);
  free(load);
  return 0;
}

/* The jobs' results (their objects joined the library as they landed); 0, or -1 with the
 * first failure's error set (*tpl_failed when a failed object held a template). */
static int klib_collect(klib_job *job, int nj, bool *tpl_failed) {
  int rc = 0;
  for (int q = 0; q < nj; q++) {
    cpu_stats.compile_ms += job[q].ms;
    if (job[q].rc) {
      *tpl_failed = *tpl_failed || job[q].has_tpl;
      if (!rc) err_set(job[q].status ? job[q].status : GRAFT_ERR_COMPILE, "%s", job[q].err);
      rc = -1;
    }
  }
  return rc;
}

/* Compiles bodies miss[0..nm) at opt as objects (pieces: a progressive build's smaller ones),
 * up to one per core at a time; each object's bodies join the library and the disk index as
 * it lands. 0, or -1 with the first failure's error set. */
static int klib_build(const cpu_body *b, const uint64_t (*key)[2], const int *miss, int nm,
                      cpu_opt opt, int first_tpl, bool pieces, bool *tpl_failed) {
  size_t bytes = 0;
  for (int k = 0; k < nm; k++) bytes += strlen(b[miss[k]].text);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nj = klib_objects(bytes, nm, pieces), nth = nj < cores ? nj : (int)(cores < 1 ? 1 : cores);
  int rc = -1;
  klib_job *job = calloc((size_t)nj, sizeof *job);
  pthread_t *th = calloc((size_t)nth, sizeof *th);
  bool *started = calloc((size_t)nth, sizeof *started);
  klib_work w = {job, nj, 0};
  if (!job || !th || !started) err_set(GRAFT_ERR_OOM, "cpu: out of memory compiling kernels");
  else if (!klib_partition(b, key, miss, nm, first_tpl, pieces, job, nj)) {
    for (int q = 0; q < nj; q++) job[q].opt = opt;
    for (int t = 1; t < nth; t++) started[t] = !pthread_create(&th[t], NULL, klib_compile, &w);
    klib_compile(&w); /* this thread too; it ends when no object is left */
    for (int t = 1; t < nth; t++)
      if (started[t]) pthread_join(th[t], NULL);
    rc = klib_collect(job, nj, tpl_failed);
  }
  for (int q = 0; job && q < nj; q++) rd_sb_free(&job[q].src);
  free(job);
  free(th);
  free(started);
  return rc;
}

/* The function of body key from memory, else from the disk cache's index (its object joins
 * the library), else NULL. */
static cpu_kernel_fn klib_find(const uint64_t key[2]) {
  pthread_mutex_lock(&klib_mu);
  cpu_kernel_fn f = klib_get(key);
  pthread_mutex_unlock(&klib_mu);
  if (f) return f;
  cpu_object obj;
  if (!cpu_object_find(key, &obj) || klib_add_locked(&obj)) return NULL;
  pthread_mutex_lock(&klib_mu);
  f = klib_get(key);
  pthread_mutex_unlock(&klib_mu);
  return f; /* NULL when the index named an object without it (then it compiles anew) */
}

/* The key of text at opt, and its function from the library: the full level's if there is
 * one (*full set), else at opt's. */
static cpu_kernel_fn klib_lookup(const char *text, cpu_opt opt, uint64_t key[2], bool *full) {
  uint64_t fk[2];
  cpu_cache_key(text, CPU_OPT_FULL, fk);
  cpu_kernel_fn f = klib_find(fk);
  *full = f != NULL;
  if (opt == CPU_OPT_QUICK) cpu_cache_key(text, CPU_OPT_QUICK, key);
  else memcpy(key, fk, sizeof fk);
  return f || opt == CPU_OPT_FULL ? f : klib_find(key);
}

/* What one resolve compiles: all[] holds the graph's n bodies, then the nt templates some of
 * them run as (cpu_sized.c); via[i] is the entry whose function graph body i runs. */
typedef struct {
  cpu_body *all;
  uint64_t (*key)[2];
  int *miss, *via, nm, n, nt;
} klib_need;

/* Graph body i missed the library: it runs as a size-generic template when its skeleton was
 * seen with other literals (found compiled, or queued once per resolve), else it compiles as it
 * is. 0, or -1 when out of memory. */
static int klib_miss(klib_need *w, int i, cpu_opt opt, bool lib_only, cpu_kernel_fn *fn,
                     int64_t **lits, bool *all_full) {
  cpu_body t;
  if (cpu_sized_template(&w->all[i], lib_only, &t, &lits[i])) return -1;
  if (!t.text) {
    w->miss[w->nm++] = i;
    *all_full = *all_full && opt == CPU_OPT_FULL;
    return 0;
  }
  uint64_t k[2];
  bool full;
  fn[i] = klib_lookup(t.text, opt, k, &full);
  *all_full = *all_full && (full || opt == CPU_OPT_FULL);
  int q = w->n;
  while (q < w->n + w->nt && (w->key[q][0] != k[0] || w->key[q][1] != k[1])) q++;
  if (fn[i] || q < w->n + w->nt) { /* compiled, or queued by another body of this graph */
    free(t.text);
    if (!fn[i]) w->via[i] = q; /* only bodies waiting for a queued template point past n */
    return 0;
  }
  w->all[q] = t;
  memcpy(w->key[q], k, sizeof k);
  w->via[i] = q;
  w->miss[w->nm++] = q;
  w->nt++;
  return 0;
}

/* Graph body i (of a program not seen to vary) missed the library at the quick level: it runs
 * a template compiled for another graph when one fits it. 0 (fn[i] NULL when none), or -1 when
 * out of memory. */
static int klib_compiled_template(const cpu_body *b, cpu_kernel_fn *fn, int64_t **lits) {
  cpu_body t;
  if (cpu_sized_existing(b, &t, lits)) return -1;
  if (!t.text) return 0;
  uint64_t k[2];
  bool full;
  *fn = klib_lookup(t.text, CPU_OPT_QUICK, k, &full);
  free(t.text);
  if (!*fn) {
    free(*lits);
    *lits = NULL;
  }
  return 0;
}

/* The templates failed to compile: their skeletons are marked, and the bodies that were to run
 * them compile as they are. */
static void klib_drop_templates(klib_need *w, int64_t **lits) {
  int nm = 0;
  for (int k = 0; k < w->nm; k++) { /* not those an object that did compile holds */
    pthread_mutex_lock(&klib_mu);
    bool landed = klib_get(w->key[w->miss[k]]) != NULL;
    pthread_mutex_unlock(&klib_mu);
    if (w->miss[k] < w->n && !landed) w->miss[nm++] = w->miss[k];
  }
  for (int i = 0; i < w->n; i++)
    if (w->via[i] >= w->n) {
      w->via[i] = i;
      w->miss[nm++] = i;
      free(lits[i]);
      lits[i] = NULL;
    }
  for (int q = w->n; q < w->n + w->nt; q++) {
    cpu_sized_broken(w->all[q].text);
    free(w->all[q].text);
  }
  w->nm = nm;
  w->nt = 0;
}

int cpu_klib_resolve(const cpu_body *b, int n, cpu_opt *opt, bool lib_only, bool sized,
                     cpu_kernel_fn *fn, int64_t **lits, const cpu_klib_progress *progress) {
  klib_need w = {calloc((size_t)(2 * n + 1), sizeof *w.all), malloc(sizeof *w.key * (size_t)(2 * n + 1)),
                 malloc(sizeof(int) * (size_t)(2 * n + 1)), malloc(sizeof(int) * (size_t)(n + 1)),
                 0, n, 0};
  int rc = 0;
  if (!w.all || !w.key || !w.miss || !w.via) rc = -1;
  bool all_full = true;
  for (int i = 0; i < n && !rc; i++) {
    w.all[i] = b[i];
    w.via[i] = i;
    lits[i] = NULL;
    bool full;
    fn[i] = klib_lookup(b[i].text, *opt, w.key[i], &full);
    if (fn[i] && !full) all_full = false; /* found at the quick level only */
    if (fn[i] && sized && cpu_sized_note(&b[i])) rc = -1;
    if (!fn[i] && sized) rc = klib_miss(&w, i, *opt, lib_only, fn, lits, &all_full);
    else if (!fn[i] && *opt == CPU_OPT_QUICK &&
             (rc = klib_compiled_template(&b[i], &fn[i], &lits[i])) == 0 && fn[i])
      all_full = false;
    else if (!fn[i] && !rc) {
      w.miss[w.nm++] = i;
      all_full = all_full && *opt == CPU_OPT_FULL;
    }
  }
  if (rc) err_set(GRAFT_ERR_OOM, "cpu: out of memory compiling kernels");
  int built = 0;
  /* progressive: what it runs meanwhile finds each missing body by its own key */
  bool pieces = progress && !sized && !lib_only && !rc && w.nm && !w.nt;
  if (pieces) {
    memcpy(progress->keys, w.key, sizeof *w.key * (size_t)n);
    if (progress->weight) /* the heaviest first: the first pieces to land carry the most work */
      for (int a = 1; a < w.nm; a++)
        for (int c = a; c > 0 && progress->weight[w.miss[c - 1]] < progress->weight[w.miss[c]]; c--) {
          int t = w.miss[c];
          w.miss[c] = w.miss[c - 1];
          w.miss[c - 1] = t;
        }
    progress->ready(progress->ctx);
  }
  if (!rc && w.nm && lib_only) rc = 1;
  else if (!rc && w.nm) {
    built = w.nm;
    bool tpl_failed = false;
    rc = klib_build(w.all, (const uint64_t(*)[2])w.key, w.miss, w.nm, *opt, n, pieces, &tpl_failed);
    if (rc && tpl_failed) { /* an object with a template failed: its bodies compile specialised */
      graft_clear_error();
      klib_drop_templates(&w, lits);
      built = w.nm;
      rc = klib_build(w.all, (const uint64_t(*)[2])w.key, w.miss, w.nm, *opt, n, false, &tpl_failed);
    }
  }
  if (!rc) { /* atomics: a library-only build runs beside a compile (cpu_compile_cached) */
    int nsized = 0;
    for (int i = 0; i < n; i++) nsized += lits[i] != NULL;
    __atomic_fetch_add(&cpu_stats.bodies_reused, (uint64_t)(n - built), __ATOMIC_RELAXED);
    __atomic_fetch_add(&cpu_stats.bodies_compiled, (uint64_t)built, __ATOMIC_RELAXED);
    __atomic_fetch_add(&cpu_stats.bodies_sized, (uint64_t)nsized, __ATOMIC_RELAXED);
  }
  for (int i = 0; i < n && !rc; i++) { /* atomics: a progressive build's runner fills them too */
    if (__atomic_load_n(&fn[i], __ATOMIC_ACQUIRE)) continue;
    pthread_mutex_lock(&klib_mu);
    cpu_kernel_fn f = klib_get(w.key[w.via[i]]);
    pthread_mutex_unlock(&klib_mu);
    if (f) __atomic_store_n(&fn[i], f, __ATOMIC_RELEASE);
    if (!f) {
      err_set(GRAFT_ERR_INTERNAL, "cpu: a compiled kernel object lacks one of its bodies");
      rc = -1;
    }
  }
  if (!rc && all_full) *opt = CPU_OPT_FULL;
  for (int q = n; w.all && q < n + w.nt; q++) free(w.all[q].text);
  free(w.all);
  free(w.key);
  free(w.miss);
  free(w.via);
  return rc;
}

size_t cpu_klib_last_source_bytes(void) { return klib_last_bytes; }

cpu_kernel_fn cpu_klib_get(const uint64_t key[2]) {
  pthread_mutex_lock(&klib_mu);
  cpu_kernel_fn f = klib_get(key);
  pthread_mutex_unlock(&klib_mu);
  return f;
}

size_t cpu_klib_version(void) { return atomic_load(&klib_objects_taken); }

size_t cpu_klib_pieces(void) {
  pthread_mutex_lock(&klib_mu);
  size_t n = klib_used;
  pthread_mutex_unlock(&klib_mu);
  return n + cpu_object_any();
}

void cpu_klib_forget(void) {
  cpu_sized_forget();
  pthread_mutex_lock(&klib_mu);
  if (klib_tab) memset(klib_tab, 0, sizeof *klib_tab * klib_slots);
  klib_used = 0;
  pthread_mutex_unlock(&klib_mu);
}

void cpu_klib_shutdown(void) {
  cpu_object_forget();
  pthread_mutex_lock(&klib_mu);
  for (int k = 0; k < klib_nobj; k++) cpu_object_close(&klib_obj[k]);
  free(klib_obj);
  free(klib_tab);
  klib_obj = NULL;
  klib_tab = NULL;
  klib_nobj = klib_capobj = 0;
  klib_slots = klib_used = 0;
  pthread_mutex_unlock(&klib_mu);
}
