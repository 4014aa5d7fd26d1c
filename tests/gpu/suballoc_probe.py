"""Does cudaMalloc sub-allocate small buffers on this machine? Six allocations of each size, each
shown as (offset from its block's base / block size) by cuMemGetAddressRange. rawflux's symmetric
buffers no longer depend on the answer (rawflux/dist/symm.py sends the offset and takes whole
2 MiB blocks), but a false CallMismatch once seen at world 2 fits sub-allocation, so
`launch/gpu_suite.sh env` records it on every loan."""
from __future__ import annotations


def main() -> int:
    import cupy
    from cuda.bindings import driver

    cupy.cuda.Device(0).use()
    rt = cupy.cuda.runtime
    shared = False
    for size in (128, 4096, 65536, 1 << 20, 2 << 20):
        ptrs = [rt.malloc(size) for _ in range(6)]
        rows = []
        for p in ptrs:
            err, base, block = driver.cuMemGetAddressRange(p)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuMemGetAddressRange: {err.name}")
            rows.append(f"{int(p) - int(base):#x}/{int(block):#x}")
            shared |= int(p) != int(base)
        print(f"cudaMalloc({size}) x6: offset/block = {' '.join(rows)}")
        for p in ptrs:
            rt.free(p)
    print("sub-allocation: " + ("YES (small buffers share blocks here)" if shared else "none seen"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
