"""A `uqc` that starts in milliseconds, for tests that run shell scripts of many `uqc` calls.

Every `uqc` process pays 3-4 s of imports (torch, transformers) before its first step, and the
docs walk-through alone runs about 30 of them. A *zygote* pays them once: it imports what the
steps import, then forks one child per `uqc` call. The `uqc` the script finds on its PATH is a
small shim that hands the zygote its argv, working directory, environment and its own stdin,
stdout and stderr (as file descriptors, over a Unix socket), and exits with the child's code.

What the script sees is what a real `uqc` gives it: the same `uqcompress.__main__.main`, a real
process with the caller's descriptors (pipes, `$(...)`, redirections work as written), the same
exit code. What it does not cover, and tests that need it use the installed console script:
signals sent to the shim, and the imports themselves (a missing or broken dependency).

    with Zygote(tmp_path) as bin_dir:   # put bin_dir first on PATH
        subprocess.run(["bash", "-c", script], env={..., "PATH": f"{bin_dir}:..."})
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).parents[1]

# The zygote: imports the steps' heavy dependencies, then serves one fork per connection.
# Nothing runs a torch operator before forking, so no thread pool exists to be lost in a child.
_SERVER = r"""
import array, json, os, signal, socket, struct, sys

path = sys.argv[1]
import uqcompress.__main__, uqcompress.cli.app  # noqa: E401
import torch, transformers  # noqa: E401,F401
from uqcompress.steps.registry import STEPS
for step in STEPS.values():
    step.step_module()  # every step's module, and what it imports
from uqcompress.models.families import FAMILIES
for family in FAMILIES.values():
    family.classifier_class()  # the transformers modeling module of each family
import uqcompress.engine.train, uqcompress.export.onnx  # noqa: E401
import torch.onnx._internal.exporter._core  # noqa: F401  (onnxscript, the exporter)
import onnxruntime, datasets, matplotlib.pyplot, accelerate  # noqa: E401,F401

server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(8)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves
print("ready", flush=True)

def receive(conn):
    # One message: 3 descriptors (stdin, stdout, stderr) and a length-prefixed JSON request.
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size:
        body += conn.recv(size - len(body))
    return list(fds), json.loads(body)

while True:
    conn, _ = server.accept()
    fds, request = receive(conn)
    pid = os.fork()
    if pid == 0:  # the child: becomes the `uqc` the shim stands for
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # its own subprocesses are waited for
        server.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["uqc", *request["argv"]]
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        code = 0
        try:
            uqcompress.__main__.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        conn.sendall(struct.pack("!i", code))
        os._exit(0)
    for fd in fds:
        os.close(fd)
    conn.close()
"""

# The shim on PATH: plain Python, no imports beyond the standard library (about 30 ms).
_SHIM = r"""#!{python} -S
import array, json, os, socket, struct, sys
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect({path!r})
body = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
fds = array.array("i", [0, 1, 2])
conn.sendmsg([struct.pack("!I", len(body)) + body],
             [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
reply = b""
while len(reply) < 4:
    chunk = conn.recv(4 - len(reply))
    if not chunk:
        sys.stderr.write("uqc (test zygote): the child died without an exit code\n")
        sys.exit(1)
    reply += chunk
sys.exit(struct.unpack("!i", reply)[0])
"""


class Zygote:
    """Start the zygote under `where`; entering gives the folder holding the `uqc` shim."""

    def __init__(self, where: Path, env: dict[str, str] | None = None) -> None:
        self.where = where
        self.env = dict(os.environ if env is None else env)
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Path:
        self.where.mkdir(parents=True, exist_ok=True)
        # AF_UNIX paths are limited to ~100 bytes: the socket goes to a short temp name.
        socket_path = f"/tmp/uqc-zygote-{os.getpid()}-{time.monotonic_ns()}.sock"
        self.socket_path = socket_path
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, socket_path],
            env={**self.env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the uqc zygote did not start (said {line!r})")
        bin_dir = self.where / "zygote-bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "uqc"
        shim.write_text(_SHIM.format(python=sys.executable, path=socket_path))
        shim.chmod(0o755)
        return bin_dir

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
