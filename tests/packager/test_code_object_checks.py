"""AMD code-object checks on real clang-19 builds: every kernel passes on every target, each fault is caught.

kdbkit's kernels and the dialect kernel are built for gfx90a, gfx942, gfx1100 and gfx1201
once per module (16 compiles). The faults are built too, each verified to reach the code
object: an undefined symbol, an argument hip-python packs elsewhere, LDS over the limit
(clang-19 refuses that itself, so the limit is also checked on a code object whose
metadata is raised past it), a wave64 build for a wave32 processor, code object v4.
"""

from __future__ import annotations

import struct

import pytest

from kdbkit.kdb import Target
from kdbkit.kdb.arch import parse_arch
from kdbkit.packager.code_object_checks import check_code_object
from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.backends.amdgpu_code_object import packed_offsets, read_code_object
from kdbkit.runtime.compilers import AmdgcnClangCompiler
from kdbkit.runtime.compilers.amdgcn_clang import compile_amdgcn
from kdbkit.runtime.errors import BinaryLoadError, CompileError, CompilerUnavailableError
from kdbkit.runtime.kernel_sources import KernelSearchPath, kernels_dir, list_sources
from tests.prerequisites import require_amdgcn_clang
from tests.runtime.backends.code_object_builder import kernel_entry, kernel_symbols, make_code_object, metadata
from tests.runtime.conftest import compile_file, compile_text

from .test_dialect_coverage import DIALECT_DIR, DIALECT_KERNEL

ARCHS = ("gfx90a", "gfx942", "gfx1100", "gfx1201")
WAVE = {"gfx90a": 64, "gfx942": 64, "gfx1100": 32, "gfx1201": 32}
# Each arch is a clang build of every kernel: one in the fast loop, all of them in the full suite.
ARCH_CASES = [pytest.param(arch, marks=() if arch == "gfx942" else pytest.mark.slow) for arch in ARCHS]
needs_clang = pytest.mark.usefixtures("amdgcn_clang")  # skips without clang-19 (fails in CI)
SOURCES = [*list_sources(), DIALECT_KERNEL]
SEARCH_PATH = KernelSearchPath([DIALECT_DIR])  # the dialect kernel's folder, then kdbkit's kernels


def _build(source: str, arch: str, *options: str) -> bytes:
    return compile_file(Target.parse(arch), source, *options, compiler=AmdgcnClangCompiler(), search_path=SEARCH_PATH)


def _build_text(text: str, arch: str = "gfx942", *options: str) -> bytes:
    return compile_text(Target.parse(arch), text, *options, compiler=AmdgcnClangCompiler())


class _Builds(dict):
    """(source, arch) -> code object, built when first asked for."""

    def __missing__(self, key: tuple[str, str]) -> bytes:
        self[key] = _build(*key)
        return self[key]


@pytest.fixture(scope="module")
def builds() -> dict[tuple[str, str], bytes]:
    """(source, arch) -> code object, for every kernel and every arch the tests run."""
    require_amdgcn_clang()
    return _Builds()


# ---------------------------------------------------------------- every kernel, every target


@needs_clang
@pytest.mark.parametrize("arch", ARCH_CASES)
@pytest.mark.parametrize("source", SOURCES)
def test_every_kernel_passes_on_every_target(builds, source, arch):
    blob = builds[source, arch]
    assert check_code_object(blob, arch) == []
    co = read_code_object(blob)
    assert (co.arch, co.code_object_version, co.undefined_symbols) == (arch, 5, ())
    assert co.kernels
    for name, kernel in co.kernels.items():
        assert {name, f"{name}.kd"} <= set(co.defined_symbols) and kernel.symbol == f"{name}.kd"
        assert kernel.wavefront_size == WAVE[arch] == parse_arch(arch).wave_size
        explicit = kernel.explicit_args
        assert [a.offset for a in explicit] == packed_offsets([a.size for a in explicit])


