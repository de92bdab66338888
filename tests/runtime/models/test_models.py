"""The built-in networks (runtime/models): small instances of each run through kdbkit on the
lookup-chain device (PoCL in CI) and match their float64 NumPy reference; their problem lists
are what their forwards ask the solvers for; the built-in catalogues parse back."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.runtime import models
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.models.graph import view as graph_view
from kdbkit.runtime.models.network import from_storage, to_storage
from kdbkit.runtime.primitives import invoke as invoke_module
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.tensor import DeviceTensor

# Small instances of every network: (name, sizes, layout). VGG-16 at 32 x 32 keeps all its
# layers (its classifier then takes 512 features); BERT one layer of hidden 64, 4 heads.
SMALL = {
    "resnet18": (dict(image=32), "NCHW"),
    "resnet50": (dict(image=32), "NHWC"),
    "vgg16": (dict(image=32), "NCHW"),
    "mobilenet_v2": (dict(image=32), "NHWC"),
    "bert_base": (dict(seq=16, hidden=64, heads=4, intermediate=256, layers=1), "NCHW"),
}
# Norm-wise relative error against float64 with the same (rounded) weights and input.
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 3e-2}


@pytest.fixture
def handle(make_handle):
    return make_handle()


@pytest.fixture
def asked(monkeypatch):
    """The config strings of every problem a primitive call asks the solvers for."""
    seen: list[str] = []
    real = invoke_module.choose

    def recording(handle, problem, solver=None):
        seen.append(problem.config())
        return real(handle, problem, solver)

    monkeypatch.setattr(invoke_module, "choose", recording)
    return seen


def _small(name: str, *, dtype: str = "fp32", batch: int = 1, layout: str | None = None) -> models.Network:
    sizes, default_layout = SMALL[name]
    return models.build(name, batch=batch, dtype=dtype, layout=layout or default_layout, **sizes)


def _input(net: models.Network, seed: int = 1) -> np.ndarray:
    """A standard normal input, exactly representable in the network's type."""
    x = np.random.default_rng(seed).standard_normal(net.input_shape)
    return from_storage(to_storage(x, net.dtype), net.dtype).astype(np.float64)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize("name", list(SMALL))
def test_forward_matches_the_numpy_reference(handle, name):
    net = _small(name)
    x = _input(net)
    y = net.forward(handle, x)
    assert y.shape == net.output_shape and y.dtype == np.float32
    want = net.reference_forward(x)
    assert 0.1 < np.sqrt((want**2).mean()) < 10  # the initialisation keeps activations of order one
    assert _relative_error(y, want) < TOLERANCE["fp32"]


@pytest.mark.parametrize("name, dtype, layout", [("resnet18", "fp16", "NHWC"), ("bert_base", "fp16", "NCHW"),
                                                 ("mobilenet_v2", "bf16", "NCHW")])
def test_half_precision_forwards(handle, name, dtype, layout):
    net = _small(name, dtype=dtype, layout=layout, batch=2)
    x = _input(net)
    assert _relative_error(net.forward(handle, x), net.reference_forward(x)) < TOLERANCE[dtype]


@pytest.mark.parametrize("name", list(SMALL))
def test_problems_are_exactly_what_the_forward_asks_for(handle, asked, name):
    net = _small(name, batch=2)
    listed = [p.config() for p in net.problems()]
    assert len(listed) == len(set(listed))  # each once
    net.forward(handle, _input(net))
    assert set(asked) == set(listed)


def test_both_layouts_give_one_result(handle):
    nchw, nhwc = _small("resnet18", layout="NCHW"), _small("resnet18", layout="NHWC")
    x = _input(nchw)
    assert _relative_error(nhwc.forward(handle, x), nchw.forward(handle, x).astype(np.float64)) < 1e-5
    convs = [p.config() for p in nhwc.problems() if p.primitive == "conv"]
    assert convs and all("NHWC" in c for c in convs if "-3x3-" in c or "-7x7-" in c)


def test_a_second_forward_reuses_the_device_tensors(handle, monkeypatch):
    net = _small("mobilenet_v2")
    x = _input(net)
    first = net.forward(handle, x)
    calls, uploading = [], []
    backend = handle.backend
    real_alloc, real_to_device = backend.alloc, backend.to_device

    def to_device(array):
        uploading.append(True)
        try:
            calls.append("to_device")
            return real_to_device(array)
        finally:
            uploading.pop()

    def alloc(nbytes):
        if not uploading:
            calls.append("alloc")
        return real_alloc(nbytes)

    monkeypatch.setattr(backend, "to_device", to_device)
    monkeypatch.setattr(backend, "alloc", alloc)
    np.testing.assert_array_equal(net.forward(handle, x), first)
    assert calls == ["to_device"]  # the NumPy input only (the backend's upload may allocate for it)


