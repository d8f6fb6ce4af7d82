/* The executor: capture the pending IR of the synced tensors, find or build the executable,
 * bind data leaves as parameters, run, and cut the synced tensors' IR to data leaves. */
#include "graph.h"
#include "../core/device.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include "../core/trace.h"
#include "../passes/passes.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static graph_capture cap;

/* Buffer donation. A data leaf that only this graph references (no tensor holds it, and every
 * captured node dies once the roots are cut) gives its buffer to the backend, which releases
 * it at its last use, so an output allocated after that reuses the memory (an optimizer's
 * parameter update then needs no second copy). The leaf keeps no data: if the step fails
 * anyway, a later sync of these tensors reports the lost input instead of reading garbage. So
 * that nothing ordinary can fail after a donation, a graph whose gather/scatter indices cannot
 * be checked in range beforehand donates nothing, nor does one with a host call (its function
 * may refuse its values: a PyTorch kernel's checks), and nothing is donated under a memory limit
 * (where running out of memory is an expected, recoverable error). */
static int *edges;
static int edges_cap;

/* The range [*lo, *hi] of slot's integer values, judged on the host before anything runs:
 * inputs are scanned; constants and iotas are known; reshapes, broadcasts, transposes, slices,
 * integer converts and selects are followed to their sources; additions, subtractions,
 * negations, minima and maxima combine their operands' ranges (graft_flip's index, n-1 - iota,
 * is one). A range that does not fit the slot's dtype (a wrap) or anything else: unknown
 * (false). An empty value has the range [0, 0]. */
static bool exec_range(const exec_program *p, exec_buffer **bufs, int slot, int64_t *lo,
                       int64_t *hi, int depth) {
  const exec_instr *ins = &p->instr[slot];
  if (depth > 16 || !dtype_is_int(ins->dtype)) return false;
  int64_t alo, ahi, blo, bhi;
  bool ok = false;
  *lo = *hi = 0;
  if (ins->numel == 0) return true;
  switch (ins->op) {
  case IR_DATA:
    for (int k = 0; k < p->nparams && !ok; k++)
      if (p->param_slot[k] == slot) {
        if (buffer_get_state(bufs[k]) != BUFFER_READY || !device_is_host(bufs[k]->device))
          return false; /* a queued step's output; device memory is not read for this */
        *lo = *hi = dtype_load_i(bufs[k]->ptr, ins->dtype, 0);
        for (int64_t e = 1; e < ins->numel; e++) {
          int64_t v = dtype_load_i(bufs[k]->ptr, ins->dtype, e);
          if (v < *lo) *lo = v;
          if (v > *hi) *hi = v;
        }
        ok = true;
      }
    break;
  case IR_CONSTANT:
    if (ins->attr.f >= -9.2e18 && ins->attr.f <= 9.2e18) {
      *lo = *hi = (int64_t)ins->attr.f;
      ok = true;
    }
    break;
  case IR_IOTA:
    *hi = ins->shape[IR_ATTR(ins->attr, AXIS, axis)] - 1;
    ok = true;
    break;
  case IR_RESHAPE: case IR_BROADCAST: case IR_TRANSPOSE: case IR_SLICE: case IR_CONVERT:
    ok = exec_range(p, bufs, ins->in[0], lo, hi, depth + 1);
    break;
  case IR_NEG:
    ok = exec_range(p, bufs, ins->in[0], &alo, &ahi, depth + 1) &&
         !__builtin_sub_overflow((int64_t)0, ahi, lo) && !__builtin_sub_overflow((int64_t)0, alo, hi);
    break;
  case IR_SELECT: case IR_ADD: case IR_SUB: case IR_MIN: case IR_MAX: {
    int first = ins->op == IR_SELECT ? 1 : 0;
    if (!exec_range(p, bufs, ins->in[first], &alo, &ahi, depth + 1) ||
        !exec_range(p, bufs, ins->in[first + 1], &blo, &bhi, depth + 1))
      return false;
    switch (ins->op) {
    case IR_SELECT:
      *lo = alo < blo ? alo : blo, *hi = ahi > bhi ? ahi : bhi, ok = true;
      break;
    case IR_ADD:
      ok = !__builtin_add_overflow(alo, blo, lo) && !__builtin_add_overflow(ahi, bhi, hi);
      break;
    case IR_SUB:
      ok = !__builtin_sub_overflow(alo, bhi, lo) && !__builtin_sub_overflow(ahi, blo, hi);
      break;
    case IR_MIN:
      *lo = alo < blo ? alo : blo, *hi = ahi < bhi ? ahi : bhi, ok = true;
      break;
    default:
      *lo = alo > blo ? alo : blo, *hi = ahi > bhi ? ahi : bhi, ok = true;
    }
    break;
  }
  default:
    return false;
  }
  if (!ok) return false;
  switch (ins->dtype) { /* the value computed in a narrower type must not have wrapped */
  case GRAFT_I32: return *lo >= INT32_MIN && *hi <= INT32_MAX;
  case GRAFT_U8: return *lo >= 0 && *hi <= 255;
  default: return true;
  }
}

