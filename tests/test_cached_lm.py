"""KV-cache bookkeeping: after crop or gather, the cache equals the cache of a plain forward over the kept tokens."""
import pytest
import torch

from specbench.backends.torch.cached_lm import CachedLM


def caches_close(a: CachedLM, b: CachedLM):
    assert a.length == b.length
    for la, lb in zip(a.cache.layers, b.cache.layers):
        assert torch.allclose(la.keys, lb.keys, atol=1e-5) and torch.allclose(la.values, lb.values, atol=1e-5)


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_gpt2"])
def test_crop_equals_plain_forward_of_prefix(fixture, request):
    pair = request.getfixturevalue(fixture)
    lm, ref = CachedLM(pair.target), CachedLM(pair.target)
    lm.forward([5, 6, 7, 8])
    lm.forward([9, 10, 11])  # e.g. a verify pass over 3 drafted tokens
    lm.crop(5)  # keep 5 positions: 4 prompt tokens + 1 accepted
    ref.forward([5, 6, 7, 8, 9])
    caches_close(lm, ref)
    # and the next logits agree with a from-scratch forward
    assert torch.allclose(lm.forward([12])[-1], ref.forward([12])[-1], atol=1e-4)


def test_keep_positions_gathers_a_non_contiguous_path(tiny_llama):
    lm = CachedLM(tiny_llama.target)
    lm.forward([5, 6, 7])
    lm.forward([8, 9, 10])
    lm.keep_positions([0, 1, 2, 4])  # drop position 3: only valid when 4 was computed without seeing 3,
    # which the linear forward above does not guarantee, so compare the kept keys/values directly
    full = CachedLM(tiny_llama.target)
    full.forward([5, 6, 7, 8, 9, 10])
    for kept, whole in zip(lm.cache.layers, full.cache.layers):
        assert torch.allclose(kept.keys, whole.keys[..., [0, 1, 2, 4], :], atol=1e-5)
    assert lm.length == 4


def test_crop_rejects_growth(tiny_gpt2):
    lm = CachedLM(tiny_gpt2.target)
    lm.forward([1, 2, 3])
    with pytest.raises(ValueError):
        lm.crop(5)
    lm.crop(3)
    assert lm.length == 3
