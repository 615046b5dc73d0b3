"""The origin read once: one image into 16 file targets in 4 groups of 4 over loopback,
the first group's `ferry copy URL DST1..DST4 --relay-listen` reading nginx and serving what
it wrote over NBD, the other three `ferry copy nbd://... DST..` reading that relay, all
started together (tests/bench/relay_rollout.py). Against one group of 4 alone (`ferry copy
URL DST1..DST4`).

A second case gives the targets the write rate of a cloud volume (an `nbdkit --filter=rate
file` server per target, FERRY_BENCH_RELAY_RATE bits/s, 100M by default), except the
seed's first target, the local file its relay serves from (a mover's PVC); one group
alone has the same shape (its first target a file, three rated). There the targets' storage, not this
machine's two cores, bounds a group, as it does when each group has a node of its own, and
the relayed rollout's time is set against one group's.

The image is a qcow2 of a 4 GiB, 50%-data raw image (FERRY_BENCH_RELAY_SIZE overrides the
virtual size, like 512M, for a quick run), served by nginx with an access log: a qcow2
carries its allocation, so one reader needs its allocated clusters and metadata from the
origin, about the qcow2 file's size (a raw image over HTTP has no holes to skip: its whole
size is read). That is more than the raw image's data bytes: a 64 KiB cluster holding one
nonzero 4 KiB block is stored whole. Measured: the body bytes nginx served during one
relayed rollout (its access log) over the qcow2's size, with the image's data bytes and
what one group alone read beside it, and the wall times.
"""

import os
import shutil
import subprocess
from pathlib import Path

from harness import GiB, MiB, Case, Command, Goal, ratio
from cases.export_http import wait_listening
from cases.http import LateArgv, Server
from cases.nbd import free_port
from cases.qcow2 import compare

GROUPS = 4
PER_GROUP = 4
ONE_GROUP = "one group: ferry copy URL DST1..DST4"
RELAYED = "relayed: 4 groups of 4 (seed --relay-listen + 3x ferry copy nbd://)"


def _size(env):
    text = os.environ.get("FERRY_BENCH_RELAY_SIZE")
    if not text:
        return env.size(4 * GiB)
    units = {"K": 1 << 10, "M": MiB, "G": GiB}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def cases(env):
    size = _size(env)
    name = f"relay-qcow2-half-{size // MiB}m-4x4"
    image = env.image(f"half-{size // MiB}m", "half", size)
    qcow2 = env.workdir / f"{image.path.stem}.qcow2"
    if not env.dry and not qcow2.exists():
        env.log(f"making {qcow2}")
        subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(image.path), str(qcow2)],
                       check=True)
    server = Server(env.workdir / "http-relay-root", qcow2, access_log=True)
    targets = [env.target(f"{name}-{i}") for i in range(GROUPS * PER_GROUP)]
    served = {}

    def remove():
        for t in targets:
            if not env.keep_targets and t.exists():
                t.unlink()

    def setup():
        remove()
        server.reset_log()

    def checker(label, used):
        return _checker(image, server, served, label, used)

    values = {"URL": server.url, "PORT": lambda: str(free_port())}
    rollout = Path(__file__).resolve().parent.parent / "relay_rollout.py"
    commands = [
        Command(RELAYED, LateArgv(["python3", rollout, env.ferry, "URL", "PORT", str(GROUPS),
                                   *targets], values), ferry=True,
                setup=setup, cleanup=remove, check=checker(RELAYED, targets),
                note="all 16 targets; the seed ends when the last downstream copy has"),
        Command(ONE_GROUP, LateArgv([env.ferry, "copy", "URL", *targets[:PER_GROUP]], values),
                setup=setup, cleanup=remove, check=checker(ONE_GROUP, targets[:PER_GROUP])),
    ]

    def bytes_goal(results):
        if RELAYED not in served:
            return None, "not measured"
        sent, requests = served[RELAYED]
        alone = served.get(ONE_GROUP, (0, 0))[0]
        qcow2_size = qcow2.stat().st_size
        x = sent / qcow2_size
        return x <= 1.05, (f"{x:.3f}x: {sent} bytes in {requests} requests for the "
                           f"{qcow2_size}-byte qcow2 ({image.data_bytes} data bytes in the "
                           f"raw image; one group alone read {alone})")

    def time_goal(results):
        x = ratio(results, name, RELAYED, ONE_GROUP)
        return x <= 1.3, f"{x:.2f}x"

    local = Case(
        name=name,
        title=f"The origin read once: a qcow2 ({size // MiB} MiB virtual, 50% data in "
              f"scattered 1 MiB runs) from nginx into {GROUPS * PER_GROUP} files in "
              f"{GROUPS} groups of {PER_GROUP}, against one group of {PER_GROUP}",
        commands=commands,
        context=server.context,
        goals=[
            Goal("origin bytes served for 16 targets in 4 groups <= 1.05x the qcow2's size "
                 "(what one reader needs)", bytes_goal),
            Goal("relayed rollout (16 targets) <= 1.3x one group of 4", time_goal),
        ],
    )
    return [local, _rated_case(env, size, image, qcow2, server, values, rollout)]


