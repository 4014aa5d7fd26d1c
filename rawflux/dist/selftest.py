"""GPU checks of rawflux.dist, shared by tests/gpu, tests/mpi and tests/gpu/dist_checks.py.

Each check is collective over the group, returns a Check with the same ``ok`` on every rank
(results are AND-reduced over MPI) and a one-line detail, and can fail: patterns are fresh
random per call, buffers are poisoned before peers write, epochs are counted exactly.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from .group import CollectiveTimeout, Group, init
from .layout import STATE_ABORTED, STATE_TIMEOUT


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    metrics: dict = field(default_factory=dict)
    skipped: bool = False

    def line(self, world: int) -> str:
        tag = "SKIP" if self.skipped else ("PASS" if self.ok else "FAIL")
        return f"dist world={world} {self.name:<16s} {tag}  {self.detail}"


def _kernel(g: Group, name: str):
    from ..jit import get_kernel

    return get_kernel("barrier.cu", f"rawflux::{name}", device_id=g.device_id)


def _fresh_seed(g: Group) -> int:
    return g._mpi.bcast(int.from_bytes(os.urandom(4), "little") if g.rank == 0 else None, root=0)


def _all(g: Group, ok: bool) -> bool:
    from mpi4py import MPI

    return bool(g._mpi.allreduce(bool(ok), op=MPI.LAND))


def expected_pattern(seed: int, src: int, dst: int, count: int) -> np.ndarray:
    """numpy twin of selftest_pattern() in kernels/barrier.cu (u32 arithmetic wraps)."""
    u = np.uint32
    i = np.arange(count, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = u(seed) ^ (u(src) * u(0x9E3779B1)) ^ (u(dst) * u(0x85EBCA77)) ^ (i * u(0xC2B2AE3D))
        h ^= h >> u(15)
        h *= u(0x2C1B3C6D)
        h ^= h >> u(12)
        h *= u(0x297A2D39)
        h ^= h >> u(15)
    return h


def _fill_peers(g: Group, buf, slot_words: int, seed: int, stream, grid: int) -> None:
    """Queue selftest_fill_kernel: this rank's pattern into its slot of every peer's copy of buf."""
    _kernel(g, "selftest_fill_kernel").launch(
        (grid, 1, 1), (256 if grid > 1 else 64, 1, 1),
        (np.uint64(buf.peer_table_ptr), np.uint32(slot_words), np.int32(g.rank), np.int32(g.world), np.uint32(seed)),
        stream=stream)


def _received_mismatches(g: Group, buf, slot_words: int, seed: int) -> int:
    """Words of this rank's copy of buf that differ from what every rank should have written."""
    import cupy

    got = cupy.asnumpy(buf.view("uint32")).reshape(g.world, slot_words)
    return sum(int(np.count_nonzero(got[src] != expected_pattern(seed, src, g.rank, slot_words))) for src in range(g.world))


