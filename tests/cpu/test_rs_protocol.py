"""Slot safety of GEMM-ReduceScatter's one-kernel protocol (cuda_src/rawflux/fused/rs_epilogue.cuh,
rs_layout.cuh), checked on an interleaving model: W ranks, each making C calls, every call's
kernel cut into atomic steps, the steps of all ranks interleaved (exhaustively for tiny
configurations, by seeded random schedules for larger ones).

The model of one call (epoch e = the rank's counter + 1, parity p = e & 1):
  * side role, one agent per (CTA g, peer q) (the lanes of warp 1): read the epoch; CTA 0 writes
    this rank's call record into q's records[p][rank] (the words, then the tag = e: release);
    then, for each own tile of the CTA in its order: the first time, wait for q's record tag
    >= e and read its words; then wait for q's flag(p, q, tile, c) >= e for every consumer c,
    which passes the tile (the lanes join: the CTA's "ready" count is the slowest lane's);
  * consumers, one agent per (CTA g, consumer warpgroup c): read the epoch; walk the CTA's
    positions (rs_order: u = g, g + G, ...; G clusters, own_delay = G): a remote tile writes
    its rows into the owner's slot (p, rank) and owes the flag, raised at the start of the
    next tile's epilogue or at the end; an own tile waits for the ready count, then reads the
    W - 1 peers' slots (p, q) in order; at the end the last consumer of the kernel advances
    the counter to e (finish: a consumer barrier, an acq_rel count over the CTAs);
  * stream order: the next call's agents start once every agent of this call ended.

Checked at every step: (a) no write to a slot, record or flag while its owner still has a read
of the contents written by an earlier call left to do (each location counts the reads it is
owed); (b) every read (record tag and words, flag, slot) sees the value written in the
reader's own call, and every role reads its call's epoch; (c) no deadlock: until every call
of every rank ended, some step is enabled. Broken variants (one parity, the flag before the
data, a wrong wait bound, the side role's epoch read unordered with the advance) show that the
checker finds each kind of violation.

Model assumption (``side_epoch_ordered``): every side lane reads the epoch before the call's
last consumer advances it. The kernel's finish() orders only the consumers' reads (its barrier
and count cover consumer threads); CTA 0's side warp reads the epoch at its start, and nothing
makes the last CTA's advance wait for that read when CTA 0 has no own tile (the consumers wait
for the side role only on own tiles). test_side_epoch_read_must_precede_the_advance shows
what the model then finds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from rawflux.tune.rs_order import rs_position

# step codes
EPOCH, REC_WORDS, REC_TAG, WAIT_TAG, READ_WORDS, WAIT_FLAG, WRITE_SLOT, RELEASE, WAIT_READY, READ_SLOT, FINISH = range(11)
_NAMES = ("epoch", "rec_words", "rec_tag", "wait_tag", "read_words", "wait_flag", "write_slot", "release", "wait_ready",
          "read_slot", "finish")


@dataclass(frozen=True)
class Variant:
    name: str = "protocol"
    double_buffered: bool = True  # parity = e & 1; False: every call uses parity 0 (single-buffered)
    flag_after_data: bool = True  # False: a remote tile's flag is raised before its slot is written
    wait_ahead: int = 0  # own tiles wait for flag >= e + wait_ahead (1: a wrong bound)
    side_epoch_ordered: bool = True  # the last consumer's advance comes after every side lane's epoch read

    def parity(self, e: int) -> int:
        return e & 1 if self.double_buffered else 0


PROTOCOL = Variant()
SINGLE_BUFFERED = Variant("single-buffered", double_buffered=False)
FLAG_FIRST = Variant("flag before data", flag_after_data=False)
WAIT_AHEAD = Variant("waits for the next epoch", wait_ahead=1)
SIDE_UNORDERED = Variant("side epoch read unordered", side_epoch_ordered=False)


class Violation(AssertionError):
    def __init__(self, kind: str, what: str, trace=()):
        self.kind, self.what, self.trace = kind, what, list(trace)
        tail = "\n  ".join(self.trace[-24:])
        super().__init__(f"{kind}: {what}" + (f"\n last steps:\n  {tail}" if tail else ""))


class Model:
    """State: a flat tuple (call and counter per rank; pc and epoch per agent; memory values and
    the reads each location is still owed). Transitions: (agent index) -> its next step."""

    def __init__(self, world: int, calls: int, per_owner: int, ctas: int, consumers: int, variant: Variant = PROTOCOL):
        assert world >= 2 and 1 <= ctas <= world * per_owner
        self.W, self.C, self.T, self.G, self.K, self.v = world, calls, per_owner, ctas, consumers, variant
        W, T, G, K = world, per_owner, ctas, consumers
        self.U = T * K  # flags / slot regions per (owner, parity, source): (tile, consumer)
        # memory: tag, words per (owner, parity, source); flag, slot per (owner, parity, source, unit)
        self.n_rec = W * 2 * W
        self.n_unit = W * 2 * W * self.U
        self.TAG, self.WORDS = 0, self.n_rec
        self.FLAG, self.SLOT = 2 * self.n_rec, 2 * self.n_rec + self.n_unit
        self.n_mem = 2 * self.n_rec + 2 * self.n_unit
        # each rank's CTA lists: positions u = g, g + G, ... of rs_order with own_delay = G
        self.lists = [[[rs_position(u, r, W, T, G) for u in range(g, W * T, G)] for g in range(G)] for r in range(W)]
        self.progs, self.kinds, self.pass_pc = [], [], []  # per rank: agent programs; "lane" / "cons"; lanes' pc per passed tile
        readers = []
        for r in range(W):
            progs, kinds, pass_pc = [], [], []
            checkers = 0
            for g in range(G):
                own = [j for o, j in self.lists[r][g] if o == r]
                checkers += bool(own)
                for q in range(W):
                    if q == r:
                        continue
                    p = [(EPOCH,)]
                    if g == 0:
                        p += [(REC_WORDS, q), (REC_TAG, q)]
                    passed = []
                    for k, j in enumerate(own):
                        if k == 0:
                            p += [(WAIT_TAG, q), (READ_WORDS, q)]
                        p += [(WAIT_FLAG, q, j * K + c) for c in range(K)]
                        passed.append(len(p))
                    progs.append(p)
                    kinds.append(("lane", g))
                    pass_pc.append(passed)
            for g in range(G):
                for c in range(K):
                    p = [(EPOCH,)]
                    owed = None
                    k = 0
                    for o, j in self.lists[r][g]:
                        if owed is not None:
                            p.append((RELEASE,) + owed)
                            owed = None
                        if o != r:
                            if variant.flag_after_data:
                                p.append((WRITE_SLOT, o, j * K + c))
                                owed = (o, j * K + c)
                            else:
                                p += [(RELEASE, o, j * K + c), (WRITE_SLOT, o, j * K + c)]
                        else:
                            k += 1
                            p.append((WAIT_READY, g, k))
                            p += [(READ_SLOT, q, j * K + c) for q in range(W) if q != r]
                    if owed is not None:
                        p.append((RELEASE,) + owed)
                    p.append((FINISH,))
                    progs.append(p)
                    kinds.append(("cons", g))
                    pass_pc.append(None)
            self.progs.append(progs)
            self.kinds.append(kinds)
            self.pass_pc.append(pass_pc)
            readers.append(checkers)
        # the reads each write leaves owed: a record is checked by every CTA of its owner with an
        # own tile; a flag by one side lane, a slot by one consumer
        self.readers = [0] * self.n_mem
        for o in range(W):
            for i in range(2 * W):
                self.readers[self.TAG + o * 2 * W + i] = self.readers[self.WORDS + o * 2 * W + i] = readers[o]
            for i in range(2 * W * self.U):
                self.readers[self.FLAG + o * 2 * W * self.U + i] = self.readers[self.SLOT + o * 2 * W * self.U + i] = 1
        # state layout
        self.agent_base = []
        pos = 2 * W
        for r in range(W):
            self.agent_base.append(pos)
            pos += 2 * len(self.progs[r])
        self.mem_base = pos
        self.pend_base = pos + self.n_mem
        self.size = self.pend_base + self.n_mem
        self.agents = [(r, a) for r in range(W) for a in range(len(self.progs[r]))]
        self.lanes_of = [[a for a, kd in enumerate(self.kinds[r]) if kd[0] == "lane"] for r in range(W)]
        self.lanes_in = [[[a for a, kd in enumerate(self.kinds[r]) if kd == ("lane", g)] for g in range(G)] for r in range(W)]
        self.cons_of = [[a for a, kd in enumerate(self.kinds[r]) if kd[0] == "cons"] for r in range(W)]
        self._compile()

    # --- locations ------------------------------------------------------------------------------
    def rec(self, base: int, owner: int, parity: int, src: int) -> int:
        return base + (owner * 2 + parity) * self.W + src

    def unit(self, base: int, owner: int, parity: int, src: int, u: int) -> int:
        return base + ((owner * 2 + parity) * self.W + src) * self.U + u

    def initial(self) -> tuple:
        s = [0] * self.size
        for r in range(self.W):
            s[r] = 1  # call 1 running
        return tuple(s)

    def done(self, s) -> bool:
        return all(s[r] > self.C for r in range(self.W))

    # --- transitions ----------------------------------------------------------------------------
    def _compile(self) -> None:
        """Per agent: its rank, the state index of its pc, and its steps with every location
        resolved to a state index for both parities: (op, parity 0's, parity 1's, extra)."""
        W, m = self.W, self.mem_base
        self.fast = []
        for r, a in self.agents:
            b = self.agent_base[r] + 2 * a
            steps = []
            for st in self.progs[r][a]:
                op = st[0]
                loc = (None, None)
                extra = None
                if op in (REC_WORDS, REC_TAG):  # this rank's record on peer st[1]
                    base = self.WORDS if op == REC_WORDS else self.TAG
                    loc = tuple(m + self.rec(base, st[1], p, r) for p in (0, 1))
                elif op in (WAIT_TAG, READ_WORDS):  # peer st[1]'s record here
                    base = self.TAG if op == WAIT_TAG else self.WORDS
                    loc = tuple(m + self.rec(base, r, p, st[1]) for p in (0, 1))
                elif op == WAIT_FLAG:
                    loc = tuple(m + self.unit(self.FLAG, r, p, st[1], st[2]) for p in (0, 1))
                elif op == READ_SLOT:
                    loc = tuple(m + self.unit(self.SLOT, r, p, st[1], st[2]) for p in (0, 1))
                elif op == WRITE_SLOT:
                    loc = tuple(m + self.unit(self.SLOT, st[1], p, r, st[2]) for p in (0, 1))
                elif op == RELEASE:
                    loc = tuple(m + self.unit(self.FLAG, st[1], p, r, st[2]) for p in (0, 1))
                elif op == WAIT_READY:
                    base = self.agent_base[r]
                    extra = tuple((base + 2 * l, self.pass_pc[r][l][st[2] - 1]) for l in self.lanes_in[r][st[1]])
                elif op == FINISH:
                    base = self.agent_base[r]
                    extra = (tuple(base + 2 * l for l in self.lanes_of[r]),
                             tuple((base + 2 * c, len(self.progs[r][c])) for c in self.cons_of[r] if c != a))
                if not self.v.double_buffered:
                    loc = (loc[0], loc[0])
                steps.append((op, loc[0], loc[1], extra))
            self.fast.append((r, b, steps))
        self.ends = [tuple((self.agent_base[r] + 2 * x, len(p)) for x, p in enumerate(self.progs[r])) for r in range(W)]

    def enabled(self, s, i: int) -> bool:
        r, b, steps = self.fast[i]
        pc = s[b]
        if pc >= len(steps) or s[r] > self.C:
            return False
        op, l0, l1, extra = steps[pc]
        if op == WAIT_FLAG or op == WAIT_TAG:
            e = s[b + 1]
            return s[l1 if e & 1 else l0] >= e + (self.v.wait_ahead if op == WAIT_FLAG else 0)
        if op == WAIT_READY:
            for x, need in extra:
                if s[x] < need:
                    return False
            return True
        if op == FINISH and self.v.side_epoch_ordered:
            for x in extra[0]:
                if s[x] < 1:
                    return False
        return True

    def describe(self, i: int, s) -> str:
        return self.describe_at(i, *self.where(i, s))

    def where(self, i: int, s) -> tuple[int, int, int]:
        """(call, pc, epoch) of agent i in state s."""
        r, b, _ = self.fast[i]
        return s[r], s[b], s[b + 1]

    def describe_at(self, i: int, call: int, pc: int, e: int) -> str:
        r, a = self.agents[i]
        st = self.progs[r][a][pc]
        kind, g = self.kinds[r][a]
        return f"rank {r} call {call} {kind}{g}.{a} {_NAMES[st[0]]}{st[1:]} e={e}"

    def _fail(self, kind: str, i: int, s, what: str):
        r, a = self.agents[i]
        st = self.progs[r][a][s[self.agent_base[r] + 2 * a]]
        raise Violation(kind, f"rank {r} call {s[r]}: {self.kinds[r][a][0]} {_NAMES[st[0]]}{st[1:]}: {what}")

    def step(self, s: list, i: int) -> None:
        """Agent i's next step, in place; raises Violation."""
        r, b, steps = self.fast[i]
        op, l0, l1, extra = steps[s[b]]
        e = s[b + 1]
        loc = l1 if e & 1 else l0
        if op == EPOCH:
            e = s[self.W + r] + 1
            s[b + 1] = e
            if e != s[r]:
                self._fail("epoch", i, s, f"reads epoch {e}")
        elif op in (REC_WORDS, REC_TAG, WRITE_SLOT, RELEASE):  # a write: (a)
            owed = s[loc + self.n_mem]
            if owed:
                self._fail("overwrite", i, s, f"writes {e} over {s[loc]} while its owner still owes {owed} read(s) of it")
            s[loc] = e
            s[loc + self.n_mem] = self.readers[loc - self.mem_base]
        elif op in (WAIT_TAG, READ_WORDS, WAIT_FLAG, READ_SLOT):  # a read: (b)
            if s[loc] != e:
                self._fail("stale", i, s, f"epoch {e} reads {s[loc]}")
            s[loc + self.n_mem] -= 1
        elif op == FINISH:
            if all(s[x] == n for x, n in extra[1]):
                s[self.W + r] = e  # the last consumer of the kernel advances the counter
        s[b] += 1
        # the kernel ends once every agent ended (the advance happened: the consumers ended)
        ends = self.ends[r]
        for x, n in ends:
            if s[x] != n:
                return
        assert s[self.W + r] == s[r]
        s[r] += 1
        for x, _ in ends:
            s[x] = s[x + 1] = 0

    def successors(self, s):
        return [i for i in range(len(self.agents)) if self.enabled(s, i)]


