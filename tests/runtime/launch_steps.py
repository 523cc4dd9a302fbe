"""Run several `uqc` commands in one process of a `torchrun` launch (one start-up for all).

Usage: `torchrun --nproc_per_node N launch_steps.py COMMANDS.json`, where COMMANDS.json holds
a list of commands: an argument list, or `{"args": [...], "fail_rank": R}` for a command during
which rank R's torch model predictions raise a DataError (as an unreadable input on one machine
would: a test of what a failure on one process does to the whole run), or `{"args": [...],
"stop_at_batch": N}` for a training run that every rank interrupts (KeyboardInterrupt, as
Ctrl-C) at its N-th batch. Every command runs;
each rank then prints `exit codes of rank R: [...]` on stderr and exits 0 (torchrun stops
every process as soon as one exits non-zero, which would cut rank 0's last writes short).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    from uqcompress.cli.app import run
    from uqcompress.engine import sources
    from uqcompress.errors import DataError
    from uqcompress.runtime import interrupts
    from uqcompress.runtime.distributed import all_gather_objects, rank

    def broken(*args: object, **kwargs: object) -> object:
        raise DataError("injected failure on this rank", hint="none: a test")

    real_check = interrupts.check
    batches = {"seen": 0, "stop": 0}

    def check() -> None:  # the training loop asks once per batch
        batches["seen"] += 1
        if batches["seen"] == batches["stop"]:
            raise KeyboardInterrupt

    real, real_stream = sources.TorchSource.predict, sources.TorchSource.stream
    codes = []
    for command in json.loads(Path(sys.argv[1]).read_text()):
        spec: dict[str, Any] = command if isinstance(command, dict) else {"args": command}
        failing = spec.get("fail_rank") == rank()
        # image data streams through one loader (`stream`), text slice by slice (`predict`)
        sources.TorchSource.predict = broken if failing else real  # type: ignore[method-assign]
        sources.TorchSource.stream = broken if failing else real_stream  # type: ignore[method-assign,assignment]
        batches.update(seen=0, stop=spec.get("stop_at_batch", 0))
        interrupts.check = check if batches["stop"] else real_check  # type: ignore[assignment]
        codes.append(run(spec["args"]))
    interrupts.check = real_check  # type: ignore[assignment]
    all_gather_objects(None)  # every rank done with every command
    sys.stderr.write(f"exit codes of rank {rank()}: {codes}\n")


if __name__ == "__main__":
    main()
