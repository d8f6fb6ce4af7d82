/* Thread-local error state behind graft_last_status / graft_last_error. */
#ifndef GRAFT_ERROR_H
#define GRAFT_ERROR_H
#include "graft.h"

/* Sets this thread's error (printf-style message). Returns NULL for `return err_set(...)`. */
void *err_set(graft_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True when an error is already set (NULL propagation keeps the first error). */
int err_pending(void);
/* Errors set on this thread so far: a call compares counts to tell its own error from one an
 * earlier call left (which a NULL operand carries and must keep). */
unsigned err_count(void);
/* The current error names fn, the public function the user called: its leading "name: " (the
 * IR op or helper that raised it) becomes "fn: ", or "fn: " is prepended. */
void err_rename(const char *fn);
/* This thread's error kept aside (err_save) and put back (err_restore: cleared when none was
 * set), around work whose own errors must not replace it. */
typedef struct {
  graft_status st;
  char msg[1024];
} err_saved;
void err_save(err_saved *e);
void err_restore(const err_saved *e);
/* A public op's return: when r is NULL and an error was set since mark, it names fn. */
void *err_named(void *r, unsigned mark, const char *fn);
#endif
