/* The host-function registry (hostfn.h): an open-addressing table under its own lock (the
 * executor thread looks keys up while the tracing thread registers more). */
#include "hostfn.h"
#include "error.h"
#include <pthread.h>
#include <stdlib.h>

typedef struct {
  uint64_t key;
  graft_host_fn fn;
  void *ctx;
} hostfn_entry;

static pthread_mutex_t hostfn_mu = PTHREAD_MUTEX_INITIALIZER;
static hostfn_entry *hostfn_tab; /* fn NULL: empty */
static size_t hostfn_cap, hostfn_n;

static hostfn_entry *hostfn_slot(hostfn_entry *tab, size_t cap, uint64_t key) {
  size_t m = cap - 1;
  for (size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 20) & m;; i = (i + 1) & m)
    if (!tab[i].fn || tab[i].key == key) return &tab[i];
}

static int hostfn_grow(void) {
  size_t cap = hostfn_cap ? hostfn_cap * 2 : 64;
  hostfn_entry *tab = calloc(cap, sizeof *tab);
  if (!tab) return -1;
  for (size_t i = 0; i < hostfn_cap; i++)
    if (hostfn_tab[i].fn) *hostfn_slot(tab, cap, hostfn_tab[i].key) = hostfn_tab[i];
  free(hostfn_tab);
  hostfn_tab = tab;
  hostfn_cap = cap;
  return 0;
}

int hostfn_register(uint64_t key, graft_host_fn fn, void *ctx) {
  int rc = 0;
  pthread_mutex_lock(&hostfn_mu);
  if ((hostfn_n + 1) * 2 > hostfn_cap && hostfn_grow()) {
    rc = -1;
    err_set(GRAFT_ERR_OOM, "graft_host_call: out of memory registering a host function");
  } else {
    hostfn_entry *e = hostfn_slot(hostfn_tab, hostfn_cap, key);
    if (!e->fn) {
      *e = (hostfn_entry){key, fn, ctx};
      hostfn_n++;
    } else if (e->fn != fn) {
      rc = -1;
      err_set(GRAFT_ERR_ARG, "graft_host_call: key %016llx already names another function",
              (unsigned long long)key);
    }
  }
  pthread_mutex_unlock(&hostfn_mu);
  return rc;
}

bool hostfn_find(uint64_t key, graft_host_fn *fn, void **ctx) {
  pthread_mutex_lock(&hostfn_mu);
  hostfn_entry *e = hostfn_cap ? hostfn_slot(hostfn_tab, hostfn_cap, key) : NULL;
  bool found = e && e->fn;
  if (found) {
    *fn = e->fn;
    *ctx = e->ctx;
  }
  pthread_mutex_unlock(&hostfn_mu);
  return found;
}
