/* GRAFT_CHECK: every executed graph (compiled code and first tier alike) is also run on the
 * reference kernels from the same inputs, and each output is compared with the reference's.
 *
 * Order: the reference runs first, before the backend and before any input is donated (the
 * backend may free or overwrite a donated input), so both read the same inputs.
 *
 * Tolerance: an element passes when |got - ref| <= tol * (|ref| + scale), scale = the largest
 * finite magnitude in either result, at least CHECK_UNIT: tol is relative per element, with an
 * absolute floor relative to the output's size (an element that cancels to ~0 is not held to
 * its own tiny value) and to 1e-3 (an output that cancels to ~0 everywhere, the gradient of a
 * bias that a batch norm follows, is rounding noise: 1e-9 in one result, -2e-9 in the other).
 * NaN equals NaN, an infinity only itself. tol follows the instructions the output depends on,
 * in program order: movement, data, constants, gather, rng and converts of exact values add
 * nothing (tol 0: bit-exact); other elementwise arithmetic is "tight" (one or two roundings of
 * the instruction's dtype: f32 1e-5, f64 1e-12, f16/bf16 1e-2); transcendentals (exp, log,
 * tanh, erf, sigmoid, sin, cos, log1p, expm1, pow, rsqrt), sums and products, contractions
 * (dot, conv2d), scatter_add and sum pooling are "loose" (approximated functions, reordered
 * accumulation: f32 1e-3, f64 1e-9, f16/bf16 2e-2). An inexact value keeps at least the tight
 * tolerance of every later instruction's dtype (a convert to f32 rounds it again). Integer and
 * bool outputs are exact; one computed from inexact floats (argmax of a sum, a comparison, a
 * convert) may flip at a rounding tie, so up to one element in 1000 (at least one) may differ.
 *
 * A mismatch is reported on stderr the first time per graph and tier (later ones are counted
 * only: metrics check_mismatches), with the output, the code that computed it (the backend's
 * explain hook), the errors and where, and the program and generated source are written to
 * $GRAFT_DUMP_DIR or a private temp folder. GRAFT_CHECK=1 keeps the backend's results (an
 * observer); GRAFT_CHECK=strict fails the sync with GRAFT_ERR_INTERNAL (exec.c). */
#include "graph.h"
#include "../core/dtype.h"
#include "../core/error.h"
#include "../core/metrics.h"
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

check_mode check_get_mode(void) { /* per execution, as GRAFT_PROFILE and GRAFT_COMPILE */
  const char *v = getenv("GRAFT_CHECK");
  if (!v || !*v || !strcmp(v, "0")) return CHECK_OFF;
  return !strcmp(v, "strict") ? CHECK_STRICT : CHECK_ON;
}

/* The check observes: an error it meets (a failed reference run, a report that could not be
 * completed) leaves this thread's error state as it was (err_save / err_restore around it). */
static char check_ref_err[512]; /* why the last reference run failed */

exec_buffer **check_reference(const exec_program *p, exec_buffer *const *params) {
  err_saved saved;
  err_save(&saved);
  exec_buffer **ref = calloc((size_t)p->noutputs + 1, sizeof *ref);
  if (!ref || graph_backend(p->device, BACKEND_REFERENCE)->execute(NULL, p, params, ref)) {
    snprintf(check_ref_err, sizeof check_ref_err, "%s", ref ? graft_last_error() : "out of memory");
    err_restore(&saved); /* the backend's own run decides the sync */
    free(ref);
    return NULL;
  }
  return ref;
}

void check_unchecked(const exec_program *p, const char *backend_name, int backend_rc) {
  if (backend_rc) return; /* both failed (an index out of range, a memory limit): consistent */
  fprintf(stderr, "graft check: graph %016" PRIx64 ": the reference kernels failed (%s) where the "
          "%s backend ran; this execution is not compared\n", p->hash, check_ref_err,
          backend_name);
}

enum { OPC_EXACT, OPC_TIGHT, OPC_LOOSE };

static int check_op_class(const exec_instr *ins) {
  switch (ins->op) {
  case IR_EXP: case IR_LOG: case IR_TANH: case IR_ERF: case IR_SIGMOID: case IR_SIN: case IR_COS:
  case IR_LOG1P: case IR_EXPM1: case IR_POW: case IR_RSQRT:
  case IR_REDUCE_SUM: case IR_REDUCE_PROD: case IR_DOT: case IR_CONV2D: case IR_SCATTER_ADD:
    return OPC_LOOSE;
  case IR_REDUCE_WINDOW: return IR_ATTR(ins->attr, WINDOW, kind) ? OPC_LOOSE : OPC_TIGHT; /* sum : max */
  case IR_MAX_POOL_GRAD: return OPC_LOOSE; /* sums of dy where windows overlap */
  case IR_CONVERT: case IR_GATHER: case IR_RNG: return OPC_EXACT;
  default: break;
  }
  ir_kind k = ir_ops[ins->op].kind;
  return k == IR_K_LEAF || k == IR_K_MOVEMENT ? OPC_EXACT : OPC_TIGHT;
}

