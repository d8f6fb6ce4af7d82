/* Thread-local error state behind graft_last_status / graft_last_error. */
#ifndef GRAFT_ERROR_H
#define GRAFT_ERROR_H
#include "graft.h"

/* Sets this thread's error (printf-style message). Returns NULL for `return err_set(...)`. */
void *err_set(graft_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* True when an error is already set (NULL propagation keeps the first error). */
int err_pending(void);
#endif
