"""Which weights of a torch model are NaN or infinite, in words for a one-line error (issue
26: non-finite outputs, scores and starting weights are refused naming them)."""

from __future__ import annotations

from typing import Any

# Elements checked at a time: the check's temporaries (a bool mask, and an int64 count only
# for a chunk that holds a non-finite value) stay at a few MB whatever the tensor
# (a whole-tensor `(~isfinite(t)).sum()` made a bool and an int64 copy of it: 2 GB for a
# 1.5B decoder's embedding, the largest allocation of its export).
CHECK_CHUNK = 1 << 20


def non_finite_weights(model: Any) -> tuple[int, list[str]]:
    """How many parameter and buffer values of a torch model are NaN or infinite, and the
    names of the tensors that hold them (in the model's order)."""
    import torch

    count, names = 0, []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if not torch.is_floating_point(tensor):
            continue
        bad = 0
        for chunk in tensor.detach().reshape(-1).split(CHECK_CHUNK):
            finite = torch.isfinite(chunk)
            if not bool(finite.all()):  # counting sums in int64: only where there is a count
                bad += chunk.numel() - int(torch.count_nonzero(finite))
        if bad:
            count += bad
            names.append(name)
    return count, names


def weights_summary(count: int, names: list[str]) -> str:
    """`non_finite_weights` in words: "its weights hold 3 non-finite values (in a.weight)"."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more tensors" if len(names) > 3 else "")
    return f"its weights hold {count} non-finite value{'s' if count != 1 else ''} (in {shown})"
