/* Internals shared by the CPU backend's files. */
#ifndef GRAFT_CPU_INTERNAL_H
#define GRAFT_CPU_INTERNAL_H
#include "cpu.h"
#include "cpu_rt.h"
#include "../ref/ref.h"
#include "../../passes/fusion.h"
#include "error.h"
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "../render/render.h" /* the code generators' string builder and arena */

/* ---- cpu_plan.c: the fusion plan (src/passes/fusion.h) with what this backend generates ---- */
int cpu_plan_build(const exec_program *p, bool have_blas, fuse_plan *pl);
/* The slot whose buffer holds s's bytes: s, or the value under an inlined chain of reshapes
 * (an output such a chain shares that value's buffer). */
int cpu_plan_buffer_of(const exec_program *p, const fuse_plan *pl, int s);
bool cpu_op_generated(const exec_program *p, int i, bool have_blas);

/* ---- cpu_codegen.c: a program's kernels and the steps that run them ---- */
/* What the runner (cpu_backend.c) does, step by step: no code is compiled per graph, only its
 * kernels' bodies, which the kernel library (cpu_klib.c) shares between graphs and processes. */
typedef enum {
  CPU_STEP_ALLOC,    /* arg: the slot whose buffer is made */
  CPU_STEP_RELEASE,  /* arg: the slot whose buffer goes (its last use was the step before) */
  CPU_STEP_FALLBACK, /* arg: the instruction run by a host or reference kernel */
  CPU_STEP_KERNEL,   /* arg: index into cpu_code.launch */
  CPU_STEP_GEMM,     /* arg: index into cpu_code.gemm */
} cpu_step_kind;
typedef struct {
  int kind, arg;
} cpu_step;
typedef struct {
  int body;      /* index into cpu_code.body */
  int par;       /* split over the pool */
  int64_t units; /* rows (or elements) the kernel runs over */
  int slot0, nslot; /* its buffers, in its body's parameter order: cpu_code.slots[slot0..) */
  int mem0, nmem;   /* the instructions it writes: cpu_code.members[mem0..) */
  int64_t work;     /* elements times their rough cost: a progressive build's native share */
} cpu_launch;
/* CBLAS's row-major order and transpose flags, as the steps and cpu_blas_fns.gemm take them. */
enum { CPU_CBLAS_ROW_MAJOR = 101, CPU_CBLAS_NO_TRANS = 111, CPU_CBLAS_TRANS = 112 };
/* A batch of products C[q] = op(A[q]) op(B[q]) (cpu_blas_fns.gemm's arguments); k == 0 fills
 * C (numel elements) with zeros. */
typedef struct {
  int dbl, ta, tb, a, b, c; /* a, b, c: slots */
  int64_t m, n, k, lda, sa, ldb, sb, ldc, sc, batch, numel;
} cpu_gemm_call;
/* A distinct kernel body: its canonical definition (cpu_dedup.c: the function named K_, its
 * buffer parameters p_0..p_<nparam-1> after lo and hi). */
typedef struct {
  char *text;
  int nparam;
} cpu_body;
typedef struct {
  cpu_step *step;
  cpu_launch *launch;
  int *slots;
  cpu_gemm_call *gemm;
  cpu_body *body;
  int *members;
  int nstep, nlaunch, nslots, ngemm, nbody, nmembers;
  int cap[6];     /* capacities of the arrays above, in that order */
  int max_params; /* the most buffers one kernel takes */
  int oom;
} cpu_code;
/* cpu_steps.c: appending (the index, or -1 with code->oom set), rendering, freeing. */
int cpu_code_step(cpu_code *c, int kind, int arg);
int cpu_code_launch(cpu_code *c, const cpu_launch *l);
int cpu_code_slot(cpu_code *c, int slot);
int cpu_code_gemm(cpu_code *c, const cpu_gemm_call *g);
int cpu_code_body(cpu_code *c, const cpu_body *b);
int cpu_code_member(cpu_code *c, int slot);
void cpu_code_render(const cpu_code *c, const exec_program *p, const int *body_kid, rd_sb *out);
void cpu_code_free(cpu_code *c);
/* Generates the program's kernels and steps into code; *src gets a readable rendering (the
 * prelude, each distinct body under its first kernel's name k<N>_, the steps): for dumps,
 * GRAFT_CHECK's reports and tests. Returns 0 or -1 (error set). When kernel_of is not NULL,
 * sets kernel_of[s] = N for each slot s that kernel k<N> writes (other entries untouched). */
