/* Host functions that graphs call (IR_HOST_CALL): registered by key, found by the reference
 * kernel when the instruction runs. The first registration of a key stands for the process:
 * a cached graph run later calls what its key named when it was traced. */
#ifndef GRAFT_HOSTFN_H
#define GRAFT_HOSTFN_H
#include "graft.h"
#include <stdbool.h>

/* Registers (fn, ctx) under key; 0, or -1 with the error set (the key names another function,
 * or memory ran out). */
int hostfn_register(uint64_t key, graft_host_fn fn, void *ctx);
/* The function and context of key; false when none is registered. */
bool hostfn_find(uint64_t key, graft_host_fn *fn, void **ctx);
#endif