def explore(model: Model, limit: int = 400_000) -> dict:
    """Every reachable state (depth first, visited set); raises Violation with the path to it."""
    start = model.initial()
    seen = {start}
    stack = [(start, iter(model.successors(start)))]
    path: list[str] = []
    finals = max_lag = 0
    W = model.W
    while stack:
        s, it = stack[-1]
        i = next(it, None)
        if i is None:
            stack.pop()
            if path:
                path.pop()
            continue
        t = list(s)
        try:
            model.step(t, i)
        except Violation as v:
            raise Violation(v.kind, v.what, path + [model.describe(i, s)]) from None
        t = tuple(t)
        if t in seen:
            continue
        seen.add(t)
        if len(seen) > limit:
            raise RuntimeError(f"more than {limit} states: use random schedules for this configuration")
        calls = [min(t[r], model.C) for r in range(W)]
        max_lag = max(max_lag, max(calls) - min(calls))
        succ = model.successors(t)
        path.append(model.describe(i, s))
        if not succ:
            if not model.done(t):
                raise Violation("deadlock", f"no step enabled; calls {[t[r] for r in range(W)]}", path)
            finals += 1
        stack.append((t, iter(succ)))
    return {"states": len(seen), "finals": finals, "max_lag": max_lag}


def run_random(model: Model, rng: random.Random) -> tuple[int, int]:
    """One schedule: PCT-like priorities (a random priority per rank, then per agent, reshuffled
    at random points), or uniformly random steps. Returns (steps, the largest gap between two
    ranks' calls); raises Violation with the last steps."""
    s = list(model.initial())
    n, W = len(model.agents), model.W
    trace: list[tuple] = []

    def shuffle():
        rank_prio = [rng.random() for _ in range(W)]
        return sorted(range(n), key=lambda i: -(rank_prio[model.agents[i][0]] * 4 + rng.random()))

    order = shuffle()
    steps = lag = 0
    change = rng.randrange(1, 200)
    uniform = rng.random() < 0.3
    enabled = model.enabled
    while not model.done(s):
        if uniform:
            cand = model.successors(s)
            i = rng.choice(cand) if cand else None
        else:
            i = next((x for x in order if enabled(s, x)), None)
        if i is None:
            raise Violation("deadlock", f"no step enabled; calls {s[:W]}", [model.describe_at(*t) for t in trace])
        trace.append((i,) + model.where(i, s))
        if len(trace) > 48:
            del trace[:24]
        try:
            model.step(s, i)
        except Violation as v:
            raise Violation(v.kind, v.what, [model.describe_at(*t) for t in trace]) from None
        steps += 1
        if steps == change:
            order = shuffle()
            change += rng.randrange(1, 200)
            calls = [min(c, model.C) for c in s[:W]]
            lag = max(lag, max(calls) - min(calls))
    return steps, lag


