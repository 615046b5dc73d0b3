"""iSCSI: a 4 GiB image with 50% data written to and read from tgt on loopback, ferry
against qemu-img convert -m 8 -W on iscsi:// URLs (qemu-block-extra's libiscsi driver).

One tgtd (user space, rdwr backing store) serves one target with three LUNs for the whole
case, on a free port: LUN 1 is the write target, thin, backed by a sparse file whose blocks
are all deallocated (hole-punched) before each run, so every command starts from a LUN that
reads as zeroes; LUNs 2 (thin) and 3 (not thin) are the read source, backed by one copy of
the image allocated like the image itself (harness.copy_keeping_allocation). tgtd keeps its default session parameters (MaxRecvDataSegmentLength 8 KiB,
MaxBurstLength 256 KiB, InitialR2T=Yes) for every initiator. Results are checked with
qemu-img compare on the files behind the LUNs.
"""

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import GiB, Case, Command, Goal, fresh_copy, peer, ratio, which

IQN = "iqn.2024-01.io.ferry:bench"
TGT_INSTALL = "apt-get install -y tgt"
QEMU_ISCSI_INSTALL = ("add the bookworm-backports apt source (docs/BENCHMARKS.md, \"Installing the peers\"), "
                      "then apt-get install -y -t bookworm-backports qemu-block-extra")


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    server = Tgtd(env.workdir / "iscsi-luns")
    local_target = env.target("iscsi-read")
    return [
        Case(
            name="iscsi-write-half-4g",
            title="Copy file to iSCSI (tgt, thin LUN): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=write_commands(env, server, image),
            goals=[_ratio_goal("iSCSI write <= 0.8x qemu-img convert -m 8 -W",
                               "iscsi-write-half-4g", "qemu-img convert -m 8 -W", 0.8),
                   _ratio_goal("iSCSI write <= 0.8x qemu-img convert -m 8 -W -t writeback",
                               "iscsi-write-half-4g", "qemu-img convert -m 8 -W -t writeback",
                               0.8)],
            context=lambda: server.running(image),
            notes=["Target: a thin LUN (rdwr backing file, thin_provisioning=1) on tgtd 1.0.85, "
                   "127.0.0.1, deallocated before each run."],
        ),
        Case(
            name="iscsi-read-half-4g",
            title="Copy iSCSI to file (tgt, thin LUN): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=read_commands(env, server, image, local_target, thin=True),
            goals=read_goals("iscsi-read-half-4g", "thin LUN"),
            context=lambda: server.running(image),
            notes=["Source: the image on a thin LUN (thin_provisioning=1: GET LBA STATUS) of "
                   "tgtd 1.0.85 on 127.0.0.1, its backing file allocated like the image (one "
                   "extent per 1 MiB data run); target: a new local file.",
                   "tgt's GET LBA STATUS walks the backing file from the LBA asked to its end "
                   "(SEEK_DATA/SEEK_HOLE) whatever the allocation length, so a call costs time "
                   "in proportion to the extents after it. qemu-img asks for one descriptor "
                   "per call (one call per extent: quadratic), ferry for 255. The `qemu-img "
                   "map` row times qemu-img's calls alone; the no-thin case below reads the "
                   "same file with no GET LBA STATUS at all."],
        ),
        Case(
            name="iscsi-read-half-4g-nothin",
            title="Copy iSCSI to file (tgt, LUN without thin provisioning): 4 GiB, 50% data in "
                  "scattered 1 MiB runs",
            commands=read_commands(env, server, image, local_target, thin=False),
            goals=read_goals("iscsi-read-half-4g-nothin", "LUN without thin provisioning"),
            context=lambda: server.running(image),
            notes=["Source: the same backing file as a LUN without thin provisioning (no "
                   "LBPME: every initiator reads every block and finds the zeroes itself)."],
        ),
        Case(
            name="iscsi-read-half-4g-nothin-null",
            title="Read iSCSI into nothing (tgt, LUN without thin provisioning, into nbdkit's "
                  "null plugin): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=null_read_commands(env, server, image),
            goals=[_ratio_goal("iSCSI read alone (LUN without thin provisioning) <= 0.8x "
                               "qemu-img convert -n -m 8 -W", "iscsi-read-half-4g-nothin-null",
                               "qemu-img convert -n -m 8 -W", 0.8)],
            context=lambda: server.running(image),
            notes=["The read of the case above without the local file: each command writes "
                   "into nbdkit's null plugin (a throwaway NBD export that discards writes, on "
                   "a Unix socket), so the row times the iSCSI read alone, with no page-cache "
                   "write and no flush. Nothing is written to check; the bytes of the same "
                   "read are checked in the case above."],
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
        # The read LUNs' backing file, allocated like the image (see harness.copy_keeping_allocation).
        self.read_lun = self.lun_dir / "read-source.img"
        self.port = free_port()
        self.control = None

    # LUN numbers: the write target, the read source thin, the read source without thin provisioning.
    WRITE, READ_THIN, READ_FULL = 1, 2, 3

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
        for tool in ("tgtd", "tgtadm"):
            if not which(tool):
                raise RuntimeError(f"{tool} is not installed: {TGT_INSTALL}")
        self.lun_dir.mkdir(parents=True, exist_ok=True)
        size = (image.size + 511) // 512 * 512
        with open(self.write_lun, "wb") as f:
            f.truncate(size)
        fresh_copy(image.path, self.read_lun)
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-iscsi-"))
        proc = self._start(run_dir / "tgtd.log")
        try:
            self.tgtadm("--mode", "target", "--op", "new", "--tid", "1", "--targetname", IQN)
            for lun, path, thin in ((self.WRITE, self.write_lun, True),
                                    (self.READ_THIN, self.read_lun, True),
                                    (self.READ_FULL, self.read_lun, False)):
                self.tgtadm("--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun",
                            str(lun), "--bstype", "rdwr", "--backing-store", str(path))
                if thin:
                    self.tgtadm("--mode", "logicalunit", "--op", "update", "--tid", "1",
                                "--lun", str(lun), "--params", "thin_provisioning=1")
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
        kw.update(setup=server.deallocate_write_lun,
                  check=lambda _r: compare(image.path, server.write_lun))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    convert = ["qemu-img", "convert", "-n", "-m", "8", "-W", "-f", "raw", "-O", "raw"]
    qemu = dict(install=QEMU_ISCSI_INSTALL, available=qemu_img_has_iscsi())
    return [
        cmd("ferry copy", [env.ferry, "copy", image.path, server.url(server.WRITE)],
            ferry=True, note="8 workers, SYNCHRONIZE CACHE at the end"),
        cmd("qemu-img convert -m 8 -W", [*convert, image.path, server.url(server.WRITE)],
            note="-n: the LUN exists; cache=unsafe: never flushes", **qemu),
        cmd("qemu-img convert -m 8 -W -t writeback",
            [*convert, "-t", "writeback", image.path, server.url(server.WRITE)],
            note="-n; SYNCHRONIZE CACHE at the end", **qemu),
    ]


def read_commands(env, server, image, target, thin):
    def remove():
        if target.exists():
            target.unlink()

    def cmd(label, argv, **kw):
        if "check" not in kw:
            kw.update(setup=remove, cleanup=remove,
                      check=lambda _r: compare(image.path, target))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    url = server.url(server.READ_THIN if thin else server.READ_FULL)
    convert = ["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "raw"]
    qemu = dict(install=QEMU_ISCSI_INSTALL, available=qemu_img_has_iscsi())
    found = [
        cmd("ferry copy", [env.ferry, "copy", url, target], ferry=True,
            note="8 workers; fsyncs the file at the end"),
        cmd("qemu-img convert -m 8 -W", [*convert, url, target],
            note="cache=unsafe: never flushes", **qemu),
        cmd("qemu-img convert -m 8 -W -t writeback", [*convert, "-t", "writeback", url, target],
            note="flushes at the end", **qemu),
    ]
    if thin:
        found.append(cmd("qemu-img map", ["qemu-img", "map", "-f", "raw", "--output=json", url],
                         check=lambda r: map_check(r, image),
                         note="not a copy: qemu-img's GET LBA STATUS calls alone", **qemu))
    return found


def null_read_commands(env, server, image):
    sink = 'nbdkit -U - null size="$1" --run "$2 nbd+unix:///?socket=\\$unixsocket"'
    if not which("nbdkit") and not env.dry:
        raise RuntimeError("nbdkit is not installed (the null sink of this case): apt-get install -y nbdkit")
    url = server.url(server.READ_FULL)
    qemu = dict(install=QEMU_ISCSI_INSTALL, available=qemu_img_has_iscsi())
    return [
        Command("ferry copy", ["sh", "-c", sink, "sh", str(image.size), f"{env.ferry} copy {url}"],
                ferry=True, note="8 workers; the NBD target is flushed (nbdkit null: a no-op)"),
        peer("qemu-img convert -n -m 8 -W",
             ["sh", "-c", sink, "sh", str(image.size),
              f"qemu-img convert -n -m 8 -W -f raw -O raw {url}"],
             note="cache=unsafe: never flushes", **qemu),
    ]


def map_check(result, image):
    """The map over iSCSI must cover the whole image."""
    extents = json.loads(result.stdout)
    end = max((e["start"] + e["length"] for e in extents), default=0)
    if end != image.size:
        return f"qemu-img map covers {end} bytes, not {image.size}"
    return None


def read_goals(case_name, what):
    return [
        _ratio_goal(f"iSCSI read ({what}) <= 0.8x qemu-img convert -m 8 -W", case_name,
                    "qemu-img convert -m 8 -W", 0.8),
        _ratio_goal(f"iSCSI read ({what}) <= 0.8x qemu-img convert -m 8 -W -t writeback",
                    case_name, "qemu-img convert -m 8 -W -t writeback", 0.8),
    ]


def _ratio_goal(text, case_name, peer, limit):
    def judge(results):
        try:
            x = ratio(results, case_name, "ferry copy", peer)
        except KeyError:
            return None, f"{peer} did not run"
        return x <= limit, f"{x:.2f}x"
    return Goal(text, judge)
