"""The copy-engine AllGather-GEMM's ordering, run on a model of what its calls issue (issue 38,
item 7: at 73ae221 the "ce" checks at world 2, two processes on one H200 without MPS, lost the
peer's chunk: on both ranks, push and pull, every check from the first call of each fresh op
object, the whole chunk, and no wait timed out; 9 reruns never showed it again).

The model. Every rank's calls are issued by the real AGGemm host code with CUDA faked (the
fake_cuda fixture of test_ag_gemm_cpu.py), so the copies, flags, events and launches carry the
addresses and streams a GPU would get. A device executor then runs them: each stream in issue
order, an event wait once the record it was issued behind has run, and the kernels as
fused/ag_gemm.cuh writes them: ag_local_kernel (the epoch, the arrivals, the own rows, the gate
on every peer's arrival), the GEMM (the epoch read, then per chunk and slab the wait
ready >= epoch and the read), the group barrier. A flag copy reads the epoch word when it runs,
not when it was issued. Memory is one map of 4-byte words over every rank's buffers; every word
of every call's shard is a distinct value, so a read of any other bytes is seen. Every
interleaving of the ranks' streams is explored (world 2, two calls) or sampled (world 3). The
"sm" path's copy kernel runs as a stream of its own (started after the call's start, the GEMM
once it has read the epoch: PDL; the stream's later work after both), its blocks in claim order,
each after its peer's arrival, so calls of a copy="auto" op that switch paths are explored too.

What it shows:
  1. the ce path as built is safe, push and pull, whole chunks and k-slabs: in every
     interleaving each GEMM read sees its own call's rows and no wait is left waiting;
  2. each ordering fault is caught, and none gives the signature above: a flag copied before its
     data, a GEMM that reads the epoch before the call's start wrote it, copies not gated on the
     peers' arrival, a call that does not join its side streams (a late flag copy then carries
     the next call's epoch; pull needs no join for that, its GEMM waits for all its flags):
     on push every one is wrong in some interleavings and right in others;
  3. the signature is what a peer mapping at its block's base gives (symm.allocate before 5ce3f84
     took the opened pointer for the buffer) when cudaMalloc placed the gathered buffer behind
     another buffer of one block and the sync buffer at a block's start: in every interleaving,
     on both ranks, push and pull, every peer chunk of every call is wrong, the own rows are
     right, and no wait fails (the flags land, the rows land elsewhere). symm.allocate now adds
     the offset and proves each mapping by its owner's stamp (test_symm_offsets.py), so such a
     mapping is refused at construction.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass

import pytest

from rawflux.ops import ag_gemm as A
from tests.cpu.test_ag_gemm_cpu import fake_cuda  # noqa: F401  the fixture
from tests.cpu.test_ag_gemm_cpu import FakeCAI, read_map
from tests.fake_group import OpGroup

K = 128  # two 64-column k blocks: slabs 1 or 2
ROW = 2 * K  # bytes of a bf16 row
M_LOC = 1  # rows per chunk (the model's memory stays small)
MAIN = 0x42
SHARD_BASE = 0x7D00_0000_0000


def shard_ptr(rank: int, call: int) -> int:
    """Rank ``rank``'s input shard of call ``call`` (fresh memory every call)."""
    return SHARD_BASE + ((rank * 16 + call) << 24)


def shard_word(addr: int) -> int | None:
    """The value a shard holds at ``addr`` (None outside every shard): distinct for every word."""
    off = addr - SHARD_BASE
    if not 0 <= off < (1 << 32):
        return None
    tag, byte = off >> 24, off & 0xFFFFFF
    return 0x4000_0000 + (tag << 16) + byte // 4


# --------------------------------------------------------------------------------------------
# symmetric buffers as placed by a sub-allocating cudaMalloc


@dataclass
class Buf:
    name: str
    nbytes: int
    ptr: int
    peer_ptrs: list
    peer_table_ptr: int