def random_schedules(model: Model, count: int, seed: int) -> dict:
    rng = random.Random(seed)
    steps = lag = 0
    for _ in range(count):
        n, g = run_random(model, rng)
        steps, lag = steps + n, max(lag, g)
    return {"steps": steps, "max_lag": lag}


# --------------------------------------------------------------------------------------------
# the protocol holds

TINY = [  # (W, C, tiles per owner, CTAs, consumers): exhaustive
    (2, 4, 1, 1, 1),
    (2, 5, 1, 1, 1),
    (2, 4, 2, 1, 1),
    (2, 4, 1, 2, 1),
    (2, 4, 1, 1, 2),
]


@pytest.mark.parametrize("cfg", TINY, ids=lambda c: "W{}C{}T{}G{}K{}".format(*c))
def test_exhaustive_tiny(cfg):
    res = explore(Model(*cfg))
    assert res["finals"] >= 1  # some interleaving ends every call of every rank
    assert res["max_lag"] == 1  # a rank runs a call ahead of a peer still in the previous one: parity matters


BIGGER = [  # (W, C, tiles per owner, CTAs, consumers, schedules)
    (2, 5, 3, 2, 2, 400),
    (3, 4, 1, 1, 1, 1500),
    (3, 5, 2, 2, 1, 300),
    (3, 4, 2, 3, 2, 150),
    (4, 4, 1, 1, 1, 400),
    (4, 5, 1, 2, 1, 150),
    (4, 4, 2, 4, 1, 60),
]


