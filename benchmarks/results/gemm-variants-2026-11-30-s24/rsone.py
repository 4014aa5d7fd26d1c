"""GEMM-RS world-N repro of gemm_rs_checks' correct.* cases (session 24): each case several times, printed at once."""
import os, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "tests/gpu"))
import gemm_rs_checks as C
from mpi4py import MPI
import rawflux.dist as dist
comm = MPI.COMM_WORLD
g = dist.init(comm)
names = sys.argv[1].split(",") if len(sys.argv) > 1 else None
for case in C.CORRECT_CASES:
    if names and case[0] not in names:
        continue
    for it in range(int(os.environ.get("ITERS", "3"))):
        t0 = time.time()
        c = C._guard(comm, g, case[0], lambda c=case: C.check_correct(g, comm, c))
        if comm.rank == 0:
            print(f"{it} {time.time() - t0:5.1f}s {c.line(comm.size)[:200]}", flush=True)
dist.finalize()