class World:
    """Every rank's symmetric buffers. Rank q's buffer sits ``offsets[name]`` bytes into a block of
    its own; ``mapping`` "buffer" maps each peer's buffer where it is (symm.allocate today),
    "block" at its block's base (the opened pointer taken for the buffer, before 5ce3f84)."""

    def __init__(self, world: int, offsets: dict[str, int] | None = None, mapping: str = "buffer"):
        self.world, self.offsets, self.mapping = world, offsets or {}, mapping
        self.tables: dict[int, list[int]] = {}  # peer tables in device memory (ptr -> u64 words)
        self._made: dict[tuple[int, str], Buf] = {}

    def symmetric(self, rank: int, nbytes: int, name: str) -> Buf:
        part = name.split(".")[-1]
        index = ("gathered", "sync").index(part)
        off = self.offsets.get(part, 0)
        base = [((q + 1) << 40) + ((index + 1) << 32) for q in range(self.world)]
        ptrs = [b + off for b in base]
        peers = [ptrs[q] if q == rank or self.mapping == "buffer" else base[q] for q in range(self.world)]
        table = ((rank + 1) << 40) + (0xF0 << 32) + index * 0x1000
        self.tables[table] = peers
        buf = Buf(name, nbytes, ptrs[rank], peers, table)
        self._made[(rank, part)] = buf
        return buf


class ModelGroup(OpGroup):
    def __init__(self, rank, world, log, mem: World):
        super().__init__(rank, world, log)
        self.mem = mem

    def symmetric(self, nbytes, name):
        return self.mem.symmetric(self.rank, nbytes, name)


def issue_calls(log, world: int, direction: str, calls: int, slabs: int, mem: World, sides: int = 1, m_locs=None) -> list[list[tuple]]:
    """Each rank's issue log for ``calls`` calls of one fresh op object per rank; ``m_locs``: the
    rows per rank of each call on a copy="auto" op whose calls of 1 row take "sm" and of more
    "ce" (op.path overridden: the model's shapes are all decode-sized), else M_LOC on copy="ce"."""
    cap = max(m_locs or (M_LOC,))
    ops = [A.AGGemm(ModelGroup(r, world, log, mem), world * cap, 64, K, "bf16", direction=direction, copy="auto" if m_locs else "ce",
                    slabs=slabs, ce_streams=sides) for r in range(world)]
    if m_locs:
        for op in ops:
            op.path = lambda m, w=world: "sm" if m == w else "ce"
    logs: list[list[tuple]] = [[] for _ in range(world)]
    for c in range(calls):
        m_loc = m_locs[c] if m_locs else M_LOC
        for r, op in enumerate(ops):
            log.clear()
            op(FakeCAI(shard_ptr(r, c), (m_loc, K)), FakeCAI(0x7C00_0000_0000, (64, K)),
               out=FakeCAI(0x7B00_0000_0000 + (r << 32), (world * m_loc, 64)), stream=MAIN)
            logs[r] += list(log)
    return logs


# --------------------------------------------------------------------------------------------
# the device executor

# Faults, each a departure from what the code issues or what the kernels do:
FAULTS = ("flag_first", "stale_epoch", "no_gate", "no_join")


@dataclass(frozen=True)
class Op:
    kind: str  # local | gemm | copy | flag | record | wait | barrier | nop
    args: tuple = ()


