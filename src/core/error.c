/* Thread-local error state: each thread sees only its own last error. */
#include "error.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local graft_status err_status;
static _Thread_local char err_msg[1024];

void *err_set(graft_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  err_status = st;
  return NULL;
}

int err_pending(void) { return err_status != GRAFT_OK; }

graft_status graft_last_status(void) { return err_status; }
const char *graft_last_error(void) { return err_status == GRAFT_OK ? "" : err_msg; }
void graft_clear_error(void) {
  err_status = GRAFT_OK;
  err_msg[0] = 0;
}
