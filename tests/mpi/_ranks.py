"""What the GPU tests under mpirun need of every rank, agreed across ranks so all skip together
(a rank that skipped alone would leave the others waiting in a collective)."""
from __future__ import annotations

import pytest


def require_gpu_on_every_rank(comm=None, *, hopper: bool = False) -> None:
    """pytest.skip on every rank unless every rank has a CUDA GPU (and, with hopper, sm_90)."""
    from mpi4py import MPI

    from rawflux.dist._backend import gpu_available

    comm = comm or MPI.COMM_WORLD
    ok, why = gpu_available()
    if not comm.allreduce(ok, op=MPI.LAND):
        pytest.skip(f"needs a GPU on every rank: {why or 'another rank has none'}")
    if hopper:
        import cupy

        if not comm.allreduce(cupy.cuda.Device().compute_capability == "90", op=MPI.LAND):
            pytest.skip("rawflux's GEMM kernels need sm_90 (Hopper) on every rank")
