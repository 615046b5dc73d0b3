"""The benchmark harness core: commands, cases, timing, peak RSS, tables and goals.

In the spirit of QEMU's simplebench: every command of a case runs several times, the
commands of a case alternating (so a slow minute of a shared machine hurts all of them),
and the table shows the median, the spread and each peer's ratio to ferry. Cases come
from modules in cases/ (see cases/__init__.py); this file knows nothing about any tool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

MiB = 1 << 20
GiB = 1 << 30


@dataclasses.dataclass
class Env:
    """What cases need: the binaries under test, the image directory, the options."""

    repo: Path
    ferry: Path
    mkimage: Path
    mover_job: Path  # ferry-mover-job: a copy run as a mover pod runs it
    workdir: Path
    repeat: int
    quick: bool
    keep_targets: bool = False
    dry: bool = False  # list cases only: make no images
    log: Callable[[str], None] = print
    _images: dict = dataclasses.field(default_factory=dict)

    def size(self, full: int) -> int:
        """A benchmark size, shrunk 16x in --quick mode (for trying the harness)."""
        return max(full // 16, MiB) if self.quick else full

    def image(self, name: str, pattern: str, size: int, seed: int = 1) -> "Image":
        """The image NAME, made once with ferry-mkimage and reused across runs while its
        description (pattern, size, seed, generator) is unchanged."""
        if name in self._images:
            return self._images[name]
        if self.dry:
            return Image(self.workdir / f"{name}.img", size, pattern, size // 2, size // 2)
        path = self.workdir / f"{name}.img"
        meta_path = self.workdir / f"{name}.meta.json"
        meta = {"pattern": pattern, "size": size, "seed": seed, "generator": 1}
        info = None
        if path.exists() and meta_path.exists():
            try:
                saved = json.loads(meta_path.read_text())
                if {k: saved.get(k) for k in meta} == meta and path.stat().st_size == size:
                    info = saved
            except (OSError, ValueError):
                info = None
        if info is None:
            self.log(f"making {path} ({pattern}, {fmt_size(size)})")
            out = subprocess.run(
                [str(self.mkimage), pattern, str(size), str(path), str(seed)],
                check=True, capture_output=True, text=True,
            ).stdout
            fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            info = dict(meta, nonzero_block_bytes=int(fields["nonzero_block_bytes"]),
                        written=int(fields["written"]))
            meta_path.write_text(json.dumps(info))
        image = Image(path=path, size=size, pattern=pattern,
                      data_bytes=info["nonzero_block_bytes"], written=info["written"])
        self._images[name] = image
        return image

    def target(self, name: str) -> Path:
        return self.workdir / f"{name}.target.img"


@dataclasses.dataclass
class Image:
    path: Path
    size: int
    pattern: str
    data_bytes: int  # bytes in 4 KiB blocks holding data
    written: int  # bytes written to the file (its allocation)


@dataclasses.dataclass
class Command:
    """One contender in a case.

    argv runs with no shell; setup and cleanup run before and after each run, untimed
    (cleanup typically removes the target); check runs once after the first timed run and
    raises (or returns an error string) when the result is wrong.
    """

    label: str
    argv: list
    ferry: bool = False
    setup: Optional[Callable[[], None]] = None
    cleanup: Optional[Callable[[], None]] = None
    check: Optional[Callable[["RunResult"], Optional[str]]] = None
    note: str = ""
    # Set for a peer whose program is not installed: the command that installs it. The
    # row then says so in the report instead of silently disappearing.
    missing: str = ""


@dataclasses.dataclass
class Reference:
    """A computed row with no command (for example the two-core SHA-256 limit)."""

    label: str
    seconds: float
    note: str = ""


@dataclasses.dataclass
class Goal:
    """A goal from the issue, judged on the results of this run. judge returns
    (met or None when it cannot tell, a short explanation)."""

    text: str
    judge: Callable[[dict], tuple]


@dataclasses.dataclass
class Case:
    name: str
    title: str
    commands: list
    references: list = dataclasses.field(default_factory=list)
    goals: list = dataclasses.field(default_factory=list)
    # A context manager factory for servers the case needs (started before, stopped after).
    context: Optional[Callable[[], contextlib.AbstractContextManager]] = None
    # Lines printed under the table (how a reference was computed, caveats).
    notes: list = dataclasses.field(default_factory=list)
    # Runs only when --only names it (long sweeps such as the engine tuning).
    optional: bool = False


@dataclasses.dataclass
class RunResult:
    seconds: float
    max_rss_kib: int
    stdout: str
    stderr: str


@dataclasses.dataclass
class Stats:
    label: str
    runs: list  # of RunResult
    ferry: bool = False
    note: str = ""
    error: str = ""

    @property
    def times(self) -> list:
        return [r.seconds for r in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.runs else float("nan")

    @property
    def peak_rss_mib(self) -> float:
        return max((r.max_rss_kib for r in self.runs), default=0) / 1024


TIME = "/usr/bin/time"


def measure(argv: list, timeout: float = 3600) -> RunResult:
    """Runs argv; returns its wall time and peak RSS.

    The peak RSS comes from GNU time (`/usr/bin/time -f %M`, Debian package `time`), whose
    child is the command itself: a child forked straight from this Python process would
    count the harness's own pages in its high-water mark before exec. For a shell, the
    figure covers the commands it ran and waited for. Without GNU time the RSS column
    says 0."""
    argv = [str(a) for a in argv]
    with tempfile.NamedTemporaryFile("r", prefix="ferry-bench-rss-") as rss_file:
        wrapped = ([TIME, "-f", "%M", "-o", rss_file.name, *argv]
                   if os.access(TIME, os.X_OK) else argv)
        start = time.perf_counter()
        try:
            proc = subprocess.run(wrapped, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{' '.join(argv)} did not finish in {timeout:.0f} s") from e
        seconds = time.perf_counter() - start
        rss_text = rss_file.read().split()
    stdout = proc.stdout.decode(errors="replace")
    stderr = proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {stderr.strip()[-2000:]}")
    rss = int(rss_text[-1]) if rss_text and rss_text[-1].isdigit() else 0
    return RunResult(seconds, rss, stdout, stderr)


def run_case(env: Env, case: Case) -> dict:
    """Runs every command of the case `env.repeat` times, alternating, after one untimed
    warm-up each; returns {label: Stats}."""
    stats = {c.label: Stats(c.label, [], ferry=c.ferry, note=c.note) for c in case.commands}
    for cmd in case.commands:
        if cmd.missing:
            stats[cmd.label].error = f"not installed: `{cmd.missing}`"
            env.log(f"  {case.name}: {cmd.label}: {stats[cmd.label].error}")
    try:
        with case.context() if case.context else contextlib.nullcontext():
            _run_rounds(env, case, stats)
    except Exception as e:  # a case whose servers would not start: record it, go on
        message = "failed: " + (str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
        env.log(f"  {case.name}: {message}")
        for st in stats.values():
            if not st.runs and not st.error:
                st.error = message
    return stats


def _run_rounds(env: Env, case: Case, stats: dict) -> None:
    live = [cmd for cmd in case.commands if not cmd.missing]
    for round_no in range(env.repeat + 1):
        for cmd in list(live):
            st = stats[cmd.label]
            try:
                if cmd.setup:
                    cmd.setup()
                result = measure(cmd.argv)
                if round_no == 1 and cmd.check:
                    problem = cmd.check(result)
                    if problem:
                        raise RuntimeError(f"check failed: {problem}")
            except Exception as e:  # one broken peer must not sink the whole run
                st.error = "failed: " + (str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
                env.log(f"  {case.name}: {cmd.label}: {st.error}")
                live.remove(cmd)
                continue
            finally:
                # No sync here: cleanup deletes the target, dropping its dirty pages, and a
                # system-wide sync on a shared machine waits for everyone's writes.
                if cmd.cleanup:
                    cmd.cleanup()
            if round_no > 0:  # round 0 warms caches and is not counted
                st.runs.append(result)
                env.log(f"  {case.name}: {cmd.label}: {result.seconds:.3f} s, "
                        f"{result.max_rss_kib / 1024:.0f} MiB")


def render_case(case: Case, stats: dict) -> str:
    """A markdown table of one case: median, min-max, peak RSS, and ferry's time over each row's."""
    rows = list(stats.values())
    primary = next((s for s in rows if s.ferry and s.runs), None)
    out = [f"### {case.title}", "",
           "| command | median s | min-max s | peak RSS MiB | ferry / this |",
           "|---|---:|---:|---:|---:|"]
    for s in rows:
        label = f"`{s.label}`" + (f" ({s.note})" if s.note else "")
        if not s.runs:
            out.append(f"| {label} | {s.error} | | | |")
            continue
        ratio = primary.median / s.median if primary and s.median > 0 else float("nan")
        out.append(f"| {label} | {s.median:.3f} | {min(s.times):.3f}-{max(s.times):.3f} | "
                   f"{s.peak_rss_mib:.0f} | {ratio:.2f} |")
    for ref in case.references:
        ratio = primary.median / ref.seconds if primary and ref.seconds > 0 else float("nan")
        label = ref.label + (f" ({ref.note})" if ref.note else "")
        out.append(f"| {label} | {ref.seconds:.3f} | computed | - | {ratio:.2f} |")
    out.append("")
    for note in case.notes:
        out.append(f"- {note}")
    if case.notes:
        out.append("")
    return "\n".join(out)


def judge_goals(cases: list, results: dict) -> str:
    """The goals of the cases run, each met, missed or n/a (could not be judged: a row did
    not run), with a count of each at the top."""
    rows, counts = [], {"met": 0, "missed": 0, "n/a": 0}
    for case in cases:
        for goal in case.goals:
            try:
                met, detail = goal.judge(results)
            except Exception as e:  # missing rows: say so rather than crash
                met, detail = None, f"cannot judge: {e}"
            mark = {True: "met", False: "missed", None: "n/a"}[met]
            counts[mark] += 1
            rows.append(f"| {goal.text} | {'**met**' if met else mark} | {detail} |")
    summary = ", ".join(f"{n} {mark}" for mark, n in counts.items() if n)
    lines = ["### Goals", "", f"{summary or 'no goals in the cases run'}.", ""]
    if rows:
        lines += ["| goal | result | measured |", "|---|---|---|", *rows]
    lines.append("")
    return "\n".join(lines)


def ratio(results: dict, case: str, a: str, b: str) -> float:
    """median(a) / median(b) within one case."""
    sa, sb = results[case][a], results[case][b]
    if not sa.runs or not sb.runs:
        raise KeyError(f"no runs of {a if not sa.runs else b}")
    return sa.median / sb.median


def copy_keeping_allocation(src: Path, dst: Path) -> None:
    """Copies SRC to DST with the same allocation: its data extents (SEEK_DATA/SEEK_HOLE)
    copied as they are, zero blocks inside them included, its holes left holes.

    Not `cp --sparse=always`, which also punches every zero 4 KiB block inside the data
    and so turns an image of a few thousand 1 MiB runs into tens of thousands of extents:
    a server that reports allocation (tgt's GET LBA STATUS, for one) then answers
    differently than it would for the image itself."""
    tmp = dst.with_name(dst.name + ".partial")
    with open(src, "rb") as fi, open(tmp, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        fo.truncate(size)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fi.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after offset
                break
            end = os.lseek(fi.fileno(), start, os.SEEK_HOLE)
            pos = start
            while pos < end:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), min(end - pos, GiB), pos, pos)
                if n <= 0:
                    raise OSError(f"copy_file_range {src} -> {tmp} at {pos} returned {n}")
                pos += n
            offset = end
    os.replace(tmp, dst)


def fresh_copy(src: Path, dst: Path) -> None:
    """copy_keeping_allocation unless DST is already a copy of SRC as it is now."""
    if (dst.exists() and dst.stat().st_size == src.stat().st_size
            and dst.stat().st_mtime >= src.stat().st_mtime):
        return
    copy_keeping_allocation(src, dst)


def fmt_size(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def which(tool: str) -> Optional[str]:
    return shutil.which(tool)


def peer(label: str, argv: list, install: str, tool: Optional[str] = None,
         available: Optional[bool] = None, **kw) -> Command:
    """A peer's Command; when the peer cannot run here (TOOL, by default argv[0], is not on
    PATH, or AVAILABLE is False), a row whose report tells the command that installs it."""
    if available is None:
        available = bool(which(tool or str(argv[0])))
    if available:
        return Command(label, argv, **kw)
    return Command(label, argv, missing=install, note=kw.get("note", ""))