/* True when gather/scatter instruction i cannot fail at run time. */
static bool exec_index_in_range(const exec_program *p, exec_buffer **bufs, int i) {
  const exec_instr *ins = &p->instr[i];
  int64_t size = p->instr[ins->in[0]].shape[IR_ATTR(ins->attr, AXIS, axis)], lo, hi;
  return exec_range(p, bufs, ins->in[1], &lo, &hi, 0) &&
         (p->instr[ins->in[1]].numel == 0 || (lo >= 0 && hi < size));
}

/* Only the leaf holds b (and, while b is pending, the queued step that fills it: that step runs
 * before any later one, so b is then the later step's alone). */
static bool exec_sole_owner(const exec_buffer *b) {
  int queued = buffer_get_state(b) == BUFFER_PENDING;
  return buffer_refs(b) == 1 + queued && !b->release; /* borrowed memory is never graft's to reuse */
}

static void exec_donate(const exec_program *p, exec_buffer **bufs, ir_node *const *roots, int n) {
  bool any = false;
  if (buffer_get_limit()) return;
  for (int k = 0; k < cap.nparams && !any; k++)
    any = exec_sole_owner(cap.params[k]->data) && cap.params[k]->data->bytes >= EXEC_DONATE_MIN_BYTES;
  if (!any) return;
  for (int i = 0; i < p->ninstr; i++)
    if (p->instr[i].op == IR_HOST_CALL ||
        ((p->instr[i].op == IR_GATHER || p->instr[i].op == IR_SCATTER_ADD) &&
         !exec_index_in_range(p, bufs, i)))
      return;
  if (cap.n > edges_cap) {
    int *e = realloc(edges, sizeof *e * (size_t)cap.n);
    if (!e) return; /* no donation: still correct */
    edges = e;
    edges_cap = cap.n;
  }
  memset(edges, 0, sizeof *edges * (size_t)cap.n);
  for (int i = 0; i < cap.n; i++)
    for (int k = 0; k < cap.nodes[i]->nin; k++) edges[cap.nodes[i]->in[k]->slot]++;
  for (int r = 0; r < n; r++) edges[roots[r]->slot]++; /* each root tensor holds its node */
  for (int i = 0; i < cap.n; i++)
    if (cap.nodes[i]->op != IR_DATA && cap.nodes[i]->refcnt != edges[i]) return; /* held outside */
  for (int k = 0; k < cap.nparams; k++) {
    ir_node *leaf = cap.params[k];
    if (leaf->refcnt != edges[leaf->slot] || !exec_sole_owner(leaf->data) || leaf->data->bytes < EXEC_DONATE_MIN_BYTES)
      continue;
    bufs[k]->donated = 1; /* the leaf's reference moves to the backend */
    leaf->data = NULL;
    metrics.m.donated_buffers++;
  }
}

