"""qcow2 images to a raw file: ferry copy against `qemu-img convert -m 8 -W -t writeback`
(both flush the target), for a plain qcow2 and for qcow2 images whose clusters are
compressed with zlib and with zstd; then a qcow2 served over HTTP by nginx, against
`qemu-img convert` reading it through `nbdkit curl` (CDI's import path).

The qcow2 images are made once from the 4 GiB half-data image with `qemu-img convert`
(`-c -o compression_type=...` for the compressed ones) and reused while newer than it.
ferry decompresses clusters on its workers; qemu-img on its coroutines' thread pool.
"""

import os
import shutil
import subprocess

from harness import GiB, Case, Command, Goal, peer, ratio, which
from cases.http import LateArgv, Server, has_curl_plugin, NBDKIT_INSTALL

KINDS = [
    # name, extra qemu-img convert options, goal (at most this ratio to qemu-img)
    ("qcow2", [], 0.8),
    ("qcow2-zlib", ["-c", "-o", "compression_type=zlib"], 0.5),
    ("qcow2-zstd", ["-c", "-o", "compression_type=zstd"], 0.5),
]
QEMU = "qemu-img convert -m 8 -W -t writeback"


def made(env, image, name, options):
    """IMAGE as qcow2 (NAME), made once and reused while newer than the image."""
    path = env.workdir / f"{image.path.stem}.{name}"
    if env.dry:
        return path
    if not path.exists() or path.stat().st_mtime < image.path.stat().st_mtime:
        env.log(f"making {path}")
        tmp = path.with_suffix(".part")
        subprocess.run(["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "qcow2",
                        *options, str(image.path), str(tmp)], check=True)
        os.replace(tmp, path)
    return path


def compare(image, target):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                          str(image), str(target)], capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


def cases(env):
    if not which("qemu-img"):
        return []
    image = env.image("half-4g", "half", env.size(4 * GiB))
    found = []
    for name, options, most in KINDS:
        source = made(env, image, name, options)
        case_name = f"{name}-to-raw-half-4g"
        target = env.target(case_name)

        def remove(target=target):
            if not env.keep_targets and target.exists():
                target.unlink()

        def check(_result, target=target):
            return compare(image.path, target)

        def cmd(label, argv, **kw):
            return Command(label, argv, setup=remove, cleanup=remove, check=check, **kw)

        found.append(Case(
            name=case_name,
            title=f"{name} to raw file: 4 GiB virtual, 50% data in scattered 1 MiB runs, "
                  "target flushed at the end by every command",
            commands=[
                cmd("ferry copy", [env.ferry, "copy", source, target], ferry=True,
                    note="format detected by magic"),
                cmd(QEMU, ["qemu-img", "convert", "-m", "8", "-W", "-t", "writeback",
                           "-f", "qcow2", "-O", "raw", source, target]),
            ],
            goals=[_goal(f"{name} to raw <= {most}x {QEMU}", case_name, QEMU, most)],
        ))
    found.append(_over_http(env, image, made(env, image, "qcow2", [])))
    return found


def _over_http(env, image, qcow2):
    name = "http-qcow2-half-4g"
    server = Server(env.workdir / "http-qcow2-root", qcow2)
    target = env.target(name)

    def remove():
        if not env.keep_targets and target.exists():
            target.unlink()

    values = {"TARGET": lambda: target, "URL": server.url}
    common = dict(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
    nbdkit = ["sh", "-c",
              'nbdkit -U - --filter=readahead --filter=retry curl url="$1" '
              '--run "qemu-img convert -m 8 -W -t writeback -f qcow2 -O raw \\$nbd $2"',
              "sh", "URL", "TARGET"]
    label = "nbdkit curl + qemu-img convert -m 8 -W -f qcow2"
    return Case(
        name=name,
        title="qcow2 over HTTP to raw file: nginx on loopback, 4 GiB virtual, 50% data",
        commands=[
            Command("ferry copy", LateArgv([env.ferry, "copy", "URL", "TARGET"], values),
                    ferry=True, note="ranged GETs by 8 workers", **common),
            peer(label, LateArgv(nbdkit, values), install=NBDKIT_INSTALL,
                 available=has_curl_plugin(), **common),
        ],
        context=server.context,
        goals=[_goal(f"qcow2 over HTTP <= 0.8x {label}", name, label, 0.8)],
    )


def _goal(text, case_name, peer_label, most):
    def judge(results):
        x = ratio(results, case_name, "ferry copy", peer_label)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)
