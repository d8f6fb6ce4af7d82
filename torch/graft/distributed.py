"""Data-parallel training on graft across processes (Open MPI).

Launch N copies with `mpirun -np N python3 train.py`; each process trains on its shard of the
batch and the gradients are averaged across processes inside the step's one compiled graph:

    import graft, graft.distributed as gd
    gd.init()                                   # joins mpirun's job (a world of one without it)
    model = Net().to(graft.device()); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in shard:                          # e.g. DistributedSampler(ds) after init()
        opt.zero_grad(); F.cross_entropy(model(x), y).backward()
        gd.optimizer_step(opt)                  # all_reduce(grads, "mean"), then opt.step()
        graft.step()                            # forward, backward, all_reduce, update: one graph

`torch.distributed.init_process_group("graft")` also works after `import graft.distributed`:
the "graft" process-group backend runs dist.all_reduce / broadcast / all_gather / barrier on
graft tensors, and DistributedSampler sees graft's rank and world size.

Every process must make the same collectives in the same order. A process whose shapes differ
gets an error naming both sides; a process that dies, raises or stalls makes the others fail
within GRAFT_DIST_TIMEOUT seconds (default 30) instead of hanging: an uncaught exception in
one process aborts the whole job (mpirun then names the rank).
"""
import atexit
import os
import sys

import torch
import torch.distributed as _tdist

import graft

_ops = torch.ops.graft
_REDUCE = {"sum": 0, "mean": 1, "avg": 1, "max": 2, "min": 3}
_state = {"init": False}


def is_available():
    """True when graft was built with Open MPI (else only a world of one process exists)."""
    return bool(_ops.dist_available())


def _launcher_env():
    """Rank, world size and local rank from Open MPI's mpirun, or None when not launched."""
    e = os.environ
    if "OMPI_COMM_WORLD_RANK" not in e:
        return None
    return (int(e["OMPI_COMM_WORLD_RANK"]), int(e["OMPI_COMM_WORLD_SIZE"]),
            int(e.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))


def _torch_env_defaults():
    """Fills in what torch.distributed's env:// rendezvous reads, from mpirun's variables, so
    init_process_group("graft") needs no arguments. MASTER_ADDR defaults to this host (one
    machine; across machines export it, e.g. `mpirun -x MASTER_ADDR=node0`); the port comes
    from the job id so that concurrent jobs do not collide."""
    env = _launcher_env()
    if env is None:
        return
    r, w, lr = env
    os.environ.setdefault("RANK", str(r))
    os.environ.setdefault("WORLD_SIZE", str(w))
    os.environ.setdefault("LOCAL_RANK", str(lr))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    job = os.environ.get("OMPI_MCA_ess_base_jobid", "0")
    os.environ.setdefault("MASTER_PORT", str(20000 + int(job) % 20000 if job.isdigit() else 29500))


def _excepthook(kind, value, tb):
    # An uncaught exception: the others would wait in their next collective until the timeout.
    # Say what happened, then end the whole job at once.
    _prev_excepthook(kind, value, tb)
    sys.stderr.flush()
    _ops.dist_abort(1)


_prev_excepthook = sys.excepthook


def init():
    """Joins the job mpirun started (or a world of one when not launched); idempotent.
    Returns the world size."""
    if _state["init"]:
        return world_size()
    w = int(_ops.dist_init())
    _state["init"] = True
    atexit.register(finalize)
    if w > 1:
        sys.excepthook = _excepthook
    return w


def finalize():
    """Leaves the job (called at exit by init's atexit hook)."""
    if _state["init"]:
        _state["init"] = False
        _ops.dist_finalize()


def rank():
    """This process's rank (0 before init)."""
    return int(_ops.dist_rank())


def world_size():
    """Processes in the job (1 before init)."""
    return int(_ops.dist_world_size())


def _as_list(tensors):
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def all_reduce(tensors, op="sum"):
    """Reduces graft tensors across processes, in place (lazily: it runs in the next step's
    graph); op is "sum", "mean", "max" or "min". One MPI call per dtype."""
    if op not in _REDUCE:
        raise ValueError(f"graft.distributed.all_reduce: unknown op {op!r} (one of "
                         f"{', '.join(sorted(_REDUCE))})")
    ts = _as_list(tensors)
    _ops.dist_all_reduce(ts, _REDUCE[op])
    return tensors


def broadcast(tensors, root=0):
    """Every process takes rank root's values of the tensors, in place."""
    ts = _as_list(tensors)
    _ops.dist_broadcast(ts, int(root))
    return tensors


def all_gather(tensors):
    """For each tensor, a new one of shape [world_size, *shape] holding every rank's value."""
    out = _ops.dist_all_gather(_as_list(tensors))
    return out[0] if isinstance(tensors, torch.Tensor) else out


def reduce_gradients(optimizer, op="mean"):
    """Averages (op="mean") the gradients of the optimizer's parameters across processes."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if grads:
        all_reduce(grads, op)


def optimizer_step(optimizer, **step_kwargs):
    """reduce_gradients(optimizer) (averaged over the world), then optimizer.step()."""
    reduce_gradients(optimizer)
    return optimizer.step(**step_kwargs)


# ---------------------------------------------------------------- torch.distributed backend

_PG = _tdist.ProcessGroup
_C10D = torch._C._distributed_c10d


def _done(result):
    # Collectives are lazy graph nodes: the Work is complete once recorded; values come at sync.
    fut = torch.futures.Future()
    fut.set_result(result)
    return _C10D._create_work_from_future(fut)


def _reduce_name(op):
    names = {_tdist.ReduceOp.SUM: "sum", _tdist.ReduceOp.MAX: "max", _tdist.ReduceOp.MIN: "min"}
    if hasattr(_tdist.ReduceOp, "AVG"):
        names[_tdist.ReduceOp.AVG] = "mean"
    for k, v in names.items():
        if op == k:
            return v
    raise RuntimeError(f"graft process group: reduce op {op} is not supported (SUM, AVG, MAX, MIN)")


class ProcessGroupGraft(_PG):
    """torch.distributed's view of graft's process group (backend name "graft")."""

    def __init__(self, store, rank_, size, timeout):
        super().__init__(rank_, size)
        self._store = store

    def getBackendName(self):
        return "graft"

    def allreduce(self, tensors, opts=None):
        op = _reduce_name(opts.reduceOp) if opts is not None else "sum"
        all_reduce(tensors, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        broadcast(tensors, opts.rootRank if opts is not None else 0)
        return _done(tensors)

    def allgather(self, output_lists, inputs, opts=None):
        gathered = all_gather(inputs)
        for outs, g in zip(output_lists, gathered):
            for r, o in enumerate(outs):
                o.copy_(g[r])
        return _done(output_lists)

    def barrier(self, opts=None):
        # A tiny all_reduce, synced: returns once every rank has reached it.
        t = torch.zeros(1).to(graft.device())
        all_reduce([t], "sum")
        graft.sync([t])
        return _done([])


def _create_pg(store, rank_, size, timeout):
    if not _state["init"]:
        init()
    if (rank_, size) != (rank(), world_size()):
        raise RuntimeError(f"graft process group: torch.distributed says rank {rank_} of {size} "
                           f"but mpirun started rank {rank()} of {world_size()}")
    return ProcessGroupGraft(store, rank_, size, timeout)


if "GRAFT" not in _tdist.Backend._plugins:
    # torch 2 maps a backend to the device types it serves (cpu and cuda when not told).
    _tdist.Backend.register_backend("graft", _create_pg, devices=["cpu", graft.DEVICE_TYPE])
_torch_env_defaults()
