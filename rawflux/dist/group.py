"""The tensor-parallel group: MPI ranks of one node, each bound to a GPU, sharing memory by CUDA IPC.

``init(comm=None) -> Group`` (collective; idempotent per communicator) builds it:

1. topology: rank, world, node-local rank (``comm.Split_type(MPI.COMM_TYPE_SHARED)``); a group
   spanning several nodes is refused with a clear error (IPC needs one node).
2. device: CUDA that cannot be used at all (no CUDA packages, driver or device) raises
   CudaUnavailable on every rank, saying what is missing. ``RAWFLUX_DEVICE`` / ``init(device=)``
   if given, else local rank % visible devices
   (for a group that leaves out some of the node's processes, the launcher's node-local rank
   instead, so several groups on one node do not all start at device 0). Several ranks on one device is allowed: the emulated node.
3. peer access: GPUs are compared by PCI bus id; for every peer on another GPU,
   cudaDeviceCanAccessPeer then cudaDeviceEnablePeerAccess (already enabled is fine); the same
   GPU needs nothing. ``peer_access`` is True only if every rank reaches every peer.
4. control state: a host-mapped Status record, a symmetric control buffer (abort word, barrier
   epoch and flags), and a GroupCtrl struct in device memory that kernels receive by pointer.

Every step that can fail on one rank only is agreed across ranks (``collective_try``), so a
failure raises the same DistError on every rank instead of leaving the others in a collective.

Host-side exchanges of calls and teardown (symmetric(), free_symmetric(), close()) are bounded by
the group's timeout (``topology.exchange``): a rank that died or makes another call is named in a
MissingRanks / DistError instead of hanging the others, and the group is unusable after it.

Teardown (``Group.close()``, ``finalize()``, and at interpreter exit): device sync, close the
peers' IPC mappings, then tell every peer "done with your memory" and wait for theirs (at most
CLOSE_WAIT_TIMEOUTS x the group's timeout: a peer may still be finishing a call that gives up);
free own buffers only once every peer said so (CUDA forbids freeing memory a peer still maps),
else leak them. A healthy close that finds a peer missing raises MissingRanks after freeing what
it could. A group that has already failed (a wait gave up, a peer raised the abort flag, an
exchange timed out) waits for no one: it only looks whether every peer's "done" already came.
Safe to call twice. With MPI already finalized, a device barrier stands in for the exchange.
"""
from __future__ import annotations

import atexit
import struct
import sys
import threading

from .. import env
from ..jit.faults import raise_if_lost
from ..runtime.device import CudaUnavailable
from . import topology
from ._backend import cuda_backend
from .layout import (CTRL_ABORT, describe_abort, CTRL_BYTES, CTRL_FLAGS, GROUP_CTRL_BYTES, STATE_CALL_MISMATCH, STATE_OK, STATUS_BYTES,
                     StatusRecord, decode_ctrl, pack_group_ctrl)
from .symm import SymmetricBuffer, allocate, close_mappings, collective_try, free_local
from .topology import CollectiveTimeout, DistError, MissingRanks


_STATE_OK_WORD = STATE_OK.to_bytes(4, "little")  # Status.state, the record's first word


class CallMismatch(CollectiveTimeout):
    """Ranks disagreed on a call of a fused op (shape, dtype, op object, protocol, or one rank did
    not make the call). ``.record`` holds the decoded Status; ``.peer`` the rank that differs."""

    def __init__(self, message: str, record: StatusRecord | None = None, peer: int | None = None):
        super().__init__(message, record)
        self.peer = peer


# Status.state -> function(record) -> exception, for states whose meaning an upper layer knows
# better (the fused ops register a describer for call mismatches; dist never imports them).
_describers: dict[int, object] = {}


def register_failure_describer(state: int, describe) -> None:
    _describers[int(state)] = describe


def failure_exception(rec: StatusRecord) -> CollectiveTimeout:
    describe = _describers.get(rec.state)
    if describe is not None:
        return describe(rec)
    if rec.state == STATE_CALL_MISMATCH:
        return CallMismatch(rec.message(), rec, rec.peer)
    return CollectiveTimeout(rec.message(), rec)


# A healthy close waits this many group timeouts for its peers: one may still be finishing a call
# that gives up after a timeout (the default timeout gives 30 s).
CLOSE_WAIT_TIMEOUTS = 3.0


