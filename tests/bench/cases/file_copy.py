"""File-to-file copies: ferry against qemu-img convert -m 8 -W, nbdcopy and cp --sparse=always,
each with and without a final flush of the target.

ferry copy always flushes the target before it reports success, so it runs the same command
in both variants. The peers: qemu-img's default target cache mode (unsafe) never flushes and
`-t writeback` flushes at the end; nbdcopy flushes with `--flush`; cp never flushes, so the
flush variant runs `sync FILE` after it.
"""

import subprocess

from harness import GiB, Case, Command, Goal, peer, ratio, which

IMAGES = [
    # name, pattern, size, title
    ("half-4g", "half", 4 * GiB, "4 GiB, 50% data in scattered 1 MiB runs"),
    ("empty-4g", "empty", 4 * GiB, "4 GiB, empty"),
    ("random-1g", "random", 1 * GiB, "1 GiB, random data"),
]


def cases(env):
    found = []
    for name, pattern, size, title in IMAGES:
        image = env.image(name, pattern, env.size(size))
        for flush in (False, True):
            case_name = f"copy-{name}-{'flush' if flush else 'noflush'}"
            target = env.target(case_name)
            found.append(Case(
                name=case_name,
                title=f"Copy file to file: {title}, "
                      + ("target flushed at the end by every command" if flush
                         else "no final flush by the peers"),
                commands=commands(env, image.path, target, flush),
                goals=goals(name, case_name, flush),
            ))
    return found


def commands(env, source, target, flush):
    def remove():
        if not env.keep_targets and target.exists():
            target.unlink()

    def check(_result):
        if target.stat().st_size != source.stat().st_size:
            return f"{target} has size {target.stat().st_size}, not {source.stat().st_size}"
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(source), str(target)], capture_output=True, text=True)
        if cmp.returncode != 0:
            return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
        return None

    def cmd(label, argv, **kw):
        return Command(label, argv, setup=remove, cleanup=remove, check=check, **kw)

    found = [cmd("ferry copy", [env.ferry, "copy", source, target], ferry=True,
                 note="always flushes")]
    if which("qemu-img"):
        cache = ["-t", "writeback"] if flush else []
        found.append(cmd("qemu-img convert -m 8 -W" + (" -t writeback" if flush else ""),
                         ["qemu-img", "convert", "-m", "8", "-W", "-f", "raw", "-O", "raw",
                          *cache, source, target]))
    found.append(peer("nbdcopy" + (" --flush" if flush else ""),
                      ["nbdcopy", *(["--flush"] if flush else []), source, target],
                      install="apt-get install -y libnbd-bin",
                      setup=remove, cleanup=remove, check=check))
    if flush:
        found.append(cmd("cp --sparse=always && sync FILE",
                         ["sh", "-c", 'cp --sparse=always "$0" "$1" && sync "$1"',
                          source, target]))
    else:
        found.append(cmd("cp --sparse=always", ["cp", "--sparse=always", source, target]))
    return found


def goals(image_name, case_name, flush):
    q = "qemu-img convert -m 8 -W" + (" -t writeback" if flush else "")
    n = "nbdcopy" + (" --flush" if flush else "")
    variant = "with flush" if flush else "peers without flush"
    found = []
    if image_name == "half-4g":
        found.append(_ratio_goal(f"50%-data copy <= 0.8x {q} ({variant})", case_name, q, 0.8))
        found.append(_ratio_goal(f"50%-data copy <= 1.0x {n} ({variant})", case_name, n, 1.0))
    if image_name == "empty-4g":
        found.append(_ratio_goal(f"empty-image copy <= 1.0x {n} ({variant})", case_name, n, 1.0))
    found.append(Goal(f"peak RSS of a default copy <= 64 MiB ({case_name})",
                      lambda r: _rss(r, case_name)))
    return found


def _ratio_goal(text, case_name, peer, limit):
    def judge(results):
        x = ratio(results, case_name, "ferry copy", peer)
        return x <= limit, f"{x:.2f}x"
    return Goal(text, judge)


def _rss(results, case_name):
    mib = results[case_name]["ferry copy"].peak_rss_mib
    return mib <= 64, f"{mib:.0f} MiB"
