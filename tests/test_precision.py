"""dtype by capability, the linear kernel it brings, and the prepacked bf16 linear."""
import pytest
import torch
import torch.nn.functional as F

from specbench.errors import ConfigError
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.backends import precision as precision_module
from specbench.backends.torch.cpu_linear import PackedLinear, pack_linears
from specbench.backends.precision import resolve_precision
from specbench.models.tiny import build_tiny_pair


PACKED_MISSING = precision_module.packed_linear_missing()
needs_packed_linear = pytest.mark.skipif(PACKED_MISSING is not None, reason=f"oneDNN packed linear: {PACKED_MISSING}")
AVX2_ONLY_ERROR = ("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, "
                   "avx512vl and avx512dq")


def pretend_cpu(monkeypatch, bf16: bool):
    monkeypatch.setattr(precision_module, "_cpu_query", lambda name: bf16 and name == "_is_avx512_bf16_supported")


def test_auto_is_bf16_with_the_packed_kernel_where_the_cpu_has_native_bf16(monkeypatch):
    pretend_cpu(monkeypatch, bf16=True)
    p = resolve_precision("auto", "cpu")
    assert p.dtype == "bfloat16" and "AVX512-BF16" in p.reason and p.warning is None
    assert p.linear_kernel == ("onednn_packed" if precision_module.packed_linear_available() else "torch")
    assert resolve_precision("float32", "cpu").linear_kernel == "torch"  # packing made fp32 slower here


def test_auto_is_fp32_without_native_bf16_and_explicit_bf16_warns(monkeypatch):
    pretend_cpu(monkeypatch, bf16=False)
    p = resolve_precision("auto", "cpu")
    assert p.dtype == "float32" and "emulated" in p.reason and p.linear_kernel == "torch"
    explicit = resolve_precision("bfloat16", "cpu")
    assert explicit.dtype == "bfloat16" and "emulated" in explicit.warning and explicit.linear_kernel == "torch"


def test_bad_values_name_the_key_and_the_valid_ones():
    with pytest.raises(ConfigError, match=r"model.dtype: unknown dtype 'fp8'; valid: \['auto', 'float32'"):
        resolve_precision("fp8", "cpu")
    with pytest.raises(ConfigError, match="model.linear_kernel: unknown linear kernel"):
        resolve_precision("auto", "cpu", "magic")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"model.device: 'cuda': CUDA is not available.*\['cpu'\]"):
            resolve_precision("auto", "cuda")


@needs_packed_linear
def test_packed_linear_matches_torch_up_to_bf16_rounding():
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 200).to(torch.bfloat16)
    packed = PackedLinear(linear)
    for rows in (1, 3, 17):
        x = torch.randn(2, rows, 96, dtype=torch.bfloat16)
        ours, ref = packed(x), F.linear(x, linear.weight, linear.bias)
        assert ours.shape == ref.shape == (2, rows, 200) and ours.dtype == torch.bfloat16
        exact = x.double() @ linear.weight.double().T + linear.bias.double()
        assert (ours.double() - exact).abs().max() <= 2 * (ref.double() - exact).abs().max() + 1e-2


@needs_packed_linear
def test_a_packed_linears_weight_reads_back_exactly_without_its_bias():
    from specbench.models.heads.draft_head import linear_weight
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    torch.nn.init.normal_(linear.bias, std=1.0)
    packed = PackedLinear(linear)
    assert torch.equal(linear_weight(packed), linear.weight) and torch.equal(packed.bias, linear.bias)


@needs_packed_linear
def test_a_packed_bf16_pair_decodes_and_speculative_follows_its_greedy():
    pair = build_tiny_pair(name="tiny-bf16", dtype="bfloat16", linear_kernel="onednn_packed")
    assert pair.dtype == "bfloat16" and pair.precision.linear_kernel == "onednn_packed"
    assert not any(isinstance(m, torch.nn.Linear) for m in pair.target.modules())
    prompt = [10, 20, 30, 40]
    greedy = Greedy(pair, "greedy").generate(prompt, 24, set()).tokens
    spec = SpeculativeDecoding(pair, "speculative", gamma=3).generate(prompt, 24, set()).tokens
    assert len(greedy) == len(spec) == 24
    assert spec[:4] == greedy[:4]  # bf16: later tokens may flip at near-ties; the runner classifies those


@needs_packed_linear
def test_pack_linears_replaces_every_linear():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 4)))
    model = model.to(torch.bfloat16)
    assert pack_linears(model) == 2 and model(torch.randn(1, 8, dtype=torch.bfloat16)).shape == (1, 4)


@pytest.fixture
def cpu_without_bf16_packing(monkeypatch):
    """oneDNN as on an AVX2-only CPU (Zen 3): the packed-linear ops exist, their bf16 reorder raises."""
    def reorder(weight, batch_size):
        raise RuntimeError(AVX2_ONLY_ERROR)

    precision_module.packed_linear_missing.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", reorder)
    yield
    precision_module.packed_linear_missing.cache_clear()


def test_a_cpu_that_cannot_pack_bf16_never_gets_the_packed_kernel(monkeypatch, cpu_without_bf16_packing):
    pretend_cpu(monkeypatch, bf16=True)  # even where torch reports native bf16 dot products
    assert resolve_precision("auto", "cpu").linear_kernel == "torch"
    assert resolve_precision("bfloat16", "cpu").linear_kernel == "torch"
    with pytest.raises(ConfigError, match=r"model.linear_kernel: onednn_packed cannot run here: this CPU cannot run "
                                          r"oneDNN's bf16 weight packing .*avx512bw.*valid: \['auto', 'torch'\]"):
        resolve_precision("bfloat16", "cpu", "onednn_packed")
