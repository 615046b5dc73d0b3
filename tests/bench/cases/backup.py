"""Backups of the 4 GiB 50%-data image: `ferry backup` against restic 0.14, with the
repository in a local directory and on the local s3s-fs server.

Cases, for each repository kind:
- full backup into an empty repository (ferry plain and encrypted; restic always encrypts),
- restore of that backup into a fresh file,
- a second backup after 1% of the image's 4 MiB chunks changed (each run changes another
  1% of a working copy, so every run is an incremental over the previous one),
and, with the directory repository, the dirty-bitmap backup over NBD (qemu-nbd -B) against
ferry's own incremental over the same export without the bitmap (restic has no such mode).

Besides time and peak RSS, the goals report the bytes each repository holds after the full
backup and the objects written per GiB of image: one object is one PUT on S3 (ferry
writes one object per new chunk; restic packs blobs into larger pack files).
"""

import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

from harness import GiB, MiB, Case, Command, Goal, copy_keeping_allocation, peer, ratio, which

RESTIC_INSTALL = "apt-get install -y restic"
QEMU_INSTALL = "apt-get install -y qemu-utils"
PASSWORD = "ferry-bench-backup-passphrase"
WORKERS = 8
CHUNK = 4 * MiB
# Per worker: the read buffer and the encoded copy being stored (restore: the plaintext
# buffer, the blob being opened and two being fetched, blobs being compressed chunks), so
# 3 chunks' worth; plus 64 MiB for the runtime, the SDK and the index.
RSS_LIMIT_MIB = 64 + 3 * WORKERS * CHUNK // MiB
CHANGED = 0.01


class Lazy:
    """An argv element computed when the command runs (a backup id made by the context)."""

    def __init__(self, make):
        self.make = make

    def __str__(self):
        return str(self.make())


def tree(path: Path):
    """(files, bytes) under path, hidden bookkeeping files left out."""
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for n in names:
            if not n.startswith("."):
                files += 1
                size += os.path.getsize(os.path.join(root, n))
    return files, size


class Where:
    """Repositories of one kind: directories under the bench directory, or prefixes of the
    s3s-fs bucket (whose objects are files too, so both are measured the same way)."""

    def __init__(self, env, kind):
        self.env, self.kind = env, kind
        self.root = env.workdir / f"backup-{kind}"
        self.server = None
        if kind == "s3":
            from cases.s3 import Server  # the same standalone s3s-fs server as the S3 cases
            self.server = Server(self.root / "s3-root")

    def files(self, name) -> Path:
        if self.kind == "dir":
            return self.root / name
        return self.server.object_path(name)

    def ferry(self, name) -> str:
        if self.kind == "dir":
            return str(self.root / name)
        from cases.s3 import BUCKET
        return f"s3://{BUCKET}/{name}"

    def restic(self, name) -> str:
        if self.kind == "dir":
            return str(self.root / name)
        from cases.s3 import BUCKET
        return f"s3:http://127.0.0.1:{self.server.port}/{BUCKET}/{name}"

    def reset(self, name):
        shutil.rmtree(self.files(name), ignore_errors=True)

    @contextlib.contextmanager
    def context(self, prepare=None):
        self.root.mkdir(parents=True, exist_ok=True)
        saved = dict(os.environ)
        os.environ["RESTIC_PASSWORD"] = PASSWORD
        os.environ["RESTIC_CACHE_DIR"] = str(self.root / "restic-cache")
        try:
            with (self.server.context() if self.server else contextlib.nullcontext()):
                if prepare:
                    prepare()
                yield self
        finally:
            os.environ.clear()
            os.environ.update(saved)
            shutil.rmtree(self.root, ignore_errors=True)


def run(argv, env_extra=None):
    environ = dict(os.environ, **(env_extra or {}))
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True,
                          env=environ)


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    key = env.workdir / "backup-bench.key"
    if not env.dry:
        key.write_text(PASSWORD + "\n")
    found = []
    for kind in ("dir", "s3"):
        where = Where(env, kind)
        found += [full_case(env, where, image, key), restore_case(env, where, image),
                  incremental_case(env, where, image)]
    found.append(dirty_bitmap_case(env, Where(env, "dir"), image))
    return found


