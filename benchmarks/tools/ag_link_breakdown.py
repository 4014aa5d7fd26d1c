"""Where the emulated-link call's time goes over the tax (one GPU, rawflux/bench/ag_local.py):
per point, the medians of (1) the tax on its config (every SM), (2) the tax on the link's config
(one SM fewer), (3) ag_local alone (epoch and the own edge rows' copy), (4) the link call with arrivals
at once (G = 1e7 GB/s), (5) the link call at G, (6) (4) and (7) (5) on the tax's config (the GEMM
on every SM beside the emulator's CTA). Diagnostic: prints, writes nothing.

    PYTHONPATH=. python benchmarks/tools/ag_link_breakdown.py [--points W:shape:m,...] [--reps 20]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fusion_tax import AG_SHAPES, _ag_point  # noqa: E402
from gemm import bench_many  # noqa: E402


def main() -> int:
    import rawflux
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default="2:gpt3.mlp_up:4096,2:llama70b.gate_up:1024,8:llama70b.gate_up:1024,8:gpt3.mlp_up:4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gbps", type=float, default=370.0)
    args = ap.parse_args()
    shapes = {s[0]: s for s in AG_SHAPES}
    for p in args.points.split(","):
        W, name, m = p.split(":")
        W, m = int(W), int(m)
        _, n_all, k = shapes[name]
        n = n_all // W
        ag, gath, shard, nsets, b, out = _ag_point(W, m, n, k)
        full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        s = torch.cuda.current_stream().cuda_stream
        c_tax, c_link = ag.config(m), ag.config(m, link=True)
        sl = ag.slabs(m, c_link)
        m_loc = m // W
        pitch = shard.stride(0) * 2
        rec = ag._record
        G = args.gbps
        fns = {
            "gemm": lambda i: rawflux.gemm(gath, b[i], out=full, stream=s),
            "tax": lambda i: ag.tax(b[i], out, m, s, c_tax),
            "tax_linkcfg": lambda i: ag.tax(b[i], out, m, s, c_link, slabs=sl),
            "local_only": lambda i: ag.op._launch_local(s, shard.data_ptr(), pitch, m_loc, rec, flags=0, edges=ag.op._edges(m_loc, c_link, False)),
            "link_instant": lambda i: ag.link(shard, b[i], out, m, 1e7, s, c_link, slabs=sl),
            "link": lambda i: ag.link(shard, b[i], out, m, G, s, c_link, slabs=sl),
            "link_instant_p0": lambda i: ag.link(shard, b[i], out, m, 1e7, s, c_tax, slabs=sl),
            "link_p0": lambda i: ag.link(shard, b[i], out, m, G, s, c_tax, slabs=sl),
        }
        t = dict(zip(fns, bench_many(list(fns.values()), nsets, args.reps)))
        torch.cuda.synchronize()
        g = t["gemm"]
        print(f"breakdown W={W} {name} m={m} S={sl} tax {c_tax.tag()} link {c_link.tag()}: " +
              ", ".join(f"{key} {v * 1e3:.1f} us ({v / g:.3f})" for key, v in t.items()), flush=True)
        print(f"  failed={ag.failed()}", flush=True)
        del ag, gath, shard, b, out, full
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
