"""Fan-out: one golden image into four file targets in one pass (cluster template
deployment), against four sequential `ferry copy` runs of the same image, and the same
fan-out as one job of a mover (`ferry serve` + `ferry job start SRC DST1 .. DST4`).

A second case reads the image from a slow HTTP server instead (nginx on loopback with
`limit_rate 25m` per connection: 200 MB/s for ferry's 8 connections, like a remote
template server), where reading the source once is what the fan-out saves.

The source is a local file that the page cache holds after the first run, so the disk
bounds every contender the same way: what the fan-out saves is the three extra passes over
the source (reads, extent queries, zero detection), not I/O on the targets. Every command
flushes every target before it ends.
"""

import subprocess

from harness import GiB, Case, Command, Goal, ratio
from cases.http import LateArgv, Server

TARGETS = 4
FAN_OUT = "ferry copy SRC DST1 .. DST4 (one pass)"
SEQUENTIAL = "4x ferry copy SRC DSTn (sequential)"
MOVER = "mover: one job, 4 targets (ferry serve + ferry job start)"


def cases(env):
    name = "fanout-half-4g-x4"
    image = env.image("half-4g", "half", env.size(4 * GiB))
    source = image.path
    targets = [env.target(f"{name}-{i}") for i in range(TARGETS)]

    def remove():
        for t in targets:
            if not env.keep_targets and t.exists():
                t.unlink()

    def check(_result):
        for t in targets:
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(source), str(t)], capture_output=True, text=True)
            if cmp.returncode != 0:
                return f"{t}: qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    def cmd(label, argv, **kw):
        return Command(label, argv, setup=remove, cleanup=remove, check=check, **kw)

    mover_job = [env.mover_job, env.ferry]
    commands = [
        cmd(FAN_OUT, [env.ferry, "copy", source, *targets], ferry=True),
        cmd(SEQUENTIAL, ["sh", "-c", 'f="$0"; s="$1"; shift; '
                         'for t; do "$f" copy "$s" "$t" >/dev/null || exit 1; done',
                         env.ferry, source, *targets]),
        cmd(MOVER, [*mover_job, source, *targets],
            note="service started and stopped in the measured time"),
    ]
    return [_over_http(env), Case(
        name=name,
        title=f"Fan-out: one file into {TARGETS} files, 4 GiB, 50% data in scattered "
              "1 MiB runs, against sequential copies",
        commands=commands,
        goals=[
            _ratio_goal(f"{TARGETS}-target fan-out <= 0.9x {TARGETS} sequential copies",
                        name, FAN_OUT, SEQUENTIAL, 0.9),
            _ratio_goal(f"mover fan-out job <= 0.9x {TARGETS} sequential copies",
                        name, MOVER, SEQUENTIAL, 0.9),
            Goal(f"peak RSS of a {TARGETS}-target fan-out <= 64 MiB",
                 lambda r: _rss(r, name)),
        ],
    )]


def _over_http(env):
    name = "fanout-http-half-1g-x4"
    image = env.image("half-1g", "half", env.size(1 * GiB))
    server = Server(env.workdir / "http-fanout-root", image.path, limit_rate="25m")
    targets = [env.target(f"{name}-{i}") for i in range(TARGETS)]

    def remove():
        for t in targets:
            if not env.keep_targets and t.exists():
                t.unlink()

    def check(_result):
        for t in targets:
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(image.path), str(t)], capture_output=True, text=True)
            if cmp.returncode != 0:
                return f"{t}: qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    values = {"URL": server.url}
    fan_out = "ferry copy URL DST1 .. DST4 (one pass)"
    sequential = "4x ferry copy URL DSTn (sequential)"
    single = "ferry copy URL DST1 (one target)"

    def check_one(_result):
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(image.path), str(targets[0])], capture_output=True, text=True)
        if cmp.returncode != 0:
            return f"{targets[0]}: qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    commands = [
        Command(fan_out, LateArgv([env.ferry, "copy", "URL", *targets], values), ferry=True,
                setup=remove, cleanup=remove, check=check),
        Command(single, LateArgv([env.ferry, "copy", "URL", targets[0]], values),
                setup=remove, cleanup=remove, check=check_one,
                note="the memory reference: one target"),
        Command(sequential, LateArgv(
            ["sh", "-c", 'f="$0"; s="$1"; shift; '
             'for t; do "$f" copy "$s" "$t" >/dev/null || exit 1; done',
             env.ferry, "URL", *targets], values),
            setup=remove, cleanup=remove, check=check),
    ]
    return Case(
        name=name,
        title=f"Fan-out from a slow HTTP server (nginx, 25 MB/s per connection) into "
              f"{TARGETS} files: 1 GiB, 50% data in scattered 1 MiB runs",
        commands=commands,
        context=server.context,
        goals=[
            _ratio_goal(f"{TARGETS}-target fan-out from slow HTTP <= 0.35x {TARGETS} "
                        "sequential copies", name, fan_out, sequential, 0.35),
            Goal(f"peak RSS of a {TARGETS}-target fan-out from HTTP <= one target's + 16 MiB",
                 lambda r: (r[name][fan_out].peak_rss_mib <= r[name][single].peak_rss_mib + 16,
                            f"{r[name][fan_out].peak_rss_mib:.0f} MiB, one target "
                            f"{r[name][single].peak_rss_mib:.0f} MiB")),
        ],
    )


def _ratio_goal(text, case_name, a, b, most):
    def judge(results):
        x = ratio(results, case_name, a, b)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)


def _rss(results, case_name):
    mib = results[case_name][FAN_OUT].peak_rss_mib
    return mib <= 64, f"{mib:.0f} MiB"
