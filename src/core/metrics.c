/* Metrics: counters, timers, the recent compile reasons and the text report. */
#include "metrics.h"
#include "buffer.h"
#include "ir.h"
#include "tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

metrics_state metrics;

#define NREASONS 8
static char reasons[NREASONS][512];
static int nreasons_total;

double metrics_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void metrics_add_reason(const char *reason) {
  snprintf(reasons[nreasons_total % NREASONS], sizeof reasons[0], "%s", reason);
  nreasons_total++;
}

const char *graft_last_compile_reason(void) {
  return nreasons_total ? reasons[(nreasons_total - 1) % NREASONS] : "";
}

void graft_metrics_get(graft_metrics *m) {
  if (!m) return;
  graft_lock();
  *m = metrics.m;
  m->live_tensors = (uint64_t)tensor_live_count();
  m->pending_nodes = (uint64_t)ir_pending_count();
  m->bytes_in_use = buffer_bytes_in_use();
  m->bytes_peak = buffer_bytes_peak();
  graft_unlock();
}

void graft_metrics_reset(void) {
  graft_lock();
  memset(&metrics, 0, sizeof metrics);
  buffer_reset_peak();
  nreasons_total = 0;
  graft_unlock();
}

char *graft_metrics_report(void) {
  graft_metrics m;
  graft_metrics_get(&m);
  size_t cap = 4096 + NREASONS * 520;
  char *s = malloc(cap);
  if (!s) return NULL;
  graft_lock();
  int k = snprintf(s, cap,
      "graft metrics\n"
      "  graphs compiled      %llu\n"
      "  cache hits           %llu\n"
      "  executions           %llu\n"
      "  auto syncs           %llu\n"
      "  nodes traced         %llu\n"
      "  last / max graph     %llu / %llu nodes\n"
      "  live tensors         %llu\n"
      "  pending nodes        %llu\n"
      "  bytes in use / peak  %llu / %llu\n"
      "  to device            %llu transfers, %llu bytes\n"
      "  to host              %llu transfers, %llu bytes\n"
      "  native compiles      %llu (%llu failed), %.1f ms in the compiler\n"
      "  compiled executions  %llu\n"
      "  compile time         %.3f ms\n"
      "  execute time         %.3f ms\n"
      "  sync overhead        %.3f ms over %llu syncs\n",
      (unsigned long long)m.graphs_compiled, (unsigned long long)m.cache_hits,
      (unsigned long long)m.executions, (unsigned long long)m.auto_syncs,
      (unsigned long long)m.nodes_traced, (unsigned long long)m.last_graph_nodes,
      (unsigned long long)m.max_graph_nodes, (unsigned long long)m.live_tensors,
      (unsigned long long)m.pending_nodes, (unsigned long long)m.bytes_in_use,
      (unsigned long long)m.bytes_peak, (unsigned long long)m.transfers_to_device,
      (unsigned long long)m.bytes_to_device, (unsigned long long)m.transfers_to_host,
      (unsigned long long)m.bytes_to_host, (unsigned long long)m.native_compiles,
      (unsigned long long)m.native_compile_failures, m.native_compile_ms,
      (unsigned long long)m.compiled_executions, m.compile_ms, m.execute_ms, m.sync_overhead_ms,
      (unsigned long long)m.syncs);
  int first = nreasons_total > NREASONS ? nreasons_total - NREASONS : 0;
  if (nreasons_total) k += snprintf(s + k, cap - (size_t)k, "  recent compile reasons:\n");
  for (int i = first; i < nreasons_total && (size_t)k < cap; i++)
    k += snprintf(s + k, cap - (size_t)k, "    - %s\n", reasons[i % NREASONS]);
  graft_unlock();
  return s;
}
