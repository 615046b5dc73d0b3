"""`ferry export` as an NBD server: nbdcopy reads a 4 GiB raw image (50% data in 1 MiB
runs) into a file from `ferry export` and from `qemu-nbd -r` serving the same file.

Both servers run for the whole case on free loopback ports; nbdcopy (its defaults: up to
4 connections when the server offers multi-conn, block status to skip holes) is the same
client for both, so the ratio is the servers'. The target is removed before every run and
compared with the image (qemu-img compare) after the first.
"""

import contextlib
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from harness import GiB, Case, Command, Goal, ratio, which

from cases.nbd import free_port, stop

INSTALL = "apt-get install -y qemu-utils libnbd-bin"
CASE = "export-nbdcopy-half-4g"
OURS = "nbdcopy from ferry export"
THEIRS = "nbdcopy from qemu-nbd -r"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    servers = Servers(env, image.path, env.target(CASE))
    return [Case(
        name=CASE,
        title="NBD export: nbdcopy of a 4 GiB raw image (50% data in scattered 1 MiB runs) "
              "into a file, from `ferry export` and from `qemu-nbd -r`",
        commands=commands(servers, image),
        goals=[Goal("ferry export <= 1.1x qemu-nbd -r (same nbdcopy)", judge)],
        context=servers.running,
        notes=["Servers: `ferry export IMG --listen 127.0.0.1:PORT` and `qemu-nbd -r "
               "--shared=16 -f raw`; both advertise multi-conn, so nbdcopy opens 4 "
               "connections to each."],
    )]


def judge(results):
    x = ratio(results, CASE, OURS, THEIRS)
    return x <= 1.1, f"{x:.2f}x"


class Servers:
    def __init__(self, env, source, target):
        self.env = env
        self.source = Path(source)
        self.target = Path(target)
        self.ours_port = free_port()
        self.theirs_port = free_port()

    @property
    def ours(self):
        return f"nbd://127.0.0.1:{self.ours_port}/"

    @property
    def theirs(self):
        return f"nbd://127.0.0.1:{self.theirs_port}/"

    def remove_target(self):
        with contextlib.suppress(FileNotFoundError):
            self.target.unlink()

    @contextlib.contextmanager
    def running(self):
        for tool in ("qemu-nbd", "nbdcopy"):
            if not which(tool):
                raise RuntimeError(f"{tool} is not installed: {INSTALL}")
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-export-"))
        export = None
        try:
            export = subprocess.Popen(
                [str(self.env.ferry), "export", str(self.source),
                 "--listen", f"127.0.0.1:{self.ours_port}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            uri = export.stdout.readline().strip()
            if not uri:
                raise RuntimeError("ferry export printed no URI")
            subprocess.run(["qemu-nbd", "--fork", "--persistent", "--shared=16", "-r",
                            "-f", "raw", "-b", "127.0.0.1", "-p", str(self.theirs_port),
                            f"--pid-file={run_dir / 'qemu.pid'}", str(self.source)],
                           check=True)
            yield self
        finally:
            if export is not None:
                export.send_signal(signal.SIGTERM)
                try:
                    export.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    export.kill()
            stop(run_dir / "qemu.pid")
            shutil.rmtree(run_dir, ignore_errors=True)
            self.remove_target()


def commands(servers, image):
    def check(_result):
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(image.path), str(servers.target)],
                             capture_output=True, text=True)
        if cmp.returncode != 0:
            return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    common = dict(setup=servers.remove_target, check=check)
    return [
        Command(OURS, ["nbdcopy", servers.ours, str(servers.target)], ferry=True,
                note="ferry export, its defaults", **common),
        Command(THEIRS, ["nbdcopy", servers.theirs, str(servers.target)],
                note="qemu-nbd -r --shared=16", **common),
    ]