int cpu_codegen(const exec_program *p, const fuse_plan *pl, cpu_code *code, rd_sb *src,
                int *kernel_of);
/* ---- cpu_partial.c: a progressive build's launches whose body has not landed ---- */
typedef struct cpu_partial cpu_partial;
/* Each launch of code whose body fn[] lacks, as a program of its own on the first tier; NULL
 * with the error set when out of memory. */
cpu_partial *cpu_partial_plan(const exec_program *p, const fuse_plan *pl, const cpu_code *c,
                              cpu_kernel_fn const *fn);
void cpu_partial_free(cpu_partial *x);
/* Runs launch l (one cpu_partial_plan planned) over the graph's buffers B and their data S:
 * its members' slots get their values (their buffers may be replaced). 0, or -1 with the
 * error set. */
int cpu_partial_run(const cpu_partial *x, int l, exec_buffer **B, void **S);
/* ---- cpu_picture.c ---- */
/* With GRAFT_DUMP_DIR set: graph_<hash>.kernels.dot, the program as its kernels run
 * (fuse_plan_dot; code and kernel_of from cpu_codegen; donatable inputs say after which
 * step their buffer goes), and its SVG rendering where Graphviz's dot is
 * installed. Failures only leave the files out (a dump, not a result). */
void cpu_dump_picture(const exec_program *p, const fuse_plan *pl, const cpu_code *code,
                      const int *kernel_of);
/* ---- cpu_describe.c ---- */
/* Per launch, the args of its trace span (JSON members: units, the ops it fused, the source
 * line, bytes, flops); NULL when out of memory (the spans then say less). */
char **cpu_describe_kernels(const exec_program *p, const fuse_plan *pl, const cpu_code *code,
                            const int *kernel_of);
void cpu_describe_free(char **what, int nk);
/* The prelude every kernel object starts with (math helpers, streaming stores). */
void cpu_gen_prelude(rd_sb *out);
/* Rough per-element cost of each inlined value (ops.def's cost column), its inlined inputs
 * included (saturating at 1000); 0 for the others. The GPU renderer's row scratch uses it too. */
void cpu_costs(const exec_program *p, const fuse_plan *pl, int *cost);

/* ---- cpu_dedup.c: kernels with the same code share one body ---- */
typedef struct {
  uint64_t hash;
  char *text; /* canonical text */
} cpu_dedup_entry;
typedef struct {
  cpu_dedup_entry *v;
  int n, cap;
} cpu_dedup;
/* The index of def's body among the distinct ones (equal up to their numbered names), *fresh
 * set when def is the first of its kind (recorded now); -1 when out of memory. */
int cpu_dedup_find(cpu_dedup *d, const char *def, bool *fresh);
void cpu_dedup_free(cpu_dedup *d);

/* ---- cpu_compile.c: compiler, disk cache, dlopen ---- */
/* A loaded kernel object: n bodies' run functions and their library keys. */
typedef struct {
  void *dl;
  int n;
  const uint64_t *key;      /* 2 words per body */
  const cpu_kernel_fn *fn;
  bool published;           /* an entry of the disk cache (its bodies get index entries) */
  uint64_t okey[2];         /* its cache key */
} cpu_object;
/* How hard the C compiler optimizes: the full build (-O3) or a quick one (-O1) that runs while
 * the full one compiles. Both are cached on disk. */
typedef enum { CPU_OPT_FULL, CPU_OPT_QUICK } cpu_opt;
/* The 128-bit cache key of text built at opt: a hash of the text, the compiler's identity, the
 * flags, the target, the prelude and graft's version. */
void cpu_cache_key(const char *text, cpu_opt opt, uint64_t key[2]);
/* Compiles (or loads from the disk cache) kernel object source src into obj; 0, or -1 with
 * the error set. *ms gets the compiler's wall time (0 on a disk hit). */
int cpu_compile_source(const char *src, cpu_opt opt, cpu_object *obj, double *ms);
/* The object holding body key from the disk cache's index into obj: 1 when loaded, else 0. */
int cpu_object_find(const uint64_t key[2], cpu_object *obj);
/* Whether the disk cache held any body's index entry when first asked (once between
 * graft_init and graft_shutdown: cpu_object_forget, which also lets the next compile sweep the
 * cache folder's leftovers again). */
bool cpu_object_any(void);
void cpu_object_forget(void);
/* Records in the disk cache's index that obj (an entry of it) holds each of its bodies. */
void cpu_object_index(const cpu_object *obj);
void cpu_object_close(cpu_object *obj);