def ferry_init(env, where, name, key=None):
    where.reset(name)
    extra = {"FERRY_BACKUP_KEY_FILE": str(key)} if key else {}
    run([env.ferry, "backup", "init", where.ferry(name)], extra)


def restic_init(where, name):
    where.reset(name)
    run(["restic", "-r", where.restic(name), "init"])


def full_case(env, where, image, key):
    name = f"backup-full-{where.kind}-half-4g"
    stored = {}

    def measure_repo(label, repo):
        def check(result):
            stored[label] = tree(where.files(repo))
            if label == "ferry":
                summary = json.loads(result.stdout)
                stored["chunks"] = tree(where.files(repo) / "chunks")[0]
                stored["new"] = summary["chunks_new"] * CHUNK
            return None
        return check

    with_key = ["env", f"FERRY_BACKUP_KEY_FILE={key}"]
    commands = [
        Command("ferry backup create", [env.ferry, "backup", "create", "--no-progress",
                                        "--json", image.path, where.ferry("ferry")],
                ferry=True, setup=lambda: ferry_init(env, where, "ferry"),
                check=measure_repo("ferry", "ferry"), note=f"{WORKERS} workers, 4 MiB chunks, zstd level 1 (the default)"),
        Command("ferry backup create (encrypted)",
                [*with_key, env.ferry, "backup", "create", "--no-progress", image.path,
                 where.ferry("ferry-enc")],
                setup=lambda: ferry_init(env, where, "ferry-enc", key),
                check=measure_repo("ferry-enc", "ferry-enc"), note="AES-256-GCM"),
        peer("restic backup", ["restic", "-r", Lazy(lambda: where.restic("restic")), "backup", "--quiet",
                               image.path],
             install=RESTIC_INSTALL, setup=lambda: restic_init(where, "restic"),
             check=measure_repo("restic", "restic"), note="encrypted, content-defined chunks"),
    ]

    def bytes_goal(results):
        if "ferry" not in stored or "restic" not in stored:
            return None, "not measured"
        (ff, fb), (rf, rb) = stored["ferry"], stored["restic"]
        return fb <= rb * 1.1, (f"ferry {fb / MiB:.0f} MiB in {ff} objects; "
                                f"restic {rb / MiB:.0f} MiB in {rf} objects")

    def puts_goal(results):
        if "new" not in stored or not stored["new"]:
            return None, "not measured"
        ff = stored["ferry"][0]
        chunks = stored["chunks"]
        per_gib = chunks / (stored["new"] / GiB)
        return per_gib <= 256, (f"{per_gib:.0f} chunk objects per GiB of new chunks "
                                f"({chunks} chunks, {stored['new'] / GiB:.2f} GiB), "
                                f"plus {ff - chunks} other objects per backup")

    return Case(
        name=name,
        title=f"Full backup into an empty {'S3 (s3s-fs)' if where.kind == 's3' else 'directory'} "
              "repository: 4 GiB, 50% data",
        commands=commands,
        context=where.context,
        goals=[speed_goal(name, "ferry backup create", "restic backup", 0.5),
               Goal("bytes stored <= 1.1x restic's", bytes_goal),
               Goal("PUTs per GiB of new data <= 256", puts_goal),
               rss_goal(name, "ferry backup create")],
        notes=["each run starts from an empty repository (init untimed)"],
    )


def settle():
    """Writes back what the untimed preparation left dirty (the repositories, a working
    copy), so that its writeback does not run inside the timed commands."""
    os.sync()