def test_work_tensors_share_one_buffer_and_views_are_made_once(handle):
    net = _small("bert_base")
    net.forward(handle, _input(net))
    state = net._device
    work = [site["projected"] for site in state.scratch if "projected" in site]
    assert len(work) == 3 * SMALL["bert_base"][0]["layers"] and len({id(t.buffer) for t in work}) == 1
    merged = state.values[next(n.output for n in net.graph.nodes if type(n.layer).__name__ == "MergeHeads")]
    viewed = graph_view(merged, (2, 3))
    assert graph_view(merged, (2, 3)) is viewed  # remembered by its buffer
    assert graph_view(merged, (3, 2)) is not viewed and graph_view(merged, [2, 3]) is not viewed


def test_a_device_tensor_input_gives_the_device_output(handle):
    net = _small("bert_base")
    x = _input(net)
    given = DeviceTensor.from_host(handle.backend, x.astype(np.float32))
    out = net.forward(handle, given)
    assert isinstance(out, DeviceTensor) and out.desc.shape == net.output_shape
    np.testing.assert_allclose(out.to_host(handle.backend), net.forward(handle, x), rtol=0, atol=0)
    with pytest.raises(ProblemError, match="takes fp32"):
        net.forward(handle, DeviceTensor.from_host(handle.backend, x.astype(np.float16)))


def test_parameters_are_torchvision_and_hugging_face_sized():
    """Parameter counts (running statistics aside) and names as the reference implementations'."""
    counts = {"resnet18": 11_689_512, "resnet50": 25_557_032, "vgg16": 138_357_544, "mobilenet_v2": 3_504_872,
              "bert_base": 12 * 7_087_872}
    for name, count in counts.items():
        specs = models.MODELS[name](batch=1).param_specs()
        total = sum(int(np.prod(p.shape)) for full, (_, _, p) in specs.items() if ".running_" not in full)
        assert total == count, name
    names = {"resnet18": "layer4.1.bn2.running_var", "resnet50": "layer3.5.conv3.weight",
             "vgg16": "features.28.bias", "mobilenet_v2": "features.17.conv.3.weight",
             "bert_base": "encoder.layer.11.attention.self.query.weight"}
    for name, key in names.items():
        assert key in models.MODELS[name](batch=1).param_specs(), (name, key)


def test_parameters_come_from_the_seed_whatever_the_batch():
    a, b = models.build("resnet18", batch=1, image=32), models.build("resnet18", batch=4, image=32)
    c = models.build("resnet18", batch=1, image=32, seed=1)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["fc.weight"], c.params["fc.weight"])
    assert (a.params["bn1.running_var"] > 0).all()


@pytest.mark.parametrize("name", list(models.MODELS))
def test_builtin_catalogue_parses_back(name):
    catalogue = models.builtin_catalogue(name)
    configs = [p.config() for p in catalogue]
    assert configs and len(configs) == len(set(configs))
    for problem, config in zip(catalogue, configs):
        again = parse_config(config)
        assert again == problem and again.config() == config
    types = {p.dtype.label for p in catalogue}
    assert types == {"fp16", "fp32"}


def test_problems_take_the_usual_sizes():
    conv_keys = {p.config() for p in models.problems("resnet50", 32, "fp16", "NHWC") if p.primitive == "conv"}
    assert "64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NHWC-NHWC-NHWC-FP16-F" in conv_keys  # layer1's 3x3
    gemms = {p.config() for p in models.problems("bert_base", 1, "fp32") if p.primitive == "gemm"}
    assert "gemm,type=fp32,m=128,n=3072,k=768,ta=0,tb=1,batch=1,lda=768,ldb=768,ldc=3072,sa=0,sb=0,sc=0,a=1.0,b=0.0" \
        in gemms
    assert len(models.problems("bert_base", 1, "fp32", layers=1)) == len(models.problems("bert_base", 1, "fp32"))