EXPECTED_LAYOUTS = {
    # kernel: explicit (offset, size); pointers 8 bytes, int and float 4
    "relu_fwd": [(0, 8), (8, 8), (16, 4)],
    "leaky_relu_fwd": [(0, 8), (8, 8), (16, 4), (20, 4)],  # ptr, ptr, int, float
    "reduce_sum": [(0, 8), (8, 8), (16, 4)],
    "sgemm_tiled": [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4), (36, 4), (40, 4)],
    "dialect_everything": [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4), (32, 4)],
    # activ.c: pointers, then n (and 4 sizes, 2 x 5 strides when strided), mode, alpha, beta, gamma
    "activ_fwd_packed": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(5))],
    "activ_bwd_packed": [(0, 8), (8, 8), (16, 8), (24, 8), *((32 + 4 * i, 4) for i in range(5))],
    "activ_fwd_strided": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(19))],
    "activ_bwd_strided": [(0, 8), (8, 8), (16, 8), (24, 8), *((32 + 4 * i, 4) for i in range(19))],
    "activ_fwd_vec": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(5))],
    "activ_fwd_vec_light": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(5))],
    "activ_bwd_vec": [(0, 8), (8, 8), (16, 8), (24, 8), *((32 + 4 * i, 4) for i in range(5))],
    # softmax.c: pointers, then N, C, H, W, channel mode, 2 x 4 strides, algorithm, alpha, beta
    **{f"softmax_fwd_{k}": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(16))]
       for k in ("block", "thread", "rows", "block_even")},
    **{f"softmax_bwd_{k}": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(16))]
       for k in ("block", "thread")},
    # the lanes kernels take the run's width last
    "softmax_fwd_lanes": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(17))],
    "softmax_bwd_lanes": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(17))],
    # tensorop.c: three pointers, then n (and 4 sizes, 3 x 5 strides when strided), op, alpha1, alpha2, beta
    "op_tensor_packed": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(5))],
    "op_tensor_strided": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(24))],
    "op_tensor_vec": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(5))],
    "op_tensor_rows": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(21))],
    # layernorm.c: pointers, then rows, inner (affine, eps / affine)
    "layernorm_fwd": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(4))],
    "layernorm_fwd_lanes": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(5))],
    "layernorm_bwd_data": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(3))],
    "layernorm_bwd_weight": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(2))],
    # pooling.c: three pointers, 12 geometry ints, 2 x 4 strides, mode (and save_indices)
    "pool_fwd": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(22))],
    "pool_fwd_small": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(22))],
    "pool_fwd_band": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(24))],
    "pool_fwd_nhwc": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(23))],
    "pool_fwd_2d": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(22))],
    "pool_bwd": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(21))],
    # pool_strip.c: three pointers, 7 sizes (with the top pad), 2 x 4 strides, outputs per thread, mode, vec
    **{f"pool_strip_k{g}_{v}": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(18))]
       for g in ("3s2p1", "3s2p0", "2s2p0", "3s1p1") for v in ("max", "argmax", "avg")},
    # batchnorm.c: pointers, then N, C, H, W, spatial, 2 x 4 strides, eps (factor, update / use_saved)
    "bn_fwd_infer": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(14))],
    "bn_fwd_infer_planes": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(8))],
    "bn_fwd_infer_vec": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(8))],
    "bn_fwd_infer_plane_vec": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(7))],
    "bn_fwd_infer_rows": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(4))],
    "bn_fwd_infer_rows_vec": [*((8 * i, 8) for i in range(6)), *((48 + 4 * i, 4) for i in range(4))],
    "bn_train_partial": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(6))],
    "bn_train_partial_vec": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(6))],
    "bn_train_finalize": [*((8 * i, 8) for i in range(7)), *((56 + 4 * i, 4) for i in range(7))],
    "bn_fwd_train": [*((8 * i, 8) for i in range(8)), *((64 + 4 * i, 4) for i in range(16))],
    "bn_bwd": [*((8 * i, 8) for i in range(8)), *((64 + 4 * i, 4) for i in range(15))],
    # conv_direct.c: three tensors, then 16 sizes and 3 x 4 strides (CONV_SHAPE_ARGS)
    **{f"conv_{d}_direct": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(28))]
       for d in ("fwd", "bwd_data", "bwd_weights")},
    # conv_gemm.c: two tensors, CONV_SHAPE_ARGS, then (im2col, col2im) 5 long column strides and the order
    **{name: [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(28)), *((128 + 8 * i, 8) for i in range(5)), (168, 4)]
       for name in ("conv_im2col", "conv_col2im")},
    "conv_dy_by_channel": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(28))],
    # conv_igemm.c: three tensors, CONV_SHAPE_ARGS, cfast (forward and backward data: then the
    # partial sums), the slice length and count
    **{name: [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(29)), (144, 8), (152, 4), (156, 4)]
       for name in ("conv_fwd_igemm", "conv_bwd_data_igemm")},
    "conv_wrw_igemm": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(31))],
    "conv_igemm_wrw_finish": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(11))],  # K cg Y X G slices cfast, 4 strides
    # two tensors; N H W, the strides, cols, G, slices, out's 4 strides
    "conv_igemm_split_finish": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(12))],
    # conv_depthwise.c's backward weights: three tensors, CONV_SHAPE_ARGS, the order, the slice length
    "conv_dw_bwd_weights": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(30))],
    "conv_transpose": [(0, 8), (8, 8), (16, 4), (20, 4)],  # two tensors, rows, cols
    # conv_winograd.c: two tensors, then sizes and the tensor's 4 strides
    "wino_filter": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(7))],  # K C, 4 strides, flip
    "wino_input": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(12))],
    "wino_output": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(10))],
    # conv_bias.c: two tensors, N C H W, 4 strides
    **{name: [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(8))] for name in ("conv_bias_fwd", "conv_bias_bwd")},
    # its epilogue: y, scale, shift, res; has_scale, has_res, act, then N C H W and 4 strides
    # (general) or the element count, C and the elements between channels (dense)
    "conv_epilogue_fwd": [(0, 8), (8, 8), (16, 8), (24, 8), *((32 + 4 * i, 4) for i in range(11))],
    "conv_epilogue_dense": [(0, 8), (8, 8), (16, 8), (24, 8), *((32 + 4 * i, 4) for i in range(6))],
    # conv_depthwise.c: three tensors, CONV_SHAPE_ARGS, channels_fastest
    **{name: [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(29))] for name in ("conv_dw_fwd", "conv_dw_bwd_data")},
    # the depthwise forward's direct kernels: three tensors, the shape (28 ints), then: none (rows),
    # the vectors of channels a block takes (nhwc_vec), channels_fastest and the tile (tiled)
    "conv_dw_fwd_rows": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(28))],
    "conv_dw_fwd_nhwc_vec": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(29))],
    "conv_dw_fwd_tiled": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(32))],
    "conv_flip_weights": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(8))],  # two tensors, K C Y X, 4 strides
    "conv_pad_channels": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(9))],  # two tensors, N C H W Cp, 4 strides
    "conv_pad_channels_vec": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(9))],
    "conv_stem_fwd": [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(31))],  # CONV_SHAPE_ARGS, ROWS, COLS, vec_y
    # two tensors; K C Y X, 4 strides, pads, strides
    "conv_phase_weights": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(12))],
    # two tensors; N C H W Y X, pads, strides, dx's 4 strides, align
    "conv_phase_scatter": [(0, 8), (8, 8), *((16 + 4 * i, 4) for i in range(15))],
    # gemm.c: A, B, C; M, N, K, lda, ldb, ldc; three long batch strides; trans_a, trans_b, alpha, beta
    **{name: [(0, 8), (8, 8), (16, 8), *((24 + 4 * i, 4) for i in range(6)), (48, 8), (56, 8), (64, 8),
              *((72 + 4 * i, 4) for i in range(4))] for name in ("gemm_tiled", "gemm_blocked")},
}
EXPECTED_LDS = {  # static LDS bytes at the default options
    "relu_fwd": 0, "leaky_relu_fwd": 0,
    "activ_fwd_packed": 0, "activ_bwd_packed": 0, "activ_fwd_strided": 0, "activ_bwd_strided": 0,
    "softmax_fwd_block": 256 * 4, "softmax_bwd_block": 256 * 4,  # BLOCK floats of scratch
    "activ_fwd_vec": 0, "activ_fwd_vec_light": 0, "activ_bwd_vec": 0, "op_tensor_vec": 0, "bn_fwd_infer_vec": 0, "bn_fwd_infer_plane_vec": 0,
    "bn_fwd_infer_rows": 0, "bn_fwd_infer_rows_vec": 0,
    "softmax_fwd_lanes": 256 * 4, "softmax_bwd_lanes": 256 * 4,  # scratch for runs wider than 32 lanes
    "softmax_fwd_thread": 0, "softmax_bwd_thread": 0, "softmax_fwd_rows": 256 * 4, "softmax_fwd_block_even": 256 * 4, "op_tensor_packed": 0, "op_tensor_strided": 0, "op_tensor_rows": 0,
    "layernorm_fwd": 256 * 4, "layernorm_fwd_lanes": 256 * 4, "layernorm_bwd_data": 256 * 4, "layernorm_bwd_weight": 0, "pool_fwd": 0, "pool_fwd_2d": 0, "pool_fwd_small": 0, "pool_fwd_band": 6144 * 4, "pool_bwd": 0,
    "pool_fwd_nhwc": 0,
    "bn_fwd_infer": 0, "bn_fwd_train": 256 * 4, "bn_bwd": 256 * 4, "bn_fwd_infer_planes": 0, "bn_train_partial": 256 * 4, "bn_train_partial_vec": 256 * 4, "bn_train_finalize": 0,
    "gemm_tiled": 2 * 16 * 17 * 4,  # two padded TILE x (TILE + 1) float tiles
    "conv_fwd_direct": 0, "conv_bwd_data_direct": 0, "conv_bwd_weights_direct": 256 * 4,  # CONV_WRW_BLOCK floats
    "conv_im2col": 0, "conv_col2im": 0, "conv_dy_by_channel": 0, "conv_transpose": 32 * 33 * 4, "conv_flip_weights": 0, "conv_pad_channels": 0, "conv_pad_channels_vec": 0, "conv_stem_fwd": (7680 + 192 * 16) * 4, "conv_phase_weights": 0, "conv_phase_scatter": 0, "conv_dw_fwd": 0, "conv_dw_bwd_data": 0, "conv_bias_fwd": 0, "wino_filter": 0, "wino_input": 0, "wino_output": 0,
    "conv_bias_bwd": 256 * 4, "conv_epilogue_fwd": 0, "conv_epilogue_dense": 0,
    # the double-buffered tiles, then the result rows' offsets (IG_EPILOGUE)
    **{name: 2 * 2 * 8 * 132 * 4 + 128 * 8 for name in ("conv_fwd_igemm", "conv_bwd_data_igemm", "conv_wrw_igemm")},
    "conv_igemm_wrw_finish": 0,  # (two double-buffered 8 x 132 float tiles: A's and B's)
    "conv_igemm_split_finish": 0,
    "gemm_blocked": 2 * 2 * 8 * 132 * 4 + 128 * 8,
    "conv_dw_bwd_weights": 256 * 4,  # a float per thread for the tree
    "conv_dw_fwd_rows": 0,
    **{name: 8192 * 4 for name in ("conv_dw_fwd_tiled", "conv_dw_fwd_nhwc_vec")},  # CONV_DW_TILE_FLOATS
    "reduce_sum": 256 * 4,  # BLOCK floats
    "sgemm_tiled": 2 * 16 * 16 * 4,  # two TILE x TILE float tiles
    "dialect_everything": 64 * 4 + 4,  # BLOCK floats and one int
    **{f"pool_strip_k{g}_{v}": 0 for g in ("3s2p1", "3s2p0", "2s2p0", "3s1p1") for v in ("max", "argmax", "avg")},
}  # fmt: skip


