/* The process group: collectives across processes through Open MPI, the only module that
 * includes mpi.h (built with -DGRAFT_HAVE_MPI when the Makefile finds Open MPI; without it a
 * world of one still works and a job of more reports that MPI is missing).
 *
 * A collective instruction reaches dist_run through core's hook (coll.h) while its graph
 * executes, under graft's global lock, so calls are serialized (MPI_THREAD_SERIALIZED). Each
 * call has two phases, both bounded by GRAFT_DIST_TIMEOUT seconds (default 30), so a rank that
 * died, raised or stalls makes the others fail in bounded time instead of waiting forever:
 *  1. signatures (non-blocking, polled against the deadline): every rank sends every other its
 *     sequence number and a hash of the operands' shapes and dtype; a rank that does not arrive
 *     in time is named (the error is returned; graft_dist_finalize then aborts the job, as MPI
 *     requests are left in flight), and ranks that disagree all get an error naming both sides
 *     before any data moves (never a sum of misaligned buffers; MPI stays usable);
 *  2. data: one blocking MPI_Allreduce / Bcast / Allgather in place (MPI_IN_PLACE) on the
 *     graph's flat buffer, under a watchdog thread that ends the process past the deadline.
 * Errors name ranks with their hosts (exchanged at init): across machines, where a rank runs
 * is the first thing to look at. */
#include "graft.h"
#include "../core/coll.h"
#include "../core/dtype.h"
#include "../core/error.h"
#include "../core/trace.h"
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef GRAFT_HAVE_MPI
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#endif

#define DIST_DEFAULT_TIMEOUT_S 30.0
#define DIST_HOST_LEN 64

typedef struct {
  bool init;         /* graft_dist_init succeeded */
  bool mpi;          /* launched by mpirun: collectives go through MPI */
  bool owns_mpi;     /* graft called MPI_Init, so graft finalizes */
  bool broken;       /* a collective timed out with requests in flight */
  char broken_msg[1024];
  int rank, world;
  char *hosts;       /* world names of DIST_HOST_LEN: rank r runs on hosts + r * DIST_HOST_LEN */
  char peers[256];   /* "1 on nodeB, 2 on nodeC, ...": the others, for the watchdog's message */
  double timeout_s;
  uint64_t seq;      /* collectives run: equal on every rank while their graphs agree */
} dist_state;

static dist_state dist = {.world = 1, .timeout_s = DIST_DEFAULT_TIMEOUT_S};

static const char *dist_host(int r) {
  return dist.hosts && r >= 0 && r < dist.world ? dist.hosts + (size_t)r * DIST_HOST_LEN : "?";
}

/* Which launcher started us: Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx/PMI launchers
 * (srun, other MPIs' mpiexec) set PMIX_RANK / PMI_RANK. None: a world of one. */
static bool dist_launched(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}

/* GRAFT_DIST_TIMEOUT: seconds a rank waits for the others in one collective. */
static int dist_read_timeout(void) {
  const char *s = getenv("GRAFT_DIST_TIMEOUT");
  if (!s || !*s) return 0;
  char *end;
  double v = strtod(s, &end);
  if (*end || !(v > 0) || v > 1e7)
    return err_set(GRAFT_ERR_ARG, "graft_dist_init: GRAFT_DIST_TIMEOUT=\"%s\" is not a number "
                   "of seconds > 0", s), -1;
  dist.timeout_s = v;
  return 0;
}

#ifdef GRAFT_HAVE_MPI
static double dist_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *dist_op_name(ir_op op, int64_t arg, char *buf, size_t n) {
  static const char *const red[] = {"sum", "mean", "max", "min"};
  if (op == IR_ALL_REDUCE) snprintf(buf, n, "all_reduce(%s)", arg >= 0 && arg < 4 ? red[arg] : "?");
  else if (op == IR_RANK_BROADCAST) snprintf(buf, n, "broadcast(root %" PRId64 ")", arg);
  else snprintf(buf, n, "all_gather");
  return buf;
}

