/* The graph layer: capture of pending IR, the compile cache, execution, dumps. */
#ifndef GRAFT_GRAPH_H
#define GRAFT_GRAPH_H
#include "../core/backend.h"
#include "../core/tensor.h"
#include "../passes/passes.h"
#include <stdatomic.h>

/* A captured graph: nodes in post-order (slot = index), with its hash. Arrays are owned by
 * the capture and reused between syncs (capture runs under the global lock). */
typedef struct {
  ir_node **nodes;
  int n, cap;
  ir_node **params; /* DATA leaves in first-visit order */
  int nparams, pcap;
  int *out_slot;    /* per root */
  int nroots, rcap;
  uint64_t hash, shape_free;
} graph_capture;

/* Post-order capture of everything reachable from roots (nodes may repeat in roots). */
int capture_run(graph_capture *g, ir_node *const *roots, int nroots);
/* Lowers a capture into a program (new allocation). */
exec_program *capture_lower(const graph_capture *g);
void capture_free(graph_capture *g);
/* overlaps[c]: whether cand[c], not itself a node of the roots' pending graph, reads one (a
 * value a sync of the roots computes and then drops, which a later sync of cand[c] would
 * compute again). Data leaves and constants do not count. -1 when out of memory. */
int capture_overlap(ir_node *const *roots, int nroots, ir_node *const *cand, int ncand,
                    bool *overlaps);
/* Tests only (no graft work in flight): every capture reports this hash instead of its own, so
 * that different graphs collide in the cache; 0 restores real hashes. Not in graft.h. */
void capture_test_force_hash(uint64_t hash);

/* Compile cache: graph hash -> program + backend executable. */
/* TIER_ONCE: ran once on the first tier; queued for compiling when it runs again (a training
 * loop's first step, which sets up optimizer state, is a graph of its own that never recurs). */
typedef enum { TIER_OFF, TIER_ONCE, TIER_COMPILING, TIER_READY, TIER_FAILED } tier_state;
/* How optimized the native code is: a quick build lands first, the full one replaces it. */
typedef enum { TIER_LEVEL_NONE, TIER_LEVEL_QUICK, TIER_LEVEL_FULL } tier_level;
typedef struct cache_entry {
  exec_program *prog;
  const backend *be;        /* the first tier: runs at once */
  void *exe;
  const backend *fast;      /* the compiling backend, once tier == TIER_READY */
  void *fast_exe;           /* its newest executable (lock held to read) */
  /* fast_exe for the executor thread, which takes no lock: a queued step runs the newest
   * native code when it starts, not what was ready when it was queued. */
  _Atomic(void *) published;
  atomic_bool building;     /* its first native build is queued or running */
  _Atomic double build_started_ms; /* when that build started (0: not yet) */
  double first_tier_ms;     /* its last run's time on the first tier (executor thread only) */
  double partial_slow_share; /* the native share of a progressive build's run that took longer
                               than the first tier's last (executor thread only; tier.c) */
  bool upgrade_pending;     /* it runs a quick build whose full one is not queued yet */
  double quick_build_ms;    /* how long that quick build took (lock held) */
  _Atomic double native_ms; /* its native runs' time, all together (the executor adds) */
  void *replaced_exe;       /* the quick build fast_exe replaced: a running step may use it */
  /* A progressive first build's executable (backend_partial_ready), published while its
   * pieces land: fast_exe once the build is recorded, else (the build failed, or a forked
   * child dropped it) kept here, unpublished, until the entry goes. */
  _Atomic(void *) partial_exe;
  tier_state tier;
  tier_level level;
  bool full_only;           /* the caller waits for native code (wait_compiles): no quick build */
  bool varying;             /* another size of it is cached (cache_sibling) */
  atomic_bool many_sizes;   /* its family has TIER_MANY_SIZES sizes or more (tier.c); set under
                               the lock, read by the executor thread (tier_native_for) */
  int hits;                 /* cache hits while it had no native code (lock held) */
  bool lib_failed;          /* a library build was tried and failed (tier.c) */
  uint64_t lib_tried;       /* the backend's compiler runs at that try */
  bool sizes_shown;         /* the backend saw its sizes for a sibling's templates (tier.c) */
  bool inherited;           /* made before a fork and not run since in this (child) process:
                               graft_wait_compiles leaves it alone */
  unsigned char check_reported; /* GRAFT_CHECK: bit 0 first tier, bit 1 compiled code reported */
  struct cache_entry *next; /* hash chain */
  struct cache_entry *qnext; /* compile queue */
  uint64_t *sig;            /* the captured graph's structure (cache.c), checked on a hash hit */
  size_t nsig;
} cache_entry;
/* The entry of a graph with g's hash AND g's structure (ops, dtypes, shapes, attributes,
 * wiring, roots); NULL on a miss. A hash-equal entry of another structure is a collision:
 * counted in the metrics, never returned. */
