#!/usr/bin/env python3
"""rawflux.dist checks at several world sizes on the emulated node (N ranks on one GPU, MPS).

    python tests/gpu/dist_checks.py                    # worlds 1, 2, 4, 8 under rawflux-launch --emulate
    python tests/gpu/dist_checks.py --worlds 2,8
    python tests/gpu/dist_checks.py --real --worlds 8  # one rank per GPU (rawflux-launch -n)

For each world size it launches this script again with --worker; rank 0 of the worker prints one
line per check ("dist world=W <check> PASS|FAIL|SKIP  detail"), and the driver repeats them and
ends with a summary: barrier latency (us per barrier, median) per world size. Checks: symmetric
(every rank writes every peer through the peer table), ordered_rounds (fill/barrier/verify/
barrier with no host sync), barrier_loop (10,000 back-to-back barriers), graph_replay (a
captured barrier replayed 1,000 times), barrier_latency, wait_timeout (the generic bounded wait
ends in CollectiveTimeout), skip_timeout (one rank skips a barrier; the others raise within the
timeout). Exit status 0 only if every check passed at every world size.

Then dead_rank, at worlds 2 and 4, each in a launch of its own (mpirun --enable-recovery, so the
launcher leaves the others running when a rank dies): the last rank calls os._exit(0) between
barriers; every live rank must raise CollectiveTimeout naming it within the timeout, a following
symmetric() must raise MissingRanks naming it within the timeout, close() must return at once,
and the launch must end within 2 x timeout + DEAD_EXIT_MARGIN_S of the death.

    python tests/gpu/dist_checks.py --case dead_rank --worlds 2,4 --timeout 2
"""
from __future__ import annotations

import argparse
import atexit
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEAD_EXIT_MARGIN_S = 30.0  # launcher teardown (the MPS daemon) and MPI_Finalize after the live ranks' close


def worker(args) -> int:
    sys.path.insert(0, ROOT)
    from mpi4py import MPI

    from rawflux.dist import finalize, selftest

    comm = MPI.COMM_WORLD
    ok = True
    for c in selftest.iter_checks(comm, barriers=args.barriers, replays=args.replays, timeout_s=args.timeout):
        ok = ok and c.ok
        if comm.rank == 0:
            print(c.line(comm.size), flush=True)
    finalize()
    return 0 if ok else 1


def dead_rank_worker(args) -> int:
    """The last rank dies (os._exit) between barriers; the live ranks report over a communicator of
    their own, made before the death."""
    sys.path.insert(0, ROOT)
    import cupy
    from mpi4py import MPI

    from rawflux.dist import CollectiveTimeout, MissingRanks, init
    from rawflux.dist.layout import STATE_TIMEOUT

    comm = MPI.COMM_WORLD
    rank, world = comm.rank, comm.size
    dead = world - 1
    live = comm.Split(0 if rank != dead else MPI.UNDEFINED, rank)
    death_at = [0.0]
    if rank == 0:  # registered before rawflux's own: runs after its close at exit, just before MPI_Finalize
        atexit.register(lambda: print(f"dist world={world} dead_rank_exit  at exit {time.time() - death_at[0]:.2f} s "
                                      f"after the death (death_at={death_at[0]:.3f})", flush=True))
    g = init(comm, timeout_s=args.timeout)
    ok, notes, took = True, [], [0.0, 0.0, 0.0]
    with cupy.cuda.Device(g.device_id):
        stream = cupy.cuda.Stream(non_blocking=True)
        g.symmetric(1 << 20, "dead.buf")
        for _ in range(3):  # the group works
            g.barrier(stream)
            g.synchronize(stream)
        comm.Barrier()
        death_at[0] = time.time()
        if rank == dead:
            os._exit(0)
        t = time.perf_counter()
        try:
            for _ in range(100):  # a sequence of barriers: the first one after the death must fail
                g.barrier(stream)
                g.synchronize(stream)
            ok = False
            notes.append("100 barriers passed without the dead rank")
        except CollectiveTimeout as e:
            took[0] = time.perf_counter() - t
            rec = e.record
            named = rec is not None and ((rec.state == STATE_TIMEOUT and rec.peer == dead) or dead in rec.late_ranks)
            ok = named and took[0] < args.timeout + 5.0
            notes.append(f"barrier: {'' if named else 'NOT NAMED: '}{str(e)[:120]}")
        except Exception as e:  # noqa: BLE001 - a CUDA error instead of the timeout: reported
            ok = False
            notes.append(f"barrier raised {type(e).__name__}: {str(e)[:160]}")
        t = time.perf_counter()
        try:
            g.symmetric(1 << 20, "dead.after")
            ok = False
            notes.append("symmetric() passed without the dead rank")
        except MissingRanks as e:
            took[1] = time.perf_counter() - t
            ok = ok and e.ranks == [dead] and took[1] < args.timeout + 5.0
            notes.append(f"symmetric: ranks {e.ranks}")
        except Exception as e:  # noqa: BLE001
            ok = False
            notes.append(f"symmetric() raised {type(e).__name__}: {str(e)[:160]}")
        t = time.perf_counter()
        try:
            g.close()  # failed group: waits for no one
        except Exception as e:  # noqa: BLE001
            ok = False
            notes.append(f"close() raised {type(e).__name__}: {str(e)[:160]}")
        took[2] = time.perf_counter() - t
        ok = ok and took[2] < 2.0
    every = live.allgather((ok, took, notes))
    all_ok = all(o for o, _, _ in every)
    if rank == 0:
        worst = [max(tk[i] for _, tk, _ in every) for i in range(3)]
        bad = next((f"rank {q}: {'; '.join(n)}" for q, (o, _, n) in enumerate(every) if not o), "; ".join(notes))
        print(f"dist world={world} dead_rank        {'PASS' if all_ok else 'FAIL'}  rank {dead} died; live ranks raised "
              f"after <= {worst[0]:.2f} s (barrier), {worst[1]:.2f} s (symmetric), closed in {worst[2]:.2f} s "
              f"(timeout {args.timeout:.1f} s); {bad[:200]}", flush=True)
    live.Free()
    return 0 if all_ok else 1