/* Marks MPI unusable and says so on stderr too: the user may swallow the error, and the job
 * must still be told why it is about to be aborted. */
static int dist_fail(const char *msg) {
  dist.broken = true;
  snprintf(dist.broken_msg, sizeof dist.broken_msg, "%s", msg);
  fprintf(stderr, "graft: %s\n", msg);
  err_set(GRAFT_ERR_DIST, "%s", msg);
  return -1;
}

static MPI_Comm dist_comm = MPI_COMM_NULL;
enum { DIST_TAG_SIG = 7201 };

/* What ranks compare before a collective. Sent as bytes: all ranks run the same build. */
typedef struct {
  uint64_t seq, sig;
  int64_t count, arg;
  int32_t op, dtype;
} dist_sig;

/* Polls reqs until all complete or the deadline passes (then returns 1). Spins first (MPI
 * progresses only inside MPI calls), then yields, then naps, so a rank waiting long for a slow
 * peer does not take a core from it. */
static int dist_poll(int n, MPI_Request *reqs, double deadline) {
  double t0 = dist_now();
  for (;;) {
    int done = 0;
    if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return -1;
    if (done) return 0;
    double t = dist_now();
    if (t > deadline) return 1;
    if (t - t0 > 0.1) {
      struct timespec nap = {0, 100000};
      nanosleep(&nap, NULL);
    } else if (t - t0 > 0.002) {
      sched_yield();
    }
  }
}

static void dist_sig_str(const dist_sig *s, char *buf, size_t n) {
  char nm[64];
  snprintf(buf, n, "collective #%" PRIu64 " %s of %" PRId64 " %s (shapes hash %016" PRIx64 ")",
           s->seq, dist_op_name((ir_op)s->op, s->arg, nm, sizeof nm), s->count,
           graft_dtype_name((graft_dtype)s->dtype), s->sig);
}

/* Names the ranks whose signature did not arrive (recv[r] still pending), and their hosts. */
static int dist_missing(const dist_sig *mine, MPI_Request *recv) {
  char who[256] = "", where[256] = "", what[256], msg[1024];
  size_t k = 0, h = 0;
  for (int r = 0; r < dist.world; r++) {
    int done = 1;
    if (r != dist.rank) MPI_Test(&recv[r], &done, MPI_STATUS_IGNORE);
    if (done) continue;
    if (k < sizeof who) k += (size_t)snprintf(who + k, sizeof who - k, "%s%d", k ? ", " : "", r);
    if (h < sizeof where)
      h += (size_t)snprintf(where + h, sizeof where - h, "%srank %d on %s", h ? ", " : "", r,
                            dist_host(r));
  }
  dist_sig_str(mine, what, sizeof what);
  snprintf(msg, sizeof msg, "rank %d on %s: rank(s) %s did not reach %s within %g s "
           "(GRAFT_DIST_TIMEOUT): failed, exited, stalled or cut off (%s)",
           dist.rank, dist_host(dist.rank), who, what, dist.timeout_s, where);
  return dist_fail(msg);
}

