/* The timeline trace (GRAFT_TRACE=path.json, graft_trace_begin/end): spans of what each thread
 * did (a sync's capture and cache lookup, compiles, each kernel, GEMM and fallback a step ran,
 * waits), written in Chrome's trace-event format, which Perfetto and chrome://tracing open.
 * Off, a span costs one relaxed load (trace_on). */
#ifndef GRAFT_TRACE_H
#define GRAFT_TRACE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether spans are being recorded (reads GRAFT_TRACE once, at the first call). */
bool trace_on(void);
/* Nanoseconds on the monotonic clock. */
uint64_t trace_now(void);
/* Records a span of the calling thread, [t0, t1] from trace_now: cat and name (copied), and
 * args, the text of a JSON object's members ("\"k\": 1, \"s\": \"x\"") or NULL. */
void trace_span(const char *cat, const char *name, uint64_t t0, uint64_t t1, const char *args);
/* The members "graph" (hex) and "reason" (escaped) of a span's args, into buf. */
void trace_args_reason(char *buf, size_t n, uint64_t graph, const char *reason);
/* Names the calling thread in the trace (its track's title); the first name given stays. */
void trace_thread_name(const char *name);
/* Writes the trace if one is being recorded (graft_shutdown, exit). */
void trace_shutdown(void);
#endif
