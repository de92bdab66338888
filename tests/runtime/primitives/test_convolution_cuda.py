"""On CUDA: ResNet-50 and MobileNet-V2 convolution layers in all three directions against
PyTorch in float64, NCHW and channels-last PyTorch tensors used in place. Runs where
KDB_TEST_BACKEND=cuda and PyTorch sees the GPU (scripts/run_gpu_checks.sh)."""

from __future__ import annotations

import pytest

import kdbkit

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
pytestmark = pytest.mark.gpu

# (name, C, H, W, K, filter, pad, stride, groups) at batch 2: ResNet-50's stem, a bottleneck's
# 3x3, a strided 1x1 projection and a last stage's 3x3; MobileNet-V2's depthwise 3x3 (strided) and a pointwise 1x1.
LAYERS = [
    ("resnet50 conv1 7x7/2", 3, 224, 224, 64, 7, 3, 2, 1),
    ("resnet50 layer1 3x3", 64, 56, 56, 64, 3, 1, 1, 1),
    ("resnet50 layer2 1x1/2 projection", 256, 56, 56, 512, 1, 0, 2, 1),
    ("resnet50 layer4 3x3", 512, 7, 7, 512, 3, 1, 1, 1),  # few output tiles: the reduction split
    ("mobilenet-v2 depthwise 3x3/2", 96, 112, 112, 96, 3, 1, 2, 96),
    ("mobilenet-v2 pointwise 1x1", 32, 112, 112, 16, 1, 0, 1, 1),
]


@pytest.fixture
def cuda_handle(handle):
    if handle.device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs the CUDA backend (KDB_TEST_BACKEND=cuda) and a GPU PyTorch can see")
    return handle


def _check(name, out, ref, dtype):
    limit = 1e-5 if dtype == torch.float32 else 1e-2
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    err = float((out - ref).norm() / ref.norm())
    assert err < limit, f"{name}: relative error {err:.2e} >= {limit}"


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layer", LAYERS, ids=[layer[0] for layer in LAYERS])
def test_model_layers_match_pytorch(cuda_handle, layer, dtype, channels_last):
    name, c, h, w, k, f, pad, stride, groups = layer
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt)
    wt = (torch.randn(k, c // groups, f, f, device="cuda", dtype=dtype) / (c // groups * f * f) ** 0.5).to(
        memory_format=fmt)
    geometry = {"pad": pad, "stride": stride, "groups": groups}
    y = kdbkit.convolution_forward(cuda_handle, x, wt, **geometry)
    assert y.is_contiguous(memory_format=fmt)
    _check(f"{name} forward", y, torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad, 1, groups),
           dtype)
    dy = torch.randn_like(y)
    dx = kdbkit.convolution_backward_data(cuda_handle, dy, wt, x.shape, **geometry)
    _check(f"{name} backward data", dx,
           torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), stride, pad, 1, groups), dtype)
    dw = kdbkit.convolution_backward_weights(cuda_handle, dy, x, wt.shape, **geometry)
    _check(f"{name} backward weights", dw,
           torch.nn.grad.conv2d_weight(x.double(), wt.shape, dy.double(), stride, pad, 1, groups), dtype)