def _rated_case(env, size, image, qcow2, server, values, rollout):
    """The same rollout into targets of a cloud volume's write rate (see the module doc)."""
    rate = os.environ.get("FERRY_BENCH_RELAY_RATE", "100M")
    name = f"relay-qcow2-half-{size // MiB}m-4x4-rate-{rate.lower()}"
    files = [env.target(f"{name}-{i}") for i in range(GROUPS * PER_GROUP)]
    volumes = RatedVolumes(files[1:], size, rate)
    served = {}
    late = dict(values)
    late["T0"] = lambda: str(files[0])
    late.update({f"T{i}": (lambda i=i: volumes.uri(i - 1)) for i in range(1, len(files))})
    slots = [f"T{i}" for i in range(len(files))]

    def setup(count):
        def start():
            volumes.stop()
            if files[0].exists():
                files[0].unlink()
            server.reset_log()
            volumes.start(count - 1)
        return start

    def checker(label, count):
        return _checker(image, server, served, label, files[:count])

    relayed = f"{RELAYED}, each target {rate}bit/s"
    one = f"{ONE_GROUP}, each target {rate}bit/s"
    commands = [
        Command(relayed, LateArgv(["python3", rollout, env.ferry, "URL", "PORT", str(GROUPS),
                                   *slots], late), ferry=True,
                setup=setup(len(files)), cleanup=volumes.stop,
                check=checker(relayed, len(files)),
                note="the seed's first target a file, the others nbd:// to an nbdkit file "
                     "server with the rate filter each"),
        Command(one, LateArgv([env.ferry, "copy", "URL", *slots[:PER_GROUP]], late),
                setup=setup(PER_GROUP), cleanup=volumes.stop,
                check=checker(one, PER_GROUP)),
    ]

    def time_goal(results):
        x = ratio(results, name, relayed, one)
        return x <= 1.3, f"{x:.2f}x"

    def bytes_goal(results):
        if relayed not in served:
            return None, "not measured"
        sent, requests = served[relayed]
        x = sent / qcow2.stat().st_size
        return x <= 1.05, f"{x:.3f}x: {sent} bytes in {requests} requests"

    return Case(
        name=name,
        title=f"The origin read once, each target a volume of {rate}bit/s: the same qcow2 "
              f"into {GROUPS * PER_GROUP} NBD targets in {GROUPS} groups of {PER_GROUP}, "
              f"against one group of {PER_GROUP}",
        commands=commands,
        context=server.context,
        goals=[
            Goal("relayed rollout (16 targets) <= 1.3x one group of 4, where the targets' "
                 "write rate bounds a group", time_goal),
            Goal("origin bytes served <= 1.05x the qcow2's size", bytes_goal),
        ],
    )


def _checker(image, server, served, label, targets):
    """A run's check: every target equal to the image (qemu-img compare); the bytes nginx
    served for it recorded in SERVED under LABEL."""
    def check(_result):
        served[label] = server.body_bytes_sent()
        for t in targets:
            problem = compare(image.path, t)
            if problem:
                return f"{t}: {problem}"
        return None
    return check


class RatedVolumes:
    """One `nbdkit --filter=rate file` server per target file, started empty (a sparse
    file of the image's size) before a run and stopped after it: a volume that takes
    writes at `rate` bits per second, as a cloud volume's throughput limit does."""

    def __init__(self, files, size, rate):
        self.files, self.size, self.rate = files, size, rate
        self.servers = []

    def start(self, count):
        if shutil.which("nbdkit") is None:
            raise RuntimeError("nbdkit is not installed: apt-get install -y nbdkit")
        for f in self.files[:count]:
            if f.exists():
                f.unlink()
            with open(f, "wb") as out:
                out.truncate(self.size)
            port = free_port()
            proc = subprocess.Popen(
                ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port), "--filter=rate",
                 "file", str(f), f"rate={self.rate}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self.servers.append((proc, port))
        for proc, port in self.servers:
            wait_listening(port, proc, what=f"nbdkit rate file (port {port})", seconds=30)

    def uri(self, i):
        return f"nbd://127.0.0.1:{self.servers[i][1]}"

    def stop(self):
        for proc, _ in self.servers:
            proc.terminate()
            proc.wait(timeout=30)
        self.servers = []

