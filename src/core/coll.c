/* The collective hook (coll.h): one process-wide slot the dist layer fills. */
#include "coll.h"
#include "error.h"
#include "metrics.h"

static coll_hooks coll_hook = {NULL, 0, 1};

void coll_set_hooks(const coll_hooks *h) {
  coll_hooks none = {NULL, 0, 1};
  coll_hook = h ? *h : none;
}

int coll_rank(void) { return coll_hook.rank; }
int coll_world(void) { return coll_hook.world; }

/* Counted here, hook or not, so a world of one shows the same collectives per step as a job
 * (runs under the global lock, inside a graph's execution). */
int coll_run(ir_op op, int64_t arg, graft_dtype dt, void *buf, int64_t count, uint64_t sig) {
  double t0 = metrics_now_ms();
  /* no hook: a world of one, where every collective is the identity */
  int rc = coll_hook.run ? coll_hook.run(op, arg, dt, buf, count, sig) : 0;
  if (!rc) {
    metrics.m.collectives++;
    metrics.m.collective_bytes += (uint64_t)count * graft_dtype_size(dt);
  }
  metrics.m.collective_ms += metrics_now_ms() - t0;
  return rc;
}
