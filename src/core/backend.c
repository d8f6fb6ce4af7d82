/* The backend registry (backend.h): a small fixed table of (kind, role, backend). */
#include "backend.h"
#include <string.h>

#define BACKEND_MAX 16

typedef struct {
  const char *kind;
  backend_role role;
  const backend *be;
} backend_reg;

static backend_reg regs[BACKEND_MAX];
static int nregs;

const backend *backend_register(const char *kind, backend_role role, const backend *be) {
  if (!kind || !be || (unsigned)role >= BACKEND_NROLES) return NULL;
  for (int i = 0; i < nregs; i++)
    if (regs[i].role == role && !strcmp(regs[i].kind, kind)) {
      const backend *old = regs[i].be;
      regs[i].be = be;
      return old;
    }
  if (nregs < BACKEND_MAX) regs[nregs++] = (backend_reg){kind, role, be};
  return NULL;
}

const backend *backend_find(const char *kind, backend_role role) {
  for (int i = 0; i < nregs; i++)
    if (regs[i].role == role && !strcmp(regs[i].kind, kind)) return regs[i].be;
  return NULL;
}

int backend_count(void) { return nregs; }

const backend *backend_at(int i, const char **kind, backend_role *role) {
  if (i < 0 || i >= nregs) return NULL;
  if (kind) *kind = regs[i].kind;
  if (role) *role = regs[i].role;
  return regs[i].be;
}

bool backend_supports_program(const backend *be, const exec_program *p, int *bad) {
  if (!be->supports) return true;
  for (int i = 0; i < p->ninstr; i++)
    if (!be->supports(&p->instr[i])) {
      if (bad) *bad = i;
      return false;
    }
  return true;
}

static _Thread_local backend_final_fn final_fn;
static _Thread_local void *final_ctx;

void backend_set_final_hook(backend_final_fn fn, void *ctx) {
  final_fn = fn;
  final_ctx = ctx;
}

bool backend_final_wanted(void) { return final_fn != NULL; }

void backend_output_final(int output, exec_buffer *b) {
  if (final_fn) final_fn(final_ctx, output, b);
}

static _Thread_local backend_partial_fn partial_fn;
static _Thread_local void *partial_ctx;

void backend_set_partial_hook(backend_partial_fn fn, void *ctx) {
  partial_fn = fn;
  partial_ctx = ctx;
}

bool backend_partial_wanted(void) { return partial_fn != NULL; }

void backend_partial_ready(void *exe) {
  if (partial_fn) partial_fn(partial_ctx, exe);
}
