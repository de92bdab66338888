"""The memory-bound kernels' launches follow the device description (bandwidth, compute units),
not one card: fake descriptions of an H100, an H200 and an A100, no GPU needed."""

from __future__ import annotations

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo, MemorySystem
from kdbkit.runtime.primitives import streaming
from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem
from kdbkit.runtime.primitives.activation.solvers.packed import ActivPacked, light_groups_per_unit
from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem
from kdbkit.runtime.primitives.tensorop.solvers.packed import OpTensorPacked
from kdbkit.runtime.primitives.tensorop.solvers.packed import groups_per_unit as add_groups_per_unit
from kdbkit.runtime.solver import Context
from kdbkit.runtime.tensor import DataType


def card(name: str, target: str, clock_khz: int, bus_bits: int, l2_mib: int) -> DeviceInfo:
    """A description as the CUDA backend makes it, with the memory clock and bus width the driver
    reports for that card."""
    return DeviceInfo("cuda", 0, name, Target.parse(target), 80 << 30,
                      memory=MemorySystem.from_clock(clock_khz, bus_bits, l2_mib << 20, 2048))


H100 = card("NVIDIA H100 80GB HBM3", "sm_90_132", 2_619_000, 5120, 50)
H200 = card("NVIDIA H200", "sm_90_132", 3_201_000, 6016, 60)
A100 = card("NVIDIA A100-SXM4-80GB", "sm_80_108", 1_593_000, 5120, 40)
UNKNOWN = DeviceInfo("opencl", 0, "pthread-AMD EPYC", Target("opencl", "ocl-0123456789ab", (), 16), 32 << 30)


def test_bandwidth_per_unit():
    assert streaming.unit_bytes_per_ns(H100) == pytest.approx(3352.3 / 132, rel=1e-3)
    assert streaming.unit_bytes_per_ns(H200) == pytest.approx(4814.6 / 132, rel=1e-3)
    assert streaming.unit_bytes_per_ns(UNKNOWN) == 0.0


def test_groups_in_flight_follow_the_bandwidth_per_unit():
    # Little's law: a unit with 1.44x the bytes per ns needs 1.44x the groups in flight.
    h100, h200 = (streaming.groups_in_flight(d, 4096, 2200) for d in (H100, H200))
    assert (h100, h200) == (14, 20)
    assert streaming.groups_in_flight(A100, 4096, 2200) < h100  # less bandwidth per unit
    assert streaming.groups_in_flight(H100, 4096, 1) == 1  # at least one
    assert streaming.groups_in_flight(UNKNOWN, 4096, 2200) is None  # no bandwidth: no cap


def test_the_element_wise_kernels_cap_below_full_occupancy_only_where_that_is_enough():
    # The H100's measured best (14 groups of 128 for relu, 6 of 256 for add) follows from its
    # bandwidth; the H200 needs more in flight than a multiprocessor's 2048 threads hold.
    assert light_groups_per_unit(H100) == 14 and add_groups_per_unit(H100) == 6
    assert light_groups_per_unit(H200) * 128 > 2048 and add_groups_per_unit(H200) * 256 > 2048
    assert light_groups_per_unit(UNKNOWN) is None and add_groups_per_unit(UNKNOWN) is None


class _Recorder:
    """A backend that records launchers and answers the occupancy calculator as a Hopper
    multiprocessor would for a small kernel: 2048 threads, 227 KiB of shared memory."""

    capabilities = frozenset({"occupancy"})

    def __init__(self):
        self.launches = []

    def resident_groups(self, kernel, block: int, shared: int) -> int:
        return min(2048 // block, 32, (227 << 10) // (shared + 1024))

    def launcher(self, kernel, grid, block, args, shared_bytes=0, cooperative=False):
        self.launches.append((kernel, grid, block, shared_bytes))
        return lambda *buffers: None


class _Program:
    def function(self, name: str) -> str:
        return name


def launches(solver, problem, device) -> dict:
    backend = _Recorder()
    solver.solution(problem, device).invoker_factory([_Program()], Context(backend, device, None, None))
    return {kernel: (grid, block, shared) for kernel, grid, block, shared in backend.launches}


def residents(device, kernel_launch) -> int:
    _, (block, _, _), shared = kernel_launch
    return _Recorder().resident_groups(None, block, shared)


def test_relu_s_launch_follows_the_card():
    relu = ActivationProblem("fwd", ActivationMode.RELU, DataType.FP16, (1 << 26,), (1,), (1,))
    on = {name: launches(ActivPacked(), relu, d)["activ_fwd_vec_light"] for name, d in
          (("h100", H100), ("h200", H200), ("unknown", UNKNOWN))}
    assert residents(H100, on["h100"]) == 14  # capped by shared memory the kernel does not use
    assert on["h200"][2] == 0 and on["unknown"][2] == 0  # the H200 and an unknown card: full occupancy
    assert on["h100"][0] == on["h200"][0] == ((1 << 26) // 8 // 128, 1, 1)  # the covering grid alike


def test_tensor_add_s_launch_follows_the_card():
    shape, strides = (1 << 24,), (1,)
    add = TensorOpProblem("add", DataType.FP32, shape, strides, shape, strides, strides)
    h100, h200 = (launches(OpTensorPacked(), add, d)["op_tensor_vec"] for d in (H100, H200))
    assert residents(H100, h100) == 6 and h200[2] == 0


def test_the_batch_norm_meeting_costs_more_vectors_on_a_faster_memory():
    from kdbkit.runtime.primitives.batchnorm.solvers.persistent import ROUND_COST, round_cost, team_plan

    assert abs(round_cost(H100) - ROUND_COST) <= 8  # measured there
    assert round_cost(H200) > round_cost(H100) > round_cost(A100) and round_cost(UNKNOWN) == ROUND_COST

    def resident(chunk, members):  # 132 multiprocessors of 227 KiB, 4 groups each at most (registers)
        return 132 * min(4, 227 * 1024 // ((2 * chunk + members) * 16 + 1024))

    vectors = 32 * 112 * 112 // 8  # ResNet-50's first norm, fp16
    for device in (H100, H200):
        members, chunk, teams = team_plan(vectors, 64, resident, meeting=round_cost(device))
        assert members * chunk >= vectors and members * teams <= resident(chunk, members)
    # A meeting dear enough makes the plan take fewer rounds of channels (more, larger chunks).
    cheap, dear = (team_plan(vectors, 64, resident, meeting=m) for m in (1, 1 << 20))
    assert -(-64 // dear[2]) <= -(-64 // cheap[2])


def test_the_row_kernels_grid_follows_the_multiprocessor_count():
    from kdbkit.runtime.primitives.lanes import lanes_groups

    rows = 1 << 16
    assert lanes_groups(rows, 32, 132)[0] > lanes_groups(rows, 32, 108)[0]  # a persistent grid per unit
    assert lanes_groups(rows, 64, 132) == lanes_groups(rows, 64, 108)  # runs across warps: a group per row set
