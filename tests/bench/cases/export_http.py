"""`ferry export` of a qcow2 over HTTP: nginx serves the 4 GiB half-data image as a qcow2,
`ferry export URL` serves its virtual disk over NBD, and nbdcopy reads that into a file.
Against `ferry copy URL TARGET` (the same reads without the NBD hop), and against the
nbdkit/qemu way of serving the same: `nbdkit curl` (readahead filter) under `qemu-nbd -r -f
qcow2`, read by the same nbdcopy.

The servers run for the whole case on free loopback ports; the target is removed before
every run and compared with the raw image (qemu-img compare) after the first. Goal (issue
30): the export <= 1.2x `ferry copy` of the same image.
"""

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import GiB, Case, Command, peer, which

from cases.http import LateArgv, NBDKIT_INSTALL, Server, has_curl_plugin
from cases.nbd import free_port, stop
from cases.qcow2 import compare, made

CASE = "export-http-qcow2-half-4g"
OURS = "nbdcopy from ferry export URL"
DIRECT = "ferry copy URL TARGET"
PEER = "nbdcopy from qemu-nbd -f qcow2 over nbdkit curl"
INSTALL = "apt-get install -y qemu-utils libnbd-bin"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    qcow2 = made(env, image, "qcow2", [])
    servers = Servers(env, qcow2)
    target = env.target(CASE)

    def remove():
        if not env.keep_targets and target.exists():
            target.unlink()

    common = dict(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
    values = {"URL": servers.http.url, "TARGET": lambda: target}
    return [Case(
        name=CASE,
        title="qcow2 over HTTP served as NBD: nginx on loopback, 4 GiB virtual, 50% data; "
              "nbdcopy into a file from `ferry export URL`, against `ferry copy URL` and "
              "qemu-nbd over nbdkit curl",
        commands=[
            Command(OURS, ["nbdcopy", servers.ours, target], ferry=True,
                    note="ferry export's defaults; nbdcopy's (multi-conn, block status)",
                    **common),
            Command(DIRECT, LateArgv([env.ferry, "copy", "URL", "TARGET"], values),
                    note="the same reads, no NBD hop; flushes the target", **common),
            peer(PEER, ["nbdcopy", servers.theirs, target], install=NBDKIT_INSTALL,
                 available=has_curl_plugin() and bool(which("qemu-nbd")), **common),
        ],
        context=servers.running,
        notes=["Servers: `ferry export URL --listen 127.0.0.1:PORT`; `nbdkit --filter=readahead "
               "curl url=URL` under `qemu-nbd -r --shared=16 -f qcow2 nbd://...`; the qcow2 is the "
               "qcow2 cases' image (`qemu-img convert -m 8 -W -O qcow2` of the raw image), "
               "served by nginx."],
    )]


class Servers:
    def __init__(self, env, qcow2):
        self.env = env
        self.http = Server(env.workdir / "http-export-root", qcow2)
        self.ours_port = free_port()
        self.curl_port = free_port()
        self.theirs_port = free_port()

    @property
    def ours(self):
        return f"nbd://127.0.0.1:{self.ours_port}/"

    @property
    def theirs(self):
        return f"nbd://127.0.0.1:{self.theirs_port}/"

    @contextlib.contextmanager
    def running(self):
        if not which("nbdcopy"):
            raise RuntimeError(f"nbdcopy is not installed: {INSTALL}")
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-export-http-"))
        export = nbdkit = None
        try:
            with self.http.context():
                url = self.http.url()
                export = subprocess.Popen(
                    [str(self.env.ferry), "export", url,
                     "--listen", f"127.0.0.1:{self.ours_port}"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                if not export.stdout.readline().strip():
                    raise RuntimeError("ferry export printed no URI")
                if has_curl_plugin() and which("qemu-nbd"):
                    nbdkit = subprocess.Popen(
                        ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(self.curl_port),
                         "--filter=readahead", "curl", f"url={url}"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    wait_listening(self.curl_port, nbdkit)
                    subprocess.run(["qemu-nbd", "--fork", "--persistent", "--shared=16", "-r",
                                    "-f", "qcow2", "-b", "127.0.0.1", "-p", str(self.theirs_port),
                                    f"--pid-file={run_dir / 'qemu.pid'}",
                                    f"nbd://127.0.0.1:{self.curl_port}/"], check=True)
                yield self
        finally:
            stop(run_dir / "qemu.pid")
            for proc in (export, nbdkit):
                if proc is not None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            shutil.rmtree(run_dir, ignore_errors=True)


def wait_listening(port, proc, what="nbdkit curl", seconds=10):
    """Returns once 127.0.0.1:PORT accepts a connection; raises (naming WHAT) if PROC ends
    first or SECONDS pass."""
    deadline = time.time() + seconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{what} did not listen on port {port}")
            time.sleep(0.05)
