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
"""
from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def driver(args) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run as a script from anywhere
    from _worlds import run_worlds

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    extra = ["--barriers", str(args.barriers), "--replays", str(args.replays), "--timeout", str(args.timeout)]
    lines, failures = run_worlds(__file__, "dist", worlds, extra, real=args.real, timeout_s=args.per_world_timeout, tail=40)
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
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return worker(args) if args.worker else driver(args)


if __name__ == "__main__":
    sys.exit(main())
