/* Host backends for a device with its own memory (host_bridge.c). Private to the backends. */
#ifndef GRAFT_HOST_BRIDGE_H
#define GRAFT_HOST_BRIDGE_H
#include "backend.h"

/* inner (a CPU backend) compiles p as a host program; the executable is the bridge's. */
void *hostbridge_compile(const backend *inner, const exec_program *p);
void hostbridge_free(const backend *inner, void *exe);
/* Downloads params, runs inner on the host, uploads the outputs to p->device. exe may be NULL
 * (compiled for this call). 0, or -1 with the error set (nothing leaks; donated inputs are
 * released either way). */
int hostbridge_execute(const backend *inner, void *exe, const exec_program *p,
                       exec_buffer *const *params, exec_buffer **outs);

/* Defines backend NAME: inner run on the host for a device with its own memory. */
#define HOSTBRIDGE_BACKEND(NAME, LABEL, INNER)                                                   \
  static void *NAME##_compile(const exec_program *p) { return hostbridge_compile(&INNER, p); }   \
  static void NAME##_free(void *exe) { hostbridge_free(&INNER, exe); }                            \
  static int NAME##_execute(void *exe, const exec_program *p, exec_buffer *const *params,       \
                            exec_buffer **outs) {                                                 \
    return hostbridge_execute(&INNER, exe, p, params, outs);                                     \
  }                                                                                               \
  const backend NAME = {.name = LABEL, .compile = NAME##_compile, .execute = NAME##_execute,    \
                        .free_exe = NAME##_free}
#endif