# (N, C, H, W, K, filter, pad, stride, dilation): tiles cut by every edge (positions and output
# channels not multiples of 128, K below a tile), padding, strides, dilation, uneven filters.
TC_CASES = [(2, 64, 7, 7, 16, (3, 3), (1, 1), (1, 1), (1, 1)), (3, 32, 13, 11, 130, (5, 3), (2, 0), (2, 1), (1, 2)),
            (1, 96, 20, 20, 64, (1, 1), (0, 0), (2, 2), (1, 1)), (4, 128, 9, 9, 256, (3, 3), (2, 2), (1, 1), (2, 2)),
            (2, 3, 30, 29, 64, (7, 7), (3, 3), (2, 2), (1, 1)),  # a first layer: NHWC elements, NCHW widened to 8
            (1, 20, 9, 9, 12, (3, 2), (1, 1), (1, 2), (1, 1)),  # 20 channels: NHWC elements, NCHW widened to 24
            (2, 16, 9, 9, 24, (3, 3), (1, 1), (1, 1), (1, 1)),  # 16 channels: 8-channel pieces across taps
            (2, 24, 9, 9, 10, (3, 3), (1, 1), (1, 1), (1, 1)),  # backward data from dy's 10 channels: elements
            (8, 32, 30, 30, 512, (3, 3), (1, 1), (1, 1), (1, 1))]  # 228 tiles, no split; planes of 900: not runs of 8


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", TC_CASES, ids=["x".join(map(str, c[:5])) for c in TC_CASES])
def test_the_tensor_core_implicit_gemm_matches_pytorch(cuda_handle, dtype, case, channels_last):
    """NHWC tensors used as they are; NCHW ones staged channels-last in the workspace."""
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.tensor import DataType

    n, c, h, w, k, filt, pad, stride, dilation = case
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt)
    wt = (torch.randn(k, c, *filt, device="cuda", dtype=dtype) / (c * filt[0] * filt[1]) ** 0.5).to(memory_format=fmt)
    y = kdbkit.convolution_forward(cuda_handle, x, wt, pad=pad, stride=stride, dilation=dilation,
                                   solver="ConvImplicitGemmTensorCore")
    _check("implicit GEMM forward", y, torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad,
                                                                  dilation), dtype)
    problem = ConvProblem("F", DataType.parse(str(dtype).split(".")[1].replace("bfloat16", "bf16").replace(
        "float16", "fp16")), "NHWC" if channels_last else "NCHW", (n, c, h, w), k, filt, pad, stride, dilation)
    # immediate mode's first choice: Hopper's TMA kernel where it takes the problem, else this one
    hopper = cuda_handle.device.target.arch_facts.has("wgmma") and c % 8 == 0 and k % 2 == 0
    assert choose(cuda_handle, problem).solver.name.startswith("ConvTma" if hopper else "ConvImplicitGemmTensorCore")
    if stride == (1, 1) and pad[0] <= dilation[0] * (filt[0] - 1) and pad[1] <= dilation[1] * (filt[1] - 1):
        dy = torch.randn_like(y)
        dx = kdbkit.convolution_backward_data(cuda_handle, dy, wt, x.shape, pad=pad, stride=stride, dilation=dilation,
                                              solver="ConvImplicitGemmTensorCore")
        _check("implicit GEMM backward data", dx,
               torch.nn.grad.conv2d_input(x.shape, wt.double(), dy.double(), stride, pad, dilation), dtype)


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [(2, 64, 7, 7, 16, (3, 3), (1, 1), (1, 1), (1, 1)),
                                  (3, 32, 13, 11, 136, (5, 3), (2, 0), (2, 1), (1, 2)),
                                  (4, 128, 9, 9, 256, (3, 3), (2, 2), (1, 1), (2, 2)),
                                  (1, 8, 20, 20, 64, (1, 1), (0, 0), (2, 2), (1, 1)),
                                  (2, 3, 30, 29, 64, (7, 7), (3, 3), (2, 2), (1, 1))],
                         ids=["edges", "strided-dilated", "large", "pointwise", "first-layer"])
def test_the_tensor_core_backward_weights_matches_pytorch(cuda_handle, dtype, case, channels_last):
    """Slices of positions summed by atomics, twice: the workspace is zero again after each call."""
    n, c, h, w, k, filt, pad, stride, dilation = case
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype).to(memory_format=fmt)
    wshape = (k, c, *filt)
    y = torch.nn.functional.conv2d(x, torch.zeros(wshape, device="cuda", dtype=dtype), None, stride, pad, dilation)
    dy = torch.randn_like(y).to(memory_format=fmt)
    ref = torch.nn.grad.conv2d_weight(x.double(), wshape, dy.double(), stride, pad, dilation)
    for _ in range(2):
        dw = kdbkit.convolution_backward_weights(cuda_handle, dy, x, wshape, pad=pad, stride=stride,
                                                 dilation=dilation, solver="ConvWrwImplicitGemmTensorCore")
        _check("implicit GEMM backward weights", dw, ref, dtype)
