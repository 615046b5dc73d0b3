"""NFS: a 4 GiB image with 50% data written to and read from nfs-ganesha on loopback,
ferry against qemu-img convert -m 8 -W on nfs:// URLs (qemu-block-extra's libnfs driver)
and nfs-cp (libnfs-utils).

One ganesha (VFS backend) serves an export directory next to the images for the whole case,
on free ports registered with rpcbind (qemu-img and nfs-cp find them there; ferry is given
them in the URL too). Every run writes a new target: the NFS target file is removed before
each run, so every command creates it (all three leave zero ranges unwritten on a new file,
except nfs-cp, which writes every byte). Results are checked with qemu-img compare on the
files behind the export.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from harness import GiB, Case, Command, Goal, fresh_copy, peer, ratio, which

GANESHA_INSTALL = "apt-get install -y nfs-ganesha nfs-ganesha-vfs rpcbind"
NFS_CP_INSTALL = "apt-get install -y libnfs-utils"
QEMU_NFS_INSTALL = ("add the bookworm-backports apt source (docs/BENCHMARKS.md, \"Installing the peers\"), "
                    "then apt-get install -y -t bookworm-backports qemu-block-extra")


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    server = Ganesha(env.workdir / "nfs-export")
    write_target = server.export / "write-target.img"
    read_source = server.export / "read-source.img"
    local_target = env.target("nfs-read")
    found = [
        Case(
            name="nfs-write-half-4g",
            title="Copy file to NFS (ganesha, new file): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=write_commands(env, server, image, write_target),
            goals=[_ratio_goal("NFS write <= 0.8x qemu-img convert -m 8 -W",
                               "nfs-write-half-4g", "qemu-img convert -m 8 -W", 0.8),
                   _ratio_goal("NFS write <= 0.8x qemu-img convert -m 8 -W -t writeback",
                               "nfs-write-half-4g", "qemu-img convert -m 8 -W -t writeback",
                               0.8)],
            context=server.running,
            notes=["Target: a new file on nfs-ganesha 4.3 (VFS) on 127.0.0.1, NFSv3 over TCP."],
        ),
        Case(
            name="nfs-read-half-4g",
            title="Copy NFS to file (ganesha): 4 GiB, 50% data in scattered 1 MiB runs",
            commands=read_commands(env, server, image, read_source, local_target),
            goals=[_ratio_goal("NFS read <= 0.8x qemu-img convert -m 8 -W",
                               "nfs-read-half-4g", "qemu-img convert -m 8 -W", 0.8),
                   _ratio_goal("NFS read <= 0.8x qemu-img convert -m 8 -W -t writeback",
                               "nfs-read-half-4g", "qemu-img convert -m 8 -W -t writeback",
                               0.8)],
            context=lambda: server.running(source=(image.path, read_source)),
            notes=["Source: the image on nfs-ganesha 4.3 (VFS) on 127.0.0.1, NFSv3 over TCP; "
                   "target: a new local file.",
                   "The source file on the export is sparse like the image. The goals use the "
                   "NFSv3 `ferry copy` row (qemu-img speaks only v3); the NFSv4.2 row reads the "
                   "same file with SEEK (version=4)."],
        ),
    ]
    return found


def free_port():
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            try:
                u.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Ganesha:
    def __init__(self, export):
        self.export = Path(export)
        self.nfs_port = free_port()
        self.mount_port = free_port()

    def url_v4(self, name):
        """The NFSv4.2 URL: the export's pseudo path, the NFS port only."""
        return f"nfs://127.0.0.1/export/{name}?nfsport={self.nfs_port}&version=4"

    def url(self, name, ports=True):
        url = f"nfs://127.0.0.1{self.export}/{name}"
        if ports:
            url += f"?nfsport={self.nfs_port}&mountport={self.mount_port}"
        return url

    @contextlib.contextmanager
    def running(self, source=None):
        for tool in ("ganesha.nfsd", "rpcbind"):
            if not which(tool):
                raise RuntimeError(f"{tool} is not installed: {GANESHA_INSTALL}")
        run_dir = Path(tempfile.mkdtemp(prefix="ferry-bench-nfs-"))
        self.export.mkdir(parents=True, exist_ok=True)
        (run_dir / "recov").mkdir()
        if source is not None:
            fresh_copy(*source)
        if not port_open(111):
            os.makedirs("/run/rpcbind", exist_ok=True)
            subprocess.run(["rpcbind"], check=False)
            for _ in range(200):
                if port_open(111):
                    break
                time.sleep(0.05)
        conf = run_dir / "ganesha.conf"
        conf.write_text(
            f"NFS_CORE_PARAM {{ Bind_addr = 127.0.0.1; Protocols = 3, 4; NFS_Port = {self.nfs_port}; "
            f"MNT_Port = {self.mount_port}; Enable_NLM = false; Enable_RQUOTA = false; }}\n"
            f"NFSV4 {{ Graceless = true; RecoveryRoot = {run_dir}/recov; Allow_Numeric_Owners = true; "
            "Only_Numeric_Owners = true; Minor_Versions = 0, 1, 2; }\n"
            "NFS_KRB5 { Active_krb5 = false; }\n"
            # No caching of directory entries or attributes: the harness removes targets
            # behind ganesha's back (on the export's file system), and a cached entry of
            # a removed file makes the next CREATE fail (NFS3ERR_EXIST) or a WRITE fail.
            "MDCACHE { Dir_Chunk = 0; }\n"
            f"EXPORT {{ Export_Id = 1; Path = {self.export}; Pseudo = /export; Access_Type = RW; "
            "Attr_Expiration_Time = 0; "
            "Squash = No_Root_Squash; SecType = sys; Protocols = 3, 4; Transports = TCP; "
            "FSAL { Name = VFS; } }\n")
        pid_file = run_dir / "ganesha.pid"
        subprocess.run(["ganesha.nfsd", "-f", str(conf), "-L", str(run_dir / "ganesha.log"),
                        "-p", str(pid_file)], check=True)
        try:
            for _ in range(600):
                if port_open(self.nfs_port) and port_open(self.mount_port):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"ganesha did not start: see {run_dir / 'ganesha.log'}")
            yield self
        finally:
            stop(pid_file)
            shutil.rmtree(run_dir, ignore_errors=True)