def restore_case(env, where, image):
    name = f"backup-restore-{where.kind}-half-4g"
    ids = {}
    target = env.target(name)
    restic_dir = env.workdir / f"{name}-restic"

    def prepare():
        ferry_init(env, where, "ferry")
        out = run([env.ferry, "backup", "create", "--no-progress", "--json", image.path,
                   where.ferry("ferry")]).stdout
        ids["ferry"] = json.loads(out)["id"]
        if which("restic"):
            restic_init(where, "restic")
            run(["restic", "-r", where.restic("restic"), "backup", "--quiet", image.path])
        settle()

    def remove():
        if target.exists():
            target.unlink()
        shutil.rmtree(restic_dir, ignore_errors=True)

    def compare(path):
        def check(_result):
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(image.path), str(path)], capture_output=True, text=True)
            return None if cmp.returncode == 0 else f"qemu-img compare: {cmp.stdout} {cmp.stderr}"
        return check

    restored = restic_dir / str(image.path).lstrip("/")
    commands = [
        Command("ferry backup restore", [env.ferry, "backup", "restore", "--no-progress",
                                         where.ferry("ferry"), Lazy(lambda: ids["ferry"]), target],
                ferry=True, setup=remove, cleanup=remove, check=compare(target),
                note="verifies the block hash; fsyncs; zero chunks left as holes"),
        peer("restic restore latest", ["restic", "-r", Lazy(lambda: where.restic("restic")), "restore",
                                       "latest", "--target", restic_dir],
             install=RESTIC_INSTALL, setup=remove, cleanup=remove, check=compare(restored),
             note="never flushes"),
    ]
    return Case(
        name=name,
        title=f"Restore from a {'S3 (s3s-fs)' if where.kind == 's3' else 'directory'} "
              "repository into a new file: 4 GiB, 50% data",
        commands=commands,
        context=lambda: where.context(prepare),
        goals=[speed_goal(name, "ferry backup restore", "restic restore latest", 0.5),
               rss_goal(name, "ferry backup restore")],
    )


