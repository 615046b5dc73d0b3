"""Instant access: a backup of the 4 GiB 50%-data image in the s3s-fs repository, read
whole by nbdcopy from `ferry backup serve`, against `ferry backup restore` of the same
backup into a file (the issue's goal: nbdcopy of the export <= 1.2x the restore).

The export runs for the whole case on a free loopback port (its defaults: a 128 MiB chunk
cache, 8 chunks read ahead); nbdcopy uses its defaults (4 connections, block status to skip
holes). Both targets are removed before every run and compared with the image after it.
Time to first byte is measured by hand (docs/BACKUP.md); it is not a case here.
"""

import contextlib
import json
import signal
import subprocess

from harness import GiB, Case, Command, which

from cases.backup import Lazy, Where, ferry_init, run, settle, speed_goal
from cases.nbd import free_port

INSTALL = "apt-get install -y qemu-utils libnbd-bin"
CASE = "backup-serve-s3-half-4g"
OURS = "nbdcopy from ferry backup serve"
THEIRS = "ferry backup restore"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    where = Where(env, "s3")
    target = env.target(CASE)
    state = {}

    def prepare():
        ferry_init(env, where, "serve")
        out = run([env.ferry, "backup", "create", "--no-progress", "--json", image.path,
                   where.ferry("serve")]).stdout
        state["id"] = json.loads(out)["id"]
        settle()

    @contextlib.contextmanager
    def context():
        if not which("nbdcopy"):
            raise RuntimeError(f"nbdcopy is not installed: {INSTALL}")
        with where.context(prepare):
            port = free_port()
            served = subprocess.Popen(
                [str(env.ferry), "backup", "serve", where.ferry("serve"), state["id"],
                 "--listen", f"127.0.0.1:{port}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            try:
                state["uri"] = served.stdout.readline().strip()
                if not state["uri"]:
                    raise RuntimeError("ferry backup serve printed no URI")
                yield
            finally:
                served.send_signal(signal.SIGTERM)
                try:
                    served.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    served.kill()
                remove()

    def remove():
        if target.exists():
            target.unlink()

    def check(_result):
        cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                              str(image.path), str(target)], capture_output=True, text=True)
        return None if cmp.returncode == 0 else f"qemu-img compare: {cmp.stdout} {cmp.stderr}"

    commands = [
        Command(OURS, ["nbdcopy", Lazy(lambda: state["uri"]), target], ferry=True,
                setup=remove, check=check,
                note="chunks fetched on demand into the cache, read-ahead 8 chunks"),
        Command(THEIRS, [env.ferry, "backup", "restore", "--no-progress", where.ferry("serve"),
                         Lazy(lambda: state["id"]), target],
                setup=remove, check=check, note="8 workers, 16 GETs ahead; verifies the block hash"),
    ]
    return [Case(
        name=CASE,
        title="Instant access: nbdcopy of a backup served over NBD from S3 (s3s-fs) against "
              "its restore, 4 GiB, 50% data",
        commands=commands,
        context=context,
        goals=[speed_goal(CASE, OURS, THEIRS, 1.2)],
    )]
