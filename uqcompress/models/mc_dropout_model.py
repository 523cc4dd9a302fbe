"""The MC Dropout model (Gal & Ghahramani, 2016): a classifier run S times with dropout kept
on at inference, the S softmaxes averaged; the S samples are its members.

Dropout sites: every place where the family's config applies its *hidden* dropout, with one
rate p everywhere (default: the config's `hidden_dropout_prob`):

- the embeddings' output;
- per block, the attention output projection's output and the MLP down projection's output
  (BERT's `attention.output.dropout` and `output.dropout`; ViT's residual dropout after
  `o_proj` and `fc2`), before their residual add;
- BERT: the pooled features before the classifier (its `dropout`); ViT has none there.

Attention-probability dropout stays off: its masks would be `[H, T, T]` per layer and sample,
T/d times the hidden sites' in size, and it would not fit the one noise input below.

The masks are thresholded from the `noise` input every sampling model takes (uq/noise.py):
standard normal draws `[B, S, K, T, d]`, K = the sites in the order they run (embeddings,
then attention and MLP of layer 0, 1, ..., then the classifier's); an element is kept where
its draw exceeds Phi^-1(p), which happens with probability 1 - p, and scaled by 1/(1 - p) as
`nn.Dropout` does. The classifier site reads the draws of the first token. So an ONNX graph
takes the draws as an input and thresholds them in-graph; without it, in eval mode each
example draws from its own generator seeded by the spec's seed and its content (the same
input gets the same samples in any batch, in torch and in the Predictor); in training mode
the masks are fresh Bernoulli draws. Rate 0 keeps everything: every sample is the base model.

The masks are applied by forward hooks on the family's own modules (named by its anatomy),
so the weights keep the base model's names (under `inner.`) and no module is swapped.
`MC_DROPOUT` at the end declares the kind to the registry (`models/kinds.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from uqcompress.errors import ConfigError
from uqcompress.models.families import FAMILIES
from uqcompress.models.kind_base import MC_DROPOUT_KEY, ModelKind  # MC_DROPOUT_KEY: the spec's
from uqcompress.models.outputs import MemberOutput

if TYPE_CHECKING:
    from uqcompress.models.families import Family
    from uqcompress.models.families.base import DropoutSites

# Families whose dropout sites are mapped (and tested): those declaring `dropout_sites`.
MC_DROPOUT_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.dropout_sites is not None)
# The inputs an example's draws are keyed on (uq/noise.py): what the exported graph takes.
NOISE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "pixel_values")


@dataclass(frozen=True)
class MCDropoutSpec:
    """The layout, stored in the config under `uqc_mc_dropout`."""

    samples: int  # S: dropout samples averaged at inference
    rate: float  # p: drop probability at every site
    seed: int  # of the per-example draws when none are given

    def to_dict(self) -> dict[str, Any]:
        return {
            "members": self.samples,  # what eval and export count as M
            "samples": self.samples,
            "rate": self.rate,
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config: Any) -> MCDropoutSpec:
        raw = getattr(config, MC_DROPOUT_KEY)
        return cls(samples=int(raw["samples"]), rate=float(raw["rate"]), seed=int(raw["seed"]))


def mc_dropout_family(family: Family) -> Family:
    """The family, or the one-line refusal of a family whose dropout sites are not mapped."""
    dropout_sites(family)
    return family


def dropout_sites(family: Family) -> DropoutSites:
    """The family's `dropout_sites`, or the one-line refusal where they are not mapped."""
    if family.dropout_sites is None:
        raise ConfigError(
            f"MC Dropout supports the {' and '.join(MC_DROPOUT_FAMILIES)} families; this "
            f"model is {family.name}",
            hint="use a bert or vit model, or a deep ensemble (uqc eval M1 M2 M3)",
        )
    return family.dropout_sites


def config_rate(config: Any) -> float:
    """The model's own hidden dropout rate (`hidden_dropout_prob`; 0 where it has none)."""
    return float(getattr(config, "hidden_dropout_prob", 0.0) or 0.0)


def keep_threshold(rate: float) -> float:
    """The draw a standard normal must exceed to be kept: Phi^-1(p) (-inf at p = 0)."""
    if rate <= 0:
        return -math.inf
    return NormalDist().inv_cdf(rate)


