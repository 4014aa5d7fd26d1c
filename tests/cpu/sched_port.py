"""Python ports of the GEMM engine's tile scheduler (cuda_src/rawflux/gemm/scheduler.cuh), shared by
the CPU tests that reason about which CTA tile a work unit is (test_gemm_rs_cpu, test_stream_k)."""
from __future__ import annotations


def raster(cu: int, ctm: int, ctn: int, group: int, raster_n: bool = False) -> tuple[int, int]:
    """TileSchedT's grouped order: cluster tile `cu` of ctm x ctn -> (cluster row, cluster column).
    `group` tile-rows side by side walked along n, or with raster_n `group` tile-columns walked
    along m (the kernel's two branches, one with the dimensions swapped)."""
    rows, cols = (ctn, ctm) if raster_n else (ctm, ctn)
    per_group = group * cols
    g = cu // per_group
    first = g * group
    gsize = min(rows - first, group)
    r = cu - g * per_group
    major, minor = first + r % gsize, r // gsize
    return (minor, major) if raster_n else (major, minor)
