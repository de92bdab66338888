"""The device's memory system (bandwidth, L2, threads per unit) as each backend reads it, with
fake drivers: no GPU needed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kdbkit.runtime.backends import cuda, hip
from kdbkit.runtime.backends.base import MemorySystem


def test_bandwidth_from_the_memory_clock_and_bus_width():
    # What the drivers report for an H100 SXM (2619 MHz, 5120 bits) and an H200 (3201 MHz, 6144 bits)
    assert MemorySystem.from_clock(2_619_000, 5120).bandwidth_gbs == pytest.approx(3352.3, abs=0.1)
    assert MemorySystem.from_clock(3_201_000, 6144).bandwidth_gbs == pytest.approx(4916.7, abs=0.1)
    assert MemorySystem.from_clock(0, 6144, 50 << 20, 2048) == MemorySystem(0.0, 50 << 20, 2048)
    assert MemorySystem.from_clock(-1, -1, -1, -1) == MemorySystem()


class _FakeCudaDriver:
    """cuDeviceGetAttribute over a table; an attribute left out is missing from the enum."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0, CUDA_ERROR_INVALID_VALUE=1)

    def __init__(self, values: dict[str, int], refused: tuple[str, ...] = ()):
        self.values, self.refused = values, refused
        self.CUdevice_attribute = SimpleNamespace(**{f"CU_DEVICE_ATTRIBUTE_{k}": k for k in (*values, *refused)})

    def cuDeviceGetAttribute(self, attr, dev):
        if attr in self.refused:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE, 0)
        return (self.CUresult.CUDA_SUCCESS, self.values[attr])

    def cuGetErrorString(self, err):
        return (0, b"invalid value")


def test_cuda_reads_the_memory_system_from_the_driver():
    driver = _FakeCudaDriver({"MEMORY_CLOCK_RATE": 3_201_000, "GLOBAL_MEMORY_BUS_WIDTH": 6144,
                              "L2_CACHE_SIZE": 50 << 20, "MAX_THREADS_PER_MULTIPROCESSOR": 2048})
    facts = cuda.memory_system(driver, 0)
    assert facts.bandwidth_gbs == pytest.approx(4916.7, abs=0.1)
    assert (facts.l2_bytes, facts.threads_per_unit) == (50 << 20, 2048)


def test_cuda_counts_a_missing_or_refused_attribute_as_unknown():
    # A newer CUDA without the memory clock, and a driver that refuses the bus width: no bandwidth.
    driver = _FakeCudaDriver({"L2_CACHE_SIZE": 40 << 20, "MAX_THREADS_PER_MULTIPROCESSOR": 2048},
                             refused=("GLOBAL_MEMORY_BUS_WIDTH",))
    facts = cuda.memory_system(driver, 0)
    assert facts == MemorySystem(0.0, 40 << 20, 2048)


def test_hip_reads_the_device_properties():
    # An MI300X's properties: its HBM3 moves four transfers a reported clock, so the two-edge
    # formula gives half its datasheet rate; the launches only compare cards of one vendor.
    mi300x = SimpleNamespace(memoryClockRate=1_300_000, memoryBusWidth=8192, l2CacheSize=4 << 20,
                             maxThreadsPerMultiProcessor=2048)
    facts = hip._memory_system(mi300x)
    assert facts.bandwidth_gbs == pytest.approx(2662.4, abs=0.1) and facts.l2_bytes == 4 << 20
    assert hip._memory_system(SimpleNamespace()) == MemorySystem()  # an older hip-python without the fields