static double check_tight(graft_dtype dt) {
  return dt == GRAFT_F32 ? 1e-5 : dt == GRAFT_F64 ? 1e-12 : dtype_is_float(dt) ? 1e-2 : 0;
}
static double check_loose(graft_dtype dt) {
  return dt == GRAFT_F32 ? 1e-3 : dt == GRAFT_F64 ? 1e-9 : dtype_is_float(dt) ? 2e-2 : 0;
}

/* tol[i] for every slot (see the top); why[i] = the instruction that set it (-1: exact). */
static void check_tolerances(const exec_program *p, double *tol, int *why) {
  for (int i = 0; i < p->ninstr; i++) {
    const exec_instr *ins = &p->instr[i];
    double t = 0;
    int w = -1;
    for (int k = 0; k < ins->nin; k++)
      if (tol[ins->in[k]] > t) {
        t = tol[ins->in[k]];
        w = why[ins->in[k]];
      }
    int c = check_op_class(ins);
    double own = c == OPC_LOOSE ? check_loose(ins->dtype)
                 : c == OPC_TIGHT || t > 0 ? check_tight(ins->dtype) : 0;
    if (own > t) {
      t = own;
      w = i;
    }
    tol[i] = t;
    why[i] = w;
  }
}

typedef struct {
  int64_t nbad, allowed;
  double max_abs, max_rel;
  int64_t at_abs, at_rel;
  double got_abs, ref_abs, got_rel, ref_rel;
  double scale;
} check_cmp;

static void check_note(check_cmp *c, int64_t e, double d, double rel, double got, double ref) {
  if (d > c->max_abs || (c->at_abs < 0 && d == c->max_abs)) {
    c->max_abs = d;
    c->at_abs = e;
    c->got_abs = got;
    c->ref_abs = ref;
  }
  if (rel > c->max_rel || (c->at_rel < 0 && rel == c->max_rel)) {
    c->max_rel = rel;
    c->at_rel = e;
    c->got_rel = got;
    c->ref_rel = ref;
  }
}

#define CHECK_UNIT 1e-3 /* the least scale of the absolute floor (see the top) */

static void check_values(const exec_instr *ins, const void *got, const void *ref, double tol,
                         check_cmp *c) {
  memset(c, 0, sizeof *c);
  c->at_abs = c->at_rel = -1;
  int64_t n = ins->numel;
  if (!dtype_is_float(ins->dtype)) {
    /* exact; computed from inexact floats (tol > 0): rounding ties may flip a few elements */
    c->allowed = tol > 0 ? (n / 1000 > 1 ? n / 1000 : 1) : 0;
    for (int64_t e = 0; e < n; e++) {
      int64_t a = dtype_load_i(got, ins->dtype, e), b = dtype_load_i(ref, ins->dtype, e);
      if (a == b) continue;
      c->nbad++;
      double d = fabs((double)a - (double)b);
      check_note(c, e, d, b ? d / fabs((double)b) : INFINITY, (double)a, (double)b);
    }
    return;
  }
  for (int64_t e = 0; e < n; e++) {
    double a = dtype_load(got, ins->dtype, e), b = dtype_load(ref, ins->dtype, e);
    if (isfinite(a) && fabs(a) > c->scale) c->scale = fabs(a);
    if (isfinite(b) && fabs(b) > c->scale) c->scale = fabs(b);
  }
  if (c->scale < CHECK_UNIT) c->scale = CHECK_UNIT;
  for (int64_t e = 0; e < n; e++) {
    double a = dtype_load(got, ins->dtype, e), b = dtype_load(ref, ins->dtype, e);
    double d;
    bool ok;
    if (isnan(a) || isnan(b) || isinf(a) || isinf(b)) {
      ok = (isnan(a) && isnan(b)) || a == b;
      d = ok ? 0 : INFINITY;
    } else {
      d = fabs(a - b);
      ok = d <= tol * (fabs(b) + c->scale);
    }
    double rel = d == 0 ? 0 : b != 0 && isfinite(b) ? d / fabs(b) : INFINITY;
    if (!ok) c->nbad++;
    if (d > 0) check_note(c, e, d, rel, a, b);
  }
}