@pytest.mark.parametrize("cfg", BIGGER, ids=lambda c: "W{}C{}T{}G{}K{}".format(*c[:5]))
def test_random_schedules(cfg):
    *shape, count = cfg
    model = Model(*shape)
    res = random_schedules(model, count, seed=sum(x * 31 ** i for i, x in enumerate(shape)))
    assert res["max_lag"] == 1  # the schedules do run a rank a call ahead of a peer


# --------------------------------------------------------------------------------------------
# the checker finds broken protocols


def _finds(model: Model, *, exhaustive: bool, count: int = 2000, seed: int = 1) -> Violation:
    with pytest.raises(Violation) as info:
        if exhaustive:
            explore(model)
        else:
            random_schedules(model, count, seed)
    return info.value


@pytest.mark.parametrize("cfg", [(2, 4, 1, 1, 1), (2, 4, 1, 1, 2)])
def test_single_buffered_slots_are_caught_exhaustively(cfg):
    v = _finds(Model(*cfg, SINGLE_BUFFERED), exhaustive=True)
    assert v.kind in ("overwrite", "stale"), v


@pytest.mark.parametrize("cfg", [(3, 4, 1, 1, 1), (4, 4, 1, 2, 1), (3, 5, 2, 2, 1)])
def test_single_buffered_slots_are_caught_by_random_schedules(cfg):
    v = _finds(Model(*cfg, SINGLE_BUFFERED), exhaustive=False, count=500)
    assert v.kind in ("overwrite", "stale"), v


