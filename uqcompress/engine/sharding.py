"""Fully sharded data parallel training (FSDP) for the training loop, on CPUs and GPUs.

Under `torchrun` or `accelerate launch` with several processes, `--fsdp` (or an accelerate
config with `distributed_type: FSDP`, which sets ACCELERATE_USE_FSDP) shards the model's
weights, gradients and optimizer state across the processes with torch's FSDP2
(`fully_shard`): each transformer block (the classes transformers lists in a model's
`_no_split_modules`) is one unit, gathered for its forward and backward and freed after. A
model that does not fit one process's memory trains this way. accelerate's own FSDP runs on
GPUs only; this one works on CPUs too (gloo), which is how it is tested.

Sharding changes the model in place (its parameters become DTensors), so after training the
full weights are gathered and the model is rebuilt as a plain module (`unsharded`) before a
step saves it. A resumable checkpoint holds whole tensors too (`full_tensors`), so it is the
file one process writes; resuming lays each one out as its shard again (`shard_like`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from uqcompress.models.loading import LoadedModel

ACCELERATE_FSDP = "ACCELERATE_USE_FSDP"  # set by `accelerate launch` from an FSDP config


def requested(flag: bool) -> bool:
    """Whether the training loop shards: `--fsdp`, or an accelerate FSDP launch, with more
    than one process (one process has nothing to shard across)."""
    from uqcompress.runtime.distributed import world_size

    from_accelerate = os.environ.get(ACCELERATE_FSDP, "").lower() in ("1", "true", "yes")
    return (flag or from_accelerate) and world_size() > 1


def block_classes(model: nn.Module) -> set[str]:
    """The class names transformers keeps whole when it splits a model (`_no_split_modules`
    of the model and of every transformers model inside it: an SVE's or a student's inner
    classifier)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return names


def shard(model: nn.Module) -> int:
    """Shard `model` in place: each transformer block, then the rest as the root unit.
    Returns how many blocks were sharded (0: the whole model is one unit). Call after the
    process group exists (the loop's Accelerator makes it) and before the optimizer is made
    (its parameters become the shards)."""
    from torch.distributed.fsdp import fully_shard

    classes = block_classes(model)
    blocks = [m for m in model.modules() if type(m).__name__ in classes and m is not model]
    for block in blocks:
        fully_shard(block)
    fully_shard(model)
    return len(blocks)


def unsharded(loaded: LoadedModel, model: nn.Module, prefix: str = "") -> nn.Module:
    """A plain module holding `model`'s full weights (gathered from every process: call on
    all of them), rebuilt from `loaded`'s config as loading would (a kind's skeleton, or the
    family's classifier). `prefix`: the weights of one submodule of the sharded `model`
    (DIRECTOR's `student.` inside the module that trained it)."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from uqcompress.models.kinds import kind_of
    from uqcompress.models.surgery import classifier_skeleton

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # the gathered tensors can be views into one all-gather buffer; each gets its own
    # storage, or safetensors refuses to save a tensor that does not cover its storage
    state = {
        name.removeprefix(prefix): value.clone() if isinstance(value, torch.Tensor) else value
        for name, value in state.items()
        if name.startswith(prefix)
    }
    build = kind_of(loaded.config).skeleton or classifier_skeleton
    with torch.random.fork_rng(devices=[]):  # building must not move the global RNG
        plain: Any = build(loaded.config, loaded.family)
    # assign: the module takes the gathered tensors as they are, dtypes included (an SVE's
    # float32 singular values in a bfloat16 model)
    plain.load_state_dict(state, strict=True, assign=True)
    plain.eval()
    result: nn.Module = plain
    return result


def full_tensors(values: dict[Any, Any]) -> dict[Any, Any]:
    """`values` with every sharded tensor (a DTensor) gathered whole onto the CPU; other
    tensors copied to the CPU, anything else as it is. A collective for sharded values: call
    on every process, with the same keys in the same order (a state dict's own order)."""
    import torch
    from torch.distributed.tensor import DTensor

    def whole(value: Any) -> Any:
        if isinstance(value, DTensor):
            return value.full_tensor().detach().to("cpu", copy=True)
        if isinstance(value, torch.Tensor):
            return value.detach().to("cpu", copy=True)
        return value

    return {key: whole(value) for key, value in values.items()}


def shard_like(full: Any, target: Any) -> Any:
    """The whole tensor `full` laid out as `target` is: this process's shard of it when
    `target` is sharded (a DTensor; every process holds `full`, so nothing is exchanged),
    else `full` itself (also when `full` already is sharded)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(target, DTensor) or isinstance(full, DTensor):
        return full
    placed = full.to(device=target.device, dtype=target.dtype)
    return distribute_tensor(placed, target.device_mesh, target.placements, src_data_rank=None)