@needs_clang
@pytest.mark.parametrize("arch", ARCH_CASES)
def test_argument_layouts_and_lds(builds, arch):
    kernels = {name: k for source in SOURCES for name, k in read_code_object(builds[source, arch]).kernels.items()}
    assert set(kernels) == set(EXPECTED_LAYOUTS)
    for name, kernel in kernels.items():
        assert [(a.offset, a.size) for a in kernel.explicit_args] == EXPECTED_LAYOUTS[name], name
        assert kernel.group_segment_fixed_size == EXPECTED_LDS[name], name
        assert kernel.kernarg_segment_size >= sum(EXPECTED_LAYOUTS[name][-1])


@needs_clang
@pytest.mark.parametrize("arch", ARCH_CASES)
def test_matmul_lds_follows_the_tile_option(builds, arch):
    lds = read_code_object(_build("matmul_tiled.c", arch, "-DTILE=8")).kernels["sgemm_tiled"].group_segment_fixed_size
    assert lds == 2 * 8 * 8 * 4 == 512
    default = read_code_object(builds["matmul_tiled.c", arch]).kernels["sgemm_tiled"]
    assert default.group_segment_fixed_size == 2 * 16 * 16 * 4 == 2048


# ---------------------------------------------------------------- faults clang lets through

MYSTERY = """#include "kdb_compat.h"
extern "C" __attribute__((device{visibility})) float {function}(float);
KDB_KERNEL void calls_it(KDB_GLOBAL float* x) {{ x[KDB_LOCAL_ID_X] = {function}(x[KDB_LOCAL_ID_X]); }}
"""