/* Phase 1: every rank's signature, compared with this one's. */
static int dist_check_sigs(const dist_sig *mine) {
  int w = dist.world;
  dist_sig *all = calloc((size_t)w, sizeof *all);
  MPI_Request *req = malloc(sizeof *req * (size_t)(2 * w));
  if (!all || !req) {
    free(all), free(req);
    return err_set(GRAFT_ERR_OOM, "graft_dist: out of memory"), -1;
  }
  for (int r = 0; r < 2 * w; r++) req[r] = MPI_REQUEST_NULL;
  all[dist.rank] = *mine;
  for (int r = 0; r < w; r++) {
    if (r == dist.rank) continue;
    MPI_Irecv(&all[r], sizeof *all, MPI_BYTE, r, DIST_TAG_SIG, dist_comm, &req[r]);
    MPI_Isend(mine, sizeof *mine, MPI_BYTE, r, DIST_TAG_SIG, dist_comm, &req[w + r]);
  }
  int rc = dist_poll(2 * w, req, dist_now() + dist.timeout_s);
  if (rc > 0) rc = dist_missing(mine, req);
  else if (rc < 0) rc = dist_fail("MPI failed exchanging collective signatures");
  for (int r = 0; r < w && !rc; r++) {
    if (all[r].seq == mine->seq && all[r].sig == mine->sig && all[r].count == mine->count &&
        all[r].op == mine->op && all[r].dtype == mine->dtype && all[r].arg == mine->arg)
      continue;
    char a[256], b[256];
    dist_sig_str(mine, a, sizeof a);
    dist_sig_str(&all[r], b, sizeof b);
    err_set(GRAFT_ERR_DIST, "ranks disagree: rank %d runs %s but rank %d runs %s (every rank "
            "must trace the same collectives on the same shapes and dtypes)", dist.rank, a, r, b);
    rc = -1; /* every rank sees the same table, so every rank fails here: MPI stays usable */
  }
  free(all);
  free(req);
  return rc;
}

static MPI_Datatype dist_type(graft_dtype dt) {
  switch (dt) {
  case GRAFT_F32: return MPI_FLOAT;
  case GRAFT_F64: return MPI_DOUBLE;
  case GRAFT_I32: return MPI_INT32_T;
  case GRAFT_I64: return MPI_INT64_T;
  case GRAFT_U8: case GRAFT_BOOL: return MPI_UINT8_T; /* bool max/min = or/and on 0/1 bytes */
  default: return MPI_UINT16_T;                        /* f16/bf16, with graft's own ops */
  }
}

/* f16 and bf16 have no MPI type: they travel as 16-bit words and reduce through float with
 * these user ops (each pairwise result rounded once, as a float16 sum on a device would). */
#define DIST_HALF_OP(name, load, store, expr)                                              \
  static void name(void *in, void *inout, int *len, MPI_Datatype *dt) {                   \
    (void)dt;                                                                              \
    const uint16_t *a = in;                                                                \
    uint16_t *b = inout;                                                                   \
    for (int i = 0; i < *len; i++) {                                                       \
      float x = load(a[i]), y = load(b[i]);                                                \
      b[i] = store(expr);                                                                  \
    }                                                                                      \
  }
DIST_HALF_OP(dist_f16_sum, dtype_f16_to_f32, dtype_f32_to_f16, x + y)
DIST_HALF_OP(dist_f16_max, dtype_f16_to_f32, dtype_f32_to_f16, x > y ? x : y)
DIST_HALF_OP(dist_f16_min, dtype_f16_to_f32, dtype_f32_to_f16, x < y ? x : y)
DIST_HALF_OP(dist_bf16_sum, dtype_bf16_to_f32, dtype_f32_to_bf16, x + y)
DIST_HALF_OP(dist_bf16_max, dtype_bf16_to_f32, dtype_f32_to_bf16, x > y ? x : y)
DIST_HALF_OP(dist_bf16_min, dtype_bf16_to_f32, dtype_f32_to_bf16, x < y ? x : y)

static MPI_Op dist_half_ops[2][3]; /* [f16, bf16][sum, max, min], made at init */

static void dist_half_ops_make(void) {
  MPI_User_function *fns[2][3] = {{dist_f16_sum, dist_f16_max, dist_f16_min},
                                  {dist_bf16_sum, dist_bf16_max, dist_bf16_min}};
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 3; k++) MPI_Op_create(fns[d][k], 1, &dist_half_ops[d][k]);
}

static void dist_half_ops_free(void) {
  for (int d = 0; d < 2; d++)
    for (int k = 0; k < 3; k++) MPI_Op_free(&dist_half_ops[d][k]);
}