/* ---- cpu_klib.c: the kernel library ---- */
/* A progressive build (cpu_klib_resolve): before the missing bodies compile, keys[i] gets
 * body i's key at the build's level and ready(ctx) is called, fn[] holding the bodies found
 * compiled; the missing ones then compile in pieces, each joining the library as it lands,
 * and fn[] is filled with atomic stores (a runner may read it meanwhile). */
typedef struct {
  uint64_t (*keys)[2];
  const double *weight; /* per body, or NULL: the work its launches do (heaviest compiled first) */
  void (*ready)(void *ctx);
  void *ctx;
} cpu_klib_progress;
/* Each body's run function at level *opt, from memory, the disk cache, or compiled now (the
 * missing ones only, in parallel objects); a quick build takes a full body when there is one.
 * On return *opt is CPU_OPT_FULL when every body is fully optimized. sized (a program whose
 * sizes vary, exec_program.varying): a body may run as a size-generic template (cpu_sized.c),
 * its literals in lits[i] (the caller frees them; NULL for the others), passed to its run
 * function after its buffers. Any other program's quick build runs a template already compiled
 * where its own body is missing (a size of its own, e.g. a varying LM's longest length, whose
 * graph differs from the family's by a slice PyTorch elides). lib_only: nothing is compiled; 1
 * (no error set) when something would be. 0, or -1 with the error set. */
int cpu_klib_resolve(const cpu_body *b, int n, cpu_opt *opt, bool lib_only, bool sized,
                     cpu_kernel_fn *fn, int64_t **lits, const cpu_klib_progress *progress);
/* The function of body key if this process's library holds it (memory only), else NULL. */
cpu_kernel_fn cpu_klib_get(const uint64_t key[2]);
/* Counts the objects the library took: unchanged, a lookup that missed would miss again. */
size_t cpu_klib_version(void);
/* Closes every object (graft_shutdown, after the last graph is freed). */
void cpu_klib_shutdown(void);
/* Bodies in the library, plus one when the disk cache holds any (backend.cached_pieces). */
size_t cpu_klib_pieces(void);

/* ---- cpu_sized.c: size-generic bodies ---- */
/* When body b's skeleton (its text with the numeric literals masked) was seen before with
 * other literals: the template that serves it into tpl (the text with the varying literals
 * read from its last parameter; nparam one more than b's) and its literal values into *vals
 * (malloc'd). Otherwise tpl->text is NULL (b is recorded as its skeleton's first). The
 * skeleton's first body itself gets one only if `first_too` (a build from compiled kernels
 * only, where its own code is missing) and a template exists. 0, or -1 when out of memory.
 * GRAFT_SIZED=0 turns templates off. */
int cpu_sized_template(const cpu_body *b, bool first_too, cpu_body *tpl, int64_t **vals);
/* Records b as its skeleton's first body if the skeleton is new (b was found compiled: a later
 * size can make a template from it). 0, or -1 when out of memory. */
int cpu_sized_note(const cpu_body *b);
/* The template made before that serves body b, whatever graph b is from (nothing recorded):
 * as cpu_sized_template, tpl->text NULL when none fits. */
int cpu_sized_existing(const cpu_body *b, cpu_body *tpl, int64_t **vals);
/* A template of that text failed to compile: its skeleton's bodies stay specialised. */
void cpu_sized_broken(const char *tpl_text);
/* Forgets every skeleton (tests; graft_shutdown). */
void cpu_sized_forget(void);

/* ---- cpu_pool.c ---- */
void cpu_parallel_run(cpu_kernel_fn fn, void **S, int64_t total);

/* ---- cpu_blas.c ---- */
/* Products smaller than this are not worth a second thread. */
#define CPU_GEMM_PAR_MIN_FLOPS 4e6

/* A hot loop of the first tier built for AVX-512, AVX2 and the baseline, the CPU's chosen when
 * the library loads (an ifunc per function). */
#if defined(__SANITIZE_THREAD__) /* TSan instruments the resolvers, which run before its runtime */
#define CPU_ISAS
#else
#define CPU_ISAS __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
typedef struct {
  void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                float *, int);
  void (*dgemm)(int, int, int, int, int, int, double, const double *, int, const double *, int,
                double, double *, int);
  /* the generated code's batched product (cpu_rt.gemm) */
  void (*gemm)(int dbl, int ta, int tb, int m, int n, int k, const void *a, int lda, int64_t sa,
               const void *b, int ldb, int64_t sb, void *c, int ldc, int64_t sc, int64_t batch);
} cpu_blas_fns;
const cpu_blas_fns *cpu_blas(void); /* NULL fields when OpenBLAS cannot be loaded */
bool cpu_gemm_lib_dnnl(void);      /* oneDNN is the f32 library kernel (else OpenBLAS) */

