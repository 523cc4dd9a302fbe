"""Ctrl-C, SIGTERM and two writers at once never leave half-written artifacts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult
from uqcompress.artifacts import open_artifact

UQC = [sys.executable, "-m", "uqcompress"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "UQC_ARTIFACTS": str(tmp_path / "art")}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_finetune_leaves_nothing(
    tmp_path: Path, tiny_vit_artifact: Path, signum: int
) -> None:
    out = tmp_path / "ft"
    proc = subprocess.Popen(
        [
            *UQC,
            "finetune",
            str(tiny_vit_artifact),
            "--data",
            "builtin:digits",
            "--epochs",
            "500",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path),
    )
    deadline = time.time() + 120
    while time.time() < deadline and not any(".tmp-" in p.name for p in tmp_path.iterdir()):
        time.sleep(0.1)
    time.sleep(1.5)  # inside the training loop by now
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    # 130 is what a shell reports for both outcomes seen here: exit status 130, or (now and
    # then, on a loaded machine) the interpreter re-raising SIGINT at exit after the
    # KeyboardInterrupt was handled (returncode -2). Either way the message, the empty stdout
    # and the absence of any artifact or temp dir below are what the contract promises.
    assert proc.returncode in (130, -signal.SIGINT), stderr
    assert "interrupted; no artifact was written" in stderr
    assert stdout == ""
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_two_writers_of_the_same_id_end_with_one_valid_artifact(
    tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    out = tmp_path / "same"
    args = [
        *UQC,
        "finetune",
        str(tiny_vit_artifact),
        "--data",
        "builtin:digits@val",
        "--epochs",
        "3",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    procs = [
        subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path)
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (stdout, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr
        assert stdout.strip() == str(out)
    artifact = open_artifact(out)  # verifies every file hash
    assert artifact.manifest.step == "finetune"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same"]  # no temp dirs left


def _handlers_installed(pid: int) -> bool:
    """Whether the process has reached `main()`: uqc catches SIGTERM from its first line
    (SigCgt in /proc/PID/status is the mask of caught signals), so delays count from there
    and not from an interpreter start-up that a loaded machine may stretch."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    line = next((ln for ln in status.splitlines() if ln.startswith("SigCgt:")), None)
    return line is not None and bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_sigint_at_any_moment_of_start_up_stops_the_run(
    tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    """Ctrl-C from the first line of main() on (imports, data loading, model loading,
    training) ends with 130 and nothing written; once it was swallowed inside a `__del__`
    and the run went on to exit 0 with an artifact."""
    delays = [0.0, 0.2, 0.5, 1.0, 2.0, 3.0]  # seconds after main() starts
    runs = []
    for delay in delays:
        root = tmp_path / f"after-{delay}"
        root.mkdir()
        proc = subprocess.Popen(
            [
                *UQC,
                "finetune",
                str(tiny_vit_artifact),
                "--data",
                "builtin:digits@val",
                "--epochs",
                "300",  # minutes when uninterrupted: a lost Ctrl-C cannot go unseen
                "--device",
                "cpu",
                "--out",
                str(root / "ft"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "UQC_ARTIFACTS": str(root / "art")},
            cwd=root,
        )
        runs.append((delay, root, proc))
    # All runs at once keeps the test short; each gets its signal `delay` after its main().
    started: dict[float, float] = {}
    signalled: set[float] = set()
    deadline = time.time() + 120
    while len(signalled) < len(runs) and time.time() < deadline:
        for delay, _, proc in runs:
            if delay not in started and _handlers_installed(proc.pid):
                started[delay] = time.time()
            due = delay in started and time.time() >= started[delay] + delay
            if due and delay not in signalled:
                proc.send_signal(signal.SIGINT)
                signalled.add(delay)
        time.sleep(0.01)
    for delay, root, proc in runs:
        try:
            stdout, stderr = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(f"SIGINT {delay} s after start-up was lost: the run went on\n{stderr}")
        assert delay in signalled, f"the run signalled after {delay} s ended first\n{stderr}"
        # 130 or the interpreter's own re-raise of SIGINT at exit: see the test above.
        assert proc.returncode in (130, -signal.SIGINT), (delay, stderr)
        assert "interrupted; no artifact was written" in stderr, (delay, stderr)
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, (delay, stderr)
        assert stdout == "", delay
        assert sorted(p.name for p in root.iterdir()) in ([], ["art"]), delay
        assert not (root / "art").exists() or not any((root / "art").iterdir()), delay


# A KeyboardInterrupt raised inside a __del__ is printed ("Exception ignored in ...") and
# dropped by Python: the run used to go on and write its artifact. The object below sends
# SIGINT to its own process from its __del__, at the moment the command starts importing
# torch, so the handler runs (and raises) inside the __del__: exactly the lost Ctrl-C.
_LOSES_THE_INTERRUPT = """
import os, signal, sys

class LosesTheInterrupt:
    def __del__(self):
        print("__del__ sends SIGINT", file=sys.stderr)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10000):  # the handler runs at one of these jumps, inside __del__
            pass
        print("__del__ went on", file=sys.stderr)  # never: the KeyboardInterrupt ends it

fired = []

def hook(event, args):
    if event == "import" and args[0] == "torch" and not fired:
        fired.append(True)
        LosesTheInterrupt()  # dropped at once: its __del__ runs here

sys.addaudithook(hook)
from uqcompress.cli.app import main

main()
"""


def test_an_interrupt_lost_inside_a_del_still_stops_the_run(
    tmp_path: Path, tiny_vit_artifact: Path
) -> None:
    out = tmp_path / "ft"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOSES_THE_INTERRUPT,
            "finetune",
            str(tiny_vit_artifact),
            "--data",
            "builtin:digits@val",
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=300,
    )
    # The KeyboardInterrupt was raised inside the __del__ (and so dropped by Python).
    assert "__del__ sends SIGINT" in proc.stderr and "__del__ went on" not in proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: interrupted; no artifact was written"
    # No "Exception ignored in ... KeyboardInterrupt" note that says otherwise.
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.fixture
def lost_interrupt(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Deliver SIGINT's handler in-process and drop its KeyboardInterrupt, as a __del__ does;
    the recorded signal is forgotten after the test."""
    from uqcompress.runtime import interrupts

    monkeypatch.setattr(interrupts, "_received", None)

    def deliver() -> None:
        with contextlib.suppress(KeyboardInterrupt):
            interrupts._handler(signal.SIGINT, None)

    return deliver


def test_the_writer_installs_nothing_after_a_lost_interrupt(
    tmp_path: Path, lost_interrupt: Callable[[], None]
) -> None:
    from uqcompress.artifacts.writer import ArtifactWriter, OutputPlan

    plan = OutputPlan(kind="eval", step="eval", config={}, id_config={})
    with pytest.raises(KeyboardInterrupt), ArtifactWriter(tmp_path / "a", plan) as writer:
        (writer.dir / "metrics.json").write_text("{}")
        lost_interrupt()  # while the step works: nothing raised here
    assert list(tmp_path.iterdir()) == []  # no artifact, no temp dir


def test_a_lost_interrupt_makes_the_command_exit_130_without_a_result(
    tmp_path: Path,
    cli: Callable[..., CliResult],
    lost_interrupt: Callable[[], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from uqcompress.models import factory

    create = factory.create_model

    def create_and_lose_an_interrupt(*args: Any, **kwargs: Any) -> Any:
        lost_interrupt()
        return create(*args, **kwargs)

    monkeypatch.setattr(factory, "create_model", create_and_lose_an_interrupt)
    result = cli("init", "--family", "bert", "--labels", "neg,pos", "--out", tmp_path / "m")
    assert result.code == 130, result.err
    assert result.out == ""
    assert result.err.strip().splitlines() == ["error: interrupted; no artifact was written"]
    assert list(tmp_path.iterdir()) == []
