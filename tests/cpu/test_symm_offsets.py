"""Symmetric buffers when cudaMalloc sub-allocates (rawflux/dist/symm.py): an IPC handle opens to
the base of the block that holds the buffer, so each peer must add the owner's offset in that
block. A fake backend places every buffer at a non-zero offset in its block, and a scripted
second rank does the same; the peer table must point at the buffers, not at the blocks."""
from __future__ import annotations

import struct

import pytest

from rawflux.dist import symm
from rawflux.dist.topology import DistError

BLOCK = 64 << 20


class SubAllocBackend:
    """Rank 0's CUDA stand-in: buffers sit `offset` bytes into blocks of BLOCK bytes; opening a
    handle maps the peer's block at a fresh base (what cudaIpcOpenMemHandle does)."""

    def __init__(self, offset: int):
        self.offset = offset
        self.next_block = 0x7F00_0000_0000
        self.blocks: dict[int, int] = {}  # buffer ptr -> block base
        self.mallocs: list[int] = []
        self.ptrs: list[int] = []
        self.tables: dict[int, bytes] = {}
        self.opened: list[bytes] = []
        self.closed: list[int] = []
        self.freed: list[int] = []
        self.next_map = 0x7E00_0000_0000

    def malloc(self, nbytes):
        self.mallocs.append(nbytes)
        base = self.next_block
        self.next_block += BLOCK
        ptr = base + self.offset
        self.blocks[ptr] = base
        self.ptrs.append(ptr)
        return ptr

    def memset(self, ptr, value, nbytes):
        pass

    def address_range(self, ptr):
        return self.blocks[ptr], BLOCK

    def ipc_get(self, ptr):
        return f"block@{self.blocks[ptr]:#x}".encode()

    def ipc_open(self, handle):
        self.opened.append(handle)
        self.next_map += BLOCK
        return self.next_map

    def ipc_close(self, ptr):
        self.closed.append(ptr)

    def free(self, ptr):
        self.freed.append(ptr)

    def memcpy_htod(self, dst, data):
        self.tables[dst] = bytes(data)

    def device_u64_array(self, ptr, count, dev):
        return list(struct.unpack(f"<{count}Q", self.tables[ptr]))


class TwoRankMPI:
    """allgather as rank 0 of two, rank 1 answering with `peer(mine)`."""

    def __init__(self, peer):
        self.peer = peer

    def allgather(self, mine):
        return [mine, self.peer(mine)]


class Group:
    def __init__(self, be, mpi):
        self._backend, self._mpi, self.rank, self.world, self.device_id = be, mpi, 0, 2, 0

    def _exchange(self, key, value, what):
        return self._mpi.allgather(value)


def _peer_answers(peer_offset: int):
    def answer(mine):
        if len(mine) == 5:  # (nbytes, name, handle, offset, err): rank 1's own buffer
            n, name, _, _, _ = mine
            return (n, name, b"rank1-block", peer_offset, None)
        return mine  # collective_try's (value, error)

    return answer


@pytest.mark.parametrize("own_offset, peer_offset", [(0, 0), (0x400, 0x600), (0x200, 0)])
def test_peer_pointer_is_block_base_plus_offset(own_offset, peer_offset):
    be = SubAllocBackend(own_offset)
    g = Group(be, TwoRankMPI(_peer_answers(peer_offset)))
    buf = symm.allocate(g, 128, "meta")
    mapped = be.next_map  # where rank 1's block was opened
    assert buf.ptr == be.ptrs[0] and be.blocks[buf.ptr] == buf.ptr - own_offset
    assert buf.peer_ptrs == [buf.ptr, mapped + peer_offset]
    assert buf.peer_ptrs_dev == buf.peer_ptrs  # the device table kernels read
    assert be.opened == [b"rank1-block"]
    assert be.mallocs[0] == symm.ALLOC_BLOCK  # 128 bytes take a 2 MiB block of their own
    symm.close_mappings(be, buf)
    assert be.closed == [mapped]  # unmapped by the pointer the open returned, not + offset


def test_alloc_bytes_rounds_to_whole_blocks():
    assert [symm.alloc_bytes(n) for n in (1, 128, 2 << 20, (2 << 20) + 1)] == [2 << 20, 2 << 20, 2 << 20, 4 << 20]


def test_buffer_outside_its_block_fails_on_every_rank():
    class Bad(SubAllocBackend):
        def address_range(self, ptr):
            return self.blocks[ptr], 64  # a block smaller than the buffer: the driver lied

    be = Bad(0x40)
    g = Group(be, TwoRankMPI(lambda mine: mine))  # rank 1 reports the same error
    with pytest.raises(DistError, match="not inside its block"):
        symm.allocate(g, 128, "meta")
    assert be.freed == [be.ptrs[0]]
