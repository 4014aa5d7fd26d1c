"""The MPI side of group formation, with no CUDA: node layout, device choice, agreement checks.

Everything here takes an mpi4py communicator (or plain values) and nothing else, so the CPU tests
(tests/mpi/test_dist_cpu.py under mpirun) cover it on a machine with no GPU.
"""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from .layout import MAX_WORLD


class DistError(RuntimeError):
    """A group cannot be formed or used as asked (topology, devices, mismatched calls)."""


class CollectiveTimeout(DistError):
    """A wait gave up: a peer did not arrive in time, or the group was aborted. ``.record`` holds
    the decoded Status of a device-side wait (op, call_id, peer, late_ranks, ...), else None."""

    def __init__(self, message: str, record=None):
        super().__init__(message)
        self.record = record


@dataclass(frozen=True)
class Topology:
    rank: int
    world: int
    local_rank: int  # rank among this communicator's processes on this node
    local_world: int
    hostname: str


def node_split(comm):
    """The default node split: processes that can share memory (MPI.COMM_TYPE_SHARED)."""
    from mpi4py import MPI

    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def form(comm, *, split=node_split) -> Topology:
    """Rank, world and node-local rank of this process in ``comm``; raises DistError (on every
    rank alike) when the group spans more than one node or exceeds MAX_WORLD ranks.
    Collective over ``comm``."""
    rank, world = comm.Get_rank(), comm.Get_size()
    node = split(comm)
    try:
        local_rank, local_world = node.Get_rank(), node.Get_size()
    finally:
        node.Free()
    host = socket.gethostname()
    # Every rank sees every rank's node size, so all raise the same error or none does.
    layout = comm.allgather((local_world, host))
    if any(lw != world for lw, _ in layout):
        hosts: dict[str, list[int]] = {}
        for q, (_, h) in enumerate(layout):
            hosts.setdefault(h, []).append(q)
        raise DistError(
            f"the tensor-parallel group has {world} ranks but only {local_world} of them share a node "
            f"with rank {rank} (hosts: {hosts}); rawflux maps peers' memory with CUDA IPC, so a TP group "
            f"must lie within one node. Build it from a node-local communicator, e.g. "
            f"MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)"
        )
    if world > MAX_WORLD:
        raise DistError(f"a group of {world} ranks exceeds rawflux's limit of {MAX_WORLD} ranks per node")
    return Topology(rank, world, local_rank, local_world, host)


@dataclass(frozen=True)
class TPSplit:
    """A job's ranks in tensor-parallel groups within nodes and data-parallel groups across them.
    Ranks are the communicator's; tp_groups / dp_groups list every group (the same on every rank,
    for torch.distributed.new_group, which every rank must call for every group)."""

    tp_comm: object  # this rank's TP group, ranked by TP rank: rawflux.init(tp_comm)
    dp_comm: object  # the ranks with this rank's TP rank, one per TP group, in rank order
    rank: int  # in the communicator split
    tp_rank: int
    tp_groups: tuple[tuple[int, ...], ...]  # each in TP rank order
    dp_groups: tuple[tuple[int, ...], ...]  # dp_groups[t]: the ranks of TP rank t

    @property
    def tp_ranks(self) -> tuple[int, ...]:
        return next(g for g in self.tp_groups if self.rank in g)

    @property
    def dp_ranks(self) -> tuple[int, ...]:
        return self.dp_groups[self.tp_rank]


