"""iSCSI: a 4 GiB image with 50% data written to and read from tgt on loopback, ferry
against qemu-img convert -m 8 -W on iscsi:// URLs (qemu-block-extra's libiscsi driver).

One tgtd (user space, rdwr backing store) serves one target with two thin-provisioned LUNs
for the whole case, on a free port: LUN 1 is the write target, backed by a sparse file
whose blocks are all deallocated (hole-punched) before each run, so every command starts
from a LUN that reads as zeroes; LUN 2 is the read source, backed by a sparse copy of the
image. tgtd keeps its default session parameters (MaxRecvDataSegmentLength 8 KiB,
MaxBurstLength 256 KiB, InitialR2T=Yes) for every initiator. Results are checked with
qemu-img compare on the files behind the LUNs.
"""

import contextlib
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import GiB, Case, Command, Goal, ratio, which

IQN = "iqn.2024-01.io.ferry:bench"


def cases(env):
    if not (which("tgtd") and which("tgtadm")):
        env.log("iscsi cases skipped: tgt is needed (apt-get install -y tgt)")
        return []
    if not qemu_img_has_iscsi():
        env.log("iscsi cases skipped: qemu-img has no iscsi driver, the peer to compare with "
                "(add bookworm-backports, then apt-get install -y -t bookworm-backports "
                "qemu-block-extra)")
        return []
    image = env.image("half-4g", "half", env.size(4 * GiB))
    server = Tgtd(env.workdir / "iscsi-luns")
    local_target = env.target("iscsi-read")
    return [
        Case(
            name="iscsi-write-half-4g",
            title="Copy file to iSCSI (tgt, thin LUN): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=write_commands(env, server, image),
            goals=[_ratio_goal("iSCSI write <= 0.8x qemu-img convert -m 8 -W",
                               "iscsi-write-half-4g", "qemu-img convert -m 8 -W", 0.8)],
            context=lambda: server.running(image),
            notes=["Target: a thin LUN (rdwr backing file, thin_provisioning=1) on tgtd 1.0.85, "
                   "127.0.0.1, deallocated before each run."],
        ),
        Case(
            name="iscsi-read-half-4g",
            title="Copy iSCSI to file (tgt, thin LUN): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=read_commands(env, server, image, local_target),
            goals=[_ratio_goal("iSCSI read <= 0.8x qemu-img convert -m 8 -W",
                               "iscsi-read-half-4g", "qemu-img convert -m 8 -W", 0.8)],
            context=lambda: server.running(image),
            notes=["Source: the image on a thin LUN of tgtd 1.0.85 on 127.0.0.1; "
                   "target: a new local file."],
        ),
    ]


