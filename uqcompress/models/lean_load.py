"""Loading a checkpoint with one copy of its weights in memory.

safetensors maps its file privately: a tensor read from it is a view into the mapping, and
every page once read stays resident, counted in the process's RSS, until the whole file is
unmapped. Casting a bfloat16 checkpoint to float32 while it is mapped (transformers'
`from_pretrained(dtype=float32)`, or `load_state_dict` from `safetensors.torch.load_file`)
therefore peaks at the float32 weights plus every page of the file: 1.5x the float32
weights for a half checkpoint, 2x for a float32 one loaded into a model built beforehand.

Here each tensor is converted (`cast_in_place`) or copied (`load_streamed`) on its own, and
the pages it was read from are handed back (`release_pages`) before the next: the peak is
the result plus one tensor.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uqcompress.runtime.libc import libc_function

if TYPE_CHECKING:
    import torch
    from torch import nn

MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now


def release_pages(tensor: torch.Tensor) -> None:
    """Ask the kernel to drop the memory pages that lie wholly inside `tensor`'s bytes now.

    Only a hint, never a change of data: a page of a file mapping (a safetensors tensor) is
    read again from the file if touched again, an anonymous page is swapped out or, without
    swap, left where it is. Call it on a tensor about to be dropped whose pages would
    otherwise stay resident (a view into a mapped checkpoint). A no-op off Linux, on a
    kernel without MADV_PAGEOUT (it then fails, harmlessly) and on non-CPU tensors.
    """
    madvise = libc_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if madvise is None or tensor.device.type != "cpu" or tensor.numel() == 0:
        return
    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    stop = start + tensor.numel() * tensor.element_size()
    first, last = -(-start // page) * page, stop // page * page  # pages wholly inside
    if last > first:
        madvise(first, last - first, MADV_PAGEOUT)


def cast_in_place(model: nn.Module, dtype: torch.dtype, *, computed_buffers: bool = True) -> None:
    """Cast `model`'s floating-point parameters and buffers to `dtype` one at a time,
    releasing each source's pages as it goes (`nn.Module.to` would keep a mapped
    checkpoint's pages until the end). A tensor shared by several modules is cast once and
    stays shared. `computed_buffers=False` leaves the buffers a module computes itself and
    does not save (non-persistent: rotary `inv_freq`) as they were made, which is what
    transformers' `from_pretrained(dtype=...)` does (it keeps `inv_freq` in float32)."""
    import torch

    done: dict[int, Any] = {}
    with torch.no_grad():
        for module in model.modules():
            tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
            for table in tables:
                for name, tensor in table.items():
                    if tensor is None or not tensor.is_floating_point() or tensor.dtype == dtype:
                        continue
                    computed = (
                        table is module._buffers and name in module._non_persistent_buffers_set
                    )
                    if computed and not computed_buffers:
                        continue
                    if id(tensor) in done:
                        table[name] = done[id(tensor)]
                        continue
                    source = tensor.data
                    if isinstance(tensor, torch.nn.Parameter):
                        tensor.data = source.to(dtype)
                        done[id(tensor)] = tensor
                    else:
                        table[name] = done[id(tensor)] = source.to(dtype)
                    release_pages(source)
                    del source


def load_streamed(model: nn.Module, file: Path) -> None:
    """Copy every tensor of the safetensors `file` into `model`'s parameter or buffer of the
    same name (cast to its dtype), one tensor at a time, releasing its pages after each:
    `safetensors.torch.load_model`'s strict checks (every name the model has, or a name
    sharing its tensor; nothing else; the same shapes) without its whole-file state dict.
    ValueError names what does not fit; nothing is copied before every name and shape is
    checked."""
    import torch
    from safetensors import safe_open

    targets = model.state_dict(keep_vars=True)
    with safe_open(str(file), "pt") as handle:
        names = set(handle.keys())
        # a tensor the model holds under two names (tied weights) is saved under one
        saved = {_identity(targets[n]) for n in names if n in targets}
        missing = sorted(
            n for n in targets if n not in names and _identity(targets[n]) not in saved
        )
        unexpected = sorted(names - set(targets))
        if missing or unexpected:
            raise ValueError(
                f"the weights do not fit the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        for name in sorted(names):
            shape = list(handle.get_slice(name).get_shape())
            if shape != list(targets[name].shape):
                raise ValueError(
                    f"{name} has shape {shape} in the file, {list(targets[name].shape)} in "
                    "the model"
                )
        with torch.no_grad():
            for name in sorted(names):
                source = handle.get_tensor(name)
                targets[name].copy_(source)
                release_pages(source)
                del source


def _identity(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """Which memory a tensor is: two names of one shared tensor give the same identity (an
    empty tensor, which has no memory, is only itself)."""
    pointer = tensor.untyped_storage().data_ptr()
    if not pointer:
        return (id(tensor), -1, ())
    return (pointer, int(tensor.storage_offset()), tuple(tensor.shape))
