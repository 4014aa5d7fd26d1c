"""A Llama-style MLP split over the ranks of an MPI job (notebooks/04_tensor_parallel.ipynb runs it).

    rawflux-launch --emulate 2 notebooks/tp_mlp.py --out /tmp/tp         # 2 ranks on one GPU (MPS)
    rawflux-launch -n 4 notebooks/tp_mlp.py --out /tmp/tp                # 4 GPUs
    python -m rawflux.launch -n 2 notebooks/tp_mlp.py --backend numpy --out /tmp/tp   # no GPU

y = down(silu(gate(x)) * up(x)), sequence parallel over W ranks: rank r holds rows r*m/W.. of x
and of y, rows r*f/W.. of the gate and up weights (column parallel) and the same columns of the
down weight (row parallel). backend rawflux: gate and up as one rawflux.ag_gemm (the AllGather of
x fused into the GEMM), down as rawflux.gemm_rs (the ReduceScatter fused into it). backend numpy:
the same shards on the host, the AllGather and the ReduceScatter done by MPI. Each rank writes
<out>/rank<r>.npz: its rows of y, and (rawflux) the non-overlapped baseline's rows and both times.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


def inputs(m: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, d), dtype=np.float32).astype(BF16)


def weights(d: int, f: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gate (f, d), up (f, d), down (d, f): linear layers' (out, in) weights, bf16, scaled by
    1/sqrt(fan in) so that every activation stays near unit size."""
    rng = np.random.default_rng(seed)
    g, u = (rng.standard_normal((f, d), dtype=np.float32) / np.sqrt(d) for _ in range(2))
    dn = rng.standard_normal((d, f), dtype=np.float32) / np.sqrt(f)
    return g.astype(BF16), u.astype(BF16), dn.astype(BF16)


