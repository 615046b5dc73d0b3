"""Verified copies, file to file: `ferry copy --verify` against a plain `ferry copy` and against
the peers' way to copy and then prove the copy: nbdcopy --flush followed by blksum of source
and target, and qemu-img convert -t writeback followed by qemu-img compare.

Every command flushes the target before its verify step reads it back. ferry is run twice
more: without --verify (what the verify costs) and with --cache none (the read-back comes
from the disk, not the page cache; so does the copy's I/O).
"""

import subprocess

from harness import GiB, Case, Command, Goal, peer, ratio, which

BLKSUM_INSTALL = "blksum is not packaged: build it from https://gitlab.com/nirs/blkhash"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    source = image.path
    target = env.target("copy-verify-half-4g")
    name = "copy-verify-half-4g"

    def remove():
        if not env.keep_targets and target.exists():
            target.unlink()

    def check(_result):
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(source), str(target)], capture_output=True, text=True)
        if cmp.returncode != 0:
            return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    def cmd(label, argv, **kw):
        kw.update(setup=remove, cleanup=remove, check=check)
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    commands = [
        cmd("ferry copy --verify", [env.ferry, "copy", "--verify", source, target],
            ferry=True, note="block hash of the source, CRC-64 check of both sides"),
        cmd("ferry copy", [env.ferry, "copy", source, target], note="no verify"),
        cmd("ferry copy --verify --cache none",
            [env.ferry, "copy", "--verify", "--cache", "none", source, target]),
        cmd("nbdcopy --flush && blksum source && blksum target",
            ["sh", "-c", 'nbdcopy --flush "$0" "$1" && blksum "$0" && blksum "$1"',
             source, target],
            install=f"apt-get install -y libnbd-bin; {BLKSUM_INSTALL}",
            available=bool(which("nbdcopy") and which("blksum"))),
        cmd("qemu-img convert -m 8 -W -t writeback && qemu-img compare",
            ["sh", "-c", 'qemu-img convert -m 8 -W -t writeback -f raw -O raw "$0" "$1" '
             '&& qemu-img compare -f raw -F raw "$0" "$1"', source, target],
            install="apt-get install -y qemu-utils", tool="qemu-img"),
    ]
    return [Case(
        name=name,
        title="Verified copy file to file: 4 GiB, 50% data in scattered 1 MiB runs",
        commands=commands,
        goals=[
            _goal("copy --verify <= 0.6x nbdcopy --flush + blksum of source and target", name,
                  "nbdcopy --flush && blksum source && blksum target", 0.6),
            _goal("copy --verify <= 1.5x a plain ferry copy (read-back from the page cache)",
                  name, "ferry copy", 1.5),
        ],
        notes=["`--cache none` has no goal: its copy writes and its verify reads bypass the "
               "page cache, so both run at the disk's rate."],
    )]


def _goal(text, case_name, peer_label, most):
    def judge(results):
        x = ratio(results, case_name, "ferry copy --verify", peer_label)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)