def test_flag_before_data_is_caught():
    v = _finds(Model(2, 4, 1, 1, 1, FLAG_FIRST), exhaustive=True)
    assert v.kind == "stale" and "slot" in v.what, v
    v = _finds(Model(3, 4, 1, 1, 1, FLAG_FIRST), exhaustive=False, count=500)
    assert v.kind == "stale", v


def test_wrong_wait_bound_deadlocks():
    v = _finds(Model(2, 4, 1, 1, 1, WAIT_AHEAD), exhaustive=True)
    assert v.kind == "deadlock", v
    v = _finds(Model(3, 4, 1, 1, 1, WAIT_AHEAD), exhaustive=False, count=5)
    assert v.kind == "deadlock", v


def test_side_epoch_read_must_precede_the_advance():
    """Without the model's assumption: CTA 0 (the record pusher) has no own tile here (W=2, one
    tile per owner, 2 CTAs: CTA 0 gets the remote tile, CTA 1 the own one), its side warp
    reads the epoch late, after the last consumer advanced it, and pushes the record of the
    next epoch (its peer then waits until the timeout)."""
    model = Model(2, 4, 1, 2, 1, SIDE_UNORDERED)
    assert not any(o == r for r in range(2) for o, _ in model.lists[r][0])
    v = _finds(model, exhaustive=True)
    assert v.kind == "epoch", v
    # with one CTA the consumers wait for the side role's record check: nothing to find
    explore(Model(2, 4, 1, 1, 1, SIDE_UNORDERED))


def test_model_matches_the_kernel_order():
    """The CTA lists are rs_order's positions u = g, g + G, ...: every tile of every owner once per rank."""
    m = Model(3, 1, 2, 2, 1)
    for r in range(3):
        got = sorted(t for lst in m.lists[r] for t in lst)
        assert got == sorted((o, j) for o in range(3) for j in range(2))