def qemu_img_has_iscsi():
    # The iscsi driver is a module qemu loads on demand (qemu-block-extra).
    return bool(which("qemu-img")) and any(
        Path(d, "block-iscsi.so").exists()
        for d in ("/usr/lib/x86_64-linux-gnu/qemu", "/usr/lib/qemu", "/usr/lib64/qemu"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Tgtd:
    """tgtd with its portal on a port chosen once (URLs name it). Its management channel is a unix socket named
    by a number tgtd limits to 1..32767 and locks: a number another tgtd holds makes this
    one exit at once, and another number is tried."""

    def __init__(self, lun_dir):
        self.lun_dir = Path(lun_dir)
        self.write_lun = self.lun_dir / "write-lun.img"
        self.read_lun = self.lun_dir / "read-lun.img"
        self.port = free_port()
        self.control = None

    def url(self, lun):
        return f"iscsi://127.0.0.1:{self.port}/{IQN}/{lun}"

    def tgtadm(self, *args, check=True):
        return subprocess.run(["tgtadm", "-C", str(self.control), "--lld", "iscsi", *args],
                              check=check, capture_output=True, text=True)

    def deallocate_write_lun(self):
        size = self.write_lun.stat().st_size
        subprocess.run(["fallocate", "--punch-hole", "--offset", "0", "--length", str(size),
                        str(self.write_lun)], check=True)

    @contextlib.contextmanager
    def running(self, image):
        self.lun_dir.mkdir(parents=True, exist_ok=True)
        size = (image.size + 511) // 512 * 512
        with open(self.write_lun, "wb") as f:
            f.truncate(size)
        if not self.read_lun.exists() or self.read_lun.stat().st_size != image.size:
            subprocess.run(["cp", "--sparse=always", str(image.path), str(self.read_lun)],
                           check=True)
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-iscsi-"))
        proc = self._start(run_dir / "tgtd.log")
        try:
            self.tgtadm("--mode", "target", "--op", "new", "--tid", "1", "--targetname", IQN)
            for lun, path in ((1, self.write_lun), (2, self.read_lun)):
                self.tgtadm("--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun",
                            str(lun), "--bstype", "rdwr", "--backing-store", str(path))
                self.tgtadm("--mode", "logicalunit", "--op", "update", "--tid", "1", "--lun",
                            str(lun), "--params", "thin_provisioning=1")
            self.tgtadm("--mode", "target", "--op", "bind", "--tid", "1",
                        "--initiator-address", "127.0.0.1")
            yield self
        finally:
            self.tgtadm("--mode", "target", "--op", "delete", "--force", "--tid", "1",
                        check=False)
            self.tgtadm("--op", "delete", "--mode", "system", check=False)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(run_dir, ignore_errors=True)

    def _start(self, log):
        for attempt in range(20):
            seed = f"{os.getpid()}-{self.port}-{attempt}".encode()
            self.control = 1024 + int(hashlib.sha256(seed).hexdigest(), 16) % (32767 - 1024)
            with open(log, "wb") as out:
                proc = subprocess.Popen(["tgtd", "-f", "-C", str(self.control), "--iscsi",
                                         f"portal=127.0.0.1:{self.port}"],
                                        stdout=subprocess.DEVNULL, stderr=out)
            for _ in range(400):
                if proc.poll() is not None:
                    break
                if (self.tgtadm("--mode", "system", "--op", "show", check=False).returncode == 0
                        and port_open(self.port)):
                    return proc
                time.sleep(0.05)
            else:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"tgtd did not come up: {log.read_text()}")
        raise RuntimeError(f"tgtd did not start in 20 attempts: {log.read_text()}")


def compare(a, b):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", str(a), str(b)],
                         capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


def write_commands(env, server, image):
    def cmd(label, argv, **kw):
        return Command(label, argv, setup=server.deallocate_write_lun,
                       check=lambda _r: compare(image.path, server.write_lun), **kw)

    return [
        cmd("ferry copy", [env.ferry, "copy", image.path, server.url(1)],
            ferry=True, note="SYNCHRONIZE CACHE at the end"),
        cmd("qemu-img convert -m 8 -W",
            ["qemu-img", "convert", "-n", "-m", "8", "-W", "-f", "raw", "-O", "raw",
             image.path, server.url(1)],
            note="-n: the LUN exists; cache=unsafe: never flushes"),
    ]


def read_commands(env, server, image, target):
    def remove():
        if target.exists():
            target.unlink()

    def cmd(label, argv, **kw):
        return Command(label, argv, setup=remove, cleanup=remove,
                       check=lambda _r: compare(image.path, target), **kw)

    return [
        cmd("ferry copy", [env.ferry, "copy", server.url(2), target], ferry=True),
        cmd("qemu-img convert -m 8 -W",
            ["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "raw",
             server.url(2), target]),
    ]


def _ratio_goal(text, case_name, peer, limit):
    def judge(results):
        try:
            x = ratio(results, case_name, "ferry copy", peer)
        except KeyError:
            return None, f"{peer} did not run"
        return x <= limit, f"{x:.2f}x"
    return Goal(text, judge)