cache_entry *cache_lookup(const graph_capture *g);
/* Builds the reason a graph with capture g is compiled, naming the nearest cached graph. */
void cache_reason(const graph_capture *g, char *buf, size_t n);
/* Caches prog (lowered from capture g, whose structure the entry keeps) with its executable. */
cache_entry *cache_insert(exec_program *prog, const graph_capture *g, const backend *be,
                          void *exe);
/* Another cached graph of e's structure up to shapes and dtypes (a loop's step at another
 * batch or sequence length), the one with the most optimized native code; NULL if none.
 * *sizes: how many graphs the family has, e among them. */
cache_entry *cache_sibling(const cache_entry *e, int *sizes);
/* Marks every graph of e's family (e among them) varying, with many sizes, its kernels
 * size-generic (lock held). */
void cache_mark_family(const cache_entry *e);
/* Calls fn on every cached entry (lock held). */
void cache_foreach(void (*fn)(cache_entry *e));
void cache_clear(void);

/* Writes the graph's IR text and Graphviz file into $GRAFT_DUMP_DIR, if set. */
void dump_graph(const graph_capture *g, const exec_program *p, const char *reason,
                const passes_stats *ps);

/* Writes program p as it ran (after passes: the slot numbers of the generated source) to
 * dir/graph_<hash>.<tag>.txt after header (as comment lines), and source, when not NULL, to
 * dir/graph_<hash>.c. path receives the .txt's path. Returns 0, or -1 when a file failed. */
int dump_program(const char *dir, const exec_program *p, const char *tag, const char *header,
                 const char *source, char *path, size_t n);

/* GRAFT_CHECK (check.c), read per execution: off, 1 (report mismatches; the backend's results
 * stand) or strict (a mismatch also fails the sync with GRAFT_ERR_INTERNAL). */
typedef enum { CHECK_OFF, CHECK_ON, CHECK_STRICT } check_mode;
check_mode check_get_mode(void);
/* Runs p on the reference kernels from params, before the backend runs (inputs are not yet
 * donated). Returns the p->noutputs results, or NULL (the check is skipped, with a note). */
exec_buffer **check_reference(const exec_program *p, exec_buffer *const *params);
/* After the backend ran (rc: its result) where check_reference returned NULL: a note on stderr
 * unless the backend failed too. */
void check_unchecked(const exec_program *p, const char *backend_name, int backend_rc);
/* Compares the backend's outputs with ref (and frees ref): reports each output that differs on
 * stderr (the first time per graph and tier) with the graph's IR and generated source dumped,
 * and counts it. Returns the number of outputs that differ; msg receives a one-line summary
 * of the first. */
int check_compare(cache_entry *e, bool fast, exec_buffer *const *outs, exec_buffer **ref,
                  char *msg, size_t n);

/* Materializes the given tensors (lock held); while a collective is pending, every pending
 * tensor (a step). Returns GRAFT_OK or an error status. */
graft_status exec_sync_locked(tensor_slot *const *ts, int n);
/* The same for a read of ts's values: a small graph of computed inputs runs here at once. */
graft_status exec_read_locked(tensor_slot *const *ts, int n);
/* Materializes every live tensor that holds pending IR: a step (lock held). */
graft_status exec_step_locked(void);
/* A new graph (lock held): compiled at once with GRAFT_COMPILE=sync or when the first tier would
 * be slower than the compiler; else marked TIER_ONCE, to compile on a background thread if it
 * runs again; nothing with GRAFT_COMPILE=off. */
