"""The GEMM engine's dynamic tile order (RAWFLUX_DYN_SCHED, gemm/mainloop_sm90.cuh), on the CPU:

- its variants compile without spills or serialized wgmma, and the launch reserves the ticket ring;
- the hand-over protocol, as step machines interleaved at random: each cluster's leader producer
  draws tickets from one global counter and hands them to the peer CTA's producer (id_full) and,
  through a ring of kStages + 1 slots, to the consumers, who read a tile's ticket after the full
  barrier of its first stage. Every tile is taken exactly once, every reader sees the ticket that
  was meant for it (a slot is never rewritten early, a barrier never runs a phase ahead), and the
  last cluster out leaves the counters at zero.
"""
from __future__ import annotations

import random

import pytest

from rawflux import tune
from rawflux.check_kernels import _WGMMA_SERIALIZED
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops import gemm as g
from rawflux.runtime import DType

DYN = "RAWFLUX_DYN_SCHED=1"


def _dyn_tiles():
    return [t for t in tune.TILES if t.cluster_k == 1 and t.stream_k_ok]


@pytest.mark.parametrize("tag", ["128x256x64s4c2x1w2", "128x192x64s5c2x1w2", "64x128x64s8c1w2"])
def test_dyn_variants_compile_clean(tag, monkeypatch):
    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", DYN)
    t = tune.parse_tag(tag + "/k1/g8m/p0").tile
    name = g.kernel_name(t, DType.BF16, DType.BF16, "nk", sched=g.PLAIN_SCHED, epilogue=g.plain_epilogue(DType.BF16))
    r = compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(name,), filename="gemm.cu")
    res = r.resources[r.lowered[name]]
    assert res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, res
    assert _WGMMA_SERIALIZED not in r.log


def test_dyn_smem_holds_the_ticket_ring(monkeypatch):
    def ring_end(t):  # bytes past the stage ring: full, empty, the k-split pair, id_full, ids
        return 16 * t.stages + 16 + 8 * (t.stages + 1) + 4 * (t.stages + 1)

    monkeypatch.setenv("RAWFLUX_NVRTC_DEFINES", DYN)
    for t in _dyn_tiles():
        ring = t.stages * (t.bm + t.bn) * tune.BK * 2
        for out in (DType.BF16, DType.F32):
            for epi in (g.plain_epilogue(out), "rawflux::LocalStore"):
                smem = g.launch_smem_bytes(t, epi, out)
                assert smem <= tune.SMEM_PER_CTA, (t.tag(), epi)
                # 1024 of alignment slack, the ring, then the barriers and tickets (before any scratch)
                assert smem >= 1024 + ring + ring_end(t), (t.tag(), epi, smem)
                assert ring_end(t) <= 1024  # inside kScratchOffset's 1024 bytes when there is scratch
    monkeypatch.delenv("RAWFLUX_NVRTC_DEFINES")
    for t in _dyn_tiles():  # off: what it always was
        assert g.launch_smem_bytes(t, "rawflux::LocalStore", DType.F32) == t.smem_bytes


# ------------------------------------------------------------------------------------------------
# the protocol, step machines


class Bar:
    """An mbarrier: `count` arrivals and a zero transaction count complete a phase."""

    def __init__(self, count):
        self.count, self.arrived, self.tx, self.phases = count, 0, 0, 0

    def arrive(self, expect=0):
        self.arrived += 1
        self.tx += expect
        self._check()

    def complete_tx(self, n):
        self.tx -= n
        self._check()

    def _check(self):
        if self.arrived == self.count and self.tx == 0:
            self.phases += 1
            self.arrived = 0


