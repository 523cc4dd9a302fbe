"""Bounds of every count-like option (processes, members, samples, batches, lengths): the
largest and the smallest value each takes, declared once here.

An unbounded count is a way to take the machine down: `--workers 100000` once started about
1,280 loader processes, used all 24 GiB and got unrelated jobs killed by the OOM killer. Each
bound below is far above any useful value (the papers use 3-16 members and 10-30 samples) and
low enough that memory and the number of processes stay finite. A value above its bound is
refused, never clamped: a number that large is a typo, and silently running with less would
hide it. The lower bounds sit beside them (a count of 0 members or batches means nothing),
with the fix a user is told. The bounds are checked where every step config is checked
(`steps.config.problems`), so the command line, recipes and the training engine get the same
ones, said in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from uqcompress.runtime.device import usable_cores

WORKERS_PER_CORE_LIMIT = 4  # as --threads: a small multiple of the cores this process may use


@dataclass(frozen=True)
class CountLimit:
    """The largest value a count option takes and why (said in the error); the smallest (None:
    no lower bound), and the fix told for a value under it (None: pass the option's default)."""

    maximum: int
    why: str
    minimum: int | None = 1
    fix: str | None = None


def workers_limit() -> CountLimit:
    """Data-loader worker processes: each is a process of its own (torch imported)."""
    cores = usable_cores()
    return CountLimit(
        WORKERS_PER_CORE_LIMIT * cores,
        f"{WORKERS_PER_CORE_LIMIT} x the {cores} CPU cores this process may use; each worker is "
        "a process",
        minimum=0,
        fix="pass --workers 0 (read data in this process) or e.g. --workers 2",
    )


# Field name (as in the step configs) -> its bound. `workers` depends on the machine.
COUNT_LIMITS: dict[str, CountLimit] = {
    "batch_size": CountLimit(8192, "a batch is held in memory at once"),
    "members": CountLimit(
        64,
        "each member is one more model to train and run; the papers use 3-16",
        fix="pass --members 1 for one, or e.g. --members 4 for four",
    ),
    "samples": CountLimit(1024, "one forward pass per sample; the papers use 10-30"),
    "sample_chunk": CountLimit(
        1024,
        "samples run at once; at most --samples' own bound",
        fix="drop --sample-chunk to size it to memory",
    ),
    "calib_size": CountLimit(4096, "calibration holds every example's activations at once"),
    "calib_pool": CountLimit(1_000_000, "the pool is read and shuffled in memory"),
    "epochs": CountLimit(10_000, "passes over the data"),
    "max_steps": CountLimit(
        10_000_000, "optimizer steps", fix="drop --max-steps to train for --epochs"
    ),
    "grad_accum": CountLimit(
        1024,
        "batches per optimizer step",
        fix="pass --grad-accum 1 (no accumulation) or more",
    ),
    "patience": CountLimit(
        10_000,
        "epochs without improvement; at most --epochs' own bound",
        fix="pass e.g. --patience 3",
    ),
    "checkpoint_every": CountLimit(
        10_000_000,
        "optimizer steps; at most --max-steps' bound",
        fix="pass e.g. --checkpoint-every 100 (optimizer steps)",
    ),
    "ema_every": CountLimit(
        10_000_000,
        "optimizer steps; at most --max-steps' bound",
        fix="pass --ema-every 1 (update the average after every optimizer step)",
    ),
    "ema_start": CountLimit(
        10_000_000,
        "optimizer steps; at most --max-steps' bound",
        minimum=0,
        fix="pass --ema-start 0 (average from the first step)",
    ),
    "max_length": CountLimit(
        131_072,
        "tokens per example; attention memory grows as its square",
        minimum=3,  # room for a text's special tokens and one word
        fix="pass --max-length 3 or more, or leave it out (the training length)",
    ),
    "depth": CountLimit(64, "DiT blocks of the DIRECTOR student"),
    "replace_last": CountLimit(
        1024, "blocks; at most the model's layers", fix="drop --replace-last to replace every layer"
    ),
    "shared_layers": CountLimit(
        1024,
        "blocks; at most the model's layers",
        minimum=0,
        fix="pass --shared-layers 0 (no trunk) or e.g. --shared-layers 6",
    ),
    "num_labels": CountLimit(100_000, "classes of the classifier head"),
    "image_size": CountLimit(4096, "pixels per side; the image is held in memory"),
    "patch_size": CountLimit(4096, "pixels per side; at most --image-size"),
    # a seed is a name, not a count: negative ones have always been taken (torch takes them)
    "seed": CountLimit(2**32 - 1, "numpy's seeds are 32-bit", minimum=None),
    # uqc serve (its options are not a step config's; cli/serve_cmd.py checks them here)
    "max_batch": CountLimit(1024, "a batch's examples are held in memory and run at once"),
    "max_wait_ms": CountLimit(
        1000, "each request may wait this long for others to batch with", minimum=0
    ),
}


def count_limit(name: str) -> CountLimit | None:
    """The bound of the count field `name`, if it has one."""
    if name == "workers":
        return workers_limit()
    return COUNT_LIMITS.get(name)


def over_limit(name: str, value: object, flag: str) -> tuple[str, str] | None:
    """(message, hint) when `value` of the field `name` (spelled `flag`) is above its bound."""
    limit = count_limit(name)
    if limit is None or not isinstance(value, int) or isinstance(value, bool):
        return None
    if value <= limit.maximum:
        return None
    return (
        f"{flag} {value} is more than {limit.maximum:,} ({limit.why})",
        f"pass {flag} {limit.maximum} or less",
    )


def under_limit(name: str, value: object, flag: str, default: object) -> tuple[str, str] | None:
    """(message, hint) when `value` of the field `name` (spelled `flag`) is below its bound;
    the hint passes `default` (the option's default) unless the bound names its own fix."""
    limit = count_limit(name)
    if limit is None or limit.minimum is None or not isinstance(value, int):
        return None
    if isinstance(value, bool) or value >= limit.minimum:
        return None
    least = "0 or more" if limit.minimum == 0 else f"at least {limit.minimum}"
    if limit.fix is not None:
        fix = limit.fix
    elif isinstance(default, int) and not isinstance(default, bool) and default >= limit.minimum:
        fix = f"pass {flag} {default}"
    else:
        fix = f"pass {flag} {limit.minimum}"
    return f"{flag} {value} must be {least}", fix


def bound_problems(name: str, value: object, flag: str, default: object) -> tuple[str, str] | None:
    """(message, hint) when `value` of the field `name` is outside its bounds, else None."""
    return under_limit(name, value, flag, default) or over_limit(name, value, flag)