def change_chunks(path: Path, size: int, rng: random.Random):
    """Overwrites 4 KiB at the start of 1% of the 4 MiB chunks with new random bytes."""
    chunks = max(1, size // CHUNK)
    with open(path, "r+b") as f:
        for c in rng.sample(range(chunks), max(1, int(chunks * CHANGED))):
            f.seek(c * CHUNK)
            f.write(rng.randbytes(4096))


def incremental_case(env, where, image):
    name = f"backup-incremental-{where.kind}-half-4g"
    work = env.workdir / f"{name}.img"
    rng = random.Random(42)

    def prepare():
        copy_keeping_allocation(image.path, work)
        ferry_init(env, where, "ferry")
        run([env.ferry, "backup", "create", "--no-progress", work, where.ferry("ferry")])
        if which("restic"):
            restic_init(where, "restic")
            run(["restic", "-r", where.restic("restic"), "backup", "--quiet", work])
        settle()

    @contextlib.contextmanager
    def context():
        try:
            with where.context(prepare):
                yield
        finally:
            if work.exists():
                work.unlink()

    change = lambda: change_chunks(work, image.size, rng)  # noqa: E731
    commands = [
        Command("ferry backup create (1% changed)",
                [env.ferry, "backup", "create", "--no-progress", work, where.ferry("ferry")],
                ferry=True, setup=change, note="reads the image, uploads the changed chunks"),
        peer("restic backup (1% changed)",
             ["restic", "-r", Lazy(lambda: where.restic("restic")), "backup", "--quiet", work],
             install=RESTIC_INSTALL, setup=change, note="rereads the changed file"),
    ]
    return Case(
        name=name,
        title=f"Second backup after 1% of the chunks changed, "
              f"{'S3 (s3s-fs)' if where.kind == 's3' else 'directory'} repository: 4 GiB, 50% data",
        commands=commands,
        context=context,
        goals=[speed_goal(name, "ferry backup create (1% changed)", "restic backup (1% changed)", 0.5),
               rss_goal(name, "ferry backup create (1% changed)")],
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dirty_bitmap_case(env, where, image):
    name = "backup-dirty-bitmap-nbd-half-4g"
    disk = env.workdir / f"{name}.qcow2"
    pid_file = env.workdir / f"{name}.pid"
    port = free_port()
    uri = f"nbd://127.0.0.1:{port}/disk"
    rng = random.Random(7)

    def stop():
        if pid_file.exists():
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, 15)
                for _ in range(100):
                    os.kill(pid, 0)
                    time.sleep(0.05)
            except (OSError, ValueError):
                pass
            pid_file.unlink(missing_ok=True)

    def serve(bitmap):
        stop()
        argv = ["qemu-nbd", "--fork", "--persistent", "--shared=16", "-r", "-f", "qcow2",
                "-x", "disk", "-b", "127.0.0.1", "-p", str(port), f"--pid-file={pid_file}"]
        if bitmap:
            argv += ["-B", "b0"]
        subprocess.run(argv + [str(disk)], check=True, capture_output=True)

    def change():
        """New writes tracked by a cleared b0, then the export with the bitmap."""
        stop()
        subprocess.run(["qemu-img", "bitmap", "--clear", str(disk), "b0"], check=True)
        chunks = max(1, image.size // CHUNK)
        cmds = []
        for c in rng.sample(range(chunks), max(1, int(chunks * CHANGED))):
            cmds += ["-c", f"write -P {rng.randrange(1, 255)} {c * CHUNK} 4k"]
        subprocess.run(["qemu-io", "-f", "qcow2", *cmds, str(disk)], check=True,
                       capture_output=True)
        serve(True)

    def prepare():
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(image.path),
                        str(disk)], check=True)
        subprocess.run(["qemu-img", "bitmap", "--add", str(disk), "b0"], check=True)
        ferry_init(env, where, "ferry")
        serve(True)
        run([env.ferry, "backup", "create", "--no-progress", "--source-id", "vm", uri,
             where.ferry("ferry")])

    @contextlib.contextmanager
    def context():
        try:
            with where.context(prepare):
                yield
        finally:
            stop()
            disk.unlink(missing_ok=True)

    create = [env.ferry, "backup", "create", "--no-progress", "--source-id", "vm"]
    available = bool(which("qemu-nbd") and which("qemu-io"))
    commands = [
        peer("ferry backup create --dirty-bitmap b0", [*create, "--dirty-bitmap", "b0", uri,
                                                      where.ferry("ferry")],
             install=QEMU_INSTALL, available=available, setup=change,
             note="reads only the dirty chunks"),
        peer("ferry backup create (no bitmap)", [*create, uri, where.ferry("ferry")],
             install=QEMU_INSTALL, available=available, setup=change,
             note="reads every data chunk, uploads the changed ones"),
    ]
    commands[0].ferry = True
    return Case(
        name=name,
        title="Incremental backup over NBD after 1% of the chunks changed: qemu-nbd (qcow2, "
              "4 GiB, 50% data) with dirty bitmap b0, directory repository",
        commands=commands,
        context=context,
        goals=[speed_goal(name, "ferry backup create --dirty-bitmap b0",
                          "ferry backup create (no bitmap)", 0.5),
               cross_goal(name, "ferry backup create --dirty-bitmap b0",
                          "backup-incremental-dir-half-4g", "restic backup (1% changed)", 0.1)],
    )


def speed_goal(case, ours, theirs, most):
    def judge(results):
        rows = results[case]
        if not rows.get(ours) or not rows[ours].runs or not rows.get(theirs) or not rows[theirs].runs:
            return None, "not measured"
        x = ratio(results, case, ours, theirs)
        return x <= most, f"{x:.2f}x"
    return Goal(f"`{ours}` <= {most}x `{theirs}`", judge)


def cross_goal(case, ours, other_case, theirs, most):
    """OURS in CASE against THEIRS measured in OTHER_CASE (the same change of the same image)."""
    def judge(results):
        a = results.get(case, {}).get(ours)
        b = results.get(other_case, {}).get(theirs)
        if not a or not a.runs or not b or not b.runs:
            return None, "not measured"
        x = a.median / b.median
        return x <= most, f"{x:.2f}x"
    return Goal(f"`{ours}` <= {most}x `{theirs}` ({other_case})", judge)


def rss_goal(case, label):
    def judge(results):
        st = results[case].get(label)
        if not st or not st.runs:
            return None, "not measured"
        mib = st.peak_rss_mib
        return mib <= RSS_LIMIT_MIB, f"{mib:.0f} MiB"
    return Goal(f"`{label}` peak RSS <= 64 MiB + 3 x workers x chunk size ({RSS_LIMIT_MIB} MiB)", judge)