/* ---- cpu_sgemm.c ---- */
/* Whether graft's own f32 GEMM kernels (these and cpu_narrow.c's) run: the CPU has AVX-512
 * and GRAFT_OWN_GEMM is not 0 (which sends every product to OpenBLAS). */
bool cpu_own_gemm(void);
/* C = op(A) op(B) (alpha 1, beta 0, row-major f32) on one thread with AVX-512; false when the
 * CPU has none, C is too thin for its tiles, or its pack buffers cannot be allocated (the
 * caller then uses OpenBLAS). */
bool cpu_sgemm_avx512(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *a,
                      int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc);
/* dst[t * ldd + q] = src[q * ld + t] for a 16x16 f32 block, in AVX-512 registers (callers
 * check cpu_own_gemm first). */
void cpu_transpose16(const float *src, int64_t ld, float *dst, int64_t ldd);
/* The same, reading only the columns of src whose bit is set in cols (the others as 0). */
void cpu_transpose16_masked(const float *src, int64_t ld, float *dst, int64_t ldd, uint16_t cols);

/* ---- cpu_narrow.c ---- */
/* C = op(A) op(B) (alpha 1, beta 0, row-major f32) on an AVX-512 kernel when one side is 8 to
 * 16 wide (n with B untransposed, or k as A B^T) and the CPU has AVX-512; false: not taken. */
bool cpu_narrow_gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                     const float *b, int ldb, float *c, int ldc);
/* Which side cpu_narrow_gemm's kernels would take as the narrow one: 1 n, 2 k, 0 none. */
int cpu_narrow_takes(int ta, int tb, int64_t m, int64_t n, int64_t k);

/* ---- cpu_choice.c: measured choices between kernels of the same result ---- */
enum { CPU_CHOICE_MAX = 2, CPU_CHOICE_DIMS = 12 };
typedef struct {
  int slot, which, sample;
  double t0;
} cpu_choice_ticket;
/* x's size class (the nearest half octave). */
int64_t cpu_choice_class(int64_t x);
/* Which of n candidates (0: the static rule's default) to run for this instance of the class
 * (kind: a string constant; dims: the first `exact` compared as they are, the rest by size
 * class); while the class is being measured t is armed, and cpu_choice_end times the run. */
int cpu_choice_begin(const char *kind, const int64_t *dims, int nd, int exact, int n,
                     cpu_choice_ticket *t);
void cpu_choice_end(cpu_choice_ticket *t);
/* The default turned out to be the only real candidate for this class: settle on it. */
void cpu_choice_only(cpu_choice_ticket *t);
/* The classes that left their default, one line each (GRAFT_PROFILE's exit report). */
void cpu_choice_report(FILE *f);

/* ---- cpu_fewrows.c ---- */
/* C = A B^T (alpha 1, beta 0, row-major f32) on an AVX-512 kernel when C has 2 to 32 rows and
 * at least 16 columns and the CPU has AVX-512; false: not taken. */
bool cpu_fewrows_gemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                      const float *b, int ldb, float *c, int ldc);
/* Whether cpu_fewrows_gemm's kernels take such a product (the CPU aside). */
bool cpu_fewrows_takes(int ta, int tb, int64_t m, int64_t n, int64_t k);

/* ---- cpu_profile.c: GRAFT_PROFILE=1, time per call site of each compiled graph ---- */
typedef struct {
  char name[96];
  double ms;
  int64_t calls;
} cpu_profile_site;
typedef struct cpu_profile {
  cpu_profile_site *site;
  int n, cap;
  int64_t runs;
  double ms;
  uint64_t hash;
  struct cpu_profile *next; /* the list printed at exit */
} cpu_profile;
bool cpu_profile_enabled(void);
double cpu_profile_now(void); /* milliseconds, monotonic */
void cpu_profile_kernel(cpu_profile *p, int site, cpu_kernel_fn fn, int64_t total, double ms);
void cpu_profile_host(cpu_profile *p, int site, const exec_instr *ins, const exec_program *prog,
                      double ms);
void cpu_profile_gemm(cpu_profile *p, int site, int dbl, int ta, int tb, int m, int n, int k,
                      int64_t batch, double ms);
/* Counts a run; the first registers the table to be written to stderr at exit (or when freed). */
void cpu_profile_run(cpu_profile *p, uint64_t hash, double ms);
void cpu_profile_free(cpu_profile *p);

