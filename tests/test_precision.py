"""dtype by capability, the linear kernel it brings, and the prepacked bf16 linear."""
import pytest
import torch
import torch.nn.functional as F

from specbench.errors import ConfigError
from specbench.methods.greedy import Greedy
from specbench.methods.speculative import SpeculativeDecoding
from specbench.models import precision as precision_module
from specbench.models.cpu_linear import PackedLinear, pack_linears
from specbench.models.precision import resolve_precision
from specbench.models.tiny import build_tiny_pair


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


@pytest.mark.skipif(not precision_module.packed_linear_available(), reason="no oneDNN packed linear in this torch")
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


@pytest.mark.skipif(not precision_module.packed_linear_available(), reason="no oneDNN packed linear in this torch")
def test_a_packed_linears_weight_reads_back_exactly_without_its_bias():
    from specbench.models.draft_head import linear_weight
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48).to(torch.bfloat16)
    torch.nn.init.normal_(linear.bias, std=1.0)
    packed = PackedLinear(linear)
    assert torch.equal(linear_weight(packed), linear.weight) and torch.equal(packed.bias, linear.bias)


@pytest.mark.skipif(not precision_module.packed_linear_available(), reason="no oneDNN packed linear in this torch")
def test_a_packed_bf16_pair_decodes_and_speculative_follows_its_greedy():
    pair = build_tiny_pair(name="tiny-bf16", dtype="bfloat16", linear_kernel="onednn_packed")
    assert pair.dtype == "bfloat16" and pair.precision.linear_kernel == "onednn_packed"
    assert not any(isinstance(m, torch.nn.Linear) for m in pair.target.modules())
    prompt = [10, 20, 30, 40]
    greedy = Greedy(pair, "greedy").generate(prompt, 24, set()).tokens
    spec = SpeculativeDecoding(pair, "speculative", gamma=3).generate(prompt, 24, set()).tokens
    assert len(greedy) == len(spec) == 24
    assert spec[:4] == greedy[:4]  # bf16: later tokens may flip at near-ties; the runner classifies those


def test_pack_linears_replaces_every_linear():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(8, 4)))
    model = model.to(torch.bfloat16)
    if precision_module.packed_linear_available():
        assert pack_linears(model) == 2 and model(torch.randn(1, 8, dtype=torch.bfloat16)).shape == (1, 4)