def build_streams(logs, faults=()):
    """Per rank: {stream: [Op]} in issue order, and each event wait bound to the record it follows
    (stream, index), as CUDA binds cudaStreamWaitEvent to the event's latest record."""
    out = []
    for r, log in enumerate(logs):
        streams: dict[int, list[Op]] = {}
        last_record: dict[int, tuple[int, int]] = {}
        calls = 0
        copy_kernel = None  # the "sm" call's copy kernel whose GEMM is still to come: its own stream in the model

        def put(s, op):
            streams.setdefault(s, []).append(op)

        for e in log:
            kind = e[0]
            if kind == "launch" and e[1] == "ag_local_kernel":
                put(e[2], Op("local", A.AG_LOCAL_ARGS.unpack(e[4][0])))
            elif kind == "launch" and e[1] == "ag_copy_kernel":
                # The copy kernel starts once the stream's work so far (the call's start) has ended;
                # its PDL dependent, the GEMM, once every copy CTA runs (after its epoch read).
                copy_kernel = (1 << 48) + len(streams)
                streams[copy_kernel] = [Op("wait", (e[2], len(streams[e[2]]) - 1)), Op("sm_copy", A.AG_COPY_ARGS.unpack(e[4][0]))]
            elif kind == "launch" and e[1] == "gemm_kernel":
                tmap_a, _, _, pro, _, _ = e[4]
                if copy_kernel is not None:
                    assert e[5:] == ("pdl",)
                    put(e[2], Op("pdl", (copy_kernel,)))
                put(e[2], Op("gemm", (read_map(tmap_a)[0], A.AG_WAIT_PARAMS.unpack(pro[A.OWN_MAP_BYTES:]), calls)))
                if copy_kernel is not None:  # the stream's later work follows both kernels
                    put(e[2], Op("wait", (copy_kernel, 1)))
                    copy_kernel = None
                calls += 1
            elif kind == "memcpy":
                _, dst, src, n, s = e
                put(s, Op("flag" if n == 4 else "copy", (dst, src, n, 1, n, n)))
            elif kind == "memcpy2d":
                _, dst, src, _, s, dp, sp, w, h = e
                put(s, Op("copy", (dst, src, w, h, dp, sp)))
            elif kind == "record":
                _, ev, s = e
                put(s, Op("record"))
                last_record[ev] = (s, len(streams[s]) - 1)
            elif kind == "wait":
                _, s, ev = e
                src = last_record.get(ev)
                if "no_join" in faults and s == MAIN and src is not None and src[0] != MAIN:
                    continue
                put(s, Op("wait", src))
            elif kind == "barrier":
                put(e[1], Op("barrier"))
            else:
                raise AssertionError(f"the model does not know {e[:2]}")
        if "flag_first" in faults:
            for ops in streams.values():
                for i in range(len(ops) - 1):
                    if ops[i].kind == "copy" and ops[i + 1].kind == "flag":
                        ops[i], ops[i + 1] = ops[i + 1], ops[i]
        out.append(streams)
    return out


