"""Python ports of the GEMM engine's tile scheduler (cuda_src/rawflux/gemm/scheduler.cuh), shared by
the CPU tests that reason about which CTA tile a work unit is (test_gemm_rs_cpu, test_stream_k)."""
from __future__ import annotations


from rawflux.tune import raster  # TileSchedT's grouped order, ported once (the host plans narrow columns with it)

__all__ = ["raster"]
