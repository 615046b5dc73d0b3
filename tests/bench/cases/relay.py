"""The origin read once: one image into 16 file targets in 4 groups of 4 over loopback,
the first group's `ferry copy URL DST1..DST4 --relay-listen` reading nginx and serving what
it wrote over NBD, the other three `ferry copy nbd://... DST..` reading that relay, all
started together (tests/bench/relay_rollout.py). Against one group of 4 alone (`ferry copy
URL DST1..DST4`).

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
import subprocess
from pathlib import Path

from harness import GiB, MiB, Case, Command, Goal, ratio
from cases.http import LateArgv, Server

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
        def check(_result):
            for t in used:
                cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                      str(image.path), str(t)], capture_output=True, text=True)
                if cmp.returncode != 0:
                    return f"{t}: qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
            served[label] = server.body_bytes_sent()
            return None
        return check

    values = {"URL": server.url, "PORT": lambda: str(_free_port())}
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

    return [Case(
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
    )]


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