/* ---- cpu_kernels.c: typed host kernels for ops without generated code ---- */
typedef int (*cpu_host_fn)(const exec_instr *ins, const ref_arg *in, void *out);

/* A host kernel for this instruction, or NULL (the reference kernel runs it). */
cpu_host_fn cpu_host_kernel(const exec_instr *ins, const ref_arg *in);
/* Whether ins's host kernel takes operand k as view v (a contraction reads a transpose of its
 * operand's last two dims in place, as BLAS's transposed operand). */
bool cpu_host_takes_view(const exec_instr *ins, const ref_arg *in, int k, const ref_view *v);

/* ---- cpu_copy.c: strided copies over the pool (the first tier's movement and views) ---- */
typedef struct {
  int nd;
  int64_t shape[GRAFT_MAX_DIMS], sst[GRAFT_MAX_DIMS], dst[GRAFT_MAX_DIMS];
  size_t es;
  const void *src;
  int64_t sbase, dbase;
  void *out;
  const ref_padding *pad; /* a gather of a pad's view: shape is the pad's, sst the operand's */
} cpu_copy;
/* Below this many elements a copy or loop runs on the calling thread alone. */
enum { CPU_COPY_PAR_MIN = 32768 };
/* st: the row-major strides of shape. */
void cpu_row_major(int nd, const int64_t *shape, int64_t *st);
/* g's dims: shape's, size-1 ones dropped, neighbours that step alike on both sides merged. */
void cpu_copy_coalesce(cpu_copy *g, int nd, const int64_t *shape, const int64_t *sst, const int64_t *dst);
/* out[dbase + sum c[d] * dst[d]] = src[sbase + sum c[d] * sst[d]] over shape (on the pool when big). */
void cpu_copy_strided(int nd, const int64_t *shape, graft_dtype dt, const void *src, int64_t sbase,
                      const int64_t *sst, void *out, int64_t dbase, const int64_t *dst);
/* Elements [lo, lo + n) of g (coalesced against row-major dst) read at its source strides. */
void cpu_copy_gather(const cpu_copy *g, int64_t lo, int64_t n, void *dst);
/* g: the gather of operand x's view (false, g zeroed: x is row-major). */
bool cpu_copy_view(cpu_copy *g, const ref_arg *x);

/* ---- cpu_views.c: the first tier's plan of views ---- */
/* v's strides and offset: ins (a broadcast, transpose or slice of an operand of shape xshape,
 * row-major) as a view of that operand; false for other ops. */
bool cpu_view_of(const exec_instr *ins, int xnd, const int64_t *xshape, ref_view *v);
/* nst: strides that make nshape a reshape of the dims (oshape, ost) without a copy, if any
 * exist: each run of old dims that step through memory as one block must be covered by whole
 * new dims (PyTorch's view rule). */
bool cpu_view_reshape(int ond, const int64_t *oshape, const int64_t *ost, int nnd,
                      const int64_t *nshape, int64_t *nst);
/* Whether view v of a value of shape (nd, shape) is walked as that shape (its strides say it). */
bool cpu_view_plain(const ref_view *v, int nd, const int64_t *shape);
/* Whether instruction j of p can read its operand k as view v. */
typedef bool (*cpu_view_taker)(const exec_program *p, int j, int k, const ref_view *v);
/* Which of p's movement instructions run as views (ref_run's views): those every reader takes;
 * NULL with none (or out of memory: then every instruction runs, as it would anyway). */
ref_view *cpu_views_plan(const exec_program *p, cpu_view_taker takes);
/* Frees a plan's views (NULL: nothing). */
void cpu_views_free(ref_view *views, int ninstr);

/* ---- cpu_groups.c: the first tier's fused elementwise groups ---- */
/* The typed loop (not split for the pool) that computes instruction i of p, or NULL. */
typedef ref_fn (*cpu_loop_fn)(const exec_program *p, int i);
/* Fills plan's groups (inside, last_use, nleaf, leaf, run_root, ctx; its views set before);
 * a loop reading a view is a root too (its runner gathers views); none without either.
 * False when out of memory (error set; the plan's groups freed). */
bool cpu_groups_plan(const exec_program *p, ref_plan *plan, cpu_loop_fn loop_of);
/* Frees what cpu_groups_plan allocated (a plan without groups: nothing). */
void cpu_groups_free(ref_plan *plan);
/* The first tier's typed float reductions (cpu_reduce.c): ref_reduce's results, faster; NULL
 * for other ops and dtypes. */
cpu_host_fn cpu_reduce_kernel(const exec_instr *ins, const ref_arg *in);
#endif
