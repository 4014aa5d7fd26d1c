"""The harness's collective logic under mpirun, with no GPU: stand-in impls and a stand-in timer go
through cli.run, which must agree across ranks on which rows run, take the maximum over ranks,
derive the columns, and write one valid JSON file.

    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_bench_run.py
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rawflux.bench import cli, registry, report

pytestmark = pytest.mark.mpi(min_size=2)


class FakeTimer:
    """Times come from the run callable: ``run.ms`` plus this rank's ``run.skew``."""

    def __init__(self, rank):
        self.rank = rank
        self.warmed = []

    def warm(self, run, nsets, inner=1):
        for i in range(2 * inner):
            run(i % nsets)
        self.warmed.append(run)

    def sync(self):
        pass

    def time(self, run, nsets, inner=1):
        t = run.ms + run.skew * self.rank
        return [t * 1.5, t, t, t * 0.9, t, t * 3.0, t]  # median t whatever the outliers


class FakeSide:
    def __init__(self, rank):
        self.info = SimpleNamespace(gpu="Fake GPU", driver="0.0", commit=None, emulated=True, ranks_per_gpu=2, host="h",
                                    l2_bytes=60 << 20, mem_bytes=80 << 30, versions={})
        self.stream = None
        self.timer = FakeTimer(rank)
        self.sets_made = []
        self.released = 0

    def make_sets(self, p, nsets, seed):
        self.sets_made.append((p.op, p.m, nsets, seed))
        return [{"id": i} for i in range(nsets)]

    def release(self):
        self.released += 1


def _runner(ms, skew=0.0):
    def run(i):
        pass

    run.ms, run.skew = ms, skew
    return run


@pytest.fixture
def fake_impls(monkeypatch):
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    monkeypatch.setattr(registry, "_impls", {op: {} for op in registry.OPS})
    reg = registry.register
    reg("ag_gemm", "base", "nonoverlap", lambda ctx: _runner(10.0, skew=1.0))  # slowest rank decides
    reg("ag_gemm", "gemm", "gemm", lambda ctx: _runner(6.0))
    reg("ag_gemm", "comm", "comm", lambda ctx: _runner(4.0))
    reg("ag_gemm", "fused", "fused", lambda ctx: _runner(8.0), gemm_ref="gemm")

    def half_missing(ctx):
        if rank == 1:
            raise registry.Unavailable("not on rank 1")
        return _runner(1.0)

    def broken(ctx):
        def run(i):
            raise RuntimeError("kernel exploded")

        return run

    reg("ag_gemm", "half_missing", "fused", half_missing)
    reg("ag_gemm", "broken", "fused", broken)
    reg("barrier", "bar", "barrier", lambda ctx: _runner(0.005), inner=20)
    return rank


def test_run_agrees_across_ranks_and_writes_one_file(fake_impls, tmp_path, capsys):
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    out_dir = comm.bcast(str(tmp_path / "results"), root=0)
    group = SimpleNamespace(comm=comm, rank=rank, world=world, device_id=0)
    args = cli.parse_args(["--quick", "--shapes", f"{64 * world},{128 * world},256", "--out-dir", out_dir, "--seed", "7"])
    side = FakeSide(rank)
    records = cli.run(args, group, side, ["--quick"])

    names = [r["impl"] for r in records]
    assert names == ["base", "gemm", "comm", "fused", "bar"], names  # half_missing and broken skipped everywhere
    by = {r["impl"]: r for r in records}
    assert by["base"]["ms"] == pytest.approx(10.0 + (world - 1)) and by["base"]["ms_rank_min"] == pytest.approx(10.0)
    f = by["fused"]
    assert f["speedup"] == pytest.approx((10.0 + world - 1) / 8.0)
    assert f["exposed_ms"] == pytest.approx(2.0) and f["overlap_eff"] == pytest.approx(0.5)
    assert by["bar"]["us"] == pytest.approx(5.0) and by["bar"]["op"] == "barrier"
    assert all(r["emulated"] and r["world"] == world and r["quick"] for r in records)
    # the same number of input sets on every rank; different data per rank
    made = comm.allgather(side.sets_made)
    assert all(m[0][:3] == made[0][0][:3] for m in made)
    assert len({m[0][3] for m in made}) == world
    assert side.released == 2  # one ag_gemm problem, one barrier problem

    comm.Barrier()
    if rank == 0:
        files = list(Path(out_dir).glob("*.json"))
        assert len(files) == 1, files
        data = json.loads(files[0].read_text())
        assert data["schema"] == report.SCHEMA and [r["impl"] for r in data["records"]] == names
        assert all(report.validate(r) == [] for r in data["records"])
        text = capsys.readouterr().out
        assert "skip ag_gemm" in text and "not on rank 1" in text and "kernel exploded" in text


def test_layer_op_runs_marks_failures_and_writes_its_fields(monkeypatch, tmp_path):
    """--op layer through cli.run with stand-in rows (the real ones need a GPU; their steps are
    checked on the CPU by tests/cpu/test_bench_layer.py): a row whose guard fails on one rank is
    skipped on every rank and listed in meta.failed; the others carry the phase and host_ms."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    monkeypatch.setattr(registry, "_impls", {op: {} for op in registry.OPS})

    def hosted(ms):
        run = _runner(ms)
        run.host_us = 1000.0 * (1 + rank)  # the slowest rank's queueing is recorded
        return run

    def wrong(ctx):
        if rank == world - 1:
            raise registry.Failed("dx differs")
        return hosted(9.0)

    reg = registry.register
    reg("layer", "nonoverlap", "nonoverlap", lambda ctx: hosted(10.0))
    reg("layer", "rawflux", "fused", wrong, gemm_ref="gemm_only")
    reg("layer", "torch_async_tp", "fused", lambda ctx: hosted(8.0), gemm_ref="gemm_only")
    reg("layer", "gemm_only", "gemm", lambda ctx: hosted(5.0))
    out_dir = comm.bcast(str(tmp_path / "layer"), root=0)
    args = cli.parse_args(["--op", "layer", "--quick", "--shapes", "tiny", "--phase", "train,decode", "--out-dir", out_dir, "--seed", "3"])
    group = SimpleNamespace(comm=comm, rank=rank, world=world, device_id=0)
    records = cli.run(args, group, FakeSide(rank), ["--op", "layer"])

    timed = ("nonoverlap", "torch_async_tp", "gemm_only")
    assert [(r["phase"], r["impl"]) for r in records] == [(ph, i) for ph in ("train", "decode") for i in timed]
    t = {r["impl"]: r for r in records if r["phase"] == "train"}
    assert t["torch_async_tp"]["speedup"] == pytest.approx(1.25) and t["torch_async_tp"]["exposed_ms"] == pytest.approx(3.0)
    assert all(r["host_ms"] == pytest.approx(float(world)) and r["op"] == "layer" and r["label"].startswith("tiny.") for r in records)
    assert t["nonoverlap"]["m"] == 1024 and not [r for r in records if r["phase"] == "decode"][0]["seq_parallel"]
    comm.Barrier()
    if rank == 0:
        files = list(Path(out_dir).glob("*.json"))
        assert len(files) == 1 and "layer" in files[0].name
        data = json.loads(files[0].read_text())
        assert all(report.validate(r) == [] for r in data["records"])
        failed = [(f["label"], f["m"], f["impl"]) for f in data["meta"]["failed"]]
        assert failed == [("tiny.train", 1024, "rawflux"), ("tiny.decode", 16, "rawflux")]
        assert data["meta"]["failed"][0]["why"] == f"rank {world - 1}: FAILED: dx differs"
