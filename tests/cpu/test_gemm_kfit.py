"""benchmarks/tools/gemm_kfit.py: the per-k-block / per-tile split of a GEMM's time; gemm_clocks.py's
nvidia-smi reader."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gemm_kfit", ROOT / "benchmarks" / "tools" / "gemm_kfit.py")
kf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kf)


def test_fit_recovers_slope_and_intercept_from_noisy_points():
    rng = random.Random(1234)
    slope, icpt = rng.uniform(0.5, 0.8), rng.uniform(0.5, 2.0)
    xs = [16, 32, 64, 128, 256]
    pts = [(x, slope * x + icpt + rng.uniform(-1e-3, 1e-3)) for x in xs]
    s, c = kf.fit(pts)
    assert s == pytest.approx(slope, abs=1e-4)
    assert c == pytest.approx(icpt, abs=0.02)
    # Exact points give the line back exactly (to rounding), and a different line gives a different fit.
    s2, c2 = kf.fit([(x, 2.0 * x - 3.0) for x in xs])
    assert (s2, c2) == (pytest.approx(2.0), pytest.approx(-3.0))


def test_fit_needs_two_distinct_x():
    with pytest.raises(ValueError):
        kf.fit([(64, 1.0)])
    with pytest.raises(ValueError):
        kf.fit([(64, 1.0), (64, 2.0)])


@pytest.mark.parametrize("m,n,bm,bn,sms,want", [(4096, 8192, 128, 256, 132, 8), (4096, 12288, 128, 256, 132, 12),
                                                (4096, 8192, 128, 256, 128, 8), (1000, 8192, 128, 256, 132, 2)])
def test_waves(m, n, bm, bn, sms, want):
    assert kf.waves(m, n, bm, bn, sms) == want


def test_clock_probe_parses_nvidia_smi_lines():
    spec2 = importlib.util.spec_from_file_location("gemm_clocks", ROOT / "benchmarks" / "tools" / "gemm_clocks.py")
    gcl = importlib.util.module_from_spec(spec2)
    spec2.loader.exec_module(gcl)
    text = ("2026/11/30 05:20:17.123, 1485 MHz, 689.52 W, 0x0000000000000004\n"
            "garbage line\n"
            "2026/11/30 05:20:17.173, 1470 MHz, 691.00 W, 0x0000000000000000\n")
    got = gcl.parse_smi(text)
    assert [(mhz, w, r) for _, mhz, w, r in got] == [(1485.0, 689.52, "0x0000000000000004"), (1470.0, 691.0, "0x0000000000000000")]
    assert got[1][0] - got[0][0] == pytest.approx(0.05, abs=1e-6)
