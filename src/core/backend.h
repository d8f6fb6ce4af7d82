/* Backends and their registry. A backend is a vtable (what it supports, how it compiles a
 * program and runs the result); backends register by name and device kind with a role, and
 * the graph layer finds them here, never by naming one. The built-in backends are registered
 * by backend_register_builtin() (defined by the backends, in the one file that names them),
 * which the graph layer calls once before its first lookup: an explicit call, so a static link
 * keeps them (a constructor in an object nobody references would be dropped). */
#ifndef GRAFT_BACKEND_H
#define GRAFT_BACKEND_H
#include "program.h"

/* Counters a backend keeps, read into graft's metrics. */
typedef struct {
  uint64_t compiles;                 /* native compiler runs that succeeded */
  uint64_t disk_hits;                /* executables (or kernel objects) loaded from the disk cache */
  uint64_t kernels_compiled;         /* kernel bodies compiled */
  uint64_t kernels_reused;           /* kernel bodies a build found compiled already */
  uint64_t kernels_sized;            /* of the bodies built, those that run as size-generic templates */
  uint64_t disk_refused;             /* compiles that could not use the disk cache folder */
  uint64_t fallbacks[IR_OP_COUNT];   /* per op: instructions run on the reference kernels */
  uint64_t kernel_choices;           /* kernel classes chosen by measurement */
  uint64_t kernels_demoted;          /* of those, classes that left the default kernel */
} backend_stats;

/* A backend: what it supports, how it compiles a program and runs the result. */
typedef struct backend {
  const char *name;
  bool (*supports)(const exec_instr *ins);
  /* Returns an executable or NULL with the error set. */
  void *(*compile)(const exec_program *p);
  /* Optional: the same code built sooner (less optimized), to run while compile() builds the
   * full one; sets *full when what it returns already is the full build (a disk-cache hit). */
  void *(*compile_quick)(const exec_program *p, bool *full);
  /* Optional: a build from pieces compiled before, quick or full ones (*full set when all are
   * full): no compiler runs, and none in progress is waited for; NULL otherwise. What it saw
   * of p is remembered (the CPU backend's size-generic kernels learn from it). */
  void *(*compile_cached)(const exec_program *p, bool *full);
  /* Optional, with compile_cached: how many compiled pieces it could draw on (in memory, plus
   * one when the disk cache holds any): 0 says a try would fail. */
  size_t (*cached_pieces)(void);
  /* Optional, with progressive builds (backend_partial_ready): the share (0 to 1) of exe's
   * kernel work that runs native code now; a progressive executable's grows as the pieces of
   * its build land. Called by the thread that runs exe. */
  double (*native_share)(void *exe);
  /* params[i] binds p->param_slot[i]; outs[i] receives a new reference for output i. */
  int (*execute)(void *exe, const exec_program *p, exec_buffer *const *params, exec_buffer **outs);
  void (*free_exe)(void *exe);
  void (*stats)(backend_stats *out); /* optional */
  void (*shutdown)(void);            /* optional: stop threads, drop caches */
  /* Optional (GRAFT_CHECK reports): writes into buf which code of exe computed slot (a
   * generated kernel and what it inlines, a BLAS call, a host or reference kernel); when source
   * is not NULL, stores there the generated source (malloc'd) or NULL when there is none. It
   * may set the thread's error; the caller restores it. */
  void (*explain)(void *exe, const exec_program *p, int slot, char *buf, size_t n, char **source);
} backend;

/* Early outputs. A backend that runs a program step by step reports each output as soon as no
 * later step writes it (backend_output_final), so a caller waiting on one value (a training
 * loop's loss.item()) goes on while the rest of the step runs. The hook belongs to the thread
 * that calls execute (set around the call, NULL after); backends that report nothing need not
 * call it, and every output still comes back through outs at the end. */
typedef void (*backend_final_fn)(void *ctx, int output, exec_buffer *b);
void backend_set_final_hook(backend_final_fn fn, void *ctx);
/* True when the executing thread has a hook (a backend skips the bookkeeping otherwise). */
bool backend_final_wanted(void);
/* Output `output`'s value in b is final: b stays the backend's (the hook copies what it keeps). */
void backend_output_final(int output, exec_buffer *b);

/* Progressive builds. A thread that sets this hook around compile or compile_quick is handed,
 * before anything compiles, the executable the build will return: it runs at once, the
 * kernels compiled before (by other graphs, or processes through the disk cache) as native
 * code and the others on the first tier's loops, each switching to native code as the piece
 * of the build that holds it lands (native_share says how far it is). When the build fails
 * the executable stays the hook's (it still runs correctly; free it with free_exe), and the
 * build returns NULL. The hook belongs to the calling thread, NULL after. */
typedef void (*backend_partial_fn)(void *ctx, void *exe);
void backend_set_partial_hook(backend_partial_fn fn, void *ctx);
bool backend_partial_wanted(void);
/* Called by a backend, on the building thread: exe runs from now on (see above). */
void backend_partial_ready(void *exe);

/* What a registered backend is for, on its device kind. */
typedef enum {
  BACKEND_REFERENCE,  /* the oracle: plain kernels for every op (GRAFT_COMPILE=off, GRAFT_CHECK) */
  BACKEND_FIRST_TIER, /* runs a new graph at once */
  BACKEND_COMPILER,   /* compiles graphs that recur; its supports() decides which it takes */
  BACKEND_NROLES
} backend_role;

/* Registers be for device kind (e.g. "cpu") in role. A later registration for the same kind
 * and role replaces the earlier one (tests use it to stand in a backend) and returns the
 * replaced backend; otherwise NULL. Not thread-safe: register before graft runs graphs. */
const backend *backend_register(const char *kind, backend_role role, const backend *be);
/* The backend registered for kind and role, or NULL. */
const backend *backend_find(const char *kind, backend_role role);
/* The number of registrations and the i-th one (its backend, kind and role), in order. */
int backend_count(void);
const backend *backend_at(int i, const char **kind, backend_role *role);
/* Registers the backends built into graft (defined in src/backends/builtin.c). */
void backend_register_builtin(void);
/* True when be (a compiler) supports every instruction of p (be->supports NULL: all). On false,
 * *bad receives the first unsupported instruction's index when bad is not NULL. */
bool backend_supports_program(const backend *be, const exec_program *p, int *bad);
#endif
