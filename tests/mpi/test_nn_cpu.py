"""rawflux.nn in a job larger than one TP group, under MPI, with no GPU: the job split into TP groups
within nodes and DP groups across them (rawflux.dist.tp_split), a rawflux Group built over each TP
sub-communicator (the CPU fake backend of test_dist_cpu.py), TPMLP layers whose fused ops are
played by MPI collectives over the TP group, and torch DistributedDataParallel (gloo, CPU) over
the DP groups.

    mpirun -np 4 python -m pytest --with-mpi tests/mpi/test_nn_cpu.py   # 2 TP groups of 2
    mpirun -np 2 python -m pytest --with-mpi tests/mpi/test_nn_cpu.py   # 1 TP group of 2

Each group's outputs and gradients must match the unsplit module on that group's batch, and after
DDP's gradient all-reduce and an SGD step every DP replica must hold the same weights (bitwise),
equal to the unsplit module stepped with the averaged gradient.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")
mpi4py = pytest.importorskip("mpi4py")
from mpi4py import MPI  # noqa: E402

from rawflux.dist import finalize, init, tp_split  # noqa: E402
from rawflux.dist.topology import DistError  # noqa: E402
from rawflux.nn import _ops  # noqa: E402

from .test_dist_cpu import FakeBackend  # noqa: E402

pytestmark = pytest.mark.mpi(min_size=2)
TOL = dict(rtol=1e-9, atol=1e-9)


@pytest.fixture
def comm():
    c = MPI.COMM_WORLD.Dup()
    yield c
    finalize()
    c.Free()


def _tp(size: int) -> int:
    return 2 if size % 2 == 0 else 1


# --- the split ---------------------------------------------------------------------------------


def test_tp_split_groups(comm):
    tp = _tp(comm.size)
    sp = tp_split(comm, tp)
    try:
        assert sp.tp_comm.Get_size() == tp and sp.tp_comm.Get_rank() == sp.tp_rank
        assert sp.dp_comm.Get_size() == comm.size // tp
        assert sorted(r for g in sp.tp_groups for r in g) == list(range(comm.size))
        assert sp.tp_ranks[sp.tp_rank] == comm.rank and comm.rank in sp.dp_ranks
        assert sp.tp_comm.allgather(comm.rank) == list(sp.tp_ranks)  # TP rank order = the group's listing
        assert sp.dp_comm.allgather(sp.tp_rank) == [sp.tp_rank] * sp.dp_comm.Get_size()
        assert comm.allgather(sp.tp_groups) == [sp.tp_groups] * comm.size
    finally:
        sp.tp_comm.Free()
        sp.dp_comm.Free()


def test_tp_split_refuses_a_group_across_hosts(comm):
    two_nodes = lambda c: c.Split(c.Get_rank() % 2, c.Get_rank())  # noqa: E731 - pretend ranks alternate between 2 hosts
    with pytest.raises(DistError, match=f"a TP group of {comm.size} ranks would span two hosts"):
        tp_split(comm, comm.size, split=two_nodes)
    with pytest.raises(DistError, match="whole divisor"):
        tp_split(comm, comm.size + 1)
    if comm.size % 4 == 0:  # two nodes of >= 2 ranks: TP groups of 2 stay inside them
        sp = tp_split(comm, 2, split=two_nodes)
        assert all(len({r % 2 for r in g}) == 1 for g in sp.tp_groups)
        sp.tp_comm.Free()
        sp.dp_comm.Free()
    comm.Barrier()  # every rank raised alike: nobody is left in a collective


def test_init_refuses_a_tp_group_across_hosts(comm):
    two_nodes = lambda c: c.Split(c.Get_rank() % 2, c.Get_rank())  # noqa: E731
    with pytest.raises(DistError, match="within one node"):
        init(comm, backend=FakeBackend(), split=two_nodes)
    comm.Barrier()


# --- TP inside, DP across ----------------------------------------------------------------------


def _mpi_ops(monkeypatch, tp_comm):
    """The fused ops as MPI collectives over the TP group (float64 numpy on the host)."""
    w = tp_comm.Get_size()

    def mm(a, b, layout):
        return a @ (b.T if layout == "nk" else b)

    def ag_gemm(a, b, group, *, b_layout="nk", bias=None, gathered_out=None, return_gathered=False, max_m=None):
        full = torch.from_numpy(np.concatenate(tp_comm.allgather(a.detach().numpy())))
        out = mm(full, b, b_layout) + (bias if bias is not None else 0)
        if gathered_out is not None:
            gathered_out.copy_(full)
            full = gathered_out
        return (out, full) if return_gathered else out

    def gemm_rs(a, b, group, *, b_layout="nk", bias=None, partials=None, max_m=None):
        parts = tp_comm.allgather(mm(a, b, b_layout).detach().numpy())
        total = torch.from_numpy(sum(parts[1:], parts[0]))
        n = total.shape[0] // w
        return total[group.rank * n:(group.rank + 1) * n] + (bias if bias is not None else 0)

    def gather(x, group, *, max_m=None):
        return torch.from_numpy(np.concatenate(tp_comm.allgather(x.detach().numpy())))

    monkeypatch.setattr(_ops, "ag_gemm", ag_gemm)
    monkeypatch.setattr(_ops, "gemm_rs", gemm_rs)
    monkeypatch.setattr(_ops, "gather", gather)
    monkeypatch.setattr(_ops, "reserve", lambda *a, **k: None)  # no op objects to build


class RefMLP(torch.nn.Module):
    def __init__(self, h, f):
        super().__init__()
        torch.manual_seed(0)  # the same full weights on every rank
        self.gate_proj, self.up_proj, self.down_proj = (torch.nn.Linear(h, f, bias=False, dtype=torch.float64),
                                                        torch.nn.Linear(h, f, bias=False, dtype=torch.float64),
                                                        torch.nn.Linear(f, h, bias=False, dtype=torch.float64))

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def _rand(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_tp_groups_compose_with_ddp_across_them(comm, monkeypatch):
    import torch.distributed as dist

    import rawflux.nn as tpnn

    tp = _tp(comm.size)
    sp = tp_split(comm, tp)
    group = init(sp.tp_comm, backend=FakeBackend())  # rawflux's group over the TP sub-communicator
    assert (group.world, group.rank) == (tp, sp.tp_rank)
    _mpi_ops(monkeypatch, sp.tp_comm)
    path = comm.bcast(tempfile.mktemp(prefix="rawflux-nn-gloo-") if comm.rank == 0 else None)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=comm.rank, world_size=comm.size)
    try:
        dp_pg = None
        for ranks in sp.dp_groups:  # every rank creates every group, as torch.distributed requires
            pg = dist.new_group(list(ranks))
            if comm.rank in ranks:
                dp_pg = pg
        h, f, m, lr = 16, 32, 4 * tp, 0.5
        ref = RefMLP(h, f)
        model = torch.nn.parallel.DistributedDataParallel(tpnn.TPMLP.from_llama(ref, group), process_group=dp_pg)
        d, dp = sp.dp_comm.Get_rank(), sp.dp_comm.Get_size()
        X, G = _rand((m, h), 100 + d), _rand((m, h), 200 + d)  # this DP replica's batch
        rows = slice(sp.tp_rank * (m // tp), (sp.tp_rank + 1) * (m // tp))
        y = model(X[rows])
        y.backward(G[rows])

        # the unsplit module on every replica's batch: outputs, and the DP-averaged gradient
        grads = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
        for q in range(dp):
            ref.zero_grad()
            Xq, Gq = _rand((m, h), 100 + q), _rand((m, h), 200 + q)
            Yq = ref(Xq)
            Yq.backward(Gq)
            if q == d:
                torch.testing.assert_close(y.detach(), Yq.detach()[rows], **TOL)  # this group's outputs
            for n, p in ref.named_parameters():
                grads[n] += p.grad / dp
        blk = model.module
        fl = f // tp
        r = sp.tp_rank
        want = {"gate_up.weight": torch.cat([grads["gate_proj.weight"][r * fl:(r + 1) * fl], grads["up_proj.weight"][r * fl:(r + 1) * fl]]),
                "down.weight": grads["down_proj.weight"][:, r * fl:(r + 1) * fl]}
        with torch.no_grad():
            for n, p in blk.named_parameters():
                torch.testing.assert_close(p.grad, want[n], **TOL)  # DDP averaged over the DP group
                p -= lr * p.grad
        # every DP replica holds the same weights after the step
        for n, p in blk.named_parameters():
            mine = p.detach().numpy().copy()
            for other in sp.dp_comm.allgather(mine):
                assert np.array_equal(other, mine), f"{n} differs across the DP group"
    finally:
        dist.destroy_process_group()
        comm.Barrier()
        if comm.rank == 0 and os.path.exists(path):
            os.unlink(path)
        group.close()
        sp.tp_comm.Free()
        sp.dp_comm.Free()
