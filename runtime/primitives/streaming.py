"""Launch shapes of the memory-bound kernels, derived from the device's memory system.

A kernel that streams through device memory runs at the memory's speed only while enough bytes
are in flight to cover the memory's latency at its bandwidth (Little's law: bytes in flight =
bandwidth x the time a request is in flight). Per compute unit that is the unit's share of the
bandwidth times that time, so the groups a unit must hold follow from the device: cards of one
target share binaries but not bandwidth (an H100 and an H200 are both ``sm_90_132``, and the
second's memory is nearly half as fast again), so only run-time choices (how many groups share a unit, how large a persistent
grid is, how a cooperative kernel splits its work) can follow the card. Each kernel states what
one of its groups moves per step and how long the step's bytes stay in flight (``step_ns``);
``step_ns`` is a property of the kernel, not of the card, measured once (docs/performance.md,
"Memory-bound kernels on every card").

Where the backend cannot tell the bandwidth (OpenCL, a driver without the attributes), every
function here returns the device-neutral choice: no residency cap, the grid of the kernel's
default.
"""

from __future__ import annotations

import math

from kdbkit.runtime.backends.base import DeviceInfo

VECTOR_BYTES = 16  # the streaming kernels' access: one 16-byte vector per thread and load


def unit_bytes_per_ns(device: DeviceInfo) -> float:
    """The device's peak memory bandwidth per compute unit, in bytes per ns (GB/s per unit);
    0.0 where the bandwidth or the unit count is unknown."""
    units = device.target.cu or 0
    bandwidth = device.memory.bandwidth_gbs
    return bandwidth / units if units > 0 and bandwidth > 0 else 0.0


def groups_in_flight(device: DeviceInfo, group_bytes: int, step_ns: float) -> int | None:
    """How many groups a compute unit must hold so that its share of the bandwidth is in
    flight: ``ceil(unit_bytes_per_ns x step_ns / group_bytes)``, at least 1.

    Args:
        device: the device (its bandwidth and compute units).
        group_bytes: the bytes one group reads and writes in one step (a covering grid's group:
            all it moves).
        step_ns: how long a step's bytes stay in flight, the kernel's own property.

    Returns:
        The groups per compute unit, for :func:`kdbkit.runtime.solver.residency_cap` (which
        leaves occupancy alone where the unit holds no more than that anyway); ``None`` where
        the bandwidth is unknown: no cap.
    """
    rate = unit_bytes_per_ns(device)
    if rate <= 0:
        return None
    return max(1, math.ceil(rate * step_ns / group_bytes))

