/* Thread-local error state: each thread sees only its own last error. */
#include "error.h"
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local graft_status err_status;
static _Thread_local char err_msg[1024];
static _Thread_local unsigned err_seq; /* errors set so far */

void *err_set(graft_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  err_status = st;
  err_seq++;
  return NULL;
}

unsigned err_count(void) { return err_seq; }

/* Length of the message's leading "name: " when name is an identifier, else 0. */
static size_t err_prefix_len(const char *m) {
  size_t i = 0;
  while (isalnum((unsigned char)m[i]) || m[i] == '_') i++;
  return i && m[i] == ':' && m[i + 1] == ' ' ? i + 2 : 0;
}

void err_rename(const char *fn) {
  if (err_status == GRAFT_OK) return;
  char old[sizeof err_msg];
  memcpy(old, err_msg, sizeof old);
  size_t k = err_prefix_len(old), n = (size_t)snprintf(err_msg, sizeof err_msg, "%s: ", fn);
  if (n < sizeof err_msg) snprintf(err_msg + n, sizeof err_msg - n, "%s", old + k); /* may cut */
}

void *err_named(void *r, unsigned mark, const char *fn) {
  if (!r && err_seq != mark) err_rename(fn);
  return r;
}

int err_pending(void) { return err_status != GRAFT_OK; }

graft_status graft_last_status(void) { return err_status; }
const char *graft_last_error(void) { return err_status == GRAFT_OK ? "" : err_msg; }
void graft_clear_error(void) {
  err_status = GRAFT_OK;
  err_msg[0] = 0;
}

void err_save(err_saved *e) {
  e->st = graft_last_status();
  snprintf(e->msg, sizeof e->msg, "%s", graft_last_error());
}

void err_restore(const err_saved *e) {
  if (e->st) err_set(e->st, "%s", e->msg);
  else graft_clear_error();
}