def _run(seed, clusters, csize, stages, kb, units, slots_short=False):
    rng = random.Random(seed)
    slots = stages if slots_short else stages + 1  # kIdSlots (the kernel's: kStages + 1)
    counters = [0, 0]
    full = [[Bar(1) for _ in range(stages)] for _ in range(clusters * csize)]
    empty = [[Bar(csize) for _ in range(stages)] for _ in range(clusters * csize)]  # one consumer per CTA here
    id_full = [[Bar(1) for _ in range(slots)] for _ in range(clusters * csize)]
    ids = [[None] * slots for _ in range(clusters * csize)]
    uses = [[0] * stages for _ in range(clusters * csize)]  # consumer releases of each stage, per CTA
    drawn = {c: [] for c in range(clusters)}  # the leader's tickets, in order: what every reader must see
    done_tiles = []

    def cta(c, r):
        return c * csize + r

    def producer(c, r):
        me, stage, phase_use, tickets = cta(c, r), 0, [0] * stages, 0
        while True:
            slot = tickets % slots
            if r == 0:
                u = c if tickets == 0 else clusters + counters[0]
                if tickets:
                    counters[0] += 1
                drawn[c].append(u)
                for q in range(1, csize):
                    ids[cta(c, q)][slot] = u
                    id_full[cta(c, q)][slot].arrive()
                    yield
                ids[me][slot] = u
            else:
                while id_full[me][slot].phases <= tickets // slots:
                    yield
                # the parity wait would be fooled by a barrier two phases ahead: never happens
                assert id_full[me][slot].phases == tickets // slots + 1
                u = ids[me][slot]
                assert u == drawn[c][tickets]
            tickets += 1
            yield
            end = u >= units
            for k in range(1 if end else kb):
                while empty[me][stage].phases < phase_use[stage]:  # the previous use of the stage released
                    yield
                if end:
                    full[me][stage].arrive()  # no data: the end ticket's stage
                else:
                    full[me][stage].arrive(expect=1 + csize)  # own A + every CTA's B slice
                    yield
                    full[me][stage].complete_tx(1)  # A
                    for q in range(csize):  # this CTA's B slice, multicast: the target's stage must be free
                        tgt = cta(c, q)
                        assert uses[tgt][stage] >= phase_use[stage], "multicast into a stage still in use"
                        full[tgt][stage].complete_tx(1)
                        yield
                phase_use[stage] += 1
                stage = (stage + 1) % stages
                yield
            if end:
                break
        if r == 0:
            counters[1] += 1
            if counters[1] == clusters:
                counters[0] = counters[1] = 0

    def consumer(c, r):
        me, stage, phase_use, tickets = cta(c, r), 0, [0] * stages, 0
        while True:
            while full[me][stage].phases <= phase_use[stage]:
                yield
            assert full[me][stage].phases == phase_use[stage] + 1
            u = ids[me][tickets % slots]
            assert u == drawn[c][tickets], "a ticket slot was rewritten before its reader read it"
            tickets += 1
            if u >= units:
                return
            if r == 0:
                done_tiles.append(u)
            for k in range(kb):
                while full[me][stage].phases <= phase_use[stage]:
                    yield
                yield  # the wgmma read the stage
                for q in range(csize):  # release to the producer of every CTA that wrote into it
                    empty[cta(c, q)][stage].arrive()
                uses[me][stage] += 1
                phase_use[stage] += 1
                stage = (stage + 1) % stages
                yield

    agents = [producer(c, r) for c in range(clusters) for r in range(csize)]
    agents += [consumer(c, r) for c in range(clusters) for r in range(csize)]
    live = list(agents)
    steps = 0
    while live:
        a = rng.choice(live)
        try:
            next(a)
        except StopIteration:
            live.remove(a)
        steps += 1
        assert steps < 200_000, "no progress"
    assert sorted(done_tiles) == list(range(units))
    assert counters == [0, 0]


@pytest.mark.parametrize("seed", range(300))
def test_ticket_protocol_random_interleavings(seed):
    rng = random.Random(seed)
    _run(seed, clusters=rng.randint(1, 3), csize=rng.choice([1, 2]), stages=rng.randint(2, 5), kb=rng.randint(1, 4),
         units=rng.randint(0, 14))


def test_ticket_ring_one_slot_short_is_caught():
    """The model is strict enough to see a ring of kStages slots fail (the kernel's kIdSlots is
    kStages + 1): with one k block per tile the leader runs furthest ahead, and some interleaving
    rewrites a slot before its reader read it, or runs the peer's barrier a phase ahead."""
    failures = 0
    for seed in range(300):
        rng = random.Random(seed)
        try:
            _run(seed, clusters=rng.randint(1, 2), csize=2, stages=rng.randint(2, 4), kb=1, units=rng.randint(6, 14),
                 slots_short=True)
        except AssertionError:
            failures += 1
    assert failures > 0
