"""Symmetric buffers when cudaMalloc sub-allocates (rawflux/dist/symm.py): an IPC handle opens to
the base of the block that holds the buffer, so each peer must add the owner's offset in that
block. A fake backend places every buffer at a non-zero offset in its block, and a scripted
second rank does the same; the peer table must point at the buffers, not at the blocks. Every
mapping is proven by the owner's stamp, read back through it: a driver that hides the
sub-allocation (reports the buffer as its own block) fails on every rank instead of aliasing."""
from __future__ import annotations

import struct

import pytest

from rawflux.dist import symm
from rawflux.dist.topology import DistError

BLOCK = 64 << 20


class SubAllocBackend:
    """Rank 0's CUDA stand-in: buffers sit `offset` bytes into blocks of BLOCK bytes; opening a
    handle maps the peer's block at a fresh base (what cudaIpcOpenMemHandle does)."""

    def __init__(self, offset: int, reported_offset: bool = True):
        self.offset = offset
        self.reported_offset = reported_offset  # False: address_range reports the buffer as its own block
        self.peer_blocks: dict[int, dict[int, bytes]] = {}  # mapped base -> the peer's writes by offset in its block
        self.peer_content: dict[int, bytes] = {}  # what the next opened block holds
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
        if not self.reported_offset:
            return ptr, BLOCK - self.offset
        return self.blocks[ptr], BLOCK

    def ipc_get(self, ptr):
        return f"block@{self.blocks[ptr]:#x}".encode()

    def ipc_open(self, handle):
        self.opened.append(handle)
        self.next_map += BLOCK
        self.peer_blocks[self.next_map] = dict(self.peer_content)
        return self.next_map

    def memcpy_dtoh(self, src, nbytes):
        for base, content in self.peer_blocks.items():
            if base <= src < base + BLOCK:
                return content.get(src - base, bytes(nbytes))
        raise AssertionError(f"read of {src:#x}: not a mapped peer block")

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


PEER_STAMP = symm.STAMP.pack(0x1234_5678_9ABC_DEF0, 1)


def _peer_answers(be, peer_offset: int, reported: int | None = None):
    """Rank 1: its buffer sits ``peer_offset`` into its block, and it reports ``reported`` (default:
    the true offset); its stamp is where symm.stamp_offset puts it."""
    def answer(mine):
        if len(mine) == 6:  # (nbytes, name, handle, offset, err, stamp): rank 1's own buffer
            n, name, _, _, _, _ = mine
            be.peer_content = {peer_offset + symm.stamp_offset(n): PEER_STAMP}
            return (n, name, b"rank1-block", peer_offset if reported is None else reported, None, PEER_STAMP)
        return mine  # collective_try's (value, error)

    return answer


@pytest.mark.parametrize("own_offset, peer_offset", [(0, 0), (0x400, 0x600), (0x200, 0)])
def test_peer_pointer_is_block_base_plus_offset(own_offset, peer_offset):
    be = SubAllocBackend(own_offset)
    g = Group(be, TwoRankMPI(_peer_answers(be, peer_offset)))
    buf = symm.allocate(g, 128, "meta")
    mapped = be.next_map  # where rank 1's block was opened
    assert buf.ptr == be.ptrs[0] and be.blocks[buf.ptr] == buf.ptr - own_offset
    assert buf.peer_ptrs == [buf.ptr, mapped + peer_offset]
    assert buf.peer_ptrs_dev == buf.peer_ptrs  # the device table kernels read
    assert be.opened == [b"rank1-block"]
    assert be.mallocs[0] == symm.ALLOC_BLOCK  # 128 bytes take a 2 MiB block of their own
    nonce, owner = symm.STAMP.unpack(be.tables[buf.ptr + symm.stamp_offset(128)])  # rank 0's stamp, past its 128 bytes
    assert owner == 0 and symm.stamp_offset(128) == symm.ALLOC_BLOCK - symm.STAMP.size
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


def test_stamp_offset_leaves_the_buffer_its_bytes():
    assert symm.stamp_offset(1) == symm.ALLOC_BLOCK - 16
    assert symm.stamp_offset(2 << 20) == (4 << 20) - 16  # a whole-block buffer gets one more block for its stamp
    assert all(symm.stamp_offset(n) >= n for n in (1, 100, (2 << 20) - 16, (2 << 20) - 15, 3 << 20))


@pytest.mark.parametrize("peer_offset, reported", [(0x600, 0), (0, 0x200), (0x400, 0x200)])
def test_a_mapping_that_misses_the_buffer_fails_on_every_rank(peer_offset, reported):
    """The driver reports another offset than the one rank 1's buffer has in its block (as if
    cuMemGetAddressRange gave the sub-allocation as its own range): the stamp read through the
    mapping is not rank 1's, so allocate raises, closes the mapping and frees its buffer."""
    be = SubAllocBackend(0x200)
    g = Group(be, TwoRankMPI(_peer_answers(be, peer_offset, reported)))
    with pytest.raises(DistError, match=r"rank 1's buffer 'meta' maps to other memory here"):
        symm.allocate(g, 128, "meta")
    assert be.closed == [be.next_map] and be.freed == [be.ptrs[0]]