@needs_clang
def test_clang_19_refuses_an_undeclared_device_function_itself():
    # HIP declarations are hidden, and lld refuses an undefined hidden symbol at link time.
    with pytest.raises(CompileError, match="undefined hidden symbol: mystery"):
        _build_text(MYSTERY.format(visibility="", function="mystery"))


@needs_clang
@pytest.mark.parametrize("function", ["mystery", "expf"])
def test_an_undefined_symbol_is_a_problem(function):
    # With default visibility and the linker told to leave it unresolved, the symbol reaches
    # the code object, as it would from a toolchain that links without --no-undefined.
    text = MYSTERY.format(visibility=', visibility("default")', function=function)
    blob = compile_amdgcn(text, "gfx942", ("-I", str(kernels_dir()), "-Xoffload-linker",
                                           "--unresolved-symbols=ignore-all"), name="calls_it.c")
    assert read_code_object(blob).undefined_symbols == (function,)
    assert check_code_object(blob, "gfx942") == [
        f"undefined symbol {function!r}: nothing on the device defines it, so the module fails to load"]


ARGUMENTS = """#include "kdb_compat.h"
typedef float float4_t __attribute__((ext_vector_type(4)));
struct S { char c; double d; };
KDB_KERNEL void vector_after_int(int n, float4_t v, KDB_GLOBAL float* x) { x[n] = v.x + v.w; }
KDB_KERNEL void vector_after_ptr_int(KDB_GLOBAL float* x, int n, float4_t v) { x[n] = v.y; }
KDB_KERNEL void struct_after_int(KDB_GLOBAL double* x, int n, struct S s) { x[n] = s.d + s.c; }
"""


