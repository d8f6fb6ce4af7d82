/* Metrics state: counters, timers and the recent compile reasons (read out in src/graph/report.c). */
#include "metrics.h"
#include "buffer.h"
#include "tensor.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

metrics_state metrics;

char metrics_reasons[METRICS_NREASONS][METRICS_REASON_BYTES];
int metrics_nreasons;

double metrics_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void metrics_add_reason(const char *reason) {
  snprintf(metrics_reasons[metrics_nreasons % METRICS_NREASONS], sizeof metrics_reasons[0], "%s", reason);
  metrics_nreasons++;
}

const char *graft_last_compile_reason(void) {
  return metrics_nreasons ? metrics_reasons[(metrics_nreasons - 1) % METRICS_NREASONS] : "";
}


