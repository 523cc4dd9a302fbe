"""Build `uqcompress-runtime`: the torch-free Predictor as a wheel of its own.

    python packaging/build_runtime.py [--out dist]
    pip install "dist/uqcompress_runtime-<version>-py3-none-any.whl[cpu]"   # or [gpu]

Why a second distribution and not a runtime-only base install with the toolchain in an
extra: `pip install uqcompress` must keep giving the `uqc` CLI that every recipe, CI job and
the docs use; making the toolchain opt-in would break each of them. A service that only
runs exports installs this wheel instead: numpy, onnx, tokenizers and ONNX Runtime (about
230 MB), no torch, transformers or accelerate.

The wheel holds exactly RUNTIME_MODULES, the modules `uqcompress.export.runtime` needs for
text, image and sampling (DIRECTOR) exports, with their package `__init__`s; it installs
the same `uqcompress` import package, so install one of the two distributions, never both.
tests/packaging/test_runtime_wheel.py installs the wheel in a fresh venv and predicts with
it, so a new import the list lacks fails CI.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = "uqcompress-runtime"
RUNTIME_MODULES = (
    "uqcompress/errors.py",
    "uqcompress/engine/modality.py",
    "uqcompress/export/contract.py",
    "uqcompress/export/onnx_file.py",
    "uqcompress/export/runtime.py",
    "uqcompress/models/preprocessing.py",
    "uqcompress/runtime/deps.py",
    "uqcompress/runtime/libc.py",
    "uqcompress/runtime/paths.py",
    "uqcompress/uq/calibration.py",
    "uqcompress/uq/noise.py",
    "uqcompress/uq/outputs.py",
)
DEPENDENCIES = ("numpy>=1.26", "onnx>=1.16", "tokenizers>=0.21")
# ONNX Runtime as in the main package: onnxruntime and onnxruntime-gpu install the same
# module and must never be installed together, so it is an extra. Pick exactly one.
EXTRAS = {"cpu": ("onnxruntime>=1.18",), "gpu": ("onnxruntime-gpu>=1.18",)}


def version() -> str:
    text = (ROOT / "uqcompress" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', text, re.MULTILINE)
    if found is None:
        sys.exit("uqcompress/__init__.py has no __version__")
    return found.group(1)


def _quoted(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def pyproject() -> str:
    extras = "\n".join(f"{name} = {_quoted(deps)}" for name, deps in EXTRAS.items())
    return f"""[build-system]
requires = ["setuptools>=68", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{version()}"
description = "uqcompress's torch-free ONNX Runtime Predictor (run exports; no toolchain)."
requires-python = ">=3.11"
license = {{ text = "Apache-2.0" }}
dependencies = {_quoted(DEPENDENCIES)}

[project.optional-dependencies]
{extras}

[tool.setuptools.packages.find]
include = ["uqcompress*"]
"""


def stage(target: Path) -> None:
    """The wheel's sources: RUNTIME_MODULES and every package `__init__.py` above them."""
    packages = {"uqcompress"}
    for module in RUNTIME_MODULES:
        parts = Path(module).parts[:-1]
        packages |= {"/".join(parts[: i + 1]) for i in range(len(parts))}
        (target / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / module, target / module)
    for package in packages:
        shutil.copyfile(ROOT / package / "__init__.py", target / package / "__init__.py")
    (target / "pyproject.toml").write_text(pyproject(), encoding="utf-8")


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="uqc-runtime-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        stage(source)
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
        command += ["-q", "-w", str(out), str(source)]
        subprocess.run(command, check=True)
    wheels = sorted(out.glob(f"{NAME.replace('-', '_')}-{version()}-*.whl"))
    if not wheels:
        sys.exit(f"no wheel of {NAME} was built in {out}")
    return wheels[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the wheel goes")
    args = parser.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
