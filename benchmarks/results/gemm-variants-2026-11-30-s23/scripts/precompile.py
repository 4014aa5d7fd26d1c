"""Compile (into the JIT cache) the bf16 plain-GEMM kernels of every tile, nk and kn, under this process's RAWFLUX_NVRTC_DEFINES."""
import sys
from concurrent.futures import ProcessPoolExecutor
from rawflux import tune
from rawflux.jit import compile_cubin, kernel_source
from rawflux.ops.gemm import PLAIN_SCHED, kernel_name, plain_epilogue
from rawflux.runtime.dtypes import DType

def one(n):
    compile_cubin(kernel_source("gemm.cu"), arch="sm_90a", name_expressions=(n,), filename="gemm.cu")
    return n

if __name__ == "__main__":
    names = [kernel_name(t, DType.BF16, DType.BF16, lay, sched=PLAIN_SCHED, epilogue=plain_epilogue(DType.BF16))
             for t in (*tune.TILES, *tune.KSPLIT_TILES) for lay in ("nk", "kn") if t.supports(lay)]
    with ProcessPoolExecutor(int(sys.argv[1]) if len(sys.argv) > 1 else 8) as ex:
        print(len(list(ex.map(one, names))), "kernels compiled")
