"""The tile of the row kernels that share a row among a run of lanes (softmax, layer norm).

A row of whole 16-byte vectors is read once into registers by ``lanes`` threads (a power of
two up to the group's BLOCK), each keeping up to LANES_VECS vectors (as floats: at most 64 per
thread, so that registers do not spill); the kernels reduce across
the run with shuffles, or shared memory where the backend has none (kernels/kdb_reduce.h).
"""

from __future__ import annotations

BLOCK = 256  # the kernel files' default -DBLOCK: threads per group
# Vectors per thread kept in registers (the kernels' LANES_VECS): 4 is the files' default, so
# short and medium rows share the program of the primitive's other solvers.
SHORT, LONG = 4, 8
MAX_VECTORS = BLOCK * LONG


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def lanes_tile(vectors: int) -> tuple[int, int]:
    """(LANES_VECS, lanes) for rows of ``vectors`` vectors: two per thread up to a warp per row,
    then up to four per thread over more lanes, then the long-row program."""
    if vectors <= 32 * 2:
        return SHORT, min(32, _pow2(-(-vectors // 2)))
    if vectors <= BLOCK * SHORT:
        return SHORT, _pow2(-(-vectors // SHORT))
    return LONG, _pow2(-(-vectors // LONG))


def lanes_options(vectors: int) -> tuple[str, ...]:
    """The compile options the tile adds (none for the default)."""
    per_thread, _ = lanes_tile(vectors)
    return () if per_thread == SHORT else (f"-DLANES_VECS={per_thread}",)


GROUPS_PER_UNIT = 8  # the grid: at most this many groups per multiprocessor


def lanes_groups(rows: int, lanes: int, units: int | None = None) -> tuple[int, int, int]:
    """The grid: BLOCK // lanes rows per group, at most GROUPS_PER_UNIT groups per compute unit
    (``units``: the device's count; 132, an H100's, when unknown), so that each group takes
    several rows and the kernels' read of the next row overlaps the current one's work; runs
    wider than a warp keep a group per row set."""
    needed = -(-rows // (BLOCK // lanes))
    if lanes > 32:  # runs across warps reduce through barriers: separate groups per row measured faster
        return (max(1, min(needed, 65535)), 1, 1)
    return (max(1, min(needed, GROUPS_PER_UNIT * (units or 132), 65535)), 1, 1)