/* The synced tensors read output k as numbered by capture_lower: by first appearance of the
 * root's pre-pass slot (passes may renumber slots but keep that order). */
static void exec_out_index(int *out_index, int n) {
  for (int s = 0; s < cap.n; s++) out_index[s] = -1;
  for (int r = 0, k = 0; r < n; r++)
    if (out_index[cap.out_slot[r]] < 0) out_index[cap.out_slot[r]] = k++;
}

/* Points each synced tensor at a data leaf over its output's buffer. */
static graft_status exec_bind_roots(tensor_slot *const *ts, int n, exec_buffer *const *outs,
                                    const int *out_index) {
  graft_status st = GRAFT_OK;
  for (int r = 0; r < n; r++) {
    ir_node *old = ts[r]->node;
    exec_buffer *b = outs[out_index[cap.out_slot[r]]];
    ir_node *leaf = ir_make_data(b, old->dtype, old->ndim, old->shape, old->device);
    if (!leaf) {
      st = GRAFT_ERR_OOM;
      continue; /* this tensor stays pending: still correct, just not materialized */
    }
    leaf->loc = old->loc; /* made where its value was, not where the sync is */
    leaf->opname = old->opname;
    leaf->computed = true;
    tensor_set_node(ts[r], leaf);
  }
  return st;
}

/* Queues e's program for the executor thread (async.c): the synced tensors become leaves over
 * its pending outputs at once. */
static graft_status exec_queue(cache_entry *e, exec_buffer **bufs, tensor_slot *const *ts,
                               ir_node **roots, int n, int *out_index) {
  const exec_program *p = e->prog;
  async_job *j = async_job_new(e);
  if (!j) return graft_last_status();
  if (async_job_make_outputs(j)) { /* before anything is donated: nothing is lost */
    graft_status st = graft_last_status();
    async_job_discard(j);
    return st;
  }
  exec_donate(p, bufs, roots, n);
  async_job_take_inputs(j, bufs);
  exec_buffer **outs = bufs + p->nparams;
  for (int k = 0; k < p->noutputs; k++) outs[k] = async_job_output(j, k);
  exec_out_index(out_index, n);
  /* The leaves take their references before the job runs and drops its own. */
  graft_status st = exec_bind_roots(ts, n, outs, out_index);
  if (async_job_submit(j)) {
    st = graft_last_status();
    async_job_discard(j);
    return st;
  }
  metrics.m.async_steps++;
  return st;
}

/* Inputs a failed queued step should have computed (after a drain): the sync fails. */
static graft_status exec_failed_input(exec_buffer *const *bufs, int nparams) {
  for (int k = 0; k < nparams; k++)
    if (buffer_get_state(bufs[k]) == BUFFER_FAILED)
      return async_wait_buffer(bufs[k], "graft_sync");
  return GRAFT_OK;
}

/* The cached executable of cap's graph, built (first tier) on a miss; *tc: ms spent building.
 * NULL with the error set. */