/* The MPI reduction for all_reduce's arg (sum and mean both sum) on dt. */
static MPI_Op dist_op(int64_t arg, graft_dtype dt) {
  int k = arg == GRAFT_REDUCE_MAX ? 1 : arg == GRAFT_REDUCE_MIN ? 2 : 0;
  if (dt == GRAFT_F16 || dt == GRAFT_BF16) return dist_half_ops[dt == GRAFT_BF16][k];
  return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

/* The data phase's watchdog. Once every rank's signature has arrived, the data moves with
 * blocking MPI calls: Open MPI's tuned blocking collectives are about twice as fast here as
 * its non-blocking ones (libnbc), and a rank can now only fail inside MPI (killed, network
 * gone), where polling could not recover it anyway. If a call outlives the deadline, this
 * thread names it and exits the process, so mpirun ends the job: never a silent hang. It
 * makes no MPI call itself (graft asks only MPI_THREAD_SERIALIZED). */
static struct {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool running, stop;
  double deadline; /* dist_now() seconds; 0: disarmed */
  char what[320];
} dist_wd = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *dist_watchdog(void *arg) {
  (void)arg;
  pthread_mutex_lock(&dist_wd.mu);
  while (!dist_wd.stop) {
    if (dist_wd.deadline == 0) {
      pthread_cond_wait(&dist_wd.cv, &dist_wd.mu);
      continue;
    }
    double d = dist_wd.deadline;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    pthread_cond_timedwait(&dist_wd.cv, &dist_wd.mu, &ts);
    if (dist_wd.deadline != 0 && dist_now() >= dist_wd.deadline) {
      fprintf(stderr, "graft: rank %d on %s: %s did not complete within %g s "
              "(GRAFT_DIST_TIMEOUT) although every rank had reached it: a rank died or the "
              "network failed (the other ranks: %s); ending this process so that mpirun ends "
              "the job\n", dist.rank, dist_host(dist.rank), dist_wd.what, dist.timeout_s,
              dist.peers);
      _exit(1);
    }
  }
  pthread_mutex_unlock(&dist_wd.mu);
  return NULL;
}

static int dist_wd_start(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines in dist_now()'s clock */
  pthread_cond_init(&dist_wd.cv, &ca);
  pthread_condattr_destroy(&ca);
  dist_wd.stop = false;
  dist_wd.deadline = 0;
  if (pthread_create(&dist_wd.thread, NULL, dist_watchdog, NULL))
    return err_set(GRAFT_ERR_DIST, "graft_dist_init: cannot start the watchdog thread"), -1;
  dist_wd.running = true;
  return 0;
}

static void dist_wd_end(void) {
  if (!dist_wd.running) return;
  pthread_mutex_lock(&dist_wd.mu);
  dist_wd.stop = true;
  pthread_cond_signal(&dist_wd.cv);
  pthread_mutex_unlock(&dist_wd.mu);
  pthread_join(dist_wd.thread, NULL);
  pthread_cond_destroy(&dist_wd.cv);
  dist_wd.running = false;
}

/* Arms the watchdog for sig's collective (what != NULL) or disarms it. */
static void dist_wd_arm(const dist_sig *sig) {
  pthread_mutex_lock(&dist_wd.mu);
  if (sig) dist_sig_str(sig, dist_wd.what, sizeof dist_wd.what);
  dist_wd.deadline = sig ? dist_now() + dist.timeout_s : 0;
  pthread_cond_signal(&dist_wd.cv);
  pthread_mutex_unlock(&dist_wd.mu);
}

/* One piece of the data phase (count elements at buf), in place. */
static int dist_move(ir_op op, int64_t arg, graft_dtype dt, void *buf, int count) {
  MPI_Datatype t = dist_type(dt);
  if (op == IR_RANK_BROADCAST) return MPI_Bcast(buf, count, t, (int)arg, dist_comm);
  if (op == IR_ALL_GATHER)
    return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count, t, dist_comm);
  return MPI_Allreduce(MPI_IN_PLACE, buf, count, t, dist_op(arg, dt), dist_comm);
}

/* Phase 2: the data, in pieces of at most 2^30 elements (MPI counts are int); all_gather rows
 * cannot be split in place, so a row must fit one count. */
