/* Named tensors in a file (a model's weights, an optimizer's state): a function of no inputs
 * whose outputs are the tensors, each named, written by graft_save, so weights share the one
 * checked, versioned format of saved functions (function_file.c) and a model exported from
 * PyTorch and weights saved from C or Python read the same way. */
#include "function.h"
#include "composite.h"
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

graft_status graft_save_tensors(const char *path, int n, const char *const *names,
                                graft_tensor *const *tensors) {
  const char *fn = "graft_save_tensors";
  if (!path || !names || !tensors)
    return err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, !path ? "path" : !names ? "names" : "tensors"),
           GRAFT_ERR_NULL;
  if (n < 1) return err_set(GRAFT_ERR_ARG, "%s: no tensors to save", fn), GRAFT_ERR_ARG;
  for (int i = 0; i < n; i++) {
    if (!names[i] || !*names[i])
      return err_set(GRAFT_ERR_ARG, "%s: names[%d] is empty", fn, i), GRAFT_ERR_ARG;
    for (int j = 0; j < i; j++)
      if (!strcmp(names[i], names[j]))
        return err_set(GRAFT_ERR_ARG, "%s: the name '%s' is given twice", fn, names[i]), GRAFT_ERR_ARG;
    if (comp_bad_input(fn, "a tensor", tensors[i])) return graft_last_status();
  }
  graft_status st = graft_sync(tensors, n); /* saved as values: each a constant of the file */
  graft_function *f = st == GRAFT_OK ? graft_function_capture(0, NULL, n, tensors) : NULL;
  for (int i = 0; f && i < n && st == GRAFT_OK; i++) st = graft_function_set_output_name(f, i, names[i]);
  if (st == GRAFT_OK) st = f ? graft_save(f, path) : graft_last_status();
  graft_function_free(f);
  if (st != GRAFT_OK) err_rename(fn);
  return st;
}

/* "a, b, c" of f's names (for the message of a name the file lacks). */
static void tf_names(const graft_function *f, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = 0;
  for (int k = 0; k < f->nout && at + 1 < cap; k++) {
    const char *nm = graft_function_output_name(f, k);
    at += (size_t)snprintf(buf + at, cap - at, "%s%s", k ? ", " : "", nm ? nm : "(unnamed)");
  }
}

graft_status graft_load_tensors(const char *path, int device, int n, const char *const *names,
                                graft_tensor **out) {
  const char *fn = "graft_load_tensors";
  if (!path || (n > 0 && (!names || !out)))
    return err_set(GRAFT_ERR_NULL, "%s: %s is NULL", fn, !path ? "path" : !names ? "names" : "out"),
           GRAFT_ERR_NULL;
  for (int i = 0; i < n; i++) out[i] = NULL;
  graft_function *f = graft_load(path, device);
  if (!f) return err_rename(fn), graft_last_status();
  graft_status st = GRAFT_OK;
  if (f->nin) {
    err_set(GRAFT_ERR_FILE, "%s: %s holds a function of %d inputs, not named tensors", fn, path, f->nin);
    st = GRAFT_ERR_FILE;
  }
  int *pick = st == GRAFT_OK ? malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)) : NULL;
  if (st == GRAFT_OK && !pick) {
    err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
    st = GRAFT_ERR_OOM;
  }
  for (int i = 0; i < n && st == GRAFT_OK; i++) {
    pick[i] = -1;
    for (int k = 0; k < f->nout && pick[i] < 0 && names[i]; k++) {
      const char *nm = graft_function_output_name(f, k);
      if (nm && !strcmp(nm, names[i])) pick[i] = k;
    }
    if (pick[i] < 0) {
      char have[512];
      tf_names(f, have, sizeof have);
      err_set(GRAFT_ERR_FILE, "%s: %s has no tensor named '%s' (it has: %s)", fn, path,
              names[i] ? names[i] : "(NULL)", have);
      st = GRAFT_ERR_FILE;
    }
  }
  graft_tensor **all = st == GRAFT_OK ? calloc((size_t)f->nout, sizeof *all) : NULL;
  if (st == GRAFT_OK && !all) {
    err_set(GRAFT_ERR_OOM, "%s: out of memory", fn);
    st = GRAFT_ERR_OOM;
  }
  graft_scope_begin(); /* the outputs not asked for go with it */
  if (st == GRAFT_OK) st = graft_function_call(f, 0, NULL, f->nout, all);
  for (int i = 0; i < n && st == GRAFT_OK; i++) {
    graft_tensor *t = all[pick[i]];
    for (int j = 0; j < i; j++) /* a name asked for twice: a handle of its own */
      if (out[j] == t) {
        int64_t s[GRAFT_MAX_DIMS];
        int nd = graft_shape(t, s);
        t = graft_broadcast_to(t, nd, s);
        break;
      }
    if (!(out[i] = t)) st = graft_last_status();
  }
  for (int i = 0; i < n && st == GRAFT_OK; i++) graft_keep(out[i]);
  if (st != GRAFT_OK)
    for (int i = 0; i < n; i++) out[i] = NULL;
  graft_scope_end();
  free(all);
  free(pick);
  graft_function_free(f);
  if (st != GRAFT_OK) err_rename(fn);
  return st;
}
