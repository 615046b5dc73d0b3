"""VMDK streamOptimized, VHDX dynamic and VDI dynamic images to a raw file: ferry copy
against `qemu-img convert -m 8 -W -t writeback` (both flush the target).

The images are made once from the 4 GiB half-data image with `qemu-img convert` and reused
while newer than it, each when its case starts (so that `--only` one format makes only that
one: each is another 2 GiB). The streamOptimized VMDK's grains are deflate-compressed:
ferry inflates them on its workers, qemu-img on its coroutines' thread.
"""

import contextlib
import os
import subprocess

from harness import GiB, Case, Command, Goal, ratio, which

KINDS = [
    # case prefix, qemu-img format, its options, goal (at most this ratio to qemu-img)
    ("vm-vmdk-stream", "vmdk", ["-o", "subformat=streamOptimized"], 0.5),
    ("vm-vhdx-dynamic", "vhdx", ["-o", "subformat=dynamic"], 0.5),
    ("vm-vdi-dynamic", "vdi", ["-o", "static=off"], 0.5),
]
QEMU = "qemu-img convert -m 8 -W -t writeback"


def made(env, image, name, fmt, options):
    """IMAGE converted to FMT (file NAME), made once and reused while newer than the image."""
    path = env.workdir / f"{image.path.stem}.{name}"
    if env.dry:
        return path
    if not path.exists() or path.stat().st_mtime < image.path.stat().st_mtime:
        env.log(f"making {path}")
        tmp = path.with_name(path.name + ".part")
        subprocess.run(["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", fmt,
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
    if not which("qemu-img") and not env.dry:
        raise RuntimeError("qemu-img is not installed (it makes these images and is the peer): "
                           "apt-get install -y qemu-utils")
    image = env.image("half-4g", "half", env.size(4 * GiB))
    found = []
    for prefix, fmt, options, most in KINDS:
        source = env.workdir / f"{image.path.stem}.{prefix}"
        case_name = f"{prefix}-to-raw-half-4g"
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
            title=f"{prefix[3:]} to raw file: 4 GiB virtual, 50% data in scattered 1 MiB runs, "
                  "target flushed at the end by every command",
            commands=[
                cmd("ferry copy", [env.ferry, "copy", source, target], ferry=True,
                    note="format detected by magic"),
                cmd(QEMU, ["qemu-img", "convert", "-m", "8", "-W", "-t", "writeback",
                           "-f", fmt, "-O", "raw", source, target]),
            ],
            goals=[_goal(f"{prefix[3:]} to raw <= {most}x {QEMU}", case_name, QEMU, most)],
            context=lambda prefix=prefix, fmt=fmt, options=options: _making(
                env, image, prefix, fmt, options),
        ))
    return found


@contextlib.contextmanager
def _making(env, image, name, fmt, options):
    made(env, image, name, fmt, options)
    yield


def _goal(text, case_name, peer_label, most):
    def judge(results):
        x = ratio(results, case_name, "ferry copy", peer_label)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)