static int dist_data(ir_op op, int64_t arg, graft_dtype dt, void *buf, int64_t count,
                     const dist_sig *sig) {
  const int64_t piece = INT64_C(1) << 30;
  size_t es = graft_dtype_size(dt);
  if (op == IR_ALL_GATHER && count > piece)
    return err_set(GRAFT_ERR_ARG, "all_gather: %" PRId64 " elements per rank (at most %" PRId64
                   ")", count, piece), -1;
  int rc = MPI_SUCCESS;
  dist_wd_arm(sig);
  for (int64_t off = 0; off < count && rc == MPI_SUCCESS; off += piece)
    rc = dist_move(op, arg, dt, (char *)buf + (size_t)off * es,
                   (int)(count - off < piece ? count - off : piece));
  dist_wd_arm(NULL);
  if (rc != MPI_SUCCESS) {
    char what[256], msg[512];
    dist_sig_str(sig, what, sizeof what);
    snprintf(msg, sizeof msg, "rank %d on %s: MPI failed in %s (error %d)", dist.rank,
             dist_host(dist.rank), what, rc);
    return dist_fail(msg);
  }
  return 0;
}

/* mean = sum / world, in the buffer's dtype (checked float when traced). */
static void dist_scale(graft_dtype dt, void *buf, int64_t count) {
  if (dt == GRAFT_F32) {
    float *p = buf, w = (float)dist.world;
    for (int64_t i = 0; i < count; i++) p[i] /= w;
  } else {
    for (int64_t i = 0; i < count; i++) dtype_store(buf, dt, i, dtype_load(buf, dt, i) / dist.world);
  }
}

/* The hook behind coll_run (runs under graft's lock, inside a graph's execution). */
static int dist_run(ir_op op, int64_t arg, graft_dtype dt, void *buf, int64_t count,
                    uint64_t sig) {
  if (dist.broken) return err_set(GRAFT_ERR_DIST, "%s (an earlier collective failed)",
                                  dist.broken_msg), -1;
  if (op == IR_RANK_BROADCAST && (arg < 0 || arg >= dist.world))
    return err_set(GRAFT_ERR_ARG, "broadcast: root %" PRId64 " is not a rank of this world of %d",
                   arg, dist.world), -1;
  dist_sig mine = {++dist.seq, sig, count, arg, (int32_t)op, (int32_t)dt};
  uint64_t t0 = trace_on() ? trace_now() : 0;
  int rc = dist_check_sigs(&mine);
  if (!rc) rc = dist_data(op, arg, dt, buf, count, &mine);
  if (!rc && op == IR_ALL_REDUCE && arg == GRAFT_REDUCE_MEAN) dist_scale(dt, buf, count);
  if (t0) {
    char name[48], args[128];
    snprintf(args, sizeof args, "\"rank\": %d, \"world\": %d, \"bytes\": %" PRId64 ", \"seq\": %" PRIu64, dist.rank,
             dist.world, count * (int64_t)graft_dtype_size(dt), (uint64_t)mine.seq);
    trace_span("collective", dist_op_name(op, arg, name, sizeof name), t0, trace_now(), args);
  }
  return rc;
}

/* mpirun stops the surviving ranks with SIGTERM when one dies: say why before going, so the
 * survivors' output explains their end too. */