static cache_entry *exec_lookup(double *tc) {
  bool tr = trace_on();
  uint64_t s1 = tr ? trace_now() : 0;
  cache_entry *e = cache_lookup(&cap);
  *tc = 0;
  if (tr) trace_span("graph", e ? "cache hit" : "cache miss", s1, trace_now(), NULL);
  if (e) {
    metrics.m.cache_hits++;
    tier_hit(e);
    return e;
  }
  double c0 = metrics_now_ms();
  char reason[METRICS_REASON_BYTES];
  uint64_t t = tr ? trace_now() : 0, t_miss = t; /* each part a span of its own: where a miss's time goes */
#define EXEC_PART(name) (tr ? (trace_span("compile", name, t, trace_now(), NULL), t = trace_now()) : 0)
  cache_reason(&cap, reason, sizeof reason);
  EXEC_PART("recompile reason");
  exec_program *p = capture_lower(&cap);
  if (!p) return NULL;
  EXEC_PART("lower");
  passes_stats ps;
  if (passes_run(p, &ps)) {
    program_free(p);
    return NULL;
  }
  EXEC_PART("passes");
  const backend *be = tier_first_backend(p->device);
  void *exe = be->compile(p);
  if (!exe) {
    program_free(p);
    return NULL;
  }
  EXEC_PART("first tier's plan");
  e = cache_insert(p, &cap, be, exe);
  if (!e) {
    if (be->free_exe) be->free_exe(exe);
    program_free(p);
    return NULL;
  }
  tier_submit(e);
  EXEC_PART("cache insert and submit");
#undef EXEC_PART
  if (e->varying) { /* the reason's shapes say which dims differ from the nearest graph */
    size_t k = strlen(reason);
    if (atomic_load(&e->many_sizes))
      snprintf(reason + k, sizeof reason - k, "; a new size of a cached graph: its kernels take "
               "the sizes that vary as run-time values (size-generic), compiled once for every "
               "size");
    else
      snprintf(reason + k, sizeof reason - k, "; a second size of a cached graph: its own code, "
               "compiled once it has run often enough (a third size makes the kernels "
               "size-generic)");
  }
  metrics_add_reason(reason);
  dump_graph(&cap, p, reason, &ps);
  metrics.m.graphs_compiled++;
  *tc = metrics_now_ms() - c0;
  metrics.m.compile_ms += *tc;
  if (tr) {
    char args[METRICS_REASON_BYTES + 64];
    trace_args_reason(args, sizeof args, e->prog->hash, reason);
    trace_span("compile", "lower and plan (first tier)", t_miss, trace_now(), args);
  }
  return e;
}

/* A read (graft_to_host, graft_item, graft_to_device) of a small graph whose inputs are all
 * computed runs it on the reading thread at once instead of queueing it behind the steps in
 * flight: a mask check (nn.Transformer compares its causal mask with torch.equal mid-step), a
 * shape test, an .item() of data already there would otherwise wait for the whole previous
 * step (~1 ms each on a small model). A sync that reads nothing (graft_step, graft_sync) still
 * queues: tracing goes on while it runs. A failure is the read's own error, raised there; the
 * synced tensors then hold it, as a queued step's outputs do (reading one again says its
 * value was lost; a later step that needs it does not run), and no later sync raises it again.
 * CPU graphs only (an accelerator's queue orders its work itself), none with a host call (a
 * user's function may block on the reader), a product or a convolution (BLAS's thread count
 * is the process's: the executor sets it around its own), and not while a queued step runs the
 * same executable. GRAFT_INLINE=0: every graph queues (the A/B switch; tests of the queue). */
enum { EXEC_INLINE_INSTR = 64, EXEC_INLINE_BYTES = 256 << 10 };
static bool exec_reading; /* the sync is a read's (exec_read_locked; under graft's lock) */

static bool exec_inline_enabled(void) { /* read per sync, as GRAFT_ASYNC */
  const char *v = getenv("GRAFT_INLINE");
  return !(v && !strcmp(v, "0"));
}

static bool exec_runs_inline(const cache_entry *e, exec_buffer *const *bufs) {
  const exec_program *p = e->prog;
  if (!exec_reading || p->ninstr > EXEC_INLINE_INSTR || !exec_inline_enabled() ||
      strcmp(device_kind(p->device), "cpu"))
    return false;
  size_t bytes = 0;
  for (int i = 0; i < p->ninstr; i++) {
    ir_op op = p->instr[i].op;
    if (op == IR_HOST_CALL || op == IR_DOT || op == IR_CONV2D) return false;
    bytes += (size_t)p->instr[i].numel * graft_dtype_size(p->instr[i].dtype);
  }
  if (bytes > EXEC_INLINE_BYTES) return false;
  for (int k = 0; k < p->nparams; k++)
    if (buffer_get_state(bufs[k]) != BUFFER_READY) return false;
  return async_entry_idle(e);
}

