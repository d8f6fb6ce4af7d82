/* Metrics read-out: counters from the core, gauges, and the backends' own counters (native
 * compiles, disk hits, reference fallbacks per op), as a struct and as a text report. */
#include "graph.h"
#include "../core/loc.h"
#include "../core/device.h"
#include "../core/buffer.h"
#include "../core/metrics.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sum of every registered backend's counters (each backend once). */
static void report_backend_stats(backend_stats *bs) {
  memset(bs, 0, sizeof *bs);
  graph_backends_init();
  for (int i = 0; i < backend_count(); i++) {
    const backend *be = backend_at(i, NULL, NULL);
    bool seen = false;
    for (int j = 0; j < i; j++) seen = seen || backend_at(j, NULL, NULL) == be;
    if (seen || !be->stats) continue;
    backend_stats one;
    memset(&one, 0, sizeof one);
    be->stats(&one);
    bs->compiles += one.compiles;
    bs->disk_hits += one.disk_hits;
    bs->kernels_compiled += one.kernels_compiled;
    bs->kernels_reused += one.kernels_reused;
    bs->kernels_sized += one.kernels_sized;
    bs->disk_refused += one.disk_refused;
    bs->kernel_choices += one.kernel_choices;
    bs->kernels_demoted += one.kernels_demoted;
    for (int k = 0; k < IR_OP_COUNT; k++) bs->fallbacks[k] += one.fallbacks[k];
  }
}

void graft_metrics_get(graft_metrics *m) {
  if (!m) return;
  tensor_lock();
  async_drain(); /* the executor thread's counters describe finished steps */
  tier_record_results(); /* and the compile thread's, finished builds */
  *m = metrics.m;
  m->live_tensors = (uint64_t)tensor_live_count();
  m->pending_nodes = (uint64_t)ir_pending_count();
  m->bytes_in_use = buffer_bytes_in_use();
  m->bytes_peak = buffer_bytes_peak();
  m->bytes_pooled = buffer_pool_bytes();
  backend_stats bs;
  report_backend_stats(&bs);
  m->native_disk_hits = bs.disk_hits;
  m->kernels_compiled = bs.kernels_compiled;
  m->kernels_reused = bs.kernels_reused;
  m->kernels_sized = bs.kernels_sized;
  m->compiler_runs = bs.compiles;
  m->native_disk_refused = bs.disk_refused;
  m->kernel_choices = bs.kernel_choices;
  m->kernels_demoted = bs.kernels_demoted;
  m->fallback_ops = 0;
  for (int i = 0; i < IR_OP_COUNT; i++) m->fallback_ops += bs.fallbacks[i];
  device_traffic dt;
  device_traffic_get(&dt);
  m->device_uploads = dt.uploads;
  m->device_upload_bytes = dt.upload_bytes;
  m->device_downloads = dt.downloads;
  m->device_download_bytes = dt.download_bytes;
  tensor_unlock();
}

void graft_metrics_reset(void) {
  tensor_lock();
  async_drain(); /* the executor thread writes the execution counters */
  memset(&metrics, 0, sizeof metrics);
  device_traffic_reset();
  buffer_reset_peak();
  metrics_nreasons = 0;
  loc_reset_counts();
  tensor_unlock();
}

/* A report line: the field's label and value (times in ms with 3 decimals). */
static int report_uint64_t(char *s, size_t n, const char *label, uint64_t v) {
  return snprintf(s, n, "  %-24s %llu\n", label, (unsigned long long)v);
}
static int report_double(char *s, size_t n, const char *label, double v) {
  return snprintf(s, n, "  %-24s %.3f\n", label, v);
}

char *graft_metrics_report(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  size_t cap = 8192 + METRICS_NREASONS * (METRICS_REASON_BYTES + 8) + 1100;
  char *s = malloc(cap);
  if (!s) return NULL;
  tensor_lock();
  int k = snprintf(s, cap, "graft metrics\n");
  /* one line per field of GRAFT_METRICS_FIELDS (include/graft.h), in its order */
/* recompile sites the report lists */
#define REPORT_TOP_SITES 5
#define REPORT_FIELD(type, name, label, meaning) k += report_##type(s + k, cap - (size_t)k, label, m.name);
  GRAFT_METRICS_FIELDS(REPORT_FIELD)
#undef REPORT_FIELD
  backend_stats bs;
  report_backend_stats(&bs);
  if (m.fallback_ops) {
    k += snprintf(s + k, cap - (size_t)k, "  reference fallbacks inside compiled graphs, per op:\n");
    for (int i = 0; i < IR_OP_COUNT && (size_t)k < cap; i++)
      if (bs.fallbacks[i])
        k += snprintf(s + k, cap - (size_t)k, "    %-14s %llu\n", ir_ops[i].name,
                      (unsigned long long)bs.fallbacks[i]);
  }
  for (int i = GRAFT_CPU_DEVICES; i < device_count_known() && (size_t)k < cap; i++) {
    const device_info *d = device_get(i);
    k += snprintf(s + k, cap - (size_t)k, "  device %d %s:%d: %s, %zu MiB\n", i, d->kind, d->ordinal,
                  d->name, d->memory >> 20);
  }
  int first = metrics_nreasons > METRICS_NREASONS ? metrics_nreasons - METRICS_NREASONS : 0;
  if (metrics_nreasons) k += snprintf(s + k, cap - (size_t)k, "  recent compile reasons:\n");
  for (int i = first; i < metrics_nreasons && (size_t)k < cap; i++)
    k += snprintf(s + k, cap - (size_t)k, "    - %s\n", metrics_reasons[i % METRICS_NREASONS]);
  char top[1024];
  if (loc_top(top, sizeof top, REPORT_TOP_SITES) && (size_t)k < cap)
    k += snprintf(s + k, cap - (size_t)k, "  top recompile sites: %s\n", top);
  tensor_unlock();
  return s;
}
