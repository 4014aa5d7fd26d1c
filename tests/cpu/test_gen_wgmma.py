"""cuda_src/rawflux/ptx/wgmma.cuh is generated: the generator beside it must reproduce it exactly
(a hand edit to the header would be lost at the next regeneration)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

PTX = Path(__file__).resolve().parents[2] / "cuda_src" / "rawflux" / "ptx"


def test_generator_reproduces_wgmma_cuh():
    spec = importlib.util.spec_from_file_location("gen_wgmma", PTX / "gen_wgmma.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.render() == (PTX / "wgmma.cuh").read_text(), "wgmma.cuh differs from gen_wgmma.py's output: edit the generator and rerun it"
