# session 25: which cuTensorMapEncodeTiled parameters set which bits of the descriptor's word at byte 8
import ctypes, struct
import cupy
from cuda.bindings import driver as drv
cupy.cuda.Device(0).use()
buf = cupy.empty((4096, 6144), dtype=cupy.uint16)
ptr = buf.data.ptr
def enc(rank=2, promo=3, oob=0, swz=3, inter=0, dtype=9):
    dims = [6144, 4096] + ([1] if rank == 3 else [])
    strides = [6144 * 2] + ([6144 * 2 * 4096] if rank == 3 else [])
    box = [64, 128] + ([1] if rank == 3 else [])
    err, tm = drv.cuTensorMapEncodeTiled(drv.CUtensorMapDataType(dtype), rank, ptr, [drv.cuuint64_t(d) for d in dims],
        [drv.cuuint64_t(s) for s in strides], [drv.cuuint32_t(b) for b in box], [drv.cuuint32_t(1)] * rank,
        drv.CUtensorMapInterleave(inter), drv.CUtensorMapSwizzle(swz), drv.CUtensorMapL2promotion(promo), drv.CUtensorMapFloatOOBfill(oob))
    if err != drv.CUresult.CUDA_SUCCESS:
        return f"err {err.name}"
    raw = ctypes.string_at(int(tm.getPtr()), 128)
    w8, w12 = struct.unpack_from("<II", raw, 8)
    return f"w8={w8:#010x} w12={w12:#x} b16={raw[16:32].hex()} b32={raw[32:64].hex()} b64={raw[64:80].hex()}"
print("base rank2 promo256 oob0 swz128:", enc())
for promo in range(4):
    print(f"promo {promo}:", enc(promo=promo))
print("oob 1 (nan):", enc(oob=1))
print("rank 3:", enc(rank=3))
print("rank 3 promo 128B:", enc(rank=3, promo=2))
print("rank 3 promo 128B oob1:", enc(rank=3, promo=2, oob=1))
for swz in range(4):
    print(f"swizzle {swz}:", enc(swz=swz))
print("dtype f16 (6):", enc(dtype=6))
