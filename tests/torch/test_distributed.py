"""graft.distributed across 2 processes (mpirun launched from here; the ranks run
tests/torch/dist_worker.py): data-parallel parity with one process on the whole batch, the
torch.distributed "graft" backend, and failures that must end the job in bounded time."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

import graft.distributed as gd

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dist_worker.py")

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None or not gd.is_available(),
                                reason="Open MPI is not installed (scripts/install-deps.sh)")


def mpirun(mode, timeout=300, env=None):
    """Runs the worker on 2 ranks; returns (exit code, output, seconds)."""
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMP_NUM_THREADS="1", GRAFT_THREADS="1", **(env or {}))
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, WORKER, mode]
    t0 = time.time()
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, text=True)
    return p.returncode, p.stdout, time.time() - t0


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    rc, out, _ = mpirun("parity", env={"DIST_TEST_OUT": str(d)})
    assert rc == 0, out
    recs = []
    for r in (0, 1):
        with open(d / f"rank{r}.jsonl") as f:
            recs += [json.loads(line) for line in f]
    return recs


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_data_parallel_matches_one_process(parity_run, model):
    recs = sorted((r for r in parity_run if r.get("model") == model), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1] and recs[0]["world"] == 2
    ref = recs[0]["ref_loss"]
    assert ref[-1] < ref[0], "the model must train"
    for step in range(len(ref)):
        # The job's loss is the mean of the ranks' losses (each over its half of the batch).
        dp = (recs[0]["loss"][step] + recs[1]["loss"][step]) / 2
        assert abs(dp - ref[step]) <= 1e-5 * abs(ref[step]), (step, dp, ref[step])
        for r in recs:
            assert r["param_err"][step] <= 1e-5, (r["rank"], step, r["param_err"][step])


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_one_graph_one_collective_per_step(parity_run, model):
    for r in (r for r in parity_run if r.get("model") == model):
        g, c = r["graphs"], r["collectives"]
        assert g[-1] == g[2], f"rank {r['rank']}: graphs compiled after step 3: {g}"
        assert all(c[i] - c[i - 1] == 1 for i in range(1, len(c))), \
            f"rank {r['rank']}: MPI collectives per step (want 1, all f32): {c}"


def test_torch_distributed_backend(parity_run):
    api = sorted((r for r in parity_run if r.get("api")), key=lambda r: r["rank"])
    assert [a["rank"] for a in api] == [0, 1]
    for a in api:
        assert a["backend"] == "graft" and a["world"] == 2
        assert a["sum"] == [3.0] * 3 and a["max"] == [1.0, 1.0] and a["bcast"] == [11.0, 11.0]
        assert a["gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert a["sampler"] == list(range(a["rank"], 10, 2))


def test_killed_rank_ends_the_job():
    rc, out, secs = mpirun("kill", timeout=120)
    assert rc != 0 and secs < 60, (rc, secs, out)
    assert "process rank 1" in out and "signal 9" in out, out
    assert "finished training" not in out


def test_raising_rank_ends_the_job():
    rc, out, secs = mpirun("raise", timeout=120)
    assert rc != 0 and secs < 60, (rc, secs, out)
    # the rank is named by graft ("rank 1 on HOST aborts the job") and usually by mpirun too; Open MPI
    # 4.1 sometimes loses its own message ("ORTE_ERROR_LOG: Data unpack would read past end of
    # buffer ... show_help.c"), so graft's line is the one required
    assert "rank 1 fails on purpose" in out and re.search(r"graft: rank 1 on \S+ aborts the job", out), out


def test_mismatched_shapes_are_an_error():
    rc, out, secs = mpirun("mismatch", timeout=120)
    assert rc != 0 and secs < 60, (rc, secs, out)
    assert "ranks disagree" in out and "finished training" not in out, out


def test_world_of_one_in_process():
    """Without mpirun: a world of one, collectives are the identity, bad input is a clear error."""
    import torch
    import graft
    assert gd.init() == 1 and gd.rank() == 0 and gd.world_size() == 1
    dev = graft.device()
    a, b = torch.arange(4.0).to(dev), torch.ones(2, dtype=torch.long).to(dev)
    gd.all_reduce([a, b], "sum")
    assert a.cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and b.cpu().tolist() == [1, 1]
    assert gd.all_gather(a).shape == (1, 4)
    with pytest.raises(ValueError, match="unknown op 'prod'"):
        gd.all_reduce([a], "prod")
    with pytest.raises(RuntimeError, match="tensor 0 is on cpu, not on graft's device"):
        gd.all_reduce([torch.ones(2)])
    with pytest.raises(RuntimeError, match="mean of i64"):
        gd.all_reduce([b], "mean")
    model = torch.nn.Linear(3, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    model(torch.ones(4, 3).to(dev)).sum().backward()
    gd.optimizer_step(opt)
    graft.step()
    after = [p.detach().cpu() for p in model.parameters()]
    assert all(not torch.equal(x, y) for x, y in zip(before, after))