class Device:
    """Runs the ranks' streams; ``state`` is hashable (exhaustive search remembers it)."""

    def __init__(self, logs, world: int, mem: World, slabs: int, faults=()):
        self.world, self.mem, self.slabs, self.faults = world, mem, slabs, set(faults)
        per_rank = build_streams(logs, faults)
        self.streams = [(r, s, ops) for r, st in enumerate(per_rank) for s, ops in sorted(st.items())]
        self.index = {(r, s): i for i, (r, s, _) in enumerate(self.streams)}
        self.programs = [[self.micro(r, op) for op in ops] for r, s, ops in self.streams]

    # memory: words written so far (mem), else a shard's value, else 0
    @staticmethod
    def load(mem: dict, addr: int) -> int:
        if addr in mem:
            return mem[addr]
        v = shard_word(addr)
        return 0 if v is None else v

    def copy_rows(self, mem, dst, src, w, h, dp, sp):
        for i in range(h):
            for b in range(0, w, 4):
                mem[dst + i * dp + b] = self.load(mem, src + i * sp + b)

    def micro(self, r: int, op: Op) -> list:
        """An op as atomic steps: each step(mem, regs, pcs) -> new regs, or None while it must wait."""
        W = self.world
        if op.kind == "local":
            _, src, dst, sync, sync_peers, src_pitch, m_local, row_vecs, flags, head, tail, _ = op.args
            peers = self.mem.tables[sync_peers]

            def arrive(mem, e):
                for q in range(W):
                    if q != r:
                        mem[peers[q] + A.ARRIVE_OFFSET + 4 * r] = e

            def start(mem, regs, pcs):
                e = self.load(mem, sync + A.EPOCH_OFFSET) + 1
                mem[sync + A.EPOCH_OFFSET] = e
                if not flags & A.LOCAL_ARRIVE_LATE:
                    arrive(mem, e)
                return (e,)

            def own_rows(mem, regs, pcs):  # the edge rows (all of them here: m_local < a tile's rows)
                self.copy_rows(mem, dst, src, row_vecs * 16, head, row_vecs * 16, src_pitch)
                self.copy_rows(mem, dst + tail * row_vecs * 16, src + tail * src_pitch, row_vecs * 16, m_local - tail, row_vecs * 16, src_pitch)
                return regs

            def late(mem, regs, pcs):
                if flags & A.LOCAL_ARRIVE_LATE:
                    arrive(mem, regs[0])
                return regs

            def gate(mem, regs, pcs):
                if not flags & A.LOCAL_GATE or "no_gate" in self.faults:
                    return regs
                ok = all(self.load(mem, sync + A.ARRIVE_OFFSET + 4 * q) >= regs[0] for q in range(W) if q != r)
                return regs if ok else None

            return [start, own_rows, late, gate]
        if op.kind == "gemm":
            gath, (_, ready, epoch, m_local, rank, world, slab_kb, _, own_rows), call = op.args  # b_first: load order only
            assert rank == r and world == W
            assert not own_rows  # the model's chunks are smaller than a tile: every own row is read from the gathered buffer
            slabs = K // 64 // slab_kb if slab_kb else 1
            assert slabs == self.slabs
            slab_bytes = ROW // slabs

            def read_epoch(mem, regs, pcs):
                e = self.load(mem, epoch)
                return (e - 1 if "stale_epoch" in self.faults else e, frozenset())

            steps = [read_epoch]
            for q in A.arrival_order(r, W):
                for j in range(slabs):
                    if q != r:
                        def wait(mem, regs, pcs, q=q, j=j):
                            return regs if self.load(mem, ready + 4 * A.ready_index(q, j)) >= regs[0] else None
                        steps.append(wait)

                    def read(mem, regs, pcs, q=q, j=j):
                        ok = all(self.load(mem, gath + (q * m_local + i) * ROW + j * slab_bytes + b)
                                 == shard_word(shard_ptr(q, call) + i * ROW + j * slab_bytes + b)
                                 for i in range(m_local) for b in range(0, slab_bytes, 4))
                        return regs if ok else (regs[0], regs[1] | {(r, call, q, j)})
                    steps.append(read)
            return steps
        if op.kind == "sm_copy":
            _, src, gath_tab, sync, sync_tab, _, src_pitch, m_local, row_vecs, mode, slabs = op.args
            gath, sync_peers, row = self.mem.tables[gath_tab], self.mem.tables[sync_tab], row_vecs * 16
            slab_bytes = row // slabs

            def read_epoch(mem, regs, pcs):  # s_epoch: the call's start wrote it before this kernel began
                return (self.load(mem, sync + A.EPOCH_OFFSET),)

            steps = [read_epoch]
            for st in A.sm_copy_steps(("push", "pull")[mode], r, W, slabs):  # (slab, step) blocks in claim order
                if st.kind == "flag":
                    flag = sync_peers[st.dst_rank] + A.READY_OFFSET + 4 * A.ready_index(st.chunk, st.slab)

                    def set_flag(mem, regs, pcs, flag=flag):
                        mem[flag] = regs[0]
                        return regs
                    steps.append(set_flag)
                    continue
                q = st.dst_rank if st.src == "shard" else st.src_rank  # the peer whose arrival gates the block
                col = st.slab * slab_bytes
                if st.src == "shard":
                    args = (gath[q] + r * m_local * row + col, src + col, slab_bytes, m_local, row, src_pitch)
                else:
                    args = (gath[r] + q * m_local * row + col, gath[q] + q * m_local * row + col, slab_bytes, m_local, row, row)

                def arrived(mem, regs, pcs, q=q):
                    return regs if self.load(mem, sync + A.ARRIVE_OFFSET + 4 * q) >= regs[0] else None

                def block(mem, regs, pcs, args=args):
                    self.copy_rows(mem, *args)
                    return regs
                steps += [arrived, block]
            return steps
        if op.kind == "pdl":
            def started(mem, regs, pcs):  # the copy kernel (op 1 of its stream) is past its epoch read
                return regs if pcs[self.index[(r, op.args[0])]] >= (1, 1) else None
            return [started]
        if op.kind in ("copy", "flag"):
            def run(mem, regs, pcs):
                self.copy_rows(mem, *op.args)
                return regs
            return [run]
        if op.kind == "wait":
            def wait_event(mem, regs, pcs):
                if op.args is None:
                    return regs
                s, i = op.args
                return regs if pcs[self.index[(r, s)]][0] > i else None
            return [wait_event]
        if op.kind == "barrier":
            def arrive_barrier(mem, regs, pcs):
                n = mem.get(("barrier", r), 0) + 1
                mem[("barrier", r)] = n
                return (n,)

            def wait_barrier(mem, regs, pcs):
                return regs if all(mem.get(("barrier", q), 0) >= regs[0] for q in range(W)) else None
            return [arrive_barrier, wait_barrier]
        return [lambda mem, regs, pcs: regs]  # record, nop

    def initial(self):
        n = len(self.streams)
        return (tuple((0, 0) for _ in range(n)), tuple(() for _ in range(n)), frozenset(), frozenset())

    def moves(self, state):
        """The states one atomic step away; [] at the end or in a deadlock."""
        pcs, regs, mem_items, wrong = state
        out = []
        for i, prog in enumerate(self.programs):
            op_i, sub = pcs[i]
            if op_i >= len(prog):
                continue
            mem = dict(mem_items)
            got = prog[op_i][sub](mem, regs[i], pcs)
            if got is None:
                continue
            new_wrong = wrong
            if self.streams[i][2][op_i].kind == "gemm" and len(got) == 2 and got[1]:
                new_wrong = wrong | got[1]
            nxt = (op_i, sub + 1) if sub + 1 < len(prog[op_i]) else (op_i + 1, 0)
            new_regs = got if nxt[0] == op_i else ()
            out.append((pcs[:i] + (nxt,) + pcs[i + 1:], regs[:i] + (new_regs,) + regs[i + 1:], frozenset(mem.items()), new_wrong))
        return out

    def done(self, state) -> bool:
        return all(op_i >= len(prog) for (op_i, _), prog in zip(state[0], self.programs))

    def stuck(self, state) -> list[str]:
        """What each unfinished stream waits on."""
        return [f"rank {self.streams[i][0]} stream {self.streams[i][1]:#x}: {self.streams[i][2][op_i].kind} step {sub}"
                for i, (op_i, sub) in enumerate(state[0]) if op_i < len(self.programs[i])]