@needs_clang
def test_an_argument_the_launch_packs_elsewhere_is_a_problem():
    blob = _build_text(ARGUMENTS)
    kernels = read_code_object(blob).kernels
    # The ABI aligns the 16-byte vector to 16; hip-python aligns it to 8.
    assert [a.offset for a in kernels["vector_after_int"].explicit_args] == [0, 16, 32]
    assert packed_offsets([4, 16, 8]) == [0, 8, 24]
    # After a pointer and an int, 16 is where both put it; struct S (size 16, align 8) agrees too.
    assert [a.offset for a in kernels["vector_after_ptr_int"].explicit_args] == [0, 8, 16]
    assert [a.offset for a in kernels["struct_after_int"].explicit_args] == [0, 8, 16]
    assert check_code_object(blob, "gfx942") == [
        "kernel vector_after_int: argument 1 (by_value, 16 bytes) is at offset 16, but the HIP launch packs it at 8 "
        "(hip-python aligns each argument to min(size, 8)); pass it another way, e.g. as separate scalars"]


BIG_LDS = """#include "kdb_compat.h"
KDB_KERNEL void big_lds(KDB_GLOBAL float* x)
{
    KDB_SHARED(float, big, FLOATS);
    big[KDB_LOCAL_ID_X] = x[KDB_LOCAL_ID_X];
    KDB_BARRIER;
    x[KDB_LOCAL_ID_X] = big[FLOATS - 1 - KDB_LOCAL_ID_X];
}
"""
_LDS_KEY = b"\xb9.group_segment_fixed_size"  # fixstr of 25 bytes, then the value