def check_symmetric(g: Group, nbytes_per_rank: int = 1 << 20) -> Check:
    """Every rank writes a distinct pattern into its slot of every peer's buffer through the
    peer table; each rank checks all it received (host-side numpy reference)."""
    import cupy

    slot_words = max(1, nbytes_per_rank // 4)
    seed = _fresh_seed(g)
    buf = g.symmetric(4 * slot_words * g.world, "selftest.symmetric")
    be = g._backend
    try:
        with cupy.cuda.Device(g.device_id):
            be.memset(buf.ptr, 0xA5, buf.nbytes)  # poison: a slot nobody wrote cannot pass
            g._mpi.Barrier()  # every poison landed before any peer writes
            stream = cupy.cuda.Stream(non_blocking=True)
            t0 = time.perf_counter()
            _fill_peers(g, buf, slot_words, seed, stream, grid=64)
            g.barrier(stream)
            g.synchronize(stream)
            dt = time.perf_counter() - t0
            bad = _received_mismatches(g, buf, slot_words, seed)
        # the peer table itself must list every mapping, own pointer at own rank
        table = cupy.asnumpy(buf.peer_ptrs_dev).tolist()
        table_ok = table == buf.peer_ptrs and buf.peer_ptrs[g.rank] == buf.ptr
    finally:
        g.free_symmetric(buf)
    total_bad = g._mpi.allreduce(bad)
    ok = _all(g, bad == 0 and table_ok)
    return Check("symmetric", ok, f"{nbytes_per_rank / 2**20:.2f} MiB per rank-pair slot, {total_bad} mismatched words "
                 f"over all ranks, peer table {'ok' if table_ok else 'WRONG'}, {dt * 1e3:.1f} ms", {"mismatches": total_bad})


def check_small_symmetric(g: Group, count: int = 8, slot_words: int = 16) -> Check:
    """Several small symmetric buffers allocated back to back (cudaMalloc may pack such buffers
    into one block, which an IPC handle maps from its base: symm.py): every rank writes a
    distinct pattern (a fresh seed per buffer) into its slot of every peer's copy of each one;
    each rank checks each of its own. A peer mapping that lands on another buffer of the block
    shows up as mismatched words."""
    import cupy

    seeds = [_fresh_seed(g) for _ in range(count)]
    bufs = []
    bad = 0
    try:
        for i in range(count):
            bufs.append(g.symmetric(4 * slot_words * g.world, f"selftest.small{i}"))
        be = g._backend
        with cupy.cuda.Device(g.device_id):
            for b in bufs:
                be.memset(b.ptr, 0xA5, b.nbytes)  # poison: a slot nobody wrote cannot pass
            g._mpi.Barrier()  # every poison landed before any peer writes
            stream = cupy.cuda.Stream(non_blocking=True)
            for b, seed in zip(bufs, seeds):
                _fill_peers(g, b, slot_words, seed, stream, grid=1)
            g.barrier(stream)
            g.synchronize(stream)
            bad = sum(_received_mismatches(g, b, slot_words, seed) for b, seed in zip(bufs, seeds))
    finally:
        for b in reversed(bufs):
            g.free_symmetric(b)
    total_bad = g._mpi.allreduce(bad)
    ok = _all(g, bad == 0)
    return Check("small_symmetric", ok, f"{count} buffers of {4 * slot_words * g.world} bytes: {total_bad} mismatched words "
                 f"over all ranks", {"mismatches": total_bad})


def check_ordered_rounds(g: Group, rounds: int = 200, slot_words: int = 4096) -> Check:
    """Back-to-back rounds with no host sync: fill peers (fresh seed per round), barrier, verify
    own buffer on device, barrier (so the next fill does not overwrite what a peer still reads).
    Any missing release/acquire ordering shows up as mismatched words."""
    import cupy

    seed = _fresh_seed(g)
    buf = g.symmetric(4 * slot_words * g.world, "selftest.rounds")
    try:
        with cupy.cuda.Device(g.device_id):
            mism = cupy.zeros(1, dtype=cupy.uint32)
            fill, verify = _kernel(g, "selftest_fill_kernel"), _kernel(g, "selftest_verify_kernel")
            stream = cupy.cuda.Stream(non_blocking=True)
            g._mpi.Barrier()
            for k in range(rounds):
                s = np.uint32((seed + 7919 * k) & 0xFFFFFFFF)
                fill.launch((16, 1, 1), (256, 1, 1), (np.uint64(buf.peer_table_ptr), np.uint32(slot_words),
                                                      np.int32(g.rank), np.int32(g.world), s), stream=stream)
                g.barrier(stream)
                verify.launch((16, 1, 1), (256, 1, 1), (np.uint64(buf.ptr), np.uint32(slot_words), np.int32(g.rank),
                                                        np.int32(g.world), s, mism), stream=stream)
                g.barrier(stream)
            g.synchronize(stream)
            bad = int(mism.get()[0])
    finally:
        g.free_symmetric(buf)
    total = g._mpi.allreduce(bad)
    return Check("ordered_rounds", _all(g, bad == 0), f"{rounds} rounds fill/barrier/verify/barrier, {total} mismatched words",
                 {"mismatches": total})


def check_barrier_loop(g: Group, n: int = 10000) -> Check:
    """n back-to-back barriers, no resets: the epoch grows by exactly n, every flag matches it."""
    import cupy

    with cupy.cuda.Device(g.device_id):
        stream = cupy.cuda.Stream(non_blocking=True)
        g.synchronize()
        before = g.ctrl_state()["epoch"]
        g._mpi.Barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            g.barrier(stream)
        g.synchronize(stream)
        dt = time.perf_counter() - t0
        st = g.ctrl_state()
    ok = st["epoch"] == (before + n) & 0xFFFFFFFF and all(f == st["epoch"] for f in st["flags"]) and st["abort"] == 0
    us = max(g._mpi.allgather(dt / n * 1e6))
    return Check("barrier_loop", _all(g, ok), f"{n} barriers, epoch {before} -> {st['epoch']}, flags "
                 f"{'all equal' if ok else st['flags']}, {us:.1f} us per barrier (host loop, max over ranks)",
                 {"us_per_barrier": us})


def check_graph(g: Group, replays: int = 1000) -> Check:
    """A barrier captured in a CUDA graph, replayed `replays` times: epochs keep counting."""
    import cupy

    with cupy.cuda.Device(g.device_id):
        stream = cupy.cuda.Stream(non_blocking=True)
        g.synchronize()
        before = g.ctrl_state()["epoch"]
        with stream:
            stream.begin_capture()
            g.barrier(stream)
            graph = stream.end_capture()
        captured_epoch = g.ctrl_state()["epoch"]  # capture must not execute anything
        g._mpi.Barrier()
        t0 = time.perf_counter()
        for _ in range(replays):
            graph.launch(stream)
        g.synchronize(stream)
        dt = time.perf_counter() - t0
        st = g.ctrl_state()
    ok = (captured_epoch == before and st["epoch"] == (before + replays) & 0xFFFFFFFF
          and all(f == st["epoch"] for f in st["flags"]))
    us = max(g._mpi.allgather(dt / replays * 1e6))
    return Check("graph_replay", _all(g, ok), f"{replays} replays, epoch {before} -> {st['epoch']} "
                 f"(captured without running: {captured_epoch == before}), {us:.1f} us per replay",
                 {"us_per_replay": us})


def barrier_latency(g: Group, iters: int = 100, reps: int = 15) -> Check:
    """Barrier latency, median over `reps` samples, worst rank: (a) device latency: a CUDA graph
    of `iters` back-to-back barriers, timed with events, / iters; (b) host-issued: `iters`
    barriers launched one by one from Python (bounded below by the host launch cost)."""
    import cupy

    with cupy.cuda.Device(g.device_id):
        stream = cupy.cuda.Stream(non_blocking=True)
        for _ in range(20):
            g.barrier(stream)
        g.synchronize(stream)
        with stream:
            stream.begin_capture()
            for _ in range(iters):
                g.barrier(stream)
            graph = stream.end_capture()
        graph.launch(stream)  # warm-up (uploads the graph)
        g.synchronize(stream)

        def sample(issue):
            g._mpi.Barrier()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            issue()
            end.record(stream)
            g.synchronize(stream)
            return cupy.cuda.get_elapsed_time(start, end) * 1e3 / iters

        def one_by_one():
            for _ in range(iters):
                g.barrier(stream)

        in_graph = statistics.median(sample(lambda: graph.launch(stream)) for _ in range(reps))
        host = statistics.median(sample(one_by_one) for _ in range(reps))
    worst_graph = max(g._mpi.allgather(in_graph))
    worst_host = max(g._mpi.allgather(host))
    return Check("barrier_latency", True, f"{worst_graph:.2f} us per barrier in a CUDA graph of {iters} (device "
                 f"latency); {worst_host:.2f} us issued one by one from Python (median of {reps}, max over ranks)",
                 {"us_median": worst_graph, "us_host_issued": worst_host})


def check_skip_timeout(comm, skip_rank: int | None = None, timeout_s: float = 2.0) -> Check:
    """A fresh group with a short timeout; one rank skips a barrier. The others must raise
    CollectiveTimeout naming it within about the timeout (not hang), a further barrier must fail
    fast (the abort word), and the skipping rank must see the abort too."""
    import cupy

    world = comm.Get_size()
    if world < 2:
        return Check("skip_timeout", True, "needs at least 2 ranks", skipped=True)
    skip = world - 1 if skip_rank is None else skip_rank
    sub = comm.Dup()
    g = init(sub, timeout_s=timeout_s)
    ok, detail, elapsed, fast = True, "", 0.0, 0.0
    try:
        with cupy.cuda.Device(g.device_id):
            stream = cupy.cuda.Stream(non_blocking=True)
            g.barrier(stream)  # one good barrier first: the group works
            g.synchronize(stream)
            g._mpi.Barrier()
            if g.rank != skip:
                t0 = time.perf_counter()
                g.barrier(stream)
                try:
                    g.synchronize(stream)
                    ok, detail = False, "barrier passed although a rank skipped it"
                except CollectiveTimeout as e:
                    elapsed = time.perf_counter() - t0
                    rec = e.record
                    named = (rec.state == STATE_TIMEOUT and rec.peer == skip) or (rec.state == STATE_ABORTED and skip in rec.late_ranks)
                    ok = named and elapsed < timeout_s + 5.0
                    detail = str(e)
                # a second barrier on the aborted group must fail at once
                t1 = time.perf_counter()
                g.barrier(stream)
                try:
                    g.synchronize(stream)
                    ok = False
                except CollectiveTimeout:
                    fast = time.perf_counter() - t1
                    ok = ok and fast < 1.0
            g._mpi.Barrier()  # the skipping rank touches the group only after the others gave up
            if g.rank == skip:
                ok = g.ctrl_state()["abort"] != 0  # the timeout was propagated here as well
                detail = "abort word set by peers" if ok else "abort word NOT set on the skipping rank"
    finally:
        g.close()
        sub.Free()
    times = comm.allgather(elapsed)
    msgs = comm.allgather(detail)
    all_ok = bool(comm.allreduce(bool(ok), op=_land()))
    worst = max(t for q, t in enumerate(times) if q != skip)
    return Check("skip_timeout", all_ok, f"rank {skip} skipped; others raised after <= {worst:.2f} s "
                 f"(timeout {timeout_s:.1f} s); rank 0 said: {msgs[0 if skip != 0 else 1][:160]}",
                 {"worst_s": worst})


def check_wait_timeout(comm, timeout_s: float = 0.5) -> Check:
    """The generic bounded wait (comm/wait.cuh, used by fused kernels): wait on a flag nobody
    sets; it must end in CollectiveTimeout naming the flag, and the group must then fail fast."""
    import cupy

    sub = comm.Dup()
    g = init(sub, timeout_s=timeout_s)
    ok, detail = False, ""
    try:
        with cupy.cuda.Device(g.device_id):
            flags = g.signal_buffer(8, "selftest.wait")
            stream = cupy.cuda.Stream(non_blocking=True)
            peer = (g.rank + 1) % g.world
            t0 = time.perf_counter()
            _kernel(g, "selftest_wait_kernel").launch(
                (1, 1, 1), (32, 1, 1),
                (np.uint64(g.group_ctrl_ptr), np.uint64(flags.ptr + 4 * 3), np.uint32(1), np.int32(peer), np.int32(3),
                 np.uint32(7)), stream=stream)
            try:
                g.synchronize(stream)
                detail = "wait on an unset flag returned normally"
            except CollectiveTimeout as e:
                dt = time.perf_counter() - t0
                rec = e.record
                ok = rec.index == 3 and rec.call_id == 7 and dt < timeout_s + 5.0
                if rec.state == STATE_TIMEOUT:
                    ok = ok and rec.peer == peer and rec.expected == 1 and rec.observed == 0
                detail = f"{e} ({dt:.2f} s)"
    finally:
        g.close()
        sub.Free()
    all_ok = bool(comm.allreduce(bool(ok), op=_land()))
    return Check("wait_timeout", all_ok, detail[:220])


def _land():
    from mpi4py import MPI

    return MPI.LAND


def iter_checks(comm=None, *, barriers: int = 10000, replays: int = 1000, timeout_s: float = 2.0):
    """Every check above on ``comm`` (default COMM_WORLD), one Check at a time (so a driver can
    print each as it completes). The main group stays open."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    g = init(comm)
    yield check_symmetric(g)
    yield check_small_symmetric(g)
    yield check_ordered_rounds(g)
    yield check_barrier_loop(g, barriers)
    yield check_graph(g, replays)
    yield barrier_latency(g)
    yield check_wait_timeout(comm)
    yield check_skip_timeout(comm, timeout_s=timeout_s)


def run_all(comm=None, **kw) -> list[Check]:
    return list(iter_checks(comm, **kw))
