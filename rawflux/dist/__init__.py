"""rawflux.dist: the tensor-parallel group (mpi4py), device binding, symmetric buffers over CUDA
IPC, flags, and a device-side barrier with bounded waits.

    g = rawflux.dist.init()                    # collective; MPI.COMM_WORLD by default
    buf = g.symmetric(1 << 20, "ag.scratch")   # collective; buf.peer_ptrs, buf.peer_ptrs_dev
    flags = g.signal_buffer(64, "ag.flags")    # u32 flags, zeroed
    g.barrier(stream)                          # no host sync, capturable, bounded
    g.synchronize(stream)                      # stream sync + raise CollectiveTimeout if a wait failed
    rawflux.dist.finalize()                    # also runs at exit

Device side: cuda_src/rawflux/ptx/sync.cuh (acquire/release/fences/globaltimer),
comm/wait.cuh (bounded waits, error record), comm/signal.cuh, comm/barrier.cuh, comm/ctrl.cuh.
"""
from ..jit import register as _register
from .group import (CallMismatch, CollectiveTimeout, Group, current_group, failure_exception, finalize, groups, init,
                    register_failure_describer)
from .layout import StatusRecord
from .symm import SymmetricBuffer
from .topology import DistError, MissingRanks, TPSplit, tp_split

# The variants rawflux.dist launches (python -m rawflux.check_kernels compiles them).
_register("barrier.cu", "rawflux::barrier_kernel", archs=("sm_90a", "sm_80"))
_register("barrier.cu", "rawflux::selftest_fill_kernel", archs=("sm_90a", "sm_80"))
_register("barrier.cu", "rawflux::selftest_verify_kernel", archs=("sm_90a", "sm_80"))
_register("barrier.cu", "rawflux::selftest_wait_kernel", archs=("sm_90a", "sm_80"))

__all__ = ["CallMismatch", "CollectiveTimeout", "failure_exception", "register_failure_describer", "DistError", "Group",
           "MissingRanks", "StatusRecord", "SymmetricBuffer", "current_group",
           "finalize", "groups", "init", "TPSplit", "tp_split"]