/* An inline run failed with st: the synced tensors become leaves over failed buffers that
 * hold the error (as a queued step's outputs), so that no later sync runs the graph again. The
 * error stays set for the read that ran it; where memory for that is lacking, they stay
 * pending. */
static void exec_bind_failed(const exec_program *p, tensor_slot *const *ts, int n,
                             exec_buffer **outs, const int *out_index, graft_status st) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", graft_last_error());
  buffer_failure *f = buffer_failure_new(st, msg);
  int made = 0;
  for (; f && made < p->noutputs; made++) {
    const exec_instr *o = &p->instr[p->output_slot[made]];
    outs[made] = buffer_new_pending((size_t)o->numel * graft_dtype_size(o->dtype), p->device, "graft_sync");
    if (!outs[made]) break;
    buffer_fail(outs[made], f);
  }
  if (f && made == p->noutputs) exec_bind_roots(ts, n, outs, out_index);
  for (int k = 0; k < made; k++) buffer_release(outs[k]);
  buffer_failure_release(f);
  err_set(st, "%s", msg);
}

/* Runs e's program on this thread (checked against the reference kernels when checking) and
 * binds the synced tensors; *tx: ms of execution. here: an inline run (exec_runs_inline). */
static graft_status exec_run_here(cache_entry *e, exec_buffer **bufs, tensor_slot *const *ts,
                                  ir_node **roots, int n, int *out_index, bool checking, bool here,
                                  double *tx) {
  const exec_program *p = e->prog;
  check_mode cm = check_get_mode();
  bool fast = e->tier == TIER_READY;
  exec_buffer **ref = checking ? check_reference(p, bufs) : NULL;
  if (cm != CHECK_STRICT) exec_donate(p, bufs, roots, n);
  exec_buffer **outs = bufs + p->nparams;
  for (int k = 0; k < p->noutputs; k++) outs[k] = NULL;
  exec_out_index(out_index, n);
  double x0 = metrics_now_ms();
  uint64_t s0 = trace_on() ? trace_now() : 0;
  int rc = fast ? e->fast->execute(e->fast_exe, p, bufs, outs) : e->be->execute(e->exe, p, bufs, outs);
  *tx = metrics_now_ms() - x0;
  if (s0) { /* inline (a read's small graph), or synchronous (checking, a memory limit, collectives) */
    char args[96];
    snprintf(args, sizeof args, "\"graph\": \"%016llx\", \"tier\": \"%s\", \"ok\": %s",
             (unsigned long long)p->hash, fast ? "native" : "first", rc ? "false" : "true");
    trace_span("step", here ? (fast ? "step inline (native)" : "step inline (first tier)")
                            : (fast ? "step (native)" : "step (first tier)"), s0, trace_now(), args);
  }
  int bad = 0;
  if (checking && !ref) check_unchecked(p, fast ? e->fast->name : e->be->name, rc);
  if (ref && !rc) {
    char msg[1024];
    metrics.m.checked_executions++;
    bad = check_compare(e, fast, outs, ref, msg, sizeof msg); /* frees ref */
    if (bad && cm == CHECK_STRICT) {
      err_set(GRAFT_ERR_INTERNAL, "GRAFT_CHECK=strict: %s (%d output%s differ; report on "
              "stderr)", msg, bad, bad > 1 ? "s" : "");
      for (int k = 0; k < p->noutputs; k++) buffer_release(outs[k]);
    }
  } else if (ref) { /* the backend failed: nothing to compare */
    for (int k = 0; k < p->noutputs; k++) buffer_release(ref[k]);
    free(ref);
  }
  async_count_run(p, *tx, fast, false, !rc && !(bad && cm == CHECK_STRICT));
  if (rc) {
    graft_status st = graft_last_status() ? graft_last_status() : GRAFT_ERR_INTERNAL;
    if (here) exec_bind_failed(p, ts, n, outs, out_index, st);
    return st;
  }
  if (bad && cm == CHECK_STRICT) return GRAFT_ERR_INTERNAL; /* the synced tensors stay pending */
  graft_status st = exec_bind_roots(ts, n, outs, out_index);
  for (int k = 0; k < p->noutputs; k++) buffer_release(outs[k]);
  return st;
}

