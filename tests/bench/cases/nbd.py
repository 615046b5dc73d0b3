"""NBD to NBD: qemu-nbd (raw, 4 GiB, 50% data) -> nbdkit file, ferry against nbdcopy and
qemu-img convert -m 8 -W; and the checksum over NBD against blksum's nbd:// mode when
blksum is on PATH.

Both servers run for the whole case (started by the case's context on free loopback
ports). The target is a fresh sparse file before every run; nbdkit's file plugin opens
it anew for each connection. ferry copy always flushes the target at the end, so the
peers get their flush options (nbdcopy --flush, qemu-img -t writeback); the variant
without them is reported too. Every command's result is checked with qemu-img compare.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import GiB, Case, Command, Goal, peer, ratio, which

SERVERS_INSTALL = "apt-get install -y qemu-utils nbdkit"


# name, image size, goal against nbdcopy --flush
COPIES = [("half-4g", 4 * GiB, "4 GiB", 0.74), ("half-512m", GiB // 2, "512 MiB", 0.9)]


def cases(env):
    found = []
    for image_name, size, size_title, most in COPIES:
        image = env.image(image_name, "half", env.size(size))
        servers = Servers(image.path, env.target(f"nbd-copy-{image_name}"))
        for flush in (True, False):
            name = f"nbd-copy-{image_name}-{'flush' if flush else 'noflush'}"
            if image_name != "half-4g" and not flush:
                continue
            found.append(Case(
                name=name,
                title=f"Copy NBD to NBD: qemu-nbd (raw, {size_title}, 50% data in scattered "
                      "1 MiB runs) -> nbdkit file, "
                      + ("target flushed at the end by every command" if flush
                         else "no final flush by the peers"),
                commands=copy_commands(env, servers, image, flush),
                goals=copy_goals(name, flush, most),
                context=servers.running,
                notes=["Source: `qemu-nbd --shared=16 -f raw` (multi-conn); target: "
                       "`nbdkit file` on a fresh sparse file; both on 127.0.0.1."],
            ))
        if image_name == "half-4g":
            found.append(Case(
                name="nbd-checksum-half-4g",
                title="Checksum over NBD: qemu-nbd (raw, 4 GiB, 50% data)",
                commands=checksum_commands(env, servers, image),
                goals=[_ratio_goal("blkhash checksum over NBD <= 0.7x blksum nbd://",
                                   "nbd-checksum-half-4g", "blksum nbd://", 0.7,
                                   ours="ferry checksum")],
                context=servers.running,
            ))
    return found


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Servers:
    """qemu-nbd serving the source image, nbdkit serving the target file."""

    def __init__(self, source, target):
        self.source = Path(source)
        self.target = Path(target)
        # Chosen now so commands can name them; the servers bind them when the case runs.
        self.src_port = free_port()
        self.dst_port = free_port()

    @property
    def src(self):
        return f"nbd://127.0.0.1:{self.src_port}/disk"

    @property
    def dst(self):
        return f"nbd://127.0.0.1:{self.dst_port}/"

    def fresh_target(self):
        with open(self.target, "wb") as f:
            f.truncate(self.source.stat().st_size)

    @contextlib.contextmanager
    def running(self):
        for tool in ("qemu-nbd", "nbdkit"):
            if not which(tool):
                raise RuntimeError(f"{tool} is not installed: {SERVERS_INSTALL}")
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-nbd-"))
        pids = []
        try:
            self.fresh_target()
            subprocess.run(["qemu-nbd", "--fork", "--persistent", "--shared=16", "-r",
                            "-f", "raw", "-x", "disk", "-b", "127.0.0.1",
                            "-p", str(self.src_port), f"--pid-file={run_dir / 'src.pid'}",
                            str(self.source)], check=True)
            pids.append(run_dir / "src.pid")
            subprocess.run(["nbdkit", "-i", "127.0.0.1", "-p", str(self.dst_port),
                            "-P", str(run_dir / "dst.pid"), "file", str(self.target)],
                           check=True)
            pids.append(run_dir / "dst.pid")
            yield self
        finally:
            for pid_file in pids:
                stop(pid_file)
            shutil.rmtree(run_dir, ignore_errors=True)


def stop(pid_file):
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.01)
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 15)
        for _ in range(1000):
            os.kill(pid, 0)
            time.sleep(0.01)
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def copy_commands(env, servers, image, flush):
    def check(_result):
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(image.path), str(servers.target)],
                             capture_output=True, text=True)
        if cmp.returncode != 0:
            return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    def cmd(label, argv, **kw):
        kw.update(setup=servers.fresh_target, check=check)
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    cache = ["-t", "writeback"] if flush else []
    return [
        cmd("ferry copy", [env.ferry, "copy", servers.src, servers.dst],
            ferry=True, note="8 workers, always flushes"),
        cmd("nbdcopy" + (" --flush" if flush else ""),
            ["nbdcopy", *(["--flush"] if flush else []), servers.src, servers.dst],
            install="apt-get install -y libnbd-bin",
            note="its defaults: up to 4 connections (multi-conn)"),
        cmd("qemu-img convert -m 8 -W" + (" -t writeback" if flush else ""),
            ["qemu-img", "convert", "-n", "-m", "8", "-W", "-f", "raw", "-O", "raw", *cache,
             servers.src, servers.dst],
            install="apt-get install -y qemu-utils", note="-n: the target exists"),
    ]


def copy_goals(case_name, flush, most):
    if not flush:
        return []
    what = case_name.removeprefix("nbd-copy-").removesuffix("-flush")
    return [
        _ratio_goal(f"NBD copy ({what}) <= {most}x nbdcopy --flush", case_name,
                    "nbdcopy --flush", most),
        _ratio_goal(f"NBD copy ({what}) <= 0.7x qemu-img convert -m 8 -W -t writeback",
                    case_name, "qemu-img convert -m 8 -W -t writeback", 0.7),
    ]


def _ratio_goal(text, case_name, peer, limit, ours="ferry copy"):
    def judge(results):
        x = ratio(results, case_name, ours, peer)
        return x <= limit, f"{x:.2f}x"
    return Goal(text, judge)


def checksum_commands(env, servers, image):
    digests = {}

    def same_digest(label):
        def check(result):
            words = result.stdout.split()
            digest = next((w for w in words if len(w) == 64), None)
            if digest is None:
                return f"no digest in {result.stdout!r}"
            digests[label] = digest
            if len(set(digests.values())) > 1:
                return f"digests differ: {digests}"
            return None
        return check

    return [
        Command("ferry checksum", [env.ferry, "checksum", servers.src],
                ferry=True, check=same_digest("ferry")),
        peer("blksum nbd://", ["blksum", servers.src], check=same_digest("blksum"),
             install="blksum is not packaged: build it from https://gitlab.com/nirs/blkhash"),
    ]
