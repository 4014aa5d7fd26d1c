"""Bisects the sm-path failures of ag_gemm_checks on the emulated node (2026-12-07, 147f4ad, world 2:
graph[push/sm] and graph[pull/sm] every replay wrong in one chunk of the gathered A, torch_stream[.../sm]
every call wrong, while every bitwise[.../sm] check and every ce path passed). The same checks,
one change at a time: the host's fast path off (nofast), the GEMM launched without PDL (nopdl:
the validated path, the GEMM after the copy kernel ends), B first off (bfirst_off), pull; after
the suite's bitwise checks have run in the process, as in the suite. One line per case:

    python -m rawflux.launch --emulate 2 python3 tests/gpu/ag_sm_bisect.py      (gpu_suite.sh agsm)
"""
import importlib.util
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
spec = importlib.util.spec_from_file_location("agc", os.path.join(HERE, "ag_gemm_checks.py"))
C = importlib.util.module_from_spec(spec)
spec.loader.exec_module(C)


def main():
    from _worlds import preload_torch

    preload_torch()
    from mpi4py import MPI

    from rawflux.dist import init
    from rawflux.ops import ag_gemm as A

    comm = MPI.COMM_WORLD
    group = init(comm.Dup())
    real_fast, real_init, real_launch = A.AGGemm.fast_entry, A.AGGemm.__init__, A.AGGemm._launch_gemm

    def set_mode(nofast=False, bfirst=True, nopdl=False):
        A.AGGemm.fast_entry = (lambda self, key: None) if (nofast or nopdl) else real_fast
        A.AGGemm._launch_gemm = (lambda self, s, prepared, pdl=False: real_launch(self, s, prepared, pdl=False)) if nopdl else real_launch

        def init(self, *a, **k):
            k["b_first"] = bfirst
            real_init(self, *a, **k)

        A.AGGemm.__init__ = init

    cases = [
        ("prior bitwise", {}, lambda c: C.check_bitwise(c, "push", "sm", "nk", [256, 64, 128, 1, 3, 65, 127, 129, 200])),
        ("graph m192", {}, lambda c: C.check_graph(c, "push", "sm", replays=10)),
        ("torch m192", {}, lambda c: C.check_torch_stream(c, "push", "sm", calls=6)),
        ("random", {}, lambda c: C.check_random_calls(c, calls=200)),
        ("graph m192 nofast", {"nofast": True}, lambda c: C.check_graph(c, "push", "sm", replays=10)),
        ("graph m192 nopdl", {"nopdl": True}, lambda c: C.check_graph(c, "push", "sm", replays=10)),
        ("graph m192 bfirst_off", {"bfirst": False, "fresh": True}, lambda c: C.check_graph(c, "push", "sm", replays=10)),
        ("torch m192 nopdl", {"nopdl": True}, lambda c: C.check_torch_stream(c, "push", "sm", calls=6)),
        ("graph m192 pull", {}, lambda c: C.check_graph(c, "pull", "sm", replays=10)),
    ]
    ctx = None
    for i, (name, mode, fn) in enumerate(cases):
        mode = dict(mode)
        fresh = mode.pop("fresh", False)
        set_mode(**mode)
        if ctx is None or fresh:
            ctx = C.Ctx(comm, group, 100 + 50 * i, True)
        try:
            ok, detail = fn(ctx)
        except Exception as e:  # noqa: BLE001
            ok, detail = False, f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3].strip()}"
        oks = comm.allgather((ok, detail, ctx.ops and [o.last_config.tag() if o.last_config else None for o in ctx.ops.values()],
                              [o.slabs(2 * 192) for o in ctx.ops.values()] if ctx.ops else None))
        if comm.rank == 0:
            print(f"DIAG {name}: " + " | ".join(f"r{r}: {'PASS' if o else 'FAIL'} {d[:150]} cfg={c} S={s}" for r, (o, d, c, s) in enumerate(oks)),
                  flush=True)
        if any(comm.allgather(group.status_unchecked().failed)):
            if comm.rank == 0:
                print("DIAG group failed: stop", flush=True)
            break
    group.close()


main()