/* One graph per device: roots holds the pending nodes of one device. */
static graft_status exec_device_run(tensor_slot *const *ts, ir_node **roots, int n) {
  double t0 = metrics_now_ms(), tc = 0, tx = 0;
  uint64_t s0 = trace_on() ? trace_now() : 0;
  if (capture_run(&cap, roots, n)) return graft_last_status();
  if (s0) trace_span("graph", "capture and hash", s0, trace_now(), NULL);
  cache_entry *e = exec_lookup(&tc);
  if (!e) return graft_last_status();
  const exec_program *p = e->prog;
  exec_buffer **bufs = malloc(sizeof *bufs * ((size_t)p->nparams + (size_t)p->noutputs + 1));
  int *out_index = malloc(sizeof(int) * ((size_t)cap.n + 1));
  if (!bufs || !out_index) {
    free(bufs);
    free(out_index);
    err_set(GRAFT_ERR_OOM, "out of memory binding a graph");
    return GRAFT_ERR_OOM;
  }
  for (int k = 0; k < p->nparams; k++) {
    bufs[k] = cap.params[k]->data;
    if (!bufs[k]) { /* see exec_donate: a failed step consumed this input */
      free(bufs);
      free(out_index);
      err_set(GRAFT_ERR_ARG, "graft_sync: input %d of this graph was donated to a step that "
              "failed, so its value is lost; recompute it from its sources", k);
      return GRAFT_ERR_ARG;
    }
  }
  /* GRAFT_CHECK: the reference kernels run first, from the inputs as bound, before any is
   * donated (check.c); the plain reference backend (GRAFT_COMPILE=off) is not checked against
   * itself. Under GRAFT_CHECK=strict nothing is donated, so a sync that a mismatch fails leaves
   * its tensors pending and usable, as after any failed step. */
  check_mode cm = check_get_mode();
  bool checking = cm && (e->tier == TIER_READY || e->be != graph_backend(p->device, BACKEND_REFERENCE));
  /* Checking reads the inputs here, a memory limit makes running out of memory an expected,
   * recoverable error, and collectives call MPI: all run in this thread, after what is queued. */
  bool queue = async_enabled() && !checking && !buffer_get_limit() && !p->has_collective;
  graft_status st;
  bool here = queue && exec_runs_inline(e, bufs);
  if (queue && !here) {
    st = exec_queue(e, bufs, ts, roots, n, out_index);
  } else {
    if (here) metrics.m.inline_runs++; /* its inputs are computed: nothing to wait for */
    else async_drain();                /* a synchronous run: after everything queued */
    st = exec_failed_input(bufs, p->nparams);
    if (st == GRAFT_OK) st = exec_run_here(e, bufs, ts, roots, n, out_index, checking, here, &tx);
  }
  free(bufs);
  free(out_index);
  metrics.m.syncs++;
  metrics.m.sync_overhead_ms += metrics_now_ms() - t0 - tc - tx;
  return st;
}

static graft_status exec_sync_some(tensor_slot *const *ts, int n);
static graft_status exec_device(tensor_slot *const *ts, ir_node **roots, int n);

typedef struct {
  tensor_slot **ts;
  int n, cap;
  bool oom;
} exec_pending;

static void exec_collect(tensor_slot *t, void *ctx) {
  exec_pending *l = ctx;
  if (t->node->op == IR_DATA || l->oom) return;
  if (l->n == l->cap) {
    int c = l->cap ? l->cap * 2 : 64;
    tensor_slot **p = realloc(l->ts, sizeof *p * (size_t)c);
    if (!p) {
      l->oom = true;
      return;
    }
    l->ts = p;
    l->cap = c;
  }
  l->ts[l->n++] = t;
}

