"""rawflux.dist's CUDA side on the CPU (NVRTC, no GPU): the Python mirror of the control/status
layouts matches comm/ctrl.cuh, every dist kernel compiles for sm_90a and sm_80 with no spills,
and the primitives headers compile on their own (others include them in fused kernels)."""
from __future__ import annotations

import pytest

from rawflux.dist import layout
from rawflux.jit import compile_cubin, kernel_source

pytest.importorskip("cuda.bindings.nvrtc")

ARCHS = ("sm_90a", "sm_80")
KERNELS = ("rawflux::barrier_kernel", "rawflux::selftest_fill_kernel", "rawflux::selftest_verify_kernel",
           "rawflux::selftest_wait_kernel")


@pytest.mark.parametrize("arch", ARCHS)
def test_layout_matches_cuda(arch):
    compile_cubin(layout.cuda_layout_asserts(), arch=arch)


def test_layout_check_can_fail():
    broken = layout.cuda_layout_asserts().replace(
        f"late_mask) == {layout.STATUS_OFFSETS['late_mask']}", "late_mask) == 44")
    with pytest.raises(Exception, match="Status.late_mask"):
        compile_cubin(broken, arch="sm_90a")


@pytest.mark.parametrize("arch", ARCHS)
def test_dist_kernels_compile_without_spills(arch):
    res = compile_cubin(kernel_source("barrier.cu"), arch=arch, name_expressions=KERNELS, filename="barrier.cu")
    for name in KERNELS:
        r = res.resources[res.lowered[name]]
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0 and r["stack"] == 0, (name, r)
    assert "0 bytes gmem" in res.log or "bytes gmem" not in res.log  # no stray device globals


@pytest.mark.parametrize("arch", ARCHS)
def test_primitive_headers_compile_alone(arch):
    src = """
#include "rawflux/ptx/sync.cuh"
#include "rawflux/comm/signal.cuh"
#include "rawflux/comm/wait.cuh"
#include "rawflux/comm/barrier.cuh"
using namespace rawflux;
// A fused-kernel shaped use: wait for a peer's chunk, then signal a peer's flag.
__global__ void probe(const GroupCtrl* g, const u64* flag_table, u32 call_id, u32* out) {
  const WaitCtx c = make_wait_ctx(g, kOpAgGemm, call_id);
  const u32* my_flags = peer_ptr<u32>(flag_table, g->rank);
  if (!cta_wait_flag_geq(my_flags + blockIdx.x, call_id, c, (g->rank + 1) % g->world, blockIdx.x)) return;
  out[blockIdx.x] = ld_acquire_gpu_u32(my_flags) + static_cast<u32>(globaltimer_ns());
  fence_proxy_async();
  cta_signal_set(peer_ptr<u32>(flag_table, (g->rank + 1) % g->world, 4ull * blockIdx.x), call_id);
  if (threadIdx.x == 0) { signal_add(out + 1, 1u); fence_acq_rel_sys(); }
}
"""
    compile_cubin(src, arch=arch, name_expressions=("probe",))


def test_abort_word_names_both_ranks():
    from rawflux.dist.layout import describe_abort

    assert describe_abort(3).startswith("rank 2 gave up (")  # low half: rank + 1; no late rank known
    text = describe_abort(3 | (8 << 16))
    assert text.startswith("rank 2 gave up on rank 7 (") and "abort flag" in text
    assert describe_abort(0).startswith("another rank gave up")
