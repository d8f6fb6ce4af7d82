/* Host backends for a device with its own memory: inputs download to host buffers, a CPU
 * backend runs the program, outputs upload. The OpenCL device's reference backend (GRAFT_COMPILE
 * =off, GRAFT_CHECK's oracle) and first tier (a graph's first run, while its kernels build) are
 * these; every transfer is counted (device_traffic). */
#include "host_bridge.h"
#include "device.h"
#include "error.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  exec_program hp; /* the program as the host backend sees it: same arrays, device cpu:0 */
  void *inner_exe;
} hostbridge_exe;

static void hostbridge_host_program(const exec_program *p, exec_program *hp) {
  *hp = *p;
  hp->device = 0;
}

void *hostbridge_compile(const backend *inner, const exec_program *p) {
  hostbridge_exe *x = calloc(1, sizeof *x);
  if (!x) return err_set(GRAFT_ERR_OOM, "out of memory compiling a graph for the host");
  hostbridge_host_program(p, &x->hp);
  x->inner_exe = inner->compile(&x->hp);
  if (!x->inner_exe) {
    free(x);
    return NULL;
  }
  return x;
}

void hostbridge_free(const backend *inner, void *exe) {
  hostbridge_exe *x = exe;
  if (!x) return;
  if (inner->free_exe) inner->free_exe(x->inner_exe);
  free(x);
}

/* Inputs donated to this run are released when it fails before taking them (the contract of
 * backend.execute: donated inputs are released either way). */
static void hostbridge_release_donated(const exec_program *p, exec_buffer *const *params) {
  for (int j = 0; j < p->nparams; j++)
    if (params[j]->donated) {
      params[j]->donated = 0;
      buffer_release(params[j]);
    }
}

/* Host copies of the device inputs; a donated input is ours to drop once copied, and its copy is
 * then donated to the host backend in turn. */
static int hostbridge_inputs(const exec_program *p, exec_buffer *const *params, exec_buffer **h) {
  for (int k = 0; k < p->nparams; k++) {
    h[k] = buffer_to_device(params[k], 0, "a host backend's input");
    if (!h[k]) {
      while (k--) buffer_release(h[k]);
      hostbridge_release_donated(p, params);
      return -1;
    }
  }
  for (int k = 0; k < p->nparams; k++)
    if (params[k]->donated) {
      params[k]->donated = 0;
      buffer_release(params[k]);
      h[k]->donated = 1;
    }
  return 0;
}

int hostbridge_execute(const backend *inner, void *exe, const exec_program *p,
                       exec_buffer *const *params, exec_buffer **outs) {
  hostbridge_exe *x = exe, local = {0};
  if (!x) { /* the reference backend, asked without an executable (GRAFT_CHECK) */
    hostbridge_host_program(p, &local.hp);
    local.inner_exe = inner->compile(&local.hp);
    if (!local.inner_exe) return -1;
    x = &local;
  }
  size_t n = (size_t)p->nparams + (size_t)p->noutputs + 1;
  exec_buffer **h = calloc(n, sizeof *h);
  unsigned char *given = calloc(n, 1);
  int rc = -1;
  if (!h || !given) {
    err_set(GRAFT_ERR_OOM, "out of memory running a graph on the host");
    hostbridge_release_donated(p, params);
  } else if (!hostbridge_inputs(p, params, h)) {
    exec_buffer **houts = h + p->nparams;
    for (int k = 0; k < p->nparams; k++) given[k] = (unsigned char)h[k]->donated;
    rc = inner->execute(x->inner_exe, &x->hp, h, houts);
    for (int k = 0; k < p->nparams; k++)
      if (!given[k]) buffer_release(h[k]); /* a donated one the host backend released */
    for (int k = 0; k < p->noutputs; k++) {
      outs[k] = rc ? NULL : buffer_to_device(houts[k], p->device, "an output back on the device");
      if (!rc && !outs[k]) {
        rc = -1;
        for (int j = 0; j < k; j++) buffer_release(outs[j]), outs[j] = NULL;
      }
    }
    for (int k = 0; k < p->noutputs; k++) buffer_release(houts[k]);
  }
  free(h);
  free(given);
  if (x == &local && inner->free_exe) inner->free_exe(local.inner_exe);
  return rc;
}