/* A collective must run once per step, at the same point on every rank. Syncing only some of
 * its outputs (a read of one) would leave the others pending on the same collective node, to
 * run it again in a later graph; and a rank that read and a rank that did not would disagree.
 * So while a collective is pending, every sync runs everything pending: a step. */
graft_status exec_sync_locked(tensor_slot *const *ts, int n) {
  return ir_collective_count() ? exec_step_locked() : exec_sync_some(ts, n);
}

/* The tensors read, and every live pending tensor whose graph shares pending nodes with
 * theirs, into *all (malloc'd; *m of them); -1 when out of memory. A loop that reads its loss
 * every step and never calls graft.step() (unmodified PyTorch code) had its loss synced alone:
 * the parameters' updates stayed pending over the forward's activations, which that sync had
 * computed and dropped, so the next step's graph computed them again, and the one after both
 * steps: resnet18's graphs grew by ~3700 nodes a step (80, 110, 177, 211, 287 ms). Synced with
 * the loss, the live values that share its work make the step a graph of its own, as
 * graft.step() would. A read that shares nothing (a mask check over computed data) stays
 * small, and the read's own intermediates (a C scope's, a Python local) are not outputs. */
static int exec_read_set(tensor_slot *const *ts, int n, tensor_slot ***all, int *m) {
  exec_pending l = {0};
  tensor_foreach_live(exec_collect, &l);
  ir_node **roots = malloc(sizeof *roots * ((size_t)n + 1));
  ir_node **cand = malloc(sizeof *cand * ((size_t)l.n + 1));
  bool *hit = malloc((size_t)l.n + 1);
  tensor_slot **out = malloc(sizeof *out * ((size_t)n + (size_t)l.n + 1));
  int rc = -1;
  if (!l.oom && roots && cand && hit && out) {
    for (int i = 0; i < n; i++) roots[i] = ts[i]->node;
    for (int i = 0; i < l.n; i++) cand[i] = l.ts[i]->node;
    if (!capture_overlap(roots, n, cand, l.n, hit)) {
      memcpy(out, ts, sizeof *out * (size_t)n);
      *m = n;
      for (int i = 0; i < l.n; i++)
        if (hit[i]) out[(*m)++] = l.ts[i];
      *all = out;
      out = NULL;
      rc = 0;
    }
  }
  free(l.ts);
  free(roots);
  free(cand);
  free(hit);
  free(out);
  if (rc) err_set(GRAFT_ERR_OOM, "graft: out of memory listing the tensors a read syncs");
  return rc;
}

graft_status exec_read_locked(tensor_slot *const *ts, int n) {
  if (ir_collective_count()) return exec_step_locked();
  bool computes = false; /* a read of computed values (a loss after graft.step()) walks nothing */
  for (int i = 0; i < n && !computes; i++) computes = ts[i]->node->nin > 0;
  tensor_slot **all = (tensor_slot **)ts;
  int m = n;
  if (computes && exec_read_set(ts, n, &all, &m)) return GRAFT_ERR_OOM;
  exec_reading = true;
  graft_status st = exec_sync_some(all, m);
  exec_reading = false;
  if (all != ts) free(all);
  return st;
}

graft_status exec_step_locked(void) {
  exec_pending l = {0};
  tensor_foreach_live(exec_collect, &l);
  graft_status st = GRAFT_ERR_OOM;
  if (l.oom) err_set(GRAFT_ERR_OOM, "graft_step: out of memory listing live tensors");
  else st = exec_sync_some(l.ts, l.n);
  free(l.ts);
  return st;
}

typedef struct {
  uint64_t seq;
  int i;
} exec_root_order;