class MCDropoutModel(nn.Module):
    """The base classifier with dropout masks at its hidden-dropout sites, S samples folded
    into the batch (sample-major). Call it like the base classifier; `noise` `[B, S, K, T, d]`
    makes the draws explicit (see the module docstring).

    Shape: inputs `[B, ...]` -> member_logits `[B, S, C]`.
    """

    def __init__(self, inner: nn.Module, family: Family, spec: MCDropoutSpec) -> None:
        super().__init__()
        self.family = mc_dropout_family(family)
        self.inner = inner
        self.spec = spec
        self.config: Any = getattr(inner, "config", None)
        # Samples per inference pass (None: sized by uq.noise.AUTO_CHUNK_TOKENS); a runtime
        # setting, never saved: it changes memory and speed, not the result.
        self.sample_chunk: int | None = None
        self._mask_of: MaskSource | None = None  # set during a forward
        for index, (module, where) in enumerate(self._site_modules()):
            hook = _SiteHook(self, index)
            if where == "input":
                module.register_forward_pre_hook(hook.input)
            else:
                module.register_forward_hook(hook.output)

    def _site_modules(self) -> list[tuple[nn.Module, str]]:
        """(module, "output" | "input") per site, in the order they run."""
        family, inner = self.family, self.inner
        sites: list[tuple[nn.Module, str]] = [(family.embeddings(inner), "output")]
        for block in family.blocks(inner):
            parts = family.block_parts(block, self.config)
            sites += [(parts.attention.output, "output"), (parts.mlp.down, "output")]
        if dropout_sites(family).classifier:
            sites.append((family.head_parts(inner).classifier, "input"))
        return sites

    @property
    def members(self) -> int:
        return self.spec.samples

    @property
    def sites(self) -> int:
        """K: dropout sites (embeddings, 2 per block, the classifier's where it has one)."""
        return len(self._site_modules())

    def image_tokens(self) -> int | None:
        """Tokens of an image model (patches + CLS); None for text (it varies)."""
        return self.family.fixed_tokens(self.config)

    def noise_shape(self, batch: int, tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of the `noise` input: `[B, S, K, T, d]`."""
        return (batch, self.spec.samples, self.sites, tokens, int(self.config.hidden_size))

    def train(self, mode: bool = True) -> MCDropoutModel:
        """As `nn.Module.train`, but the base model's own dropout modules stay off: in
        training mode too, the only dropout is this model's masks (fresh ones)."""
        super().train(mode)
        self.inner.eval()
        return self

    def forward(self, noise: torch.Tensor | None = None, **inputs: Any) -> MemberOutput:
        inputs = {k: v for k, v in inputs.items() if k != "labels" and v is not None}
        if noise is not None or self.training:
            return MemberOutput(member_logits=self._pass(inputs, noise))
        batch = int(next(iter(inputs.values())).shape[0])
        # Per-example draws, in slices of examples that run all S samples at once: the draws
        # depend on the example alone, so the slicing changes memory, never the result.
        from uqcompress.uq.noise import examples_per_pass

        tokens = self._tokens(inputs)
        size = examples_per_pass(batch, self.spec.samples, tokens, self.sample_chunk)
        parts = [
            self._pass({k: v[i : i + size] for k, v in inputs.items()}, None)
            for i in range(0, batch, size)
        ]
        return MemberOutput(member_logits=parts[0] if len(parts) == 1 else torch.cat(parts))

    def _tokens(self, inputs: dict[str, Any]) -> int:
        fixed = self.image_tokens()
        return fixed if fixed is not None else int(inputs["input_ids"].shape[1])

    def _pass(self, inputs: dict[str, Any], noise: torch.Tensor | None) -> torch.Tensor:
        """One forward of all S samples. Shape: inputs `[B, ...]`, noise `[B, S, K, T, d]` or
        None -> `[B, S, C]`."""
        samples = self.spec.samples
        repeated = {
            key: value.repeat(samples, *([1] * (value.dim() - 1)))  # sample-major [S*B, ...]
            for key, value in inputs.items()
            if isinstance(value, torch.Tensor)
        }
        if noise is not None:
            self._mask_of = self._given_masks(noise)
        elif self.training:
            self._mask_of = self._fresh_masks()
        else:
            self._mask_of = self._example_masks(inputs)
        try:
            logits = self.inner(**repeated).logits  # [S*B, C]
        finally:
            self._mask_of = None
        # (no int() of the batch size: an exported graph keeps it dynamic)
        return logits.reshape(samples, -1, logits.shape[-1]).transpose(0, 1)  # [B, S, C]

    def _given_masks(self, noise: torch.Tensor) -> MaskSource:
        """Masks thresholded from explicit draws (what the exported graph computes).

        Shape: noise `[B, S, K, T, d]` -> each site's mask `[S*B, T, d]`.
        """
        batch, samples, sites, tokens, hidden = noise.shape
        # [B, S, K, T, d] -> [K, S*B, T, d], matching the sample-major folding
        folded = noise.permute(2, 1, 0, 3, 4).reshape(sites, samples * batch, tokens, hidden)
        threshold, scale = keep_threshold(self.spec.rate), 1.0 / (1.0 - self.spec.rate)

        def given(site: int, like: torch.Tensor) -> torch.Tensor:
            return (folded[site] > threshold).to(like.dtype) * scale

        return given

    def _fresh_masks(self) -> MaskSource:
        """Fresh Bernoulli(1 - p) masks from the global RNG (training)."""
        rate, scale = self.spec.rate, 1.0 / (1.0 - self.spec.rate)

        def fresh(site: int, like: torch.Tensor) -> torch.Tensor:
            keep = torch.rand(like.shape, device=like.device) >= rate
            return keep.to(like.dtype) * scale

        return fresh

    def _example_masks(self, inputs: dict[str, Any]) -> MaskSource:
        """Each site's masks from per-example generators (uq/noise.py), drawn site by site in
        the order the sites run (one site's draws in memory). Shape: each `[S*B, T, d]`."""
        from uqcompress.uq.noise import ExampleNoise

        arrays = {
            name: (value.detach().float() if name == "pixel_values" else value.detach().long())
            .cpu()
            .numpy()
            for name, value in inputs.items()
            if name in NOISE_KEYS
        }
        samples, hidden = self.spec.samples, int(self.config.hidden_size)
        stream = ExampleNoise(arrays, self.spec.seed, samples, hidden, tokens=self.image_tokens())
        batch, _, tokens, _ = stream.shape
        threshold, scale = keep_threshold(self.spec.rate), 1.0 / (1.0 - self.spec.rate)
        drawn = [0]  # sites drawn so far

        def example(site: int, like: torch.Tensor) -> torch.Tensor:
            if site < drawn[0]:
                raise RuntimeError(f"dropout site {site} ran twice or out of order")
            while drawn[0] < site:  # a site that did not run: its draws are skipped
                stream.step()
                drawn[0] += 1
            draw = torch.from_numpy(stream.step())  # [B, S, T, d]
            drawn[0] += 1
            folded = draw.transpose(0, 1).reshape(samples * batch, tokens, hidden)
            keep = (folded > threshold).to(device=like.device, dtype=like.dtype)
            return keep * scale

        return example


# (site index, the tensor it masks) -> the mask, broadcastable after `_site_mask`
MaskSource = Callable[[int, torch.Tensor], torch.Tensor]


class _SiteHook:
    """The forward hook of one dropout site: multiplies a module's output `[S*B, T, d]` (or,
    as a pre-hook, a classifier's input `[S*B, d]`) by the site's mask while the model runs a
    forward pass, and changes nothing otherwise (the inner model run on its own). An object
    rather than a closure, so that a deep copy of the model hooks the copy."""

    def __init__(self, model: MCDropoutModel, site: int) -> None:
        self.model, self.site = model, site

    def output(self, _module: nn.Module, _args: Any, output: Any) -> Any:
        source = self.model._mask_of
        if source is None:
            return None
        hidden = output[0] if isinstance(output, tuple) else output
        masked = hidden * _site_mask(source, self.site, hidden)
        return (masked, *output[1:]) if isinstance(output, tuple) else masked

    def input(self, _module: nn.Module, args: tuple[Any, ...]) -> Any:
        source = self.model._mask_of
        if source is None:
            return None
        pooled = args[0]
        return (pooled * _site_mask(source, self.site, pooled), *args[1:])


def _site_mask(source: MaskSource, site: int, hidden: torch.Tensor) -> torch.Tensor:
    """The mask for `hidden`: `[S*B, T, d]`, or at the classifier `[S*B, d]` (the draws of
    the first token)."""
    mask = source(site, hidden)
    if hidden.dim() == 2 and mask.dim() == 3:
        mask = mask[:, 0, :]  # [S*B, d]
    return mask


def mc_dropout_skeleton(config: Any, family: Family) -> MCDropoutModel:
    """An MC Dropout model with the shapes its config records (weights to be loaded)."""
    from uqcompress.models.surgery import classifier_skeleton

    spec = MCDropoutSpec.from_config(config)
    inner: Any = classifier_skeleton(config, family)  # of a pruned model: its heads
    model = MCDropoutModel(inner, family, spec)
    model.config = config
    return model


def with_samples(model: MCDropoutModel, samples: int) -> None:
    """Change S for inference (`eval --samples`)."""
    from dataclasses import replace

    if samples < 1:
        raise ConfigError(f"--samples {samples} must be at least 1", hint="pass --samples 10")
    model.spec = replace(model.spec, samples=samples)


def _mc_dropout_summary(loaded: Any) -> dict[str, Any]:
    spec = loaded.model.spec
    return {
        "members": loaded.members,
        "method": "mc-dropout",
        "samples": spec.samples,
        "rate": spec.rate,
        "dropout_sites": loaded.model.sites,
    }


MC_DROPOUT = ModelKind(
    name="mc-dropout",
    key=MC_DROPOUT_KEY,
    described="an MC Dropout model",
    noun="MC Dropout model",
    remake="uqc mc-dropout",
    skeleton=mc_dropout_skeleton,
    ensemble=True,
    refusal="{step} the base model it was made from",
    summarise=_mc_dropout_summary,
)