void tier_submit(cache_entry *e);
/* A cached graph runs again (lock held): one that ran once is queued for compiling now. */
void tier_hit(cache_entry *e);
/* Registers the built-in backends, once (any thread; later calls return at once). Every lookup
 * below calls it; graft_metrics_get too, so a test may replace a registration after it. */
void graph_backends_init(void);
/* The backend registered for device's kind (device.h) in role (NULL when there is none). */
const backend *graph_backend(int device, backend_role role);
/* The backend a new graph on device first runs on: the interpreter with host kernels, or the
 * plain reference backend under GRAFT_COMPILE=off. */
const backend *tier_first_backend(int device);
/* Executor thread (no lock): e's native code, waiting for its first build when one is in
 * flight and native code would save more on e's queued steps (queued: how many, at
 * e->first_tier_ms each) than the rest of the build takes; NULL: run on the first tier. */
void *tier_native_for(cache_entry *e, int queued, double *share);
/* Stops the compile thread (lock NOT held: the thread takes it to publish results). */
void tier_shutdown(void);
/* Records the builds the compile thread finished while graft's lock was held elsewhere (lock
 * held): their metrics and levels (a quick build's full one then waits until it pays). */
void tier_record_results(void);
/* Tests: returns when no build is queued or running (queues nothing), so that the caller may
 * change the environment the compile thread reads. */
void tier_wait_idle(void);
/* Shuts each backend down once (graft_shutdown, after the cached graphs are freed). */
void graph_backends_shutdown(void);
/* Asynchronous execution (async.c): a job runs one graph on the executor thread. */
typedef struct async_job async_job;
/* GRAFT_ASYNC (read per sync): on unless "0". */
bool async_enabled(void);
/* A job for e's program (lock held); it runs e's native code if published by the time it
 * starts (tier_native_for), else the first tier. NULL with the error set. */
async_job *async_job_new(cache_entry *e);
/* Makes the pending output placeholders; -1 with the error set (discard the job). */
int async_job_make_outputs(async_job *j);
/* Takes the inputs: a reference to each, except a donated one, whose reference it is given. */
void async_job_take_inputs(async_job *j, exec_buffer *const *inputs);
/* Output k's placeholder (the job keeps its reference until it has run). */
exec_buffer *async_job_output(const async_job *j, int k);
/* Queues a job with its outputs and inputs; -1 with the error set (discard it). */
int async_job_submit(async_job *j);
void async_job_discard(async_job *j);
/* Waits until every queued job has run (lock may be held: the executor never takes it). */
void async_drain(void);
/* Whether no queued or running step runs e's graph. */
bool async_entry_idle(const cache_entry *e);
/* Counts a run of p (ms of execution; native code or the first tier; ok) in the metrics. */
void async_count_run(const exec_program *p, double ms, bool native, bool partial, bool ok);
/* Waits until b is not pending; the error of the step that failed to compute it, as fn's. */
graft_status async_wait_buffer(const exec_buffer *b, const char *fn);
/* The first failure of a queued step numbered up to `upto` that no sync has reported yet, as
 * fn's error (reported once), or GRAFT_OK. A sync passes the last step queued before its own:
 * whether its own step already failed on the executor must not depend on timing (that one
 * is reported by its tensors, or by the next sync). */
graft_status async_take_failure(const char *fn, uint64_t upto);
/* The number of the last step queued (0: none). */
uint64_t async_last_seq(void);
/* Runs what is queued and stops the executor thread (graft_shutdown). */
void async_shutdown(void);

/* fork() while graft's threads run (fork.c registers one set of handlers for them, in an order
 * that cannot deadlock: queued steps drain first, then the compile in progress lands). The
 * child starts with no executor and no compile thread, a consistent queue of pending builds,
 * and starts each thread again when it needs it. */
void graph_fork_register(void);
void async_fork_prepare(void);
void async_fork_parent(void);
void async_fork_child(void);
void tier_fork_wait_build(void);
void tier_fork_prepare(void);
void tier_fork_parent(void);
void tier_fork_child(void);
/* Frees the executor's scratch (graft_shutdown). */
void exec_shutdown(void);
#endif
