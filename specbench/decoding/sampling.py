"""Turning logits into a next token: argmax at temperature 0, else temperature + top-p sampling.

The same ``Sampler`` processes draft and target logits, so the distributions q (draft) and p
(target) used by rejection sampling are exactly the ones each model would sample from alone.
"""
from __future__ import annotations

import torch

from ..backends.host_reads import host_value


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.generator = torch.Generator(device="cpu")
        self.device_generators: dict[torch.device, torch.Generator] = {}  # sampling where the probabilities are
        self.reset(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def reset(self, seed: int) -> None:
        self.seed = int(seed)
        self.generator.manual_seed(self.seed)
        for generator in self.device_generators.values():
            generator.manual_seed(self.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) logits -> (n, V) float32 probabilities after temperature and top-p (nucleus)."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p >= 1.0:
            return probs
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= self.top_p, 0.0)  # keeps the top token always
        nucleus = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        return nucleus / nucleus.sum(dim=-1, keepdim=True)

    def sample(self, probs: torch.Tensor) -> int:
        """One token from a (V,) distribution, drawn where it is (a GPU's probabilities are not copied to the host:
        only the token is read), with this sampler's generator for that device (seeded alike)."""
        return int(self.sample_ids(probs))

    def sample_ids(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of (..., V) probabilities as a (...,) long tensor on their device, read by nothing (a
        draft sampled on the device feeds it to its next forward as it is: speculative.DraftChain)."""
        probs = probs.detach().float()
        return torch.multinomial(probs, 1, generator=self._generator(probs.device))[..., 0]

    def _generator(self, device: torch.device) -> torch.Generator:
        if device.type == "cpu":
            return self.generator
        if device not in self.device_generators:
            self.device_generators[device] = torch.Generator(device=device)
            self.device_generators[device].manual_seed(self.seed)
        return self.device_generators[device]

    def uniform(self) -> float:
        """u ~ U[0, 1) from the host generator (a host value on every machine: host_reads.host_value)."""
        return float(host_value(torch.rand((), generator=self.generator)))

    def pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """Next token from (V,) logits, and its (V,) distribution (None when greedy)."""
        if self.greedy:
            return int(logits.argmax()), None
        probs = self.probs(logits[None])[0]
        return self.sample(probs), probs