def test_bad_arguments_are_named():
    with pytest.raises(ProblemError, match="no built-in network 'resnet19'"):
        models.problems("resnet19", 1, "fp32")
    with pytest.raises(ProblemError, match="no size seq"):
        models.build("resnet18", seq=4)
    with pytest.raises(ProblemError, match="no layout 'NHWC'"):
        models.build("bert_base", layout="NHWC")


def test_torch_reference_matches_numpy():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine's runs compare with it)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in SMALL:
        net = _small(name)
        x = _input(net)
        assert _relative_error(net.torch_forward(x, device), net.reference_forward(x)) < 1e-4, name


def _loaded(model, params: dict[str, np.ndarray], strip: str = ""):
    """``model`` in float64 with ``params`` loaded by name; batch norm's step counters aside,
    every parameter must be one of ours and every one of ours must be taken."""
    import torch

    state = {k.removeprefix(strip): torch.from_numpy(v) for k, v in params.items()}
    model = model.double().eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("num_batches_tracked") for k in missing), (missing, unexpected)
    return model


def test_torchvision_models_take_the_parameters_and_agree():
    """The architectures are torchvision's: its models load every parameter by name and compute
    what the NumPy reference does (float64, so to rounding)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed (the GPU machine has it)")
    for name in ("resnet18", "resnet50", "mobilenet_v2", "vgg16"):
        net = _small(name, batch=2)
        model = getattr(torchvision.models, name)(weights=None)
        if name == "vgg16":  # at 32 x 32 the classifier takes the 512 features as they are (see vgg.py)
            model.avgpool = torch.nn.Identity()
            model.classifier[0] = torch.nn.Linear(512, 4096)
        model = _loaded(model, net.held_params)
        x = _input(net)
        with torch.no_grad():
            got = model(torch.from_numpy(x)).numpy()
        assert _relative_error(got, net.reference_forward(x)) < 1e-10, name


def test_hugging_face_bert_takes_the_parameters_and_agrees():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the GPU machine has it)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the GPU machine has it)")
    net = models.build("bert_base", batch=2, seq=16, hidden=64, heads=4, intermediate=256, layers=2)
    config = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=256,
                                     num_hidden_layers=2, hidden_act="gelu", layer_norm_eps=1e-12,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config._attn_implementation = "eager"
    from transformers.models.bert.modeling_bert import BertEncoder

    encoder = _loaded(BertEncoder(config), net.held_params, strip="encoder.")
    x = _input(net)
    with torch.no_grad():
        out = encoder(torch.from_numpy(x))
    got = (out[0] if isinstance(out, tuple) else out.last_hidden_state).numpy()
    assert _relative_error(got, net.reference_forward(x)) < 1e-10


def _launches(handle, monkeypatch, net, x) -> tuple[np.ndarray, int]:
    """The forward's output and how many kernels it launched."""
    backend, count = handle.backend, [0]
    launch = type(backend).launch

    def counting(self, *args, **kwargs):
        count[0] += 1
        return launch(self, *args, **kwargs)

    monkeypatch.setattr(type(backend), "launch", counting)
    try:
        return net.forward(handle, x), count[0]
    finally:
        monkeypatch.setattr(type(backend), "launch", launch)


def test_linear_layers_with_their_addition_and_gelu_run_as_fused_calls(handle, monkeypatch):
    sizes, layout = SMALL["bert_base"]
    fused = models.build("bert_base", layout=layout, **sizes)
    layers = models.Network("bert_base", fused.graph, layout=layout, fuse=False)
    assert sorted((f.linear, f.residual is not None, f.activation) for f in fused.fusions.values()) == \
        [(True, False, "gelu_erf"), (True, True, "none"), (True, True, "none")]
    x = _input(fused)
    got, fused_launches = _launches(handle, monkeypatch, fused, x)
    want, layer_launches = _launches(handle, monkeypatch, layers, x)
    if handle.device.backend == "opencl":  # where every launch goes through Backend.launch (CUDA's launchers do not)
        # Each of the three runs as the gemm and one epilogue pass here (no solver of PoCL's
        # fuses): one launch fewer each than gemm, bias and addition or GELU
        assert fused_launches == layer_launches - 3
    assert _relative_error(got, want.astype(np.float64)) < 1e-5
    assert _relative_error(got, fused.reference_forward(x)) < TOLERANCE["fp32"]
    listed = {p.primitive for p in fused.problems()}
    assert "convepi" in listed  # the pass's program goes into a network's bundle
