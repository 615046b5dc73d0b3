"""Fan-out: one golden image into four file targets in one pass (cluster template
deployment), against four sequential `ferry copy` runs of the same image, and the same
fan-out as one job of a mover (`ferry serve` + `ferry job start SRC DST1 .. DST4`).

The source is a local file that the page cache holds after the first run, so the disk
bounds every contender the same way: what the fan-out saves is the three extra passes over
the source (reads, extent queries, zero detection), not I/O on the targets. Every command
flushes every target before it ends.
"""

import subprocess

from harness import GiB, Case, Command, Goal, ratio

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
        cmd(SEQUENTIAL, ["sh", "-c", 'f="$0"; s="$1"; shift 2; '
                         'for t; do "$f" copy "$s" "$t" >/dev/null || exit 1; done',
                         env.ferry, source, *targets]),
        cmd(MOVER, [*mover_job, source, *targets],
            note="service started and stopped in the measured time"),
    ]
    return [Case(
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


def _ratio_goal(text, case_name, a, b, most):
    def judge(results):
        x = ratio(results, case_name, a, b)
        return x <= most, f"{x:.2f}x"
    return Goal(text, judge)


def _rss(results, case_name):
    mib = results[case_name][FAN_OUT].peak_rss_mib
    return mib <= 64, f"{mib:.0f} MiB"