@dataclass
class Outcomes:
    wrong: set  # frozensets of (rank, call, chunk, slab) read wrong, one per end state
    deadlocks: list
    states: int


def explore(dev: Device, limit: int = 600_000) -> Outcomes:
    seen, stack = set(), [dev.initial()]
    res = Outcomes(set(), [], 0)
    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        assert len(seen) <= limit, "state space larger than the model's limit"
        nxt = dev.moves(st)
        if not nxt:
            if dev.done(st):
                res.wrong.add(st[3])
            else:
                res.deadlocks.append(dev.stuck(st))
            continue
        stack.extend(nxt)
    res.states = len(seen)
    return res


def sample(dev: Device, runs: int, seed: int) -> Outcomes:
    rng = random.Random(seed)
    res = Outcomes(set(), [], 0)
    for _ in range(runs):
        st = dev.initial()
        while True:
            nxt = dev.moves(st)
            if not nxt:
                break
            st = rng.choice(nxt)
            res.states += 1
        if dev.done(st):
            res.wrong.add(st[3])
        else:
            res.deadlocks.append(dev.stuck(st))
    return res


def model(log, direction, slabs, world=2, calls=2, faults=(), mem=None, sides=1, m_locs=None) -> Device:
    mem = mem or World(world)
    return Device(issue_calls(log, world, direction, calls, slabs, mem, sides, m_locs), world, mem, slabs, faults)