class Group:
    """See the module docstring. Fields: comm, rank, world, local_rank, device_id, peer_access,
    same_device (per rank: shares this rank's GPU), mps (this rank's context is an MPS client)."""

    def __init__(self, comm, *, device: int | None = None, timeout_s: float | None = None, backend=None,
                 split=topology.node_split):
        self.comm = comm
        self._backend = backend if backend is not None else cuda_backend()
        self._closed = False
        self._failure: str | None = None  # a host-side exchange gave up: no collective may follow
        self._buffers: list[SymmetricBuffer] = []
        self._nccl = None
        self._status_host = 0
        self._status_dev = 0
        self._group_ctrl = 0
        self.ctrl: SymmetricBuffer | None = None
        self._mpi = comm.Dup()  # private traffic never mixes with the caller's messages
        # The ops' bounded agreements (rawflux.ops._collective.bounded_allgather) get a communicator of
        # their own, made while every rank is here: a request one of them abandons at its timeout
        # then never meets the group's teardown, a later group's setup or the caller's messages.
        self.agree_comm = self._mpi.Dup()
        try:
            self._setup(device, timeout_s, split)
        except BaseException:
            self._release_local(free=True)
            self._closed = True
            for c in (self.agree_comm, self._mpi):
                try:
                    c.Free()
                except Exception:  # noqa: BLE001
                    pass
            raise

    # --- formation ----------------------------------------------------------------------------
    def _setup(self, device, timeout_s, split):
        be = self._backend
        topo = topology.form(self._mpi, split=split)
        self.rank, self.world = topo.rank, topo.world
        self.local_rank, self.local_world, self.hostname = topo.local_rank, topo.local_world, topo.hostname
        forced = device if device is not None else env.device_override()
        # Bind by the rank in this group's node split; only when the group leaves out some of
        # the node's processes (several groups per node) by the launcher's node-local rank.
        launcher = env.launcher_local()
        binding_rank = launcher[0] if launcher is not None and launcher[1] > self.local_world else self.local_rank
        # CUDA that cannot be used at all (no CUDA packages, driver or device) gets its own sentence,
        # on every rank alike, before the binding step would report it as a CUDA error.
        probe = getattr(be, "problem", None)
        err = probe() if probe is not None else None
        whys = self._mpi.allgather(None if err is None else str(err))
        if err is not None:
            raise err
        bad = [q for q, w in enumerate(whys) if w]
        if bad:
            raise CudaUnavailable(f"rank(s) {bad} cannot use CUDA: {whys[bad[0]]}")

        def bind():
            dev = topology.choose_device(binding_rank, be.device_count(), forced)
            be.use_device(dev)
            return dev, be.pci_bus_id(dev)

        bound = collective_try(self._mpi, bind, "device binding")
        self.device_id = bound[self.rank][0]
        self.bus_ids = [b for _, b in bound]
        self.same_device = topology.peer_map(self.bus_ids, self.rank)
        mps_probe = getattr(be, "mps_enabled", None)
        with be.device_scope(self.device_id):
            self.mps = bool(mps_probe(self.device_id)) if mps_probe is not None else False

        def peers():
            problems = []
            with be.device_scope(self.device_id):
                for q, bus in enumerate(self.bus_ids):
                    if self.same_device[q]:
                        continue  # same GPU (emulated node): IPC maps it, no peer access needed
                    pdev = be.device_by_pci_bus_id(bus)
                    if pdev is None:
                        problems.append(f"rank {q}'s GPU {bus} is not visible to rank {self.rank}")
                    elif not be.can_access_peer(self.device_id, pdev):
                        problems.append(f"rank {self.rank}'s GPU {self.bus_ids[self.rank]} cannot access rank {q}'s GPU {bus} (no P2P)")
                    else:
                        be.enable_peer_access(pdev)
            return problems

        problems = collective_try(self._mpi, peers, "peer access")
        self.peer_problems = [p for ps in problems for p in ps]
        self.peer_access = not self.peer_problems
        self._timeout_s = float(timeout_s if timeout_s is not None else env.wait_timeout_s())
        if self._timeout_s <= 0:
            raise DistError(f"the wait timeout must be positive, got {self._timeout_s} s")
        if not self.peer_access:
            return  # a group without P2P can still use nccl(); symmetric()/barrier() explain why not

        def status():
            with be.device_scope(self.device_id):
                self._status_host, self._status_dev = be.host_alloc_mapped(STATUS_BYTES)

        collective_try(self._mpi, status, "host-mapped status allocation")
        with be.device_scope(self.device_id):
            self.ctrl = allocate(self, CTRL_BYTES, "rawflux.ctrl")
            self._buffers.append(self.ctrl)

        def ctrl():
            with be.device_scope(self.device_id):
                self._group_ctrl = be.malloc(GROUP_CTRL_BYTES)
                be.memcpy_htod(self._group_ctrl, pack_group_ctrl(
                    self._timeout_ns(), self._status_dev, self.ctrl.peer_table_ptr, self.rank, self.world))
                be.prepare_barrier(self.device_id)

        collective_try(self._mpi, ctrl, "group control setup (barrier kernel compile/load)")

    def _timeout_ns(self) -> int:
        return int(self._timeout_s * 1e9)

    # --- properties ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def shares_gpu_under_mps(self) -> bool:
        """Other ranks of this group run on this rank's GPU as MPS clients (the emulated node)."""
        return self.mps and sum(self.same_device) > 1

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    @property
    def group_ctrl_ptr(self) -> int:
        """Device pointer to this rank's GroupCtrl (comm/ctrl.cuh): the one argument fused
        kernels need to make bounded waits (make_wait_ctx) and to find the control buffers."""
        self._check_usable()
        return self._group_ctrl

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"device {getattr(self, 'device_id', '?')}"
        return f"<rawflux Group rank {getattr(self, 'rank', '?')}/{getattr(self, 'world', '?')} {state}>"

    def _check_open(self):
        if self._closed:
            raise DistError("this group is closed (rawflux.finalize() or Group.close() ran); call rawflux.init() again")

    def _check_usable(self):
        self._check_open()
        if not self.peer_access:
            raise DistError(
                "symmetric memory and device-side barriers need peer access between all GPUs of the group: "
                + "; ".join(self.peer_problems)
            )

    # --- failures -------------------------------------------------------------------------------
    def mark_failed(self, why: str) -> None:
        """Record that a host-side agreement on this group gave up (the ops' bounded agreements run on
        agree_comm): later exchanges refuse at once, and close() waits for no peer."""
        self._failure = self._failure or str(why)

    def _check_healthy(self, what: str) -> None:
        if self._failure:
            raise DistError(f"{what}: this group is unusable after an earlier failure: {self._failure}")

    def _exchange(self, key: str, value, what: str) -> list:
        """Bounded allgather over the private communicator (topology.exchange). One that gave up
        may leave messages in flight, so the group is unusable after it."""
        self._check_healthy(what)
        try:
            return topology.exchange(self._mpi, key, value, self._timeout_s, what)
        except DistError as e:
            self._failure = str(e)
            raise

    def _seen_failure(self) -> str | None:
        """Why this group must not close collectively (a wait of this rank gave up, a peer raised the
        abort flag, a host-side exchange gave up), or None. Local reads only."""
        if self._failure:
            return self._failure
        try:
            rec = self.status_unchecked() if self._status_host else None
            if rec is not None and rec.failed:
                return rec.message()
            if self.ctrl is not None:
                (abort,) = struct.unpack("<I", self._backend.memcpy_dtoh(self.ctrl.ptr + CTRL_ABORT, 4))
                if abort:
                    return describe_abort(abort)
        except Exception as e:  # noqa: BLE001 - a broken context: nothing collective can follow
            return f"this rank's device state cannot be read ({type(e).__name__}: {e})"
        return None

    # --- configuration --------------------------------------------------------------------------
    def set_timeout(self, seconds: float) -> None:
        """Bound on every device-side wait of this group, from now on (kernels read it from
        device memory, so graphs captured earlier follow too). Not collective; give every rank
        the same value. Synchronous; not inside a graph capture."""
        self._check_usable()
        if not seconds > 0:
            raise ValueError(f"timeout must be positive, got {seconds}")
        self._timeout_s = float(seconds)
        with self._backend.device_scope(self.device_id):
            self._backend.memcpy_htod(self._group_ctrl, struct.pack("<Q", self._timeout_ns()))

    # --- memory ---------------------------------------------------------------------------------
    def symmetric(self, nbytes: int, name: str) -> SymmetricBuffer:
        """Collective: ``nbytes`` of zeroed device memory on every rank, mapped into every peer
        (rawflux.dist.symm). Every rank must ask for the same size and name, in the same order."""
        self._check_usable()
        self._check_healthy(f"symmetric buffer '{name}'")
        with self._backend.device_scope(self.device_id):
            buf = allocate(self, nbytes, name)
        self._buffers.append(buf)
        return buf

    def signal_buffer(self, n_flags: int, name: str) -> SymmetricBuffer:
        """Collective: a symmetric array of ``n_flags`` u32 flags, zeroed (comm/signal.cuh)."""
        n = int(n_flags)
        if n <= 0:
            raise ValueError(f"signal_buffer '{name}' needs at least one flag, got {n_flags}")
        return self.symmetric(4 * n, name)

    def free_symmetric(self, buf: SymmetricBuffer) -> None:
        """Collective: free a symmetric buffer before the group closes (device sync, device
        barrier and a bounded exchange first, so no peer still uses or maps it). On a group that
        has failed it waits for no one: it unmaps the peers' copies and leaves this rank's memory
        to close(), which frees it only once every peer is done with it."""
        self._check_usable()
        if buf not in self._buffers:
            raise DistError(f"symmetric buffer '{buf.name}' does not belong to this group (or was freed)")
        be = self._backend
        with be.device_scope(self.device_id):
            be.synchronize()
            if self._seen_failure() is not None:
                close_mappings(be, buf)
                return
            be.launch_barrier(self._group_ctrl, self.world, self.device_id, None)
            be.synchronize()
            self.raise_if_failed()
            close_mappings(be, buf)
            names = self._exchange("free_symmetric()", buf.name, f"freeing symmetric buffer '{buf.name}'")
            topology.check_agreed(names, "which symmetric buffer to free")  # peers unmapped it too
            free_local(be, buf)
        self._buffers.remove(buf)

    # --- synchronisation ------------------------------------------------------------------------
    def barrier(self, stream=None) -> None:
        """Device-side barrier across the group on ``stream`` (default: CuPy's current stream).
        No host synchronisation, capturable in a CUDA graph, bounded by the group's timeout; a
        timeout shows up at ``synchronize()`` / ``raise_if_failed()`` as CollectiveTimeout."""
        self._check_usable()
        be = self._backend
        with be.device_scope(self.device_id):
            be.launch_barrier(self._group_ctrl, self.world, self.device_id, stream)

    @property
    def status(self) -> StatusRecord:
        """This rank's error record, read from host-mapped memory (no device synchronisation)."""
        self._check_usable()
        return StatusRecord.from_bytes(self._backend.read_host(self._status_host, STATUS_BYTES))

    def healthy(self) -> bool:
        """No device-side wait of this rank has failed: one 4-byte read of the host-mapped record
        (the ops' per-call check; raise_if_failed() says what failed)."""
        return not self._closed and self._backend.read_host(self._status_host, 4) == _STATE_OK_WORD

    def raise_if_failed(self) -> None:
        """Raise CollectiveTimeout if any device-side wait of this rank gave up. The record is
        sticky: once a wait failed, the group stays failed (make a new one)."""
        rec = self.status
        if rec.failed:
            raise failure_exception(rec)

    def synchronize(self, stream=None) -> None:
        """Wait for ``stream`` (default: CuPy's current stream), then raise_if_failed()."""
        self._check_usable()
        try:
            with self._backend.device_scope(self.device_id):
                self._backend.stream_synchronize(stream)
        except Exception as e:  # noqa: BLE001 - a lost context gets its own error, the rest pass through
            raise_if_lost(e, "Group.synchronize", self.failure_detail())
            raise
        self.raise_if_failed()

    def failure_detail(self) -> str:
        """What this rank's status record holds, for an error that has more to say ('' when it
        holds no failure). The record is host memory: readable after the CUDA context is lost."""
        rec = self.status
        return f"this rank's status record: {failure_exception(rec)}" if rec.failed else ""

    def ctrl_state(self) -> dict:
        """Abort word, barrier epoch and arrival flags of this rank (synchronous copy; call after
        synchronize() for a settled view). For tests and debugging."""
        self._check_usable()
        with self._backend.device_scope(self.device_id):
            raw = self._backend.memcpy_dtoh(self.ctrl.ptr, CTRL_BYTES)
        assert CTRL_FLAGS + 4 * self.world <= len(raw)
        return decode_ctrl(raw, self.world)

    # --- NCCL -----------------------------------------------------------------------------------
    def nccl(self):
        """A cupy.cuda.nccl.NcclCommunicator over this group, built on first use (collective the
        first time: rank 0's unique id is broadcast over MPI)."""
        self._check_open()
        if self._nccl is None:
            def make_uid():
                from cupy.cuda import nccl

                return nccl.get_unique_id() if self.rank == 0 else None

            uid = collective_try(self._mpi, make_uid, "NCCL unique id (cupy.cuda.nccl)")[0]

            def make_comm():
                from cupy.cuda import nccl

                with self._backend.device_scope(self.device_id):
                    return nccl.NcclCommunicator(self.world, uid, self.rank)

            try:
                self._nccl = make_comm()
            except Exception as e:
                shared = sum(self.same_device) > 1
                hint = (" (several ranks share one GPU here, the emulated node; NCCL may refuse that: "
                        "use one GPU per rank for NCCL baselines)") if shared else ""
                raise DistError(f"NCCL communicator setup failed on rank {self.rank}: {e}{hint}") from e
        return self._nccl

    # --- teardown ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Teardown (see the module docstring): collective on a healthy group, local on a failed
        one; bounded either way. Safe to call twice. Raises MissingRanks, after freeing what it
        could, when a healthy group finds peers that do not come to close."""
        if self._closed:
            return
        self._closed = True
        be = self._backend
        warnings = []

        def step(what, fn):
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - teardown goes on; reported below
                warnings.append(f"{what}: {type(e).__name__}: {e}")
                return None

        from mpi4py import MPI

        dev = getattr(self, "device_id", None)
        mpi_up = not MPI.Is_finalized()
        device_ok = False
        with _quiet_scope(be, dev):
            step("device synchronize", be.synchronize)  # this rank's waits are bounded: it returns
            failed = self._seen_failure()
            if self._nccl is not None:
                # ncclCommDestroy may wait for peers; abort does not
                step("NCCL communicator teardown", getattr(self._nccl, "abort", self._nccl.destroy) if failed else self._nccl.destroy)
                self._nccl = None
            if not mpi_up and not failed and self._group_ctrl and self.peer_access:
                # no MPI left to say "done": a device barrier (bounded) tells that peers' kernels ended
                step("teardown device barrier", lambda: be.launch_barrier(self._group_ctrl, self.world, self.device_id, None))
                step("device synchronize", be.synchronize)
                rec = step("status read", self.status_unchecked)
                device_ok = rec is not None and not rec.failed
            for buf in reversed(self._buffers):  # done with every peer's memory
                step(f"close IPC mappings of '{buf.name}'", lambda b=buf: close_mappings(be, b))
        done, lost = False, None
        wait_s = CLOSE_WAIT_TIMEOUTS * self._timeout_s
        if mpi_up:
            def confirm():
                # A failed group only looks at what already came: a peer may be dead.
                topology.post(self._mpi, "close()", failed is None)
                return topology.collect(self._mpi, "close()", 0.0 if failed else wait_s, skip_other=True)

            got = step("close exchange", confirm)
            if got is not None:
                _, missing, others = got
                done = not missing
                if missing and not failed:
                    lost = MissingRanks(topology.missing_message(
                        missing, "rawflux's close", wait_s, others,
                        "the group is closed here without them; this rank's share of its memory is left "
                        "allocated (they may still map it)"), missing)
        with _quiet_scope(be, dev):
            self._release_local(free=done or device_ok, step=step)
        if not (done or device_ok) and lost is None:
            why = " (the group had failed; a peer may be dead)" if failed else ""
            warnings.append("not every peer said it was done with this rank's symmetric buffers: they are "
                            f"left allocated, not freed{why}")
        if done:
            step("communicator free", self.agree_comm.Free)  # local: a request abandoned on it only delays the release
            step("communicator free", self._mpi.Free)
        _forget(self)
        if warnings:
            print(f"[rawflux.dist] rank {getattr(self, 'rank', '?')}: teardown: " + "; ".join(warnings), file=sys.stderr, flush=True)
        if lost is not None:
            raise lost

    def status_unchecked(self) -> StatusRecord:
        return StatusRecord.from_bytes(self._backend.read_host(self._status_host, STATUS_BYTES))

    def _release_local(self, free: bool, step=None):
        """Unmap the peers' memory, then free what only this rank uses; this rank's shared memory
        only if ``free`` (no peer maps it any more)."""
        be = self._backend
        step = step or (lambda what, fn: fn())
        for buf in reversed(self._buffers):  # every mapping of a peer's memory first ...
            step(f"close IPC mappings of '{buf.name}'", lambda b=buf: close_mappings(be, b))
        for buf in reversed(self._buffers):  # ... then this rank's own memory
            step(f"free '{buf.name}'", lambda b=buf: free_local(be, b, shared=free))
        self._buffers.clear()
        if self._group_ctrl:
            step("free GroupCtrl", lambda: be.free(self._group_ctrl))
            self._group_ctrl = 0
        if self._status_host:
            step("free status record", lambda: be.free_host(self._status_host))
            self._status_host = self._status_dev = 0


class _quiet_scope:
    """device_scope that tolerates a broken context during teardown."""

    def __init__(self, be, dev):
        self._cm = None
        if dev is None:
            return
        try:
            self._cm = be.device_scope(dev)
        except Exception:  # noqa: BLE001
            self._cm = None

    def __enter__(self):
        if self._cm is not None:
            try:
                self._cm.__enter__()
            except Exception:  # noqa: BLE001
                self._cm = None
        return self

    def __exit__(self, *exc):
        if self._cm is not None:
            try:
                self._cm.__exit__(*exc)
            except Exception:  # noqa: BLE001
                pass
        return False


# --- process-wide registry ----------------------------------------------------------------------
_lock = threading.RLock()
_groups: dict[int, Group] = {}
_current: Group | None = None
_atexit_registered = False


def _comm_key(comm) -> int:
    from mpi4py import MPI

    return int(MPI._handleof(comm))


def init(comm=None, *, device: int | None = None, timeout_s: float | None = None, backend=None,
         split=None) -> Group:
    """Build (collectively) or return the group for ``comm`` (default MPI.COMM_WORLD). A second
    call with the same communicator returns the same Group. ``device`` forces the CUDA ordinal
    (else RAWFLUX_DEVICE, else local rank % visible devices); ``timeout_s`` bounds device-side
    waits (else RAWFLUX_WAIT_TIMEOUT_S). ``backend``/``split`` are for tests."""
    global _current, _atexit_registered
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    key = _comm_key(comm)
    with _lock:
        g = _groups.get(key)
        if g is not None and not g.closed:
            _current = g
            return g
        g = Group(comm, device=device, timeout_s=timeout_s, backend=backend,
                  split=split if split is not None else topology.node_split)
        _groups[key] = g
        _current = g
        if not _atexit_registered:
            # Registered after mpi4py's import, so it runs before MPI is finalized at exit.
            atexit.register(_finalize_at_exit)
            _atexit_registered = True
        return g


def current_group() -> Group:
    """The group made by the latest init() that is still open."""
    with _lock:
        if _current is None or _current.closed:
            raise DistError("no rawflux group: call rawflux.init() (or rawflux.dist.init()) first")
        return _current


def groups() -> list[Group]:
    with _lock:
        return [g for g in _groups.values() if not g.closed]


def finalize() -> None:
    """Close every group, newest first (collective; bounded). Safe to call twice; runs at exit.
    Raises the first error a close raised (peers missing at close), once every group is closed."""
    with _lock:
        pending = list(_groups.values())
    first = None
    for g in reversed(pending):
        try:
            g.close()
        except DistError as e:
            first = first or e
    if first is not None:
        raise first


def _finalize_at_exit() -> None:
    try:
        finalize()
    except DistError as e:  # one line, not a traceback: the process exits as it would have
        print(f"[rawflux.dist] at exit: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _forget(g: Group) -> None:
    global _current
    with _lock:
        for k, v in list(_groups.items()):
            if v is g:
                del _groups[k]
        if _current is g:
            live = [v for v in _groups.values() if not v.closed]
            _current = live[-1] if live else None
