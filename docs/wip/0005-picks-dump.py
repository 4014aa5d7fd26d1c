"""docs/wip/0005: dump the time model's picks (tune.heuristic and gemm_rs.choose_config) over a grid,
as JSON, so two trees' picks can be compared: run it before and after `git apply
docs/wip/0005-model-pull80.patch` and diff the two files (0005-picks-moved.txt is that diff at
e148694). CPU only: the H200's SM count is given, not read."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rawflux import tune  # noqa: E402
from rawflux.ops import gemm_rs  # noqa: E402

dev = tune.DeviceInfo(sms=132, cc=(9, 0), l2_bytes=60 << 20)
out = {}
shapes = ((6144, 12288), (12288, 6144), (8192, 8192), (28672, 8192), (8192, 28672), (4096, 4096), (1536, 6144), (3072, 1024))
for m in (1, 16, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384):
    for n, k in shapes:
        for lay in ("nk", "kn"):
            out[f"gemm {m} {n} {k} {lay}"] = tune.heuristic(m, n, k, lay, dev).tag()
            for part in (4, 2):
                out[f"rs {m} {n} {k} {lay} p{part}"] = gemm_rs.choose_config(m, n, k, lay, dev, 128, part).tag()
json.dump(out, open(sys.argv[1], "w"), indent=0)
print(len(out), "picks")