static int exec_cmp_root(const void *a, const void *b) {
  const exec_root_order *x = a, *y = b;
  return x->seq != y->seq ? (x->seq > y->seq) - (x->seq < y->seq) : (x->i > y->i) - (x->i < y->i);
}

/* The roots in the order the program made them: the capture walks them so, and the steps run
 * in the program's order, the loss (made in the forward pass) before the gradients and the
 * optimizer's updates, where a walk from the parameters put it last. A backend that reports
 * outputs as they become final (async.c) then gives a loop its loss while the step goes on. */
static exec_root_order *order_key; /* scratch of exec_order_roots (under the lock) */
static tensor_slot **order_sel;
static int order_cap;

static void exec_order_roots(tensor_slot **sel, ir_node **roots, int m) {
  bool sorted = true;
  for (int i = 1; i < m && sorted; i++) sorted = roots[i - 1]->seq <= roots[i]->seq;
  if (sorted) return;
  if (m > order_cap) {
    exec_root_order *o = realloc(order_key, sizeof *o * (size_t)m);
    if (o) order_key = o;
    tensor_slot **s2 = o ? realloc(order_sel, sizeof *s2 * (size_t)m) : NULL;
    if (s2) order_sel = s2;
    if (!o || !s2) return; /* any order is correct; this one is only sooner */
    order_cap = m;
  }
  for (int i = 0; i < m; i++) order_key[i] = (exec_root_order){roots[i]->seq, i};
  qsort(order_key, (size_t)m, sizeof *order_key, exec_cmp_root);
  for (int i = 0; i < m; i++) order_sel[i] = sel[order_key[i].i];
  for (int i = 0; i < m; i++) sel[i] = order_sel[i], roots[i] = order_sel[i]->node;
}

static graft_status exec_sync_some(tensor_slot *const *ts, int n) {
  tensor_slot **sel = malloc(sizeof *sel * ((size_t)n + 1));
  ir_node **roots = malloc(sizeof *roots * ((size_t)n + 1));
  if (!sel || !roots) {
    free(sel);
    free(roots);
    err_set(GRAFT_ERR_OOM, "graft_sync: out of memory");
    return GRAFT_ERR_OOM;
  }
  graft_status st = GRAFT_OK;
  for (int dev = 0; dev < GRAFT_MAX_DEVICES && st == GRAFT_OK; dev++) {
    int m = 0;
    for (int i = 0; i < n; i++) {
      ir_node *node = ts[i]->node;
      if (node->op == IR_DATA || node->device != dev) continue;
      /* a tensor listed twice is harmless: both roots name the same slot */
      sel[m] = ts[i];
      roots[m++] = node;
    }
    exec_order_roots(sel, roots, m);
    if (m) st = exec_device(sel, roots, m);
  }
  free(sel);
  free(roots);
  return st;
}

/* exec_device_run, a span of the trace ("sync": the graph's size and hash, hit or compiled). */
static graft_status exec_device(tensor_slot *const *ts, ir_node **roots, int n) {
  if (!trace_on()) return exec_device_run(ts, roots, n);
  trace_thread_name("tracing (syncs)");
  uint64_t t0 = trace_now();
  uint64_t compiled = metrics.m.graphs_compiled;
  graft_status st = exec_device_run(ts, roots, n);
  char args[160];
  snprintf(args, sizeof args, "\"graph\": \"%016llx\", \"roots\": %d, \"nodes\": %d, \"new graph\": %s, "
           "\"status\": %d", (unsigned long long)cap.hash, n, cap.n,
           metrics.m.graphs_compiled != compiled ? "true" : "false", (int)st);
  trace_span("graph", "sync", t0, trace_now(), args);
  return st;
}

void exec_shutdown(void) {
  capture_free(&cap);
  free(edges);
  edges = NULL;
  edges_cap = 0;
  free(order_key);
  free(order_sel);
  order_key = NULL;
  order_sel = NULL;
  order_cap = 0;
}
