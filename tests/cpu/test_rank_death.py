"""A rank that dies mid-call or stops calling, on the CPU fake backend (tests/mpi/test_dist_cpu.py's
FakeBackend: shared files for device memory, the barrier protocol run in Python) under real MPI.

Each case launches W = 2 or 4 ranks (mpirun --enable-recovery, so the launcher keeps the others
running when one dies, as a launcher that does not kill the job would) of this file's worker: two
good rounds of barrier / symmetric() / free_symmetric(), then the last rank dies (os._exit,
SIGKILL, an uncaught exception) or stops calling, before or inside one call. Every live rank must
raise an error naming it within the wait timeout (a close that finds it missing: within close's
wait), close the group without waiting for anyone, and exit; the whole run is under a watchdog
that kills it, so a hang fails the test instead of stalling the suite.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 1.0  # the group's wait timeout in the worker
MARGIN_S = 3.0  # scheduling slack on a small, oversubscribed machine
CLOSE_FAST_S = 0.5  # a failed group's close waits for no one
# After every rank is ready the run must have ended by then (the workers skip MPI_Finalize: see
# leave() in worker); rawflux's own part is timed by the events (raised, closed, exit).
WATCHDOG_S = 30.0
TAG = "RANKDEATH "


# --- the worker (one MPI rank) -------------------------------------------------------------------

def _die(mode: str, hold_s: float):
    if mode == "exit":
        os._exit(0)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "raise":
        raise RuntimeError("rank-death test: this rank raised and stops")
    if mode == "stop":  # alive but making no call; then leaves as a normal program would (atexit close)
        time.sleep(hold_s)
        sys.exit(0)
    raise ValueError(mode)


def worker(mode: str, where: str, folder: str) -> None:
    sys.path.insert(0, ROOT)
    import atexit

    from mpi4py import MPI

    from rawflux.dist import init
    from tests.mpi.test_dist_cpu import FakeBackend

    comm = MPI.COMM_WORLD
    rank, dead = comm.rank, comm.size - 1
    t0 = [time.monotonic()]

    def say(**kw):
        print(TAG + json.dumps(dict(rank=rank, t=round(time.monotonic() - t0[0], 3), **kw)), flush=True)

    def leave():
        say(event="exit")
        # MPI_Finalize (mpi4py's, after this) with a dead peer is Open MPI's business, not rawflux's:
        # it once took over 27 s on a loaded 2-core machine, so the live ranks leave here
        os._exit(0)

    atexit.register(leave)  # before rawflux's: runs after its finalize, before mpi4py's
    be = FakeBackend(folder=folder)
    g = init(comm, backend=be, timeout_s=TIMEOUT_S)
    for i in range(2):  # the group works
        g.barrier()
        g.synchronize()
        g.free_symmetric(g.symmetric(4096, f"death.{i}"))
    buf = g.symmetric(4096, "death.kept")
    comm.Barrier()
    t0[0] = time.monotonic()
    say(event="ready")
    if rank == dead:
        if where == "mid_symmetric":  # die inside the call, after the handle exchange
            be.ipc_open = lambda handle: _die(mode, 0)
        else:
            _die(mode, hold_s=3 * TIMEOUT_S + 2.0)
    calls = {"barrier": lambda: (g.barrier(), g.synchronize()),
             "symmetric": lambda: g.symmetric(4096, "death.new"),
             "mid_symmetric": lambda: g.symmetric(4096, "death.new"),
             "free": lambda: g.free_symmetric(buf),
             "close": g.close}
    t = time.monotonic()
    try:
        calls[where]()
        say(event="no error", took=time.monotonic() - t)
    except Exception as e:  # noqa: BLE001 - reported to the test
        rec = getattr(e, "record", None)
        named = dead in getattr(e, "ranks", []) or (rec is not None and dead in rec.late_ranks)
        say(event="raised", type=type(e).__name__, msg=str(e), named=bool(named), took=time.monotonic() - t)
    t = time.monotonic()
    g.close()
    say(event="closed", took=time.monotonic() - t, closed=g.closed)


# --- the tests -----------------------------------------------------------------------------------

def _run(world: int, mode: str, where: str, tmp_path):
    if shutil.which(os.environ.get("RAWFLUX_MPIRUN") or "mpirun") is None:
        pytest.skip("needs mpirun")
    pytest.importorskip("mpi4py")
    cmd = [sys.executable, "-m", "rawflux.launch", "-n", str(world), "--oversubscribe",
           "--mpirun-arg", "--enable-recovery", "--", sys.executable, os.path.abspath(__file__),
           "--worker", mode, where, str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)
    reader.start()
    start, ready_at = time.monotonic(), None
    while p.poll() is None:  # the watchdog: startup gets 60 s, the run after every rank is ready WATCHDOG_S
        now = time.monotonic()
        if ready_at is None and sum(ln.startswith(TAG) and '"ready"' in ln for ln in list(out)) == world:
            ready_at = now
        if (ready_at is not None and now - ready_at > WATCHDOG_S) or now - start > 60 + WATCHDOG_S:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            reader.join(5)
            pytest.fail(f"world {world}, {mode} at {where}: still running {now - (ready_at or start):.1f} s after "
                        f"{'every rank was ready' if ready_at else 'the start'} (a hang); output:\n" + "".join(out)[-4000:])
        time.sleep(0.02)
    reader.join(10)
    lines = [json.loads(ln[len(TAG):]) for ln in out if ln.startswith(TAG)]
    return lines, "".join(out)


CASES = [("exit", "barrier", "CollectiveTimeout"), ("exit", "symmetric", "MissingRanks"),
         ("exit", "close", "MissingRanks"), ("kill", "mid_symmetric", "MissingRanks"),
         ("kill", "free", "CollectiveTimeout"), ("stop", "barrier", "CollectiveTimeout"),
         ("raise", "symmetric", "DistError")]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mode,where,error", CASES)
def test_live_ranks_raise_close_and_exit(world, mode, where, error, tmp_path):
    lines, out = _run(world, mode, where, tmp_path)
    dead = world - 1
    bound = (3 * TIMEOUT_S if where == "close" else TIMEOUT_S) + MARGIN_S
    for r in range(dead):
        mine = {e["event"]: e for e in lines if e["rank"] == r}
        ctx = f"world {world}, {mode} at {where}, rank {r}: {sorted(mine)}\n{out[-3000:]}"
        got = mine.get("raised")
        assert got is not None, "no error: " + ctx
        assert got["type"] == error, ctx
        assert got["named"] or error == "DistError", ctx  # DistError: a call mismatch, named in the message
        assert f"rank {dead}" in got["msg"] or f"[{dead}]" in got["msg"], ctx
        assert got["took"] < bound, ctx
        assert mine["closed"]["closed"] and mine["closed"]["took"] < CLOSE_FAST_S, ctx
        assert "exit" in mine, ctx
    if mode == "stop":  # the rank that stopped calling also leaves cleanly later
        assert any(e["rank"] == dead and e["event"] == "exit" for e in lines), out[-3000:]


if __name__ == "__main__":
    assert sys.argv[1] == "--worker"
    worker(*sys.argv[2:5])
