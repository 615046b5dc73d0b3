#!/usr/bin/env python3
"""Benchmark ferry against its peers and print a markdown report.

    python3 tests/bench/run.py [--dir DIR] [--repeat N] [--only TEXT] [--quick] [--output FILE]

Builds ferry (release), makes the images in DIR (default: a temporary directory under
/var/tmp, removed afterwards; a DIR you name keeps its images for the next run), runs every
case's commands alternately REPEAT times after a warm-up, and prints a markdown report: the
command, commit, date, machine and tool versions, the goals met or missed, then per case
the median, min-max, peak RSS and ferry's time as a ratio of each peer's.
Cases live in tests/bench/cases/ (one module per family; see cases/__init__.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import cases as case_registry  # noqa: E402
import harness  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="where images and targets go (default: a temp dir under /var/tmp)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each command (default 5)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only cases whose name contains TEXT (repeatable)")
    ap.add_argument("--quick", action="store_true", help="images 16x smaller, to try the harness")
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--output", type=Path,
                    help="also write the report to this file (rewritten after every case)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args()

    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    target_dir = cargo_target_dir()
    if not args.no_build and not args.list:  # listing the cases needs no binaries
        log("building ferry (release)")
        subprocess.run(["cargo", "build", "--release", "-p", "ferry", "--bin", "ferry",
                        "-p", "ferry-tests", "--bin", "ferry-mkimage", "--bin", "ferry-mover-job",
                        "--bin", "ferry-operator-scale", "--bin", "ferry-snapshot-metadata-server"],
                       cwd=REPO, check=True)
    ferry = target_dir / "release" / "ferry"
    mkimage = target_dir / "release" / "ferry-mkimage"
    mover_job = target_dir / "release" / "ferry-mover-job"
    for binary in (ferry, mkimage, mover_job):
        if not binary.exists() and not args.list:
            ap.error(f"{binary} is missing: build it or drop --no-build")

    temporary = args.dir is None
    workdir = Path(tempfile.mkdtemp(prefix="ferry-bench-", dir="/var/tmp")) if temporary else args.dir
    workdir.mkdir(parents=True, exist_ok=True)
    env = harness.Env(repo=REPO, ferry=ferry, mkimage=mkimage, mover_job=mover_job,
                      workdir=workdir, repeat=args.repeat, quick=args.quick, log=log)
    try:
        env.dry = args.list
        all_cases = case_registry.load(env, args.only)
        if args.only:
            selected = [c for c in all_cases if any(t in c.name for t in args.only)]
        else:
            selected = [c for c in all_cases if not c.optional]
        if args.list:
            for c in all_cases:
                print(f"{c.name}: {c.title}" + (" (optional: run with --only)" if c.optional else ""))
            return 0
        results = {}
        for case in selected:
            log(f"case {case.name}")
            results[case.name] = harness.run_case(env, case)
            if args.output:  # a run stopped early keeps the report of the cases it finished
                done = [c for c in selected if c.name in results]
                args.output.write_text(render(args, env, done, results))
        report = render(args, env, selected, results)
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report)
    if args.output:
        args.output.write_text(report)
    return 0


def render(args, env, selected, results) -> str:
    """The report: what ran where (command, commit, date, machine, tools), the goals with
    met or missed, then one table per case."""
    command = "python3 tests/bench/run.py" + "".join(f" {a}" for a in sys.argv[1:])
    out = [f"Command: `{command}`", "",
           f"{env.repeat} timed runs of each command after one untimed warm-up, the commands "
           "of a case alternating; page cache warm."
           + (" --quick: every image is 16 times smaller than its title says." if env.quick else ""),
           "",
           "| | |", "|---|---|",
           f"| commit | {git_commit()} |",
           f"| date | {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC |"]
    out += [f"| {key} | {value} |" for key, value in machine(env)]
    out += ["", "Tools:", ""]
    out += [f"- {line}" for line in tool_versions(env)]
    out.append("")
    out.append(harness.judge_goals(selected, results))
    for case in selected:
        out.append(harness.render_case(case, results[case.name]))
    return "\n".join(out)


def machine(env) -> list:
    """(key, value) rows: CPU model and cores, memory, kernel, and the images' file system."""
    cpuinfo = read("/proc/cpuinfo").splitlines()
    cpu = next((l.split(":", 1)[1].strip() for l in cpuinfo if l.startswith("model name")),
               platform.processor() or "unknown CPU")
    mem = next((int(l.split()[1]) for l in read("/proc/meminfo").splitlines()
                if l.startswith("MemTotal")), 0)
    rows = [("CPU", f"{cpu}, {os.cpu_count()} cores"),
            ("memory", f"{mem / (1 << 20):.1f} GiB"),
            ("kernel", f"{platform.system()} {platform.release()}")]
    fs = run(["df", "--output=fstype,source", str(env.workdir)]).splitlines()
    if len(fs) > 1 and len(fs[1].split()) >= 2:
        fstype, device = fs[1].split()[:2]
        rows.append(("images on", f"{fstype} ({device}), {env.workdir}"))
    return rows


def tool_versions(env) -> list:
    """The first line of each tool's --version; tools that are not installed are left out
    here (their rows in the tables say how to install them)."""
    lines = []
    for tool in (["ferry", "--version"], ["qemu-img", "--version"], ["nbdcopy", "--version"],
                 ["cp", "--version"], ["sha256sum", "--version"],
                 ["rclone", "--version"], ["aws", "--version"],
                 ["s3s-fs", "--version"], ["rustc", "--version"]):
        exe = str(env.ferry) if tool[0] == "ferry" else shutil.which(tool[0])
        if exe:
            first = run([exe, *tool[1:]], stderr=True).splitlines()
            if first:
                lines.append(first[0].strip())
    if blksum := shutil.which("blksum"):
        lines.append(f"blksum (no --version): {blksum}")
    # Servers and tools with no --version: their Debian packages' versions.
    packages = [f"{pkg} {version}" for pkg in ("nbdkit", "nfs-ganesha", "tgt", "libnfs-utils")
                if (version := run(["dpkg-query", "-W", "-f", "${Version}", pkg]).strip())]
    if packages:
        lines.append("Debian packages: " + ", ".join(packages))
    return lines


def cargo_target_dir() -> Path:
    meta = subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    return Path(json.loads(meta)["target_directory"])


def git_commit() -> str:
    """HEAD's short hash, marked when the work tree has uncommitted changes to tracked files
    (the report then does not describe that commit exactly)."""
    commit = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).strip() or "unknown"
    dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"]).strip()
    return f"{commit} (with uncommitted changes)" if dirty else commit


def run(argv, stderr=False) -> str:
    """argv's standard output (or its error output when STDERR and the output is empty)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return proc.stdout or (proc.stderr if stderr else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def read(path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