def dead_rank_driver(args, worlds: list[int]) -> list[int]:
    """dead_rank at each world, one launch each; returns the worlds that failed."""
    from _worlds import run_world

    from rawflux import env
    from rawflux.launch import mpi_flavour

    # Keep the live ranks running when one dies (the default ends the whole job).
    keep = {"openmpi": "--enable-recovery", "mpich": "-disable-auto-cleanup"}.get(mpi_flavour(env.mpirun()), "")
    old = os.environ.get("RAWFLUX_MPIRUN_ARGS")
    os.environ["RAWFLUX_MPIRUN_ARGS"] = f"{old or ''} {keep}".strip()
    failures = []
    try:
        for w in worlds:
            extra = ["--case", "dead_rank", "--timeout", str(args.timeout)]
            rc, out = run_world(__file__, w, extra, real=args.real, timeout_s=args.per_world_timeout)
            ended = time.time()
            got = [ln for ln in out.splitlines() if ln.startswith(f"dist world={w} dead_rank")]
            for ln in got:
                print(ln, flush=True)
            m = next((re.search(r"death_at=([\d.]+)", ln) for ln in got if "dead_rank_exit" in ln), None)
            delay = ended - float(m.group(1)) if m else None
            limit = 2 * args.timeout + DEAD_EXIT_MARGIN_S
            passed = rc == 0 and any(" PASS " in ln for ln in got) and delay is not None and delay < limit
            print(f"dist world={w} dead_rank_end    {'PASS' if passed else 'FAIL'}  launcher exit {rc}, "
                  + (f"{delay:.1f} s after the death (limit {limit:.0f} s)" if delay is not None else "no exit line"),
                  flush=True)
            if not passed:
                failures.append(w)
                print("\n".join(out.splitlines()[-40:]), flush=True)
    finally:
        if old is None:
            os.environ.pop("RAWFLUX_MPIRUN_ARGS", None)
        else:
            os.environ["RAWFLUX_MPIRUN_ARGS"] = old
    return failures


def driver(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script from anywhere
    sys.path.insert(0, ROOT)
    from _worlds import run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    extra = ["--barriers", str(args.barriers), "--replays", str(args.replays), "--timeout", str(args.timeout)]
    lines, failures = [], []
    if args.case in ("all", "checks"):
        lines, failures = run_worlds(__file__, "dist", worlds, extra, real=args.real, timeout_s=args.per_world_timeout, tail=40)
    if args.case in ("all", "dead_rank"):
        failures += [f"{w} (dead_rank)" for w in dead_rank_driver(args, [w for w in worlds if w in (2, 4)])]
    latency = {}
    for ln in lines:
        m = re.search(r"dist world=(\d+) barrier_latency\s+PASS\s+([\d.]+) us", ln)
        if m:
            latency[int(m.group(1))] = float(m.group(2))
    lat = ", ".join(f"world {w}: {latency[w]:.2f} us" for w in sorted(latency)) or "none measured"
    print(f"dist summary: {'ALL PASS' if not failures else f'FAILED at worlds {failures}'}; "
          f"barrier latency (median, us per barrier): {lat}", flush=True)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--real", action="store_true", help="one rank per GPU (rawflux-launch -n) instead of MPS emulation")
    ap.add_argument("--barriers", type=int, default=10000)
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=2.0, help="wait timeout (s) in the skip test")
    ap.add_argument("--per-world-timeout", type=float, default=240.0)
    ap.add_argument("--case", choices=("all", "checks", "dead_rank"), default="all",
                    help="the checks, the dead_rank case (worlds 2 and 4 only), or both")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return dead_rank_worker(args) if args.case == "dead_rank" else worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
