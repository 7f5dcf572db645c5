"""One tested dependency set (constraints-cpu.txt) that every Makefile install uses, and code that runs on both
sides of transformers' cache rename (the locked 5.x here; `make test-newest` runs the cache-API tests on the
newest 5.x)."""
import re
import tomllib
import warnings
from importlib import metadata

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from specbench.backends.torch.cached_lm import CachedLM
from specbench.backends.torch import cache_api
from specbench.models.layer_skip import LayerSkipModel

from .conftest import ROOT

LOCK = ROOT / "constraints-cpu.txt"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints-cpu.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_every_makefile_install_goes_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    definitions = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+) := (.*)$", makefile, re.M)}
    assert definitions["LOCK"] == "constraints-cpu.txt"
    assert "--constraint $(LOCK)" in definitions["PIP"] and "--constraint $(LOCK)" in definitions["PIP_WHEEL"]
    recipes = [line for line in makefile.splitlines() if line.startswith("\t")]
    direct = [line.strip() for line in recipes if re.search(r"\bpip (install|wheel)\b", line.split("#")[0])
              and "--target $(NEWEST)" not in line  # test-newest installs beside the venv, on purpose
              and "--target $(GPU_SITE)" not in line]  # gpu-check: the bundle gpu-bundle made through the lock
    assert not direct, f"installs that bypass the lock: {direct}"
    assert sum("$(PIP)" in line or "$(PIP_WHEEL)" in line for line in recipes) >= 8


def test_the_lock_pins_every_declared_dependency_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(r for group in ("test", "vllm-cpu", "llamacpp", "embedded")
                                             for r in project["optional-dependencies"][group])]
    pins = locked()
    for text in declared:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is declared in pyproject.toml but not locked"
        version = Version(pins[name])
        assert requirement.specifier.contains(version, prereleases=True), (text, pins[name])
    assert Version(pins["transformers"]) < Version("5.20")  # what vLLM's CPU build allows


def test_the_installed_packages_are_the_locked_ones():
    """What CI installs (make test) is what the lock says: nothing upgraded or downgraded under it."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    differing = {name: (version, installed.get(name)) for name, version in locked().items()
                 if name in installed and installed[name] != version}
    assert not differing, f"locked vs installed: {differing}; reinstall with make install, or refresh with make lock"
    for core in ("torch", "transformers", "tokenizers", "hydra-core"):
        assert core in installed, core


class Output(dict):
    __getattr__ = dict.__getitem__


class NewCacheApiModel(torch.nn.Module):
    """A causal LM as transformers >= 5.20 writes it: the cache argument and output field are named ``cache``;
    the old name is refused here (it is deprecated there)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, cache=None, use_cache=True, **kwargs):
        assert "past_key_values" not in kwargs, "called with the deprecated past_key_values"
        out = self.inner(input_ids=input_ids, use_cache=use_cache, **{cache_api.cache_argument(self.inner): cache},
                         **kwargs)
        return Output(logits=out.logits, cache=cache_api.returned_cache(out))


def test_the_cache_goes_by_the_name_the_model_takes(tiny_llama):
    def old(input_ids, past_key_values=None):
        pass

    def new(input_ids, cache=None):
        pass

    assert cache_api.cache_argument(old) == "past_key_values" and cache_api.cache_argument(new) == "cache"
    assert cache_api.returned_cache({"cache": 1}) == 1 and cache_api.returned_cache({"past_key_values": 2}) == 2
    lm = CachedLM(NewCacheApiModel(tiny_llama.target))
    assert lm.cache_arg == "cache"
    first = lm.forward([5, 6, 7])
    assert lm.length == 3 and first.shape[0] == 3
    reference = CachedLM(tiny_llama.target)
    assert torch.equal(reference.forward([5, 6, 7]), first)


def test_layer_skipping_passes_the_cache_by_this_versions_name(tiny_llama):
    model = LayerSkipModel(tiny_llama.target, skip=[])
    assert cache_api.cache_argument(model) == "cache"  # its own forward, on every version
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        out = model(torch.tensor([[5, 6, 7]]), use_cache=True)
    full = tiny_llama.target(torch.tensor([[5, 6, 7]])).logits
    assert torch.allclose(out.logits, full, atol=1e-5)
    assert cache_api.returned_cache(out).get_seq_length() == 3


@pytest.mark.parametrize("field", ["cache", "past_key_values"])
def test_a_causal_lm_output_holds_the_cache_under_this_versions_field(field):
    out = cache_api.causal_lm_output(torch.zeros(1, 1, 2), "C")
    assert cache_api.returned_cache(out) == "C"
    assert (cache_api.OUTPUT_FIELD == field) == (field in type(out).__dataclass_fields__)