/* "[i,j,k]" of flat element e. */
static const char *check_where(const exec_instr *ins, int64_t e, char *buf, size_t n) {
  int64_t c[GRAFT_MAX_DIMS];
  for (int d = ins->ndim - 1; d >= 0; d--) {
    c[d] = ins->shape[d] ? e % ins->shape[d] : 0;
    e = ins->shape[d] ? e / ins->shape[d] : 0;
  }
  return ir_shape_str(ins->ndim, c, buf, n);
}

/* A growable report. */
typedef struct {
  char *s;
  size_t n, cap;
} check_text;

static void check_printf(check_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check_printf(check_text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (t->s && t->n + (size_t)k < t->cap) {
      t->n += (size_t)k;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 4096;
    while (cap < t->n + (size_t)k + 1) cap *= 2;
    char *s = realloc(t->s, cap);
    if (!s) return; /* a shorter report */
    t->s = s;
    t->cap = cap;
  }
}

static char check_tmp[4096];

/* $GRAFT_DUMP_DIR, else a private folder made once per process (mkdtemp: mode 0700). */
static const char *check_dump_dir(void) {
  const char *d = getenv("GRAFT_DUMP_DIR");
  if (d && *d) {
    if (mkdir(d, 0700) && errno != EEXIST) return NULL;
    return d;
  }
  if (!check_tmp[0]) {
    const char *t = getenv("TMPDIR");
    snprintf(check_tmp, sizeof check_tmp, "%s/graft-check-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(check_tmp)) {
      check_tmp[0] = 0;
      return NULL;
    }
  }
  return check_tmp;
}

static void check_describe_output(check_text *t, const exec_program *p, int k, int slot) {
  const exec_instr *ins = &p->instr[slot];
  char shp[128], attr[512];
  ir_attr_fmt(ins->op, &ins->attr, ins->nin ? p->instr[ins->in[0]].ndim : ins->ndim, attr,
              sizeof attr);
  check_printf(t, "  output %d of %d: %s%s = %%%d %s", k, p->noutputs,
               graft_dtype_name(ins->dtype), ir_shape_str(ins->ndim, ins->shape, shp, sizeof shp),
               slot, ir_ops[ins->op].name);
  for (int q = 0; q < ins->nin; q++) check_printf(t, "%s%%%d", q ? ", " : " (", ins->in[q]);
  check_printf(t, "%s%s%s\n", ins->nin ? ")" : "", *attr ? "  " : "", attr);
}

static void check_describe_error(check_text *t, const exec_program *p, int slot,
                                 const check_cmp *c, double tol, int why) {
  const exec_instr *ins = &p->instr[slot];
  char w1[128], w2[128];
  const char *why_op = why >= 0 ? ir_ops[p->instr[why].op].name : "";
  if (!dtype_is_float(ins->dtype) && tol > 0)
    check_printf(t, "  tolerance: exact, but it is computed from inexact floats (after %s %%%d): "
                 "up to %" PRId64 " element(s) may differ at rounding ties\n", why_op, why,
                 c->allowed);
  else if (!dtype_is_float(ins->dtype))
    check_printf(t, "  tolerance: exact (%s)\n", graft_dtype_name(ins->dtype));
  else if (tol == 0)
    check_printf(t, "  tolerance: exact (only data movement from the inputs and constants)\n");
  else
    check_printf(t, "  tolerance: |got - ref| <= %g * (|ref| + %.6g), %s after %s %%%d\n", tol,
                 c->scale, check_op_class(&p->instr[why]) == OPC_LOOSE ? "loose" : "tight",
                 why_op, why);
  check_printf(t, "  max abs error %.6g at %s (got %.9g, ref %.9g); max rel error %.6g at %s "
               "(got %.9g, ref %.9g); %" PRId64 " of %" PRId64 " elements differ beyond the "
               "tolerance\n", c->max_abs, check_where(ins, c->at_abs, w1, sizeof w1), c->got_abs,
               c->ref_abs, c->max_rel, check_where(ins, c->at_rel, w2, sizeof w2), c->got_rel,
               c->ref_rel, c->nbad, ins->numel);
}

#define CHECK_DETAILED 8 /* outputs described in full per report; the rest in a line each */

int check_compare(cache_entry *e, bool fast, exec_buffer *const *outs, exec_buffer **ref,
                  char *msg, size_t msgn) {
  const exec_program *p = e->prog;
  const backend *be = fast ? e->fast : e->be;
  void *exe = fast ? e->fast_exe : e->exe;
  unsigned char bit = fast ? 2 : 1;
  bool report = !(e->check_reported & bit);
  int n = p->ninstr, bad = 0;
  double *tol = malloc(sizeof *tol * ((size_t)n + 1));
  int *why = malloc(sizeof *why * ((size_t)n + 1));
  check_text t = {0};
  char *source = NULL;
  bool source_asked = false;
  msg[0] = 0;
  if (!tol || !why) {
    fprintf(stderr, "graft check: graph %016" PRIx64 ": out of memory comparing\n", p->hash);
    goto done;
  }
  check_tolerances(p, tol, why);
  for (int k = 0; k < p->noutputs; k++) {
    int slot = p->output_slot[k];
    const exec_instr *ins = &p->instr[slot];
    check_cmp c;
    /* outputs in a device's own memory are compared from host copies */
    exec_buffer *ho = buffer_to_device(outs[k], 0, "a checked output");
    exec_buffer *hr = buffer_to_device(ref[k], 0, "a checked output");
    if (!ho || !hr) {
      buffer_release(ho);
      buffer_release(hr);
      fprintf(stderr, "graft check: graph %016" PRIx64 ": could not copy output %d to compare: "
              "%s\n", p->hash, k, graft_last_error());
      continue;
    }
    check_values(ins, ho->ptr, hr->ptr, tol[slot], &c);
    buffer_release(ho);
    buffer_release(hr);
    if (c.nbad <= c.allowed) continue;
    metrics.m.check_mismatches++;
    if (!bad++) {
      char w[128];
      snprintf(msg, msgn, "output %d (%%%d %s) of graph %016" PRIx64 " differs from the "
               "reference kernels on the %s backend: max abs error %.6g at %s", k, slot,
               ir_ops[ins->op].name, p->hash, be->name, c.max_abs,
               check_where(ins, c.at_abs, w, sizeof w));
    }
    if (!report) continue;
    if (bad == 1)
      check_printf(&t, "graft check: graph %016" PRIx64 " on the %s backend (%s) differs from "
                   "the reference kernels\n", p->hash, be->name,
                   fast ? "compiled code" : "the first tier");
    if (bad > CHECK_DETAILED) { /* an optimizer step of a broken graph: every parameter */
      char w[128];
      check_printf(&t, "  output %d (%%%d %s) differs too: max abs error %.6g at %s\n", k, slot,
                   ir_ops[ins->op].name, c.max_abs, check_where(ins, c.at_abs, w, sizeof w));
      continue;
    }
    check_describe_output(&t, p, k, slot);
    if (be->explain) {
      char what[2048];
      what[0] = 0;
      err_saved saved;
      err_save(&saved);
      be->explain(exe, p, slot, what, sizeof what, source_asked ? NULL : &source);
      err_restore(&saved);
      source_asked = true;
      check_printf(&t, "  computed by: %s\n", what);
    } else {
      check_printf(&t, "  computed by: the %s backend's %s %%%d\n", be->name, ir_ops[ins->op].name,
                   slot);
    }
    check_describe_error(&t, p, slot, &c, tol[slot], why[slot]);
  }
  if (bad && report) {
    e->check_reported |= bit;
    const char *dir = check_dump_dir();
    int err = errno;
    char path[4200];
    if (!dir) {
      check_printf(&t, "  (no dump: cannot create a folder for it: %s)\n", strerror(err));
    } else if (dump_program(dir, p, fast ? "check" : "check-tier1", t.s, source, path,
                            sizeof path)) {
      err = errno;
      check_printf(&t, "  (dump incomplete: %s: %s)\n", path, strerror(err));
    } else {
      check_printf(&t, "  dumped: %s (report and the program as it ran)", path);
      if (source) check_printf(&t, ", %s/graph_%016" PRIx64 ".c (generated source)", dir, p->hash);
      check_printf(&t, "%s\n", dir == check_tmp ? "; the folder is private to this process "
                                                   "(set GRAFT_DUMP_DIR to choose it)" : "");
    }
    check_printf(&t, "  %s; later mismatches of this graph on this backend are counted only "
                 "(metrics: check_mismatches)\n", check_get_mode() == CHECK_STRICT ?
                 "GRAFT_CHECK=strict: the sync fails" : "GRAFT_CHECK=1: the backend's results stand");
    if (t.s) fputs(t.s, stderr);
  }
done:
  for (int k = 0; k < p->noutputs; k++) buffer_release(ref[k]);
  free(ref);
  free(tol);
  free(why);
  free(source);
  free(t.s);
  return bad;
}