def shard(ws, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank r's weights: [gate_r; up_r] (2f/W, d), one GEMM for both, and down_r (d, f/W)."""
    gate, up, down = ws
    f = gate.shape[0]
    cols = slice(rank * f // world, (rank + 1) * f // world)
    return np.concatenate([gate[cols], up[cols]]), np.ascontiguousarray(down[:, cols])


def silu_mul(gu: np.ndarray) -> np.ndarray:
    """silu(gate) * up of a (rows, 2 f_loc) gate|up block, in float32."""
    g, u = np.split(gu.astype(np.float32), 2, axis=1)
    return g / (1 + np.exp(-g)) * u


def reference(x, ws) -> np.ndarray:
    """The unsplit MLP in float64 on the same bf16 inputs."""
    gate, up, down = (w.astype(np.float64) for w in ws)
    x = x.astype(np.float64)
    g, u = x @ gate.T, x @ up.T
    return (g / (1 + np.exp(-g)) * u) @ down.T


def tp_numpy(x_r, w_gu, w_dn, allgather, reduce_scatter) -> np.ndarray:
    """One rank's rows of y, rounding where the fused ops round (bf16 out of each GEMM and of the
    elementwise step); the collectives are passed in (MPI, or a loop over ranks in one process)."""
    x = allgather(x_r.astype(np.float32))                                      # (m, d)
    gu = (x @ w_gu.astype(np.float32).T).astype(BF16)                          # (m, 2f/W)
    h = silu_mul(gu).astype(BF16)                                              # (m, f/W)
    part = (h.astype(np.float32) @ w_dn.astype(np.float32).T).astype(BF16)     # (m, d), bf16 partials
    return reduce_scatter(part.astype(np.float32)).astype(BF16)                # (m/W, d)


def run_numpy(comm, x_r, w_gu, w_dn) -> dict:
    from mpi4py import MPI

    W = comm.Get_size()

    def allgather(a):
        out = np.empty((W * a.shape[0], a.shape[1]), np.float32)
        comm.Allgather(a, out)
        return out

    def reduce_scatter(a):
        out = np.empty((a.shape[0] // W, a.shape[1]), np.float32)
        comm.Reduce_scatter_block(a, out, op=MPI.SUM)
        return out

    comm.Barrier()
    t0 = time.perf_counter()
    y = tp_numpy(x_r, w_gu, w_dn, allgather, reduce_scatter)
    return {"y": y.astype(np.float32), "ms": 1e3 * (time.perf_counter() - t0)}


def run_rawflux(comm, x_r, w_gu, w_dn, iters: int) -> dict:
    import cupy as cp

    import rawflux

    group = rawflux.init(comm)
    dev = lambda a: cp.asarray(a.view(np.uint16)).view(BF16)  # noqa: E731  host bf16 -> device, through its bits
    x, gu_w, dn_w = dev(x_r), dev(w_gu), dev(w_dn)
    f_loc = w_dn.shape[1]

    def silu_mul_dev(gu):
        # bf16 <-> f32 through the bits: no reliance on CuPy's bf16 arithmetic
        bits = gu.view(cp.uint16)
        g, u = ((bits[:, s].astype(cp.uint32) << 16).view(cp.float32) for s in (slice(0, f_loc), slice(f_loc, None)))
        w = (g / (1 + cp.exp(-g)) * u).view(cp.uint32)
        return ((w + cp.uint32(0x7FFF) + ((w >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16).view(BF16)

    def fused():
        gu = rawflux.ag_gemm(x, gu_w, group)       # (m, 2f/W) = AllGather(x) @ [gate_r; up_r].T
        return rawflux.gemm_rs(silu_mul_dev(gu), dn_w, group)   # (m/W, d): rows r of sum_q h_q @ down_q.T

    def baseline():
        gu = rawflux.baseline.ag_gemm(x, gu_w, group)            # the collective, then cuBLAS
        return rawflux.baseline.gemm_rs(silu_mul_dev(gu), dn_w, group)

    def ms(fn):
        fn()
        cp.cuda.get_current_stream().synchronize()
        comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(iters):
            fn()
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / iters

    host = lambda a: cp.asnumpy(a.view(cp.uint16)).view(BF16).astype(np.float32)  # noqa: E731
    name = cp.cuda.runtime.getDeviceProperties(group.device_id)["name"]
    res = {"y": host(fused()), "y_base": host(baseline()), "ms": ms(fused), "ms_base": ms(baseline),
           "emulated": rawflux.env.emulated_node(), "gpu": name.decode() if isinstance(name, bytes) else str(name)}
    rawflux.finalize()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for rank<r>.npz")
    ap.add_argument("--backend", choices=("rawflux", "numpy"), default="rawflux")
    ap.add_argument("--shape", default="512,1024,2816", help="m,d,f: tokens, model width, MLP width (default 512,1024,2816)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls (rawflux)")
    args = ap.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    r, W = comm.Get_rank(), comm.Get_size()
    m, d, f = (int(v) for v in args.shape.split(","))
    if m % W or f % W:
        raise SystemExit(f"tp_mlp: m={m} and f={f} must divide over {W} ranks")
    x = inputs(m, d)
    w_gu, w_dn = shard(weights(d, f), r, W)
    x_r = x[r * m // W:(r + 1) * m // W]
    if r == 0:
        print(f"tp_mlp: {W} ranks, backend {args.backend}, m={m} d={d} f={f}: x shard {x_r.shape}, "
              f"gate|up shard {w_gu.shape}, down shard {w_dn.shape}", flush=True)
    res = run_numpy(comm, x_r, w_gu, w_dn) if args.backend == "numpy" else run_rawflux(comm, x_r, w_gu, w_dn, args.iters)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"rank{r}.npz", rank=r, world=W, backend=args.backend, shape=(m, d, f), **res)
    lines = comm.gather(f"rank {r}: y rows {r * m // W}..{(r + 1) * m // W - 1}, {res['ms']:.3f} ms"
                        + (f" fused, {res['ms_base']:.3f} ms non-overlapped" if "ms_base" in res else ""), root=0)
    if r == 0:
        print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