def _with_lds(blob: bytes, lds: int) -> bytes:
    """``blob`` with the (one) kernel's group_segment_fixed_size rewritten, a uint32 kept a uint32."""
    at = blob.index(_LDS_KEY) + len(_LDS_KEY)
    assert blob[at] == 0xCE and blob.count(_LDS_KEY) == 1, "expected one uint32 LDS size"
    return blob[: at + 1] + struct.pack(">I", lds) + blob[at + 5 :]


@needs_clang
@pytest.mark.parametrize("arch", ARCHS)
def test_lds_over_the_limit(arch):
    with pytest.raises(CompileError, match=r"local memory \(80000\) exceeds limit \(65536\)"):
        _build_text(BIG_LDS, arch, "-DFLOATS=20000")  # clang-19 refuses it itself
    at_limit = _build_text(BIG_LDS, arch, "-DFLOATS=16384")
    assert read_code_object(at_limit).kernels["big_lds"].group_segment_fixed_size == 65536
    assert check_code_object(at_limit, arch) == []
    over = _with_lds(at_limit, 80000)  # what a compiler that does not refuse it would write
    assert check_code_object(over, arch) == [
        f"kernel big_lds: static LDS of 80000 bytes, over the 65536 a workgroup has on {arch}"]


@needs_clang
@pytest.mark.parametrize("arch", ["gfx1100", "gfx1201"])
def test_a_wave64_build_for_a_wave32_processor_is_a_problem(arch):
    blob = _build("activation.c", arch, "-mwavefrontsize64")
    assert sorted(check_code_object(blob, arch)) == [
        f"kernel {name}: wavefront size 64, but {arch} runs HIP kernels in wavefronts of 32"
        for name in ("leaky_relu_fwd", "relu_fwd")]


@needs_clang
def test_another_version_or_processor_is_a_problem(builds):
    v4 = _build("reduce_sum.c", "gfx942", "-mcode-object-version=4")
    assert check_code_object(v4, "gfx942") == ["code object v4, not v5 (build with -mcode-object-version=5)"]
    assert check_code_object(builds["reduce_sum.c", "gfx942"], "gfx90a") == ["built for gfx942, not gfx90a"]
    xnack_off = _build("reduce_sum.c", "gfx90a:xnack-")
    assert check_code_object(xnack_off, "gfx90a:xnack-") == []
    assert check_code_object(xnack_off, "gfx90a") == [
        "built for amdgcn-amd-amdhsa--gfx90a:xnack- with features xnack- that gfx90a lacks"]


# ---------------------------------------------------------------- hand-made shapes and bad input