def stop(pid_file):
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 15)
        for _ in range(1500):
            os.kill(pid, 0)
            time.sleep(0.01)
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def compare(a, b):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", str(a), str(b)],
                         capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


def qemu_img_has_nfs():
    # The nfs driver is a module qemu loads on demand (qemu-block-extra): look for the
    # module file itself.
    return bool(which("qemu-img")) and any(
        Path(d, "block-nfs.so").exists()
        for d in ("/usr/lib/x86_64-linux-gnu/qemu", "/usr/lib/qemu", "/usr/lib64/qemu"))


def write_commands(env, server, image, target):
    def remove():
        if target.exists():
            target.unlink()

    def cmd(label, argv, **kw):
        kw.update(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    convert = ["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "raw"]
    url = server.url(target.name, ports=False)
    qemu = dict(install=QEMU_NFS_INSTALL, available=qemu_img_has_nfs())
    return [
        cmd("ferry copy", [env.ferry, "copy", image.path, server.url(target.name)],
            ferry=True, note="8 workers, UNSTABLE writes, a COMMIT every 256 MiB and at the end"),
        cmd("ferry copy, NFSv4.2", [env.ferry, "copy", image.path, server.url_v4(target.name)],
            note="version=4, the same writes and COMMITs"),
        cmd("qemu-img convert -m 8 -W", [*convert, image.path, url],
            note="cache=unsafe: never flushes", **qemu),
        cmd("qemu-img convert -m 8 -W -t writeback",
            [*convert, "-t", "writeback", image.path, url], note="flushes at the end", **qemu),
        cmd("nfs-cp", ["nfs-cp", image.path, server.url(target.name)], install=NFS_CP_INSTALL,
            note="one request at a time, writes every byte"),
    ]


def read_commands(env, server, image, source, target):
    def remove():
        if target.exists():
            target.unlink()

    def cmd(label, argv, **kw):
        kw.update(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    convert = ["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "raw"]
    url = server.url(source.name, ports=False)
    qemu = dict(install=QEMU_NFS_INSTALL, available=qemu_img_has_nfs())
    nfs_cp = ["nfs-cp", server.url(source.name), target]
    return [
        cmd("ferry copy", [env.ferry, "copy", server.url(source.name), target],
            ferry=True, note="8 workers; fsyncs the file at the end"),
        cmd("ferry copy, NFSv4.2", [env.ferry, "copy", server.url_v4(source.name), target],
            note="version=4: SEEK finds the holes, so only the data is read"),
        cmd("qemu-img convert -m 8 -W", [*convert, url, target],
            note="cache=unsafe: never flushes", **qemu),
        cmd("qemu-img convert -m 8 -W -t writeback",
            [*convert, "-t", "writeback", url, target], note="flushes at the end", **qemu),
        cmd("nfs-cp", nfs_cp, install=NFS_CP_INSTALL,
            note="one request at a time, writes every byte, never flushes"),
        cmd("nfs-cp && sync FILE", ["sh", "-c", '"$@" && sync "$3"', "sh", *nfs_cp],
            tool="nfs-cp", install=NFS_CP_INSTALL),
    ]


def _ratio_goal(text, case_name, peer, limit):
    def judge(results):
        try:
            x = ratio(results, case_name, "ferry copy", peer)
        except KeyError:
            return None, f"{peer} did not run"
        return x <= limit, f"{x:.2f}x"
    return Goal(text, judge)
