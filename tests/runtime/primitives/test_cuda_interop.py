"""On CUDA: PyTorch and CuPy tensors used in place (no copies), the caller's stream, and real model shapes
against PyTorch. Runs where KDB_TEST_BACKEND=cuda and PyTorch sees the GPU (scripts/run_gpu_checks.sh)."""

from __future__ import annotations

import pytest

import kdbkit

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_handle(handle):
    if handle.device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs the CUDA backend (KDB_TEST_BACKEND=cuda) and a GPU PyTorch can see")
    return handle


def rel_error(out, ref) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


def _no_copies(monkeypatch, handle, buffers: int):
    """Fail on any copy or allocation; record the first ``buffers`` kernel arguments of every
    launch as the driver receives them (launches made once by Backend.launcher included)."""
    import ctypes

    backend = type(handle.backend)
    for name in ("to_device", "to_host", "alloc"):
        monkeypatch.setattr(backend, name, lambda *a, **k: pytest.fail(f"{name} copied or allocated"))
    launched = []
    drv = handle.backend._drv
    real = drv.cuLaunchKernel

    def recording(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        slots = (ctypes.c_void_p * buffers).from_address(params)
        launched.append([ctypes.c_uint64.from_address(slots[i]).value for i in range(buffers)])
        return real(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra)

    monkeypatch.setattr(drv, "cuLaunchKernel", recording)
    return launched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_tensors_are_used_in_place(cuda_handle, monkeypatch, dtype):
    x = torch.randn(64, 129, device="cuda", dtype=dtype)
    y = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    kdbkit.activation_forward(cuda_handle, x, "gelu", y=y)  # warm: compiles and loads
    launched = _no_copies(monkeypatch, cuda_handle, buffers=2)
    y.fill_(float("nan"))
    assert kdbkit.activation_forward(cuda_handle, x, "gelu", y=y) is y
    torch.cuda.synchronize()
    assert launched == [[x.data_ptr(), y.data_ptr()]]
    assert rel_error(y, torch.nn.functional.gelu(x.double())) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_a_new_output_is_a_torch_tensor_and_strided_views_work(cuda_handle):
    x = torch.randn(32, 48, device="cuda")
    y = kdbkit.activation_forward(cuda_handle, x.t(), "tanh", alpha=1.0, beta=1.0)  # a transposed view
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == (48, 32)
    assert rel_error(y, torch.tanh(x.t().double())) < 1e-6


def test_cupy_arrays_through_the_cuda_array_interface(cuda_handle):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    x = cupy.random.standard_normal((33, 70), dtype=cupy.float32)
    y = cupy.empty_like(x)
    kdbkit.softmax_forward(cuda_handle, x, y=y)
    expected = torch.softmax(torch.as_tensor(x.get(), dtype=torch.float64), dim=1)
    assert rel_error(torch.as_tensor(y.get()), expected) < 1e-6


def test_the_callers_stream(cuda_handle):
    stream = torch.cuda.Stream()
    x = torch.randn(256, 1024, device="cuda")
    torch.cuda.synchronize()
    cuda_handle.set_stream(stream)
    try:
        assert cuda_handle.backend.stream == stream.cuda_stream
        with torch.cuda.stream(stream):
            y = torch.empty_like(x)
            kdbkit.softmax_forward(cuda_handle, x, y=y)
        stream.synchronize()
        assert rel_error(y, torch.softmax(x.double(), dim=1)) < 1e-6
    finally:
        cuda_handle.set_stream(None)


def _check(name, out, ref, dtype):
    limit = 1e-5 if dtype == torch.float32 else 1e-2
    err = rel_error(out, ref)
    assert err < limit, f"{name}: relative error {err:.2e} >= {limit}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_bert_base_layer_shapes_match_pytorch(cuda_handle, dtype):
    """One BERT-base encoder layer's primitives at batch 8, sequence 128 (hidden 768, 12 heads, FFN 3072)."""
    h, b, s = cuda_handle, 8, 128
    x = torch.randn(b * s, 768, device="cuda", dtype=dtype)
    w = torch.randn(768, 3072, device="cuda", dtype=dtype) / 30
    ffn = kdbkit.gemm(h, x, w)
    _check("gemm 1024x768 @ 768x3072", ffn, x.double() @ w.double(), dtype)
    _check("gelu", kdbkit.activation_forward(h, ffn, "gelu"), torch.nn.functional.gelu(ffn.double()), dtype)
    scores = torch.randn(b * 12 * s, s, device="cuda", dtype=dtype) * 3
    _check("attention softmax", kdbkit.softmax_forward(h, scores), torch.softmax(scores.double(), -1), dtype)
    gamma, beta = torch.randn(768, device="cuda", dtype=dtype), torch.randn(768, device="cuda", dtype=dtype)
    y, mean, rstd = kdbkit.layernorm_forward(h, x, gamma, beta, eps=1e-12)
    ref = torch.nn.functional.layer_norm(x.double(), (768,), gamma.double(), beta.double(), eps=1e-12)
    _check("layer norm", y, ref, dtype)
    _check("residual add", kdbkit.op_tensor(h, "add", x, y), x.double() + y.double(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_resnet50_stem_and_head_shapes_match_pytorch(cuda_handle, dtype):
    """ResNet-50 at batch 16: the stem's batch norm, relu and 3x3/2 max pool; the head's 7x7 average pool and fc."""
    h = cuda_handle
    x = torch.randn(16, 64, 112, 112, device="cuda", dtype=dtype)
    scale, bias = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda")
    mean, var = torch.randn(64, device="cuda"), torch.rand(64, device="cuda") + 0.5
    y = kdbkit.batchnorm_inference(h, x, scale, bias, mean, var)
    ref = torch.nn.functional.batch_norm(x.double(), mean.double(), var.double(), scale.double(), bias.double(),
                                         training=False)
    _check("batch norm (inference)", y, ref, dtype)
    r = kdbkit.activation_forward(h, y, "relu")
    _check("relu", r, torch.relu(y.double()), dtype)
    pooled, _ = kdbkit.pooling_forward(h, r, window=3, stride=2, pad=1, save_indices=False)
    _check("max pool 3x3/2", pooled, torch.nn.functional.max_pool2d(r.double(), 3, 2, 1), dtype)
    feats = torch.randn(16, 2048, 7, 7, device="cuda", dtype=dtype)
    avg, _ = kdbkit.pooling_forward(h, feats, mode="avg", window=7, stride=1)
    _check("average pool 7x7", avg, torch.nn.functional.avg_pool2d(feats.double(), 7), dtype)
    fc = torch.randn(2048, 1000, device="cuda", dtype=dtype) / 45
    logits = kdbkit.gemm(h, avg.reshape(16, 2048), fc)
    _check("fc 16x2048 @ 2048x1000", logits, avg.reshape(16, 2048).double() @ fc.double(), dtype)
    yt, saved_mean, saved_invstd = kdbkit.batchnorm_training(h, x, scale, bias)
    ref = torch.nn.functional.batch_norm(x.double(), None, None, scale.double(), bias.double(), training=True)
    _check("batch norm (training)", yt, ref, dtype)


def test_repeat_calls_use_each_call_s_tensors_whatever_their_alignment(cuda_handle):
    """Calls after the first run a plan (runtime/primitives/repeat.py): it must take every call's
    own addresses, and a view 4 bytes into its storage must still go to the unaligned kernels."""
    for round_ in range(6):
        base = torch.randn(4097, device="cuda", dtype=torch.float16)
        x = base[round_ % 2:][:4096]
        y = torch.full((4096,), float("nan"), device="cuda", dtype=torch.float16)
        assert kdbkit.activation_forward(cuda_handle, x, "relu", y=y) is y
        w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
        rows = torch.randn(8, 64, device="cuda")
        out, mean, rstd = torch.empty_like(rows), torch.empty(8, device="cuda"), torch.empty(8, device="cuda")
        kdbkit.layernorm_forward(cuda_handle, rows, w, b, y=out, mean=mean, rstd=rstd)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x)), round_
        assert rel_error(out, torch.nn.functional.layer_norm(rows.double(), (64,), w.double(), b.double())) < 1e-5
    assert len(cuda_handle.dispatcher.plans) == 2


def test_repeat_calls_alternating_between_tensors_that_stay_put(cuda_handle):
    """A plan keeps the buffer that wrapped each tensor while its address stays the same: calls
    alternating between two pairs of tensors (A, A, B, B, A, ...) must each write their own."""
    pairs = [(torch.randn(1000, device="cuda"), torch.empty(1000, device="cuda")) for _ in range(2)]
    for call in range(8):
        x, y = pairs[(call // 2) % 2]
        y.fill_(float("nan"))
        kdbkit.activation_forward(cuda_handle, x, "relu", y=y)
        torch.cuda.synchronize()
        assert torch.equal(y, torch.relu(x)), call
    assert len(cuda_handle.dispatcher.plans) == 1


def test_repeat_calls_with_outputs_left_to_kdbkit(cuda_handle, monkeypatch):
    """Outputs kdbkit allocates beside PyTorch inputs are part of a plan: a repeat call makes
    new ones (each call's result its own tensor) without the full path."""
    import importlib

    full_path = []
    for module in ("activation", "layernorm", "pooling"):
        api = importlib.import_module(f"kdbkit.runtime.primitives.{module}.api")
        monkeypatch.setattr(api, "invoke", lambda *a, real=api.invoke, **k: (full_path.append(a[1].config()),
                                                                             real(*a, **k))[1])
    rows, w, b = torch.empty(8, 64, device="cuda"), torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    img = torch.empty(2, 3, 9, 9, device="cuda", dtype=torch.float16)
    calls = []
    for _ in range(4):  # the same inputs with new values each time
        rows.normal_()
        img.normal_()
        relu = kdbkit.activation_forward(cuda_handle, rows, "relu")
        y, mean, rstd = kdbkit.layernorm_forward(cuda_handle, rows, w, b)
        pooled, indices = kdbkit.pooling_forward(cuda_handle, img, window=3, stride=2, pad=1, save_indices=False)
        calls.append((rows.clone(), img.clone(), relu, y, mean, rstd, pooled, indices))
    torch.cuda.synchronize()
    assert len(full_path) == 3  # the first call of each
    for r, i, relu, y, mean, rstd, pooled, indices in calls:
        assert torch.equal(relu, torch.relu(r))
        assert rel_error(y, torch.nn.functional.layer_norm(r.double(), (64,), w.double(), b.double())) < 1e-5
        assert rel_error(mean, r.double().mean(1)) < 1e-5
        assert rel_error(rstd, 1 / torch.sqrt(r.double().var(1, unbiased=False) + 1e-5)) < 1e-4
        assert torch.equal(pooled, torch.nn.functional.max_pool2d(i, 3, 2, 1)) and indices is None
    assert len({c[3].data_ptr() for c in calls}) == 4  # every call's output its own
