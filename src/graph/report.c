/* Metrics read-out: counters from the core, gauges, and the backends' own counters (native
 * compiles, disk hits, reference fallbacks per op), as a struct and as a text report. */
#include "graph.h"
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
    bs->disk_refused += one.disk_refused;
    for (int k = 0; k < IR_OP_COUNT; k++) bs->fallbacks[k] += one.fallbacks[k];
  }
}

void graft_metrics_get(graft_metrics *m) {
  if (!m) return;
  tensor_lock();
  async_drain(); /* the executor thread's counters describe finished steps */
  *m = metrics.m;
  m->live_tensors = (uint64_t)tensor_live_count();
  m->pending_nodes = (uint64_t)ir_pending_count();
  m->bytes_in_use = buffer_bytes_in_use();
  m->bytes_peak = buffer_bytes_peak();
  m->bytes_pooled = buffer_pool_bytes();
  backend_stats bs;
  report_backend_stats(&bs);
  m->native_disk_hits = bs.disk_hits;
  m->native_disk_refused = bs.disk_refused;
  m->fallback_ops = 0;
  for (int i = 0; i < IR_OP_COUNT; i++) m->fallback_ops += bs.fallbacks[i];
  tensor_unlock();
}

void graft_metrics_reset(void) {
  tensor_lock();
  async_drain(); /* the executor thread writes the execution counters */
  memset(&metrics, 0, sizeof metrics);
  buffer_reset_peak();
  metrics_nreasons = 0;
  tensor_unlock();
}

char *graft_metrics_report(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  size_t cap = 8192 + METRICS_NREASONS * 520;
  char *s = malloc(cap);
  if (!s) return NULL;
  tensor_lock();
  int k = snprintf(s, cap,
      "graft metrics\n"
      "  graphs compiled      %llu\n"
      "  cache hits           %llu (%llu hash collisions)\n"
      "  executions           %llu\n"
      "  auto syncs           %llu\n"
      "  nodes traced         %llu\n"
      "  last / max graph     %llu / %llu nodes\n"
      "  live tensors         %llu\n"
      "  pending nodes        %llu\n"
      "  bytes in use / peak  %llu / %llu (%llu pooled for reuse, %llu inputs donated)\n"
      "  to device            %llu transfers, %llu bytes\n"
      "  to host              %llu transfers, %llu bytes\n"
      "  native compiles      %llu (%llu failed), %.1f ms in the compiler\n"
      "  compiled executions  %llu\n"
      "  disk cache hits      %llu (%llu compiles could not use the cache folder)\n"
      "  graph build time     %.3f ms (capture miss, lowering, passes)\n"
      "  execute time         %.3f ms\n"
      "  sync overhead        %.3f ms over %llu syncs\n",
      (unsigned long long)m.graphs_compiled, (unsigned long long)m.cache_hits,
      (unsigned long long)m.cache_collisions,
      (unsigned long long)m.executions, (unsigned long long)m.auto_syncs,
      (unsigned long long)m.nodes_traced, (unsigned long long)m.last_graph_nodes,
      (unsigned long long)m.max_graph_nodes, (unsigned long long)m.live_tensors,
      (unsigned long long)m.pending_nodes, (unsigned long long)m.bytes_in_use,
      (unsigned long long)m.bytes_peak, (unsigned long long)m.bytes_pooled,
      (unsigned long long)m.donated_buffers, (unsigned long long)m.transfers_to_device,
      (unsigned long long)m.bytes_to_device, (unsigned long long)m.transfers_to_host,
      (unsigned long long)m.bytes_to_host, (unsigned long long)m.native_compiles,
      (unsigned long long)m.native_compile_failures, m.native_compile_ms,
      (unsigned long long)m.compiled_executions, (unsigned long long)m.native_disk_hits,
      (unsigned long long)m.native_disk_refused,
      m.compile_ms, m.execute_ms, m.sync_overhead_ms,
      (unsigned long long)m.syncs);
  if (m.async_steps)
    k += snprintf(s + k, cap - (size_t)k, "  asynchronous steps   %llu (reads waited %llu times, "
                  "%.3f ms)\n", (unsigned long long)m.async_steps,
                  (unsigned long long)m.async_waits, m.async_wait_ms);
  if (m.checked_executions || m.check_mismatches)
    k += snprintf(s + k, cap - (size_t)k, "  checked executions   %llu (GRAFT_CHECK), %llu outputs "
                  "differed from the reference kernels\n", (unsigned long long)m.checked_executions,
                  (unsigned long long)m.check_mismatches);
  if (m.collectives)
    k += snprintf(s + k, cap - (size_t)k, "  collectives          %llu (%llu bytes, %.1f ms with "
                  "waiting for other ranks)\n", (unsigned long long)m.collectives,
                  (unsigned long long)m.collective_bytes, m.collective_ms);
  backend_stats bs;
  report_backend_stats(&bs);
  if (m.fallback_ops) {
    k += snprintf(s + k, cap - (size_t)k, "  reference fallbacks inside compiled graphs, per op:\n");
    for (int i = 0; i < IR_OP_COUNT && (size_t)k < cap; i++)
      if (bs.fallbacks[i])
        k += snprintf(s + k, cap - (size_t)k, "    %-14s %llu\n", ir_ops[i].name,
                      (unsigned long long)bs.fallbacks[i]);
  }
  int first = metrics_nreasons > METRICS_NREASONS ? metrics_nreasons - METRICS_NREASONS : 0;
  if (metrics_nreasons) k += snprintf(s + k, cap - (size_t)k, "  recent compile reasons:\n");
  for (int i = first; i < metrics_nreasons && (size_t)k < cap; i++)
    k += snprintf(s + k, cap - (size_t)k, "    - %s\n", metrics_reasons[i % METRICS_NREASONS]);
  tensor_unlock();
  return s;
}