static void dist_on_term(int sig) {
  static const char msg[] = "graft: this rank was stopped by the launcher (SIGTERM), most "
                            "likely because another rank failed; see mpirun's message\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Every rank's host name, for errors; MPI_Init has already brought every rank together. */
static int dist_hosts_exchange(void) {
  char mine[MPI_MAX_PROCESSOR_NAME] = "";
  int len = 0;
  dist.hosts = calloc((size_t)dist.world, DIST_HOST_LEN);
  if (!dist.hosts) return err_set(GRAFT_ERR_OOM, "graft_dist_init: out of memory"), -1;
  MPI_Get_processor_name(mine, &len);
  mine[DIST_HOST_LEN - 1] = 0;
  if (MPI_Allgather(mine, DIST_HOST_LEN, MPI_CHAR, dist.hosts, DIST_HOST_LEN, MPI_CHAR,
                    dist_comm) != MPI_SUCCESS)
    return err_set(GRAFT_ERR_DIST, "graft_dist_init: exchanging host names failed"), -1;
  size_t k = 0;
  for (int r = 0; r < dist.world && k < sizeof dist.peers; r++)
    if (r != dist.rank)
      k += (size_t)snprintf(dist.peers + k, sizeof dist.peers - k, "%s%d on %s", k ? ", " : "",
                            r, dist_host(r));
  return 0;
}

static int dist_init_mpi(void) {
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return err_set(GRAFT_ERR_DIST, "graft_dist_init: MPI_Init failed"), -1;
    dist.owns_mpi = true;
  }
  /* A communicator of graft's own: a user's MPI traffic never matches graft's messages. */
  MPI_Comm_dup(MPI_COMM_WORLD, &dist_comm);
  dist_half_ops_make();
  MPI_Comm_set_errhandler(dist_comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(dist_comm, &dist.rank);
  MPI_Comm_size(dist_comm, &dist.world);
  if (dist_hosts_exchange() || dist_wd_start()) return -1;
  dist.mpi = true;
  coll_hooks h = {dist_run, dist.rank, dist.world};
  coll_set_hooks(&h);
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = dist_on_term;
  if (!sigaction(SIGTERM, NULL, &old) && old.sa_handler == SIG_DFL) sigaction(SIGTERM, &sa, NULL);
  return 0;
}
#endif

bool graft_dist_available(void) {
#ifdef GRAFT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

/* MPI cannot be initialized twice in a process: a job left is left for good. */
static bool dist_left_mpi;

graft_status graft_dist_init(void) {
  if (dist.init) return GRAFT_OK;
  if (dist_left_mpi) {
    err_set(GRAFT_ERR_DIST, "graft_dist_init: this process already left its MPI job "
            "(graft_dist_finalize); MPI cannot be joined again");
    return GRAFT_ERR_DIST;
  }
  if (dist_read_timeout()) return GRAFT_ERR_ARG;
  if (dist_launched()) {
#ifdef GRAFT_HAVE_MPI
    if (dist_init_mpi()) return graft_last_status();
#else
    err_set(GRAFT_ERR_DIST, "graft_dist_init: launched by an MPI launcher, but graft was built "
            "without Open MPI (install libopenmpi-dev, then rebuild graft)");
    return GRAFT_ERR_DIST;
#endif
  }
  dist.init = true; /* not launched: a world of one, no hook, collectives are the identity */
  return GRAFT_OK;
}

int graft_dist_rank(void) { return dist.rank; }
int graft_dist_world_size(void) { return dist.world; }

void graft_dist_abort(int exit_code) {
  fprintf(stderr, "graft: rank %d%s%s aborts the job (exit code %d)\n", dist.rank,
          dist.hosts ? " on " : "", dist.hosts ? dist_host(dist.rank) : "", exit_code);
#ifdef GRAFT_HAVE_MPI
  if (dist.mpi) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
  _exit(exit_code);
}

graft_status graft_dist_finalize(void) {
  if (!dist.init) return GRAFT_OK;
#ifdef GRAFT_HAVE_MPI
  if (dist.mpi && dist.broken) graft_dist_abort(1); /* MPI cannot finish with requests in flight */
  if (dist.mpi) {
    coll_set_hooks(NULL);
    dist_wd_end();
    dist_half_ops_free();
    MPI_Comm_free(&dist_comm);
    if (dist.owns_mpi) MPI_Finalize();
    dist_left_mpi = true;
  }
#endif
  free(dist.hosts);
  dist = (dist_state){.world = 1, .timeout_s = DIST_DEFAULT_TIMEOUT_S};
  return GRAFT_OK;
}
