"""rawflux.runtime.progress: a bar on a terminal, a plain line per step in a log; the benchmark sweep
and the tuner count every step up to their total; quiet when asked."""
from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

from rawflux.runtime.progress import Progress


class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 10.0  # every reading 10 s later
        return self.t


@pytest.fixture(autouse=True)
def _auto(monkeypatch):
    monkeypatch.delenv("RAWFLUX_PROGRESS", raising=False)
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)


def test_log_gets_one_plain_line_per_step_up_to_the_total():
    out = Stream(tty=False)
    with Progress(4, "sweep", stream=out, clock=Clock()) as p:
        p.step("a", keep=True)
        p.step("b")
        p.step("c d", n=2, keep=True)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    assert [re.match(r"\[(\d+)/4 ", x).group(1) for x in lines] == ["1", "2", "4"]
    assert lines[0] == "[1/4 0:10, ~0:30 left] sweep: a"  # elapsed and what is left at that rate
    assert lines[-1] == "[4/4 0:30] sweep: c d"
    assert p.count == p.total == 4


def test_terminal_gets_one_bar_redrawn_with_results_above_it():
    out = Stream(tty=True)
    with Progress(3, "sweep", stream=out, width=6) as p:
        p.step("row 1", keep=True)
        p.step("trying x")
        p.step("row 3", keep=True)
    text = out.getvalue()
    assert text.endswith("\n") and "\r\x1b[K" in text
    screen = []  # what the terminal shows: \r\x1b[K clears the line
    for chunk in text.split("\n"):
        screen.append(chunk.split("\r\x1b[K")[-1])
    assert screen[:2] == ["row 1", "row 3"]  # kept lines stay, in order
    assert screen[2].startswith("sweep |######| 3/3 100%")  # the last bar: full
    assert "1/3" in text and "2/3" in text and "trying x" in text  # the note rode on the bar


def test_off_keeps_result_lines_and_disabled_prints_nothing(monkeypatch):
    out = Stream(tty=True)
    with Progress(2, stream=out, mode="off") as p:
        p.step("row", keep=True)
        p.step("note")
    assert out.getvalue() == "row\n"
    out = Stream(tty=True)
    with Progress(2, stream=out, enabled=False) as p:
        p.step("row", keep=True)
        p.step()
        p.write("note")
    assert out.getvalue() == "" and p.count == 2
    monkeypatch.setenv("RAWFLUX_PROGRESS", "lines")
    out = Stream(tty=True)
    Progress(1, stream=out).step("x")
    assert out.getvalue().startswith("[1/1 ")
    monkeypatch.setenv("RAWFLUX_PROGRESS", "loud")
    with pytest.raises(ValueError, match="RAWFLUX_PROGRESS"):
        Progress(1)


def test_tuner_counts_every_trial_on_rank0_only(capsys, monkeypatch):
    from rawflux import plan, tune

    dev = plan.h200()
    seen = []

    def time_us(cfg):
        seen.append(cfg)
        return tune.estimate_us(2048, 4096, 4096, cfg, dev)

    best, us = tune.tune(2048, 4096, 4096, "nk", dev, time_us)
    lines = capsys.readouterr().out.splitlines()  # captured: no terminal, so lines
    assert len(lines) == len(seen) > 3
    assert lines[-1].startswith(f"[{len(seen)}/{len(seen)} ") and "tune 2048x4096x4096 nk" in lines[-1]
    assert f"best {us:.1f}" in lines[-1]
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    tune.tune(2048, 4096, 4096, "nk", dev, time_us)
    assert capsys.readouterr().out == ""


class _Timer:
    def warm(self, run, nsets, inner=1):
        pass

    def sync(self):
        pass

    def time(self, run, nsets, inner=1):
        return [1.0] * 5


class _Side:
    info = SimpleNamespace(gpu="Fake GPU", driver="0.0", commit=None, emulated=False, ranks_per_gpu=1, host="h",
                           l2_bytes=60 << 20, mem_bytes=80 << 30, versions={})
    stream = None
    timer = _Timer()

    def make_sets(self, p, nsets, seed):
        return [{} for _ in range(nsets)]

    def release(self):
        pass


@pytest.mark.parametrize("quiet", [False, True])
def test_bench_sweep_counts_rows_and_skips(monkeypatch, capsys, tmp_path, quiet):
    pytest.importorskip("mpi4py")
    from mpi4py import MPI

    from rawflux.bench import cli, registry

    monkeypatch.setattr(registry, "_impls", {op: {} for op in registry.OPS})
    registry.register("ag_gemm", "gemm", "gemm", lambda ctx: (lambda i: None))
    registry.register("ag_gemm", "gone", "fused", lambda ctx: (_ for _ in ()).throw(registry.Unavailable("not here")))
    group = SimpleNamespace(comm=MPI.COMM_SELF, rank=0, world=1, device_id=0)
    args = cli.parse_args(["--quick", "--op", "ag_gemm", "--shapes", "1024,1024", "--m", "256,512", "--no-json", "--seed", "1"]
                          + (["--quiet"] if quiet else []))
    records = cli.run(args, group, _Side(), [])
    assert len(records) == 2
    out = capsys.readouterr().out
    steps = re.findall(r"^\[(\d+)/4 ", out, re.M)
    if quiet:
        assert steps == [] and "skip ag_gemm" not in out and "ag_gemm" in out  # the table still prints
    else:
        assert steps == ["1", "2", "3", "4"]  # 2 shapes x 2 impls, the skipped impl counted too
        assert "skip ag_gemm" in out and "not here" in out