@pytest.mark.parametrize(
    "blob, problem",
    [
        (make_code_object(symbols=kernel_symbols("k")[:1]), "kernel k: symbol 'k.kd' is not defined"),
        (make_code_object(symbols=kernel_symbols("k")[1:]), "kernel k: symbol 'k' is not defined"),
        (make_code_object(metadata(kernel_entry(symbol="k.desc")), kernel_symbols("k") + [("k.desc", 1, 6)]),
         "kernel k: descriptor symbol is 'k.desc', not 'k.kd'"),
        (make_code_object(metadata(kernel_entry(args=[(0, 8, "global_buffer"), (8, 4, "by_value")],
                                                kernarg_segment_size=10))),
         "kernel k: kernarg segment of 10 bytes does not hold its explicit arguments (12 bytes)"),
        (make_code_object(metadata(kernel_entry(args=[(0, 0, "by_value")]))),
         "kernel k: an explicit argument has size 0; hip-python cannot pack it"),
        (make_code_object(metadata(kernel_entry(wavefront_size=None))), "kernel k: no .wavefront_size in its metadata"),
        (make_code_object(metadata(kernel_entry(group_segment_fixed_size=None))),
         "kernel k: no .group_segment_fixed_size (static LDS) in its metadata"),
        (make_code_object({**metadata(), "amdhsa.kernels": []}, symbols=[]), "no kernels in the metadata"),
    ],
)
def test_hand_made_faults(blob, problem):
    assert check_code_object(blob, "gfx942") == [problem]


def test_hidden_arguments_are_not_laid_out_by_the_launch():
    args = [(0, 8, "global_buffer"), (8, 4, "by_value"), (24, 4, "hidden_block_count_x"),
            (64, 8, "hidden_global_offset_x")]
    assert check_code_object(make_code_object(metadata(kernel_entry(args=args))), "gfx942") == []


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"", "not an ELF file"),
        (b"\x00garbage" * 64, "not an ELF file"),
        (make_code_object(machine=190), "machine 190, not an AMD GPU code object"),
        (make_code_object()[:200], "truncated"),
        (make_code_object(note_type=1), "no NT_AMDGPU_METADATA note"),
    ],
)
def test_unreadable_code_objects_are_binary_load_errors(blob, match):
    with pytest.raises(BinaryLoadError, match=f"^k.co .*{match}"):
        check_code_object(blob, "gfx942", what="k.co")


@pytest.mark.parametrize("arch, match", [("gfx803", "no code-object checks for gfx803"),
                                         ("sm_90", "'sm_90' is not an AMD GPU target")])
def test_a_processor_without_known_limits_is_refused(arch, match):
    with pytest.raises(CompilerUnavailableError, match=match):
        check_code_object(make_code_object(), arch)


# ---------------------------------------------------------------- the builder stores only what passes


@needs_clang
def test_device_build_refuses_a_failing_code_object(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "arguments.c").write_text(ARGUMENTS)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(CompileError) as info:
        build_bundle(Target.parse("gfx942_304"), [("activation.c", ()), ("arguments.c", ())], out,
                     compiler=AmdgcnClangCompiler(), search_path=KernelSearchPath([kernels]))
    problem = info.value.problem
    assert problem.startswith("arguments.c [] for gfx942 builds a code object that would fail on the GPU: ")
    assert "kernel vector_after_int: argument 1 (by_value, 16 bytes) is at offset 16" in problem
    assert "no bundle was written" in info.value.remedy
    assert list(out.iterdir()) == []


def test_device_build_refuses_an_unreadable_code_object(tmp_path):
    class Garbage(AmdgcnClangCompiler):
        def identity(self) -> str:
            return "clang 0.0.0"

        def compile(self, request, target, source) -> bytes:
            return b"\x7fELF-not-really"

    with pytest.raises(BinaryLoadError, match=r"^code object of activation.c \[\] for gfx942 is not an ELF file"):
        build_bundle(Target.parse("gfx942"), [("activation.c", ())], tmp_path, compiler=Garbage())
    assert list(tmp_path.iterdir()) == []


@needs_clang
def test_device_build_stores_code_objects_that_pass(tmp_path):
    from kdbkit.kdb import open_bundle

    path = build_bundle(Target.parse("gfx1201"), [(s, ()) for s in list_sources()], tmp_path,
                        compiler=AmdgcnClangCompiler())
    with open_bundle(path) as bundle:
        assert len(list(bundle.entries())) == len(list_sources())