def tp_split(comm, tp: int, *, split=node_split) -> TPSplit:
    """Collective over ``comm``: TP groups of ``tp`` ranks, each within one node (consecutive
    node-local ranks), and DP groups of the ranks that hold the same TP rank. Raises DistError on
    every rank alike when a node's rank count is not a multiple of tp (a TP group would span two
    hosts) or tp is out of range."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if not isinstance(tp, int) or isinstance(tp, bool) or not 1 <= tp <= min(size, MAX_WORLD) or size % tp:
        raise DistError(f"tp_split: tp = {tp!r} must be a whole divisor of the job's {size} ranks, at most {MAX_WORLD} (one node's GPUs)")
    node = split(comm)
    try:
        local_rank, members = node.Get_rank(), node.allgather(rank)
    finally:
        node.Free()
    layout = comm.allgather((len(members), socket.gethostname()))
    odd = sorted({(h, n) for n, h in layout if n % tp})
    if odd:
        raise DistError(
            f"tp_split: a TP group of {tp} ranks would span two hosts: "
            + ", ".join(f"{h} runs {n} of the job's ranks" for h, n in odd)
            + f", not a multiple of {tp}. rawflux maps peers' memory with CUDA IPC, so a TP group lies within one node: "
            "launch a multiple of tp ranks per node, or use a smaller tp"
        )
    first = local_rank - local_rank % tp
    mine = tuple(members[first:first + tp])
    tp_rank = local_rank % tp
    tp_comm = comm.Split(mine[0], key=tp_rank)
    dp_comm = comm.Split(tp_rank, key=rank)
    groups = comm.allgather(mine)
    tp_groups = tuple(sorted(set(groups)))
    dp_groups = tuple(tuple(sorted(g[i] for g in tp_groups)) for i in range(tp))
    return TPSplit(tp_comm, dp_comm, rank, tp_rank, tp_groups, dp_groups)


def choose_device(binding_rank: int, visible: int, forced: int | None = None) -> int:
    """The CUDA ordinal this process uses: ``forced`` (RAWFLUX_DEVICE / init(device=)) if given,
    else binding_rank % visible. Several ranks on one device is allowed (the emulated node)."""
    if visible <= 0:
        raise DistError(
            "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES and the driver)"
        )
    if forced is not None:
        if not 0 <= forced < visible:
            raise DistError(
                f"device {forced} was requested (RAWFLUX_DEVICE or init(device=)) but only {visible} "
                f"device(s) are visible (ordinals 0..{visible - 1}, as numbered under CUDA_VISIBLE_DEVICES)"
            )
        return forced
    return binding_rank % visible


def agree(comm, value, what: str):
    """Check that every rank passed the same ``value``; raise DistError on every rank naming
    which ranks differ. Returns the value. Collective."""
    return check_agreed(comm.allgather(value), what)


def check_agreed(values: list, what: str):
    """values[q]: what rank q passed; the common value, else DistError naming which ranks differ."""
    ref = values[0]
    if any(v != ref for v in values):
        groups: dict[str, list[int]] = {}
        for q, v in enumerate(values):
            groups.setdefault(repr(v), []).append(q)
        detail = "; ".join(f"ranks {ranks}: {v}" for v, ranks in groups.items())
        raise DistError(f"ranks disagree on {what} ({detail}); every rank must make the same call")
    return ref


def check_symmetric_requests(requests: list[tuple[int, str]], rank: int) -> None:
    """requests[q] = (nbytes, name) rank q asked for in one symmetric() call. Raises DistError
    (the same one on every rank) unless all are equal and positive."""
    nbytes, name = requests[rank]
    if any(r != requests[0] for r in requests):
        detail = "; ".join(f"rank {q}: {n} bytes '{nm}'" for q, (n, nm) in enumerate(requests))
        raise DistError(
            f"symmetric buffer requests differ across ranks ({detail}); every rank must allocate the "
            f"same symmetric buffers, in the same order, with the same size"
        )
    if nbytes <= 0:
        raise DistError(f"symmetric buffer '{name}' needs a positive size, got {nbytes} bytes")


def peer_map(bus_ids: list[str], rank: int) -> list[bool]:
    """same_device[q]: rank q uses the same physical GPU as this rank (PCI bus ids compared, so
    differing CUDA_VISIBLE_DEVICES across ranks do not matter)."""
    mine = bus_ids[rank].lower()
    return [b.lower() == mine for b in bus_ids]


# --- bounded exchanges ----------------------------------------------------------------------------
# Point-to-point, so that a rank that does not come (dead, or making another call) is named, and
# no collective is left pending on the communicator: after a timeout only messages are in flight.

_TAG = 0x7AF0  # a group's private communicator carries these messages and nothing else
_in_flight: list = []  # sends a dead peer never takes: kept alive, never waited on


class MissingRanks(CollectiveTimeout):
    """A host-side exchange gave up: ``.ranks`` did not arrive within the timeout (dead, or not
    making this call). The group is unusable afterwards."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = list(ranks)


def _who(ranks) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {list(ranks)}"


def missing_message(missing, what: str, timeout_s: float, others: dict, tail: str) -> str:
    busy = "".join(f"; rank {q} is in {k}" for q, k in sorted(others.items()) if q in missing)
    return (f"{_who(missing)} did not reach {what} within {timeout_s:.1f} s (it may have died, or be making "
            f"another call{busy}); {tail}")


def post(comm, key: str, value) -> None:
    """Send (key, value) to every other rank of ``comm``, waiting for no one."""
    from mpi4py import MPI

    _in_flight[:] = [r for r in _in_flight if not _finished(r)]
    rank = comm.Get_rank()
    for q in range(comm.Get_size()):
        if q != rank:
            try:
                _in_flight.append(comm.isend((key, value), dest=q, tag=_TAG))
            except MPI.Exception:  # the library knows q failed: q's side is reported missing
                pass


def _finished(req) -> bool:
    try:
        return bool(req.Test())
    except Exception:  # noqa: BLE001 - completed in error (a failed peer)
        return True


def collect(comm, key: str, timeout_s: float, *, skip_other: bool = False):
    """Every other rank's value posted under ``key``, waiting at most ``timeout_s``:
    (values by rank, ranks missing, {rank: key} of ranks that posted for another call). With
    ``skip_other`` such messages are passed over (leftovers of an abandoned exchange) and the
    rank stays awaited."""
    from mpi4py import MPI

    rank = comm.Get_rank()
    waiting = [q for q in range(comm.Get_size()) if q != rank]
    got, others, lost = {}, {}, []
    deadline = time.monotonic() + timeout_s
    while True:
        for q in list(waiting):
            try:
                while (msg := comm.improbe(source=q, tag=_TAG)) is not None:
                    k, v = msg.recv()
                    if k == key:
                        got[q] = v
                        others.pop(q, None)
                    else:
                        others[q] = k
                    if k == key or not skip_other:
                        waiting.remove(q)
                        break
            except MPI.Exception:  # the library knows q failed
                waiting.remove(q)
                lost.append(q)
        if not waiting or time.monotonic() >= deadline:
            return got, sorted(waiting + lost), others
        time.sleep(0.0005)


def exchange(comm, key: str, value, timeout_s: float, what: str) -> list:
    """allgather of a picklable value that gives up after ``timeout_s``: raises MissingRanks
    naming the ranks that did not come, or DistError when some rank made another call (``key``
    names the call)."""
    post(comm, key, value)
    got, missing, others = collect(comm, key, timeout_s)
    if others:
        calls = "; ".join(f"rank {q} is in {k}" for q, k in sorted(others.items()))
        raise DistError(f"{what}: ranks made different calls (rank {comm.Get_rank()} is in {key}; {calls}); every "
                        "rank must make the same calls in the same order. This group is unusable: close it "
                        "(rawflux.finalize()) and make a new one")
    if missing:
        raise MissingRanks(missing_message(missing, what, timeout_s, others, "this group is unusable: close it "
                                           "(rawflux.finalize()) and make a new one"), missing)
    got[comm.Get_rank()] = value
    return [got[q] for q in range(comm.Get_size())]
