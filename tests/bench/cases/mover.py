"""The mover's overhead: a copy run the way the Kubernetes operator runs it (a mover pod's
`ferry serve`, the job started and followed over gRPC; ferry-mover-job, tests/src/bin) against the
same copy by `ferry copy`, and each one's time to first byte (tests/bench/first_byte.py).

Both copies flush the target before they end. The mover's time includes the service's
start and stop, the job's admission and its progress stream: everything a mover adds.
"""

import subprocess
import sys

from harness import GiB, Case, Command, Goal, ratio

HERE_BENCH = "tests/bench"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    source = image.path
    mover_job = [env.mover_job, env.ferry]
    first_byte = [sys.executable, env.repo / HERE_BENCH / "first_byte.py"]
    found = []
    for name, title, first in (
            ("mover-copy-half-4g", "the whole copy", False),
            ("mover-first-byte-half-4g", "time to first byte", True)):
        target = env.target(name)

        def remove(target=target):
            if not env.keep_targets and target.exists():
                target.unlink()

        def check(_result, target=target):
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(source), str(target)], capture_output=True, text=True)
            if cmp.returncode != 0:
                return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
            return None

        def cmd(label, argv, **kw):
            if first:
                argv = [*first_byte, target, "--", *argv]
            return Command(label, argv, setup=remove, cleanup=remove,
                           check=None if first else check, **kw)

        mover_label = "mover: ferry serve + ferry job start --watch"
        commands = [
            cmd(mover_label, [*mover_job, source, target], ferry=True,
                note="service started and stopped in the measured time"),
            cmd("ferry copy", [env.ferry, "copy", source, target]),
        ]
        goals = []
        if not first:
            goals.append(_goal("mover copy <= 1.05x ferry copy (4 GiB, 50% data)", name,
                               mover_label, "ferry copy", 1.05))
        found.append(Case(
            name=name,
            title=f"Mover overhead, {title}: file to file, 4 GiB, 50% data in scattered 1 MiB runs",
            commands=commands,
            goals=goals,
            notes=["first byte: the command is stopped as soon as the target has its first "
                   "allocated block (polled every millisecond)"] if first else [],
        ))
    return found


def _goal(text, case_name, a, b, most):
    def judge(results):
        x = ratio(results, case_name, a, b)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)