def every_peer_chunk(world, calls, slabs) -> frozenset:
    return frozenset((r, c, q, j) for r in range(world) for c in range(calls) for q in range(world) if q != r
                     for j in range(slabs))


# --------------------------------------------------------------------------------------------
# 1. as built


@pytest.mark.parametrize("slabs", [1, 2])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_ce_path_is_safe_in_every_interleaving(fake_cuda, direction, slabs):
    log, _ = fake_cuda
    got = explore(model(log, direction, slabs))
    assert got.deadlocks == [] and got.wrong == {frozenset()}, (got.deadlocks[:1], got.wrong)
    assert got.states > 1000  # the interleavings were really explored


@pytest.mark.parametrize("m_locs", [(1, 2), (2, 1)])
@pytest.mark.parametrize("slabs", [1, 2])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_auto_switching_paths_is_safe_in_every_interleaving(fake_cuda, direction, slabs, m_locs):
    """copy="auto": a call on the "sm" path (the copy kernel, the GEMM its PDL dependent) then one
    on "ce" (side-stream copies gated by the start), or the other way round: the same epoch,
    arrivals and flags, so every GEMM read sees its own call's rows in every interleaving."""
    log, _ = fake_cuda
    dev = model(log, direction, slabs, m_locs=m_locs)
    kinds = [op.kind for r, s, ops in dev.streams if r == 0 for op in ops]
    assert "sm_copy" in kinds and "copy" in kinds and "pdl" in kinds  # both paths really run
    got = explore(dev)
    assert got.deadlocks == [] and got.wrong == {frozenset()}, (got.deadlocks[:1], got.wrong)
    assert got.states > 1000


@pytest.mark.parametrize("slabs", [1, 2])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_sm_path_is_safe_in_every_interleaving(fake_cuda, direction, slabs):
    log, _ = fake_cuda
    got = explore(model(log, direction, slabs, m_locs=(1, 1)))
    assert got.deadlocks == [] and got.wrong == {frozenset()}, (got.deadlocks[:1], got.wrong)
    assert got.states > 100


@pytest.mark.parametrize("direction", ["push", "pull"])
def test_auto_switching_paths_is_safe_on_random_schedules_at_world_3(fake_cuda, direction):
    log, _ = fake_cuda
    got = sample(model(log, direction, 2, world=3, calls=4, m_locs=(1, 2, 2, 1)), runs=40, seed=39)
    assert got.deadlocks == [] and got.wrong == {frozenset()}, (got.deadlocks[:1], got.wrong)


def test_the_model_catches_a_copy_kernel_that_skips_the_arrival(fake_cuda, monkeypatch):
    """Without its wait for the peer's arrival, the copy kernel can overwrite rows the peer's
    GEMM of the previous call still reads: the model must see that."""
    log, _ = fake_cuda
    dev = model(log, "push", 1, m_locs=(1, 1))
    for i, (r, s, ops) in enumerate(dev.streams):
        for j, op in enumerate(ops):
            if op.kind == "sm_copy":
                dev.programs[i][j] = [st if st.__name__ != "arrived" else (lambda mem, regs, pcs: regs) for st in dev.programs[i][j]]
    got = explore(dev)
    assert any(got.wrong - {frozenset()}) and frozenset() in got.wrong


