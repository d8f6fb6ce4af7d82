/* fork() in a process whose graft threads run (a PyTorch DataLoader's workers, a server that
 * forks): one set of pthread_atfork handlers for the graph layer's threads, in an order that
 * cannot deadlock. Prepare lets the build in progress land (holding no lock while it waits),
 * drains the executor's queued steps (none waits for a build meanwhile), then holds both
 * queues; the child gets both with no thread running and starts each again when it needs it
 * (async.c, tier.c). The CPU backend's thread pool has its own child handler (cpu_pool.c).
 * Registered once, from graph_backends_init, before anything runs. A thread inside a graft
 * call at the moment of the fork (not the forking one) still holds graft's global lock in the
 * child: a child that forks while other threads trace must not use graft. */
#include "graph.h"
#include <pthread.h>

/* Lock order: the compile queue is not held while steps drain (a step may look at it). */
static void graph_fork_prepare(void) {
  tier_fork_wait_build();
  async_fork_prepare();
  tier_fork_prepare();
}

static void graph_fork_parent(void) {
  tier_fork_parent();
  async_fork_parent();
}

static void graph_fork_child(void) {
  tier_fork_child();
  async_fork_child();
}

static pthread_once_t graph_fork_once = PTHREAD_ONCE_INIT;

static void graph_fork_install(void) {
  pthread_atfork(graph_fork_prepare, graph_fork_parent, graph_fork_child);
}

void graph_fork_register(void) { pthread_once(&graph_fork_once, graph_fork_install); }
