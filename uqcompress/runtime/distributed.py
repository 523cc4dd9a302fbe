"""Who am I in a multi-process launch (`torchrun`, `accelerate launch`)? Read from the
environment those launchers set, so it works before any process group exists.

Steps that only run a model over data (`eval`, `predict`, `score`) split the examples into
contiguous shards, one per process (`shard_bounds`: every example exactly once, no padding),
and bring the results together with the helpers below. They talk over a gloo process group
of their own (CPU tensors and pickled objects: outputs and score sums, never model weights),
created on first use from the launcher's environment, or beside the group `accelerate`
already made. With one process every helper is the identity and no group is created.
"""

from __future__ import annotations

import atexit
import contextlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch import Tensor

T = TypeVar("T")

_GROUP: Any = None


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def local_rank() -> int:
    """This process's index on its machine (which GPU it uses)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0)


def is_main_process() -> bool:
    """Rank 0 writes artifacts and prints results; the other ranks only compute."""
    return rank() == 0


def shard_bounds(total: int, index: int | None = None, count: int | None = None) -> tuple[int, int]:
    """The contiguous slice `[start, stop)` of `total` items that process `index` of `count`
    handles (default: this process of this launch). Shards differ in size by at most one
    (the first `total % count` get one more) and together cover every item exactly once, so
    concatenating the shards in rank order gives back the original order. A shard can be
    empty when there are fewer items than processes."""
    index = rank() if index is None else index
    count = world_size() if count is None else count
    base, extra = divmod(total, count)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def rank_device(device: str) -> str:
    """`cuda` means this process's own GPU in a multi-process launch: `cuda:LOCAL_RANK`, or
    modulo the GPUs visible when there are more processes than GPUs (they then share).
    Any other device (`cpu`, an explicit `cuda:N`) is kept."""
    if world_size() > 1 and device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return f"cuda:{local_rank() % count}" if count else device
    return device


def _group() -> Any:
    """The gloo process group the gathering helpers use (made once per process)."""
    global _GROUP
    if _GROUP is not None:
        return _GROUP
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", rank=rank(), world_size=world_size())
        atexit.register(_destroy)
        _GROUP = dist.group.WORLD
    elif dist.get_backend() == "gloo":
        _GROUP = dist.group.WORLD
    else:  # accelerate's NCCL group: a gloo one beside it for CPU objects
        _GROUP = dist.new_group(backend="gloo")
    return _GROUP


# How long a process waits at exit for the others before tearing its group down anyway.
EXIT_BARRIER_SECONDS = 30


def _destroy() -> None:
    """At exit: meet every other process (a bounded gloo barrier), then destroy the groups.
    Rank 0 of a two-process CPU launch aborted at exit now and then (SIGABRT, "terminate
    called without an active exception"), after its work was written, while its peer was
    exiting too; seen only under the full test suite's load, so this narrows a teardown
    race that could not be reproduced alone. A peer that is gone costs the wait, not a
    hang."""
    import datetime

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if _GROUP is not None:
        with contextlib.suppress(RuntimeError):  # a peer already gone: tear down regardless
            dist.monitored_barrier(
                group=_GROUP, timeout=datetime.timedelta(seconds=EXIT_BARRIER_SECONDS)
            )
    dist.destroy_process_group()


def all_gather_objects(value: T) -> list[T]:
    """Every process's `value` (picklable), in rank order, on every process."""
    if world_size() == 1:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, value, group=_group())
    return gathered


def gather_objects(value: T) -> list[T] | None:
    """Every process's `value`, in rank order, on rank 0; None on the other ranks."""
    if world_size() == 1:
        return [value]
    import torch.distributed as dist

    gathered: list[Any] | None = [None] * world_size() if is_main_process() else None
    dist.gather_object(value, gathered, dst=0, group=_group())
    return gathered


def all_gather_cat(tensor: Tensor) -> Tensor:
    """Every process's tensor concatenated along dim 0 in rank order, the same on every
    process (the sizes along dim 0 may differ). A sum over processes is
    `all_gather_cat(t[None]).sum(0)`: computed locally in rank order, so every process gets
    bit-for-bit the same value (the circuit search needs every rank to take the same pick).

    Shape: `[n_r, ...]` on process r -> `[sum_r n_r, ...]`, on the input's device.
    """
    if world_size() == 1:
        return tensor
    import torch

    parts = all_gather_objects(tensor.detach().cpu())
    return torch.cat(parts, dim=0).to(tensor.device)


def agree(compute: Callable[[], T]) -> T:
    """Run `compute` on every process and fail on every process if it failed on any.

    In a multi-process launch a process that raises while the others wait in a collective
    would leave them waiting; so every process reports whether `compute` worked before any
    result is exchanged. The failing process re-raises its own error; the others raise one
    naming it. With one process this is just `compute()`.
    """
    if world_size() == 1:
        return compute()
    from uqcompress.errors import UqcError

    try:
        value = compute()
        failure: tuple[str, str] | None = None
    except Exception as exc:
        hint = exc.hint if isinstance(exc, UqcError) else ""
        all_gather_objects((str(exc), hint))
        raise
    outcome = all_gather_objects(failure)
    for index, failed in enumerate(outcome):
        if failed is not None:
            message, hint = failed
            raise UqcError(
                f"process {index} of {world_size()} failed: {message}",
                hint=hint or "see that process's error above",
            )
    return value