@pytest.mark.parametrize("direction,sides", [("push", 1), ("pull", 1), ("push", 2)])
def test_ce_path_is_safe_on_random_schedules_at_world_3(fake_cuda, direction, sides):
    """Three ranks, three calls, 2 slabs; with ce_streams=2 the peers' copies alternate side streams."""
    log, _ = fake_cuda
    dev = model(log, direction, 2, world=3, calls=3, sides=sides)
    assert len(dev.streams) == 3 * (1 + sides)
    got = sample(dev, runs=40, seed=38)
    assert got.deadlocks == [] and got.wrong == {frozenset()}, (got.deadlocks[:1], got.wrong)


def test_the_model_runs_what_the_code_issues(fake_cuda):
    """The streams the executor runs are the op's schedule(): per call the start and the GEMM on
    the main stream, and on the side stream a data copy then its flag per (slab, peer)."""
    log, _ = fake_cuda
    dev = model(log, "push", 2, calls=1)
    main = [op.kind for r, s, ops in dev.streams if r == 0 and s == MAIN for op in ops]
    side = [op.kind for r, s, ops in dev.streams if r == 0 and s != MAIN for op in ops]
    assert main == ["local", "record", "gemm", "wait"]
    assert side == ["wait", "copy", "flag", "copy", "flag", "record"]
    flag = next(op for r, s, ops in dev.streams if r == 0 and s != MAIN for op in ops if op.kind == "flag")
    sync = [dev.mem._made[(q, "sync")].ptr for q in range(2)]
    assert flag.args[:3] == (sync[1] + A.READY_OFFSET + 4 * A.ready_index(0, 0), sync[0] + A.EPOCH_OFFSET, 4)


# --------------------------------------------------------------------------------------------
# 2. ordering faults: caught, and none deterministic


@pytest.mark.parametrize("fault", FAULTS)
def test_each_ordering_fault_is_caught_and_is_a_race(fake_cuda, fault):
    log, _ = fake_cuda
    got = explore(model(log, "push", 1, faults=(fault,)))
    assert any(got.wrong - {frozenset()}) or got.deadlocks, f"{fault}: the model found nothing"
    # a race: some interleaving still reads every chunk right, so it cannot fail every call of
    # every check on both ranks the way 73ae221 did
    assert frozenset() in got.wrong, fault
    if fault == "no_join":  # the late flag copy carries the next epoch: only a later call reads early
        assert all(c > 0 for w in got.wrong for (_, c, _, _) in w)


# --------------------------------------------------------------------------------------------
# 3. the mapping: 73ae221's signature


GATH_BYTES = 2 * M_LOC * ROW  # AGGemm's gathered buffer in this model (max_m = 2 rows)


@pytest.mark.parametrize("slabs", [1, 2])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_block_base_mapping_gives_the_lost_chunk(fake_cuda, direction, slabs):
    """The gathered buffer behind another of its size in one block, the sync buffer at a block's
    start; peers map blocks at their base (before 5ce3f84): deterministic, every peer chunk of
    every call wrong on both ranks, the own rows right, no wait fails."""
    log, _ = fake_cuda
    mem = World(2, {"gathered": GATH_BYTES, "sync": 0}, mapping="block")
    got = explore(model(log, direction, slabs, mem=mem))
    assert got.deadlocks == [] and got.wrong == {every_peer_chunk(2, 2, slabs)}


def test_same_layout_mapped_at_the_buffer_is_right(fake_cuda):
    log, _ = fake_cuda
    mem = World(2, {"gathered": GATH_BYTES, "sync": 0}, mapping="buffer")
    got = explore(model(log, "push", 1, mem=mem))
    assert got.deadlocks == [] and got.wrong == {frozenset()}


def test_block_base_mapping_of_the_sync_buffer_hangs_instead(fake_cuda):
    """Had the sync buffer been the one inside a block, the arrivals and flags would land
    elsewhere and the gate would wait: a timeout, not 73ae221's silent wrong rows."""
    log, _ = fake_cuda
    mem = World(2, {"gathered": 0, "sync": 4096}, mapping="block")
    got = explore(model(log, "push", 1, calls=1, mem=mem))
    assert got.wrong == set() and got.deadlocks and all("local step 3" in " ".join(d) for d in got.deadlocks)
