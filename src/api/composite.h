/* Helpers shared by the composites (composite.c, grad.c), on the public API plus error.h: input
 * checks and the end of a composite's scope. Errors name the composite the user called, not the
 * query or primitive the composite called that raised them. */
#ifndef GRAFT_COMPOSITE_H
#define GRAFT_COMPOSITE_H
#include "graft.h"
#include "../core/error.h"
#include <stdbool.h>

/* True (and the error set) when a required tensor is missing or no longer valid. A NULL t
 * keeps the error of the op that produced it; an invalid handle's error names fn. */
static inline bool comp_bad_input(const char *fn, const char *name, const graft_tensor *t) {
  if (!t) {
    if (!err_pending()) err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, name);
    return true;
  }
  if (graft_ndim(t) >= 0) return false;
  err_rename(fn); /* the query's error about the handle */
  return true;
}

/* Ends the scope a composite opened, keeping y. A NULL y comes from an error inside (the inputs
 * were checked first), which then names fn. */
static inline graft_tensor *comp_finish(const char *fn, graft_tensor *y) {
  graft_tensor *r = y ? graft_keep(y) : NULL;
  graft_scope_end();
  if (!r) err_rename(fn);
  return r;
}
#endif
