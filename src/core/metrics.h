/* Counters and timers behind graft_metrics_*; updated under the global lock. */
#ifndef GRAFT_METRICS_H
#define GRAFT_METRICS_H
#include "graft.h"

typedef struct {
  graft_metrics m;        /* counters (gauges are filled in on read) */
} metrics_state;

extern metrics_state metrics;
/* The most recent compile reasons (a ring of METRICS_NREASONS). */
#define METRICS_NREASONS 8
#define METRICS_REASON_BYTES 1024
extern char metrics_reasons[METRICS_NREASONS][METRICS_REASON_BYTES];
extern int metrics_nreasons;
/* Remembers a compile reason for the report (keeps the most recent few). */
void metrics_add_reason(const char *reason);
double metrics_now_ms(void);
#endif
