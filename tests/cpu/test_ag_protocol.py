"""AllGather-GEMM's barrier-free push protocol (rawflux/ops/ag_gemm.py, fused/ag_gemm.cuh), checked on
an interleaving model like GEMM-RS's (tests/cpu/test_rs_protocol.py): W ranks, each making C calls,
every call cut into atomic steps, the steps of all ranks interleaved (exhaustively for tiny
configurations, by seeded random schedules for larger ones).

The protocol as built (PROTOCOL: call e of rank r, one gathered buffer):
  * arrive: r tells every peer it has started call e (so its GEMM of e - 1, the last reader of its
    buffer, has ended: in the model, "done with e - 1" announced at the next call's start);
  * local: the own shard into the own rows, then ready[r][r] = e (stream order in the kernels);
  * push, one agent per peer q (the copies): once q has arrived at call e, the shard into q's rows
    of chunk r, then ready[q][r] = e (released after the data);
  * GEMM: for each chunk c, own first, then in arrival order: wait ready[r][c] >= e, read it;
  * stream order: the next call starts once this call's steps and its pushes have ended.
The copy-engine path waits for every peer's arrival before any push (a stronger gate, same proof).
Other variants: two gathered slots by call parity need no gate at all (TWO_SLOTS: rank r reaches
call e only after its GEMM of e - 1 read every peer's chunk of e - 1, which each peer pushed after
ending its call e - 2, the last reader of that slot); a gate before the whole call (a one-call-late
barrier) is safe too.

Checked at every step: (a) no write to a slot or flag whose previous contents its owner has not
read yet; (b) every GEMM read sees data written in the reader's own call; (c) no deadlock: until
every call of every rank has ended, some step is enabled. Broken variants (one slot without a
gate, a gate two calls back, the flag before the data) show that the checker finds each kind of
violation.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Variant:
    name: str = "protocol"
    slots: int = 2  # gathered-buffer slots: slot = e % slots
    gate: bool = False  # a bounded wait for done >= e - gate_lag from the peer(s) before pushing
    gate_lag: int = 1
    gate_at: str = "call"  # "call": one gate on every peer before the call; "push": each push waits for its own peer
    arrive: bool = False  # "done with e - 1" announced at call e's start (the kernels), not after the reads
    flag_after_data: bool = True


PROTOCOL = Variant("one slot, each push after its peer's arrival", slots=1, gate=True, gate_lag=1, gate_at="push", arrive=True)
TWO_SLOTS = Variant("two slots by call parity, no gate")
ONE_SLOT = Variant("one slot", slots=1)
FLAG_FIRST = Variant("flag before data", slots=1, gate=True, gate_at="push", arrive=True, flag_after_data=False)
ONE_SLOT_GATED = Variant("one slot, gate on the previous call", slots=1, gate=True, gate_lag=1)  # a one-call-late barrier
ONE_SLOT_GATE_SHORT = Variant("one slot, gate two calls back", slots=1, gate=True, gate_lag=2)
ARRIVE_GATE_SHORT = Variant("one slot, each push two calls back", slots=1, gate=True, gate_lag=2, gate_at="push", arrive=True)
TWO_SLOTS_GATED = Variant("two slots and a gate", gate=True, gate_lag=2)


class Violation(AssertionError):
    def __init__(self, kind: str, what: str):
        self.kind = kind
        super().__init__(f"{kind}: {what}")


# Main agent program of one call on rank r (world W): gate, local (write, flag), then per chunk in
# order: wait, read; then (gated variants) done to each peer; then end (waits for the call's pushes).
def _main_steps(r: int, world: int, variant: Variant):
    steps = [("arrive", q) for q in range(world) if q != r] if variant.arrive else []
    steps += [("gate",), ("local_write",), ("local_flag",)]
    for s in range(world):
        c = (r + s) % world  # own chunk, then the order pushes arrive in
        steps += [("wait", c), ("read", c)]
    if variant.gate and not variant.arrive:
        steps += [("done", q) for q in range(world) if q != r]
    return steps + [("end",)]


def _push_steps(variant: Variant):
    return [("flag",), ("write",)] if not variant.flag_after_data else [("write",), ("flag",)]


class Model:
    """State: per rank its call, main pc, and push pcs per peer; memory: slot tag and ready value
    per (rank, slot, chunk), done[rank][src], and whether the owner still has to read a slot's
    contents (owed)."""

    def __init__(self, world: int, calls: int, variant: Variant = PROTOCOL):
        self.w, self.calls, self.v = world, calls, variant
        self.main = [_main_steps(r, world, variant) for r in range(world)]
        self.push = _push_steps(variant)

    def initial(self):
        w, s = self.w, self.v.slots
        ranks = tuple((1, 0, tuple(0 for _ in range(w))) for _ in range(w))  # (call e, main pc, push pc per peer)
        tag = tuple(0 for _ in range(w * s * w))  # which call's data a slot chunk holds
        ready = tuple(0 for _ in range(w * s * w))
        owed = tuple(0 for _ in range(w * s * w))
        done = tuple(0 for _ in range(w * w))
        return ranks, tag, ready, owed, done

    def _i(self, q, p, c):
        return (q * self.v.slots + p) * self.w + c

    def enabled(self, st):
        """(rank, kind, peer) of every step that can run now."""
        ranks, tag, ready, owed, done = st
        out = []
        for r, (e, pc, pushes) in enumerate(ranks):
            if e > self.calls:
                continue
            p = e % self.v.slots
            step = self.main[r][pc]
            kind = step[0]
            if kind == "gate":
                if not self.v.gate or self.v.gate_at == "push" or all(done[r * self.w + q] >= e - self.v.gate_lag for q in range(self.w) if q != r):
                    out.append((r, "main", -1))
            elif kind == "wait":
                if ready[self._i(r, p, step[1])] >= e:
                    out.append((r, "main", -1))
            elif kind == "end":
                if all(x == len(self.push) for q, x in enumerate(pushes) if q != r):
                    out.append((r, "main", -1))
            else:
                out.append((r, "main", -1))
            if pc > self.main[r].index(("gate",)):  # the pushes are issued after the gate
                for q in range(self.w):
                    if q == r or pushes[q] >= len(self.push):
                        continue
                    if pushes[q] == 0 and self.v.gate and self.v.gate_at == "push" and done[r * self.w + q] < e - self.v.gate_lag:
                        continue  # this push waits for its own peer
                    out.append((r, "push", q))
        return out

    def step(self, st, move):
        ranks, tag, ready, owed, done = st
        ranks, tag, ready, owed, done = list(ranks), list(tag), list(ready), list(owed), list(done)
        r, who, q = move
        e, pc, pushes = ranks[r]
        p = e % self.v.slots
        pushes = list(pushes)
        if who == "push":
            at = pushes[q]
            kind = self.push[at][0]
            i = self._i(q, p, r)
            if kind == "write":
                if owed[i]:
                    raise Violation("overwrite", f"rank {r} call {e} writes rank {q}'s slot {p} chunk {r} (call {tag[i]}'s data unread)")
                tag[i], owed[i] = e, 1
            else:
                ready[i] = e
            pushes[q] = at + 1
        else:
            step = self.main[r][pc]
            kind = step[0]
            if kind == "local_write":
                i = self._i(r, p, r)
                if owed[i]:
                    raise Violation("overwrite", f"rank {r} call {e} overwrites its own slot {p} (call {tag[i]}'s data unread)")
                tag[i], owed[i] = e, 1
            elif kind == "local_flag":
                ready[self._i(r, p, r)] = e
            elif kind == "read":
                i = self._i(r, p, step[1])
                if tag[i] != e:
                    raise Violation("stale read", f"rank {r} call {e} reads chunk {step[1]} of slot {p} holding call {tag[i]}'s data")
                owed[i] = 0
            elif kind == "done":
                done[step[1] * self.w + r] = e
            elif kind == "arrive":
                done[step[1] * self.w + r] = e - 1  # started call e: done with e - 1
            if kind == "end":
                e, pc, pushes = e + 1, 0, [0] * self.w
            else:
                pc += 1
        ranks[r] = (e, pc, tuple(pushes))
        return tuple(ranks), tuple(tag), tuple(ready), tuple(owed), tuple(done)

    def finished(self, st):
        return all(e > self.calls for e, _, _ in st[0])


def explore(model: Model, limit: int = 400_000) -> int:
    """Every interleaving (depth-first over distinct states); returns the states seen."""
    seen = set()
    stack = [model.initial()]
    while stack:
        st = stack.pop()
        if st in seen:
            continue
        seen.add(st)
        if len(seen) > limit:
            raise RuntimeError(f"more than {limit} states")
        moves = model.enabled(st)
        if not moves and not model.finished(st):
            raise Violation("deadlock", f"no step enabled at calls {[e for e, _, _ in st[0]]}")
        for mv in moves:
            stack.append(model.step(st, mv))
    return len(seen)


def random_runs(model: Model, runs: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(runs):
        st = model.initial()
        while not model.finished(st):
            moves = model.enabled(st)
            if not moves:
                raise Violation("deadlock", f"no step enabled at calls {[e for e, _, _ in st[0]]}")
            st = model.step(st, rng.choice(moves))


@pytest.mark.parametrize("world,calls", [(2, 5), (3, 3)])
def test_protocol_is_safe_in_every_interleaving(world, calls):
    assert explore(Model(world, calls), limit=2_000_000) > 1000


@pytest.mark.parametrize("world", [4, 8])
def test_protocol_is_safe_on_random_schedules(world):
    random_runs(Model(world, 6), runs=200, seed=world)


@pytest.mark.parametrize("variant", [TWO_SLOTS, ONE_SLOT_GATED, TWO_SLOTS_GATED])
def test_other_safe_variants(variant):
    explore(Model(2, 5, variant))


@pytest.mark.parametrize("variant,kind", [(ONE_SLOT, "overwrite"), (ONE_SLOT_GATE_SHORT, "overwrite"), (ARRIVE_GATE_SHORT, "overwrite"),
                                          (FLAG_FIRST, "stale read")])
def test_the_checker_finds_each_broken_variant(variant, kind):
    with pytest.raises(Violation) as e:
        explore(Model(2, 4, variant))
    assert e.value.kind == kind, str(e.value)
