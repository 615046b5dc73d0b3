"""Immutable backups (S3 Object Lock) against mutable ones into the same server.

moto's S3 server is the only server here that enforces Object Lock (s3s-fs has none), so
both repositories live in one moto server: the mutable one in a plain bucket, the
immutable one (30 days, compliance) in a bucket created with Object Lock. Each run is a
full backup of the 4 GiB 50%-data image into an empty repository: every chunk is new, so
the immutable run's extra work is the retention headers on every PUT and the config's
retention check (a LIST of keys/, a HEAD of the config, one PutObjectRetention: moto's
request log shows 2063 requests against 2060, the chunks' HEAD and PUT the same). moto keeps objects in memory and is slow
(Python): the ratio is the point, not the absolute times. Goal: immutable <= 1.15x mutable.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from harness import GiB, Case, Command, Goal

MOTO_INSTALL = "python3 -m pip install 'moto[server]==5.2.1'"
PLAIN, LOCKED = "bench-plain", "bench-locked"


class Moto:
    """One moto S3 server for the case, restarted empty before every run: moto keeps every
    object in memory (a chunk is under its 5 MiB spill size), so a server kept for the
    whole case would hold every run's 2 GiB of chunks at once (12 GiB for two timed runs
    and the warm-up of each command), and the objects of the locked bucket cannot be
    deleted to free it."""

    def __init__(self):
        self.port = None
        self.proc = None
        self.prefix = 0

    def create(self, bucket, locked):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/{bucket}", method="PUT")
        if locked:
            request.add_header("x-amz-bucket-object-lock-enabled", "true")
        urllib.request.urlopen(request).read()

    def start(self):
        """A new, empty server on self.port with both buckets."""
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/").read()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto's server did not start on port {self.port}")
                time.sleep(0.1)
        self.create(PLAIN, False)
        self.create(LOCKED, True)

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    @contextlib.contextmanager
    def context(self):
        try:
            import moto.server  # noqa: F401
        except ImportError as e:
            raise RuntimeError(f"moto's server is not installed: {MOTO_INSTALL}") from e
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        saved = dict(os.environ)
        try:
            self.start()
            os.environ.pop("AWS_CA_BUNDLE", None)
            os.environ.pop("AWS_PROFILE", None)
            os.environ.update({
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
                "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
            })
            yield self
        finally:
            os.environ.clear()
            os.environ.update(saved)
            self.stop()

    def fresh(self, env, bucket, immutable):
        """A new repository in a new, empty server (untimed)."""
        self.stop()
        self.start()
        self.prefix += 1
        repo = f"s3://{bucket}/r{self.prefix}"
        argv = [env.ferry, "backup", "init", repo]
        if immutable:
            argv += ["--immutable-days", "30", "--immutable-mode", "compliance"]
        subprocess.run([str(a) for a in argv], check=True, capture_output=True)
        return repo


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    moto = Moto()
    repos = {}

    def setup(label, bucket, immutable):
        def make():
            repos[label] = moto.fresh(env, bucket, immutable)
        return make

    class Repo:
        def __init__(self, label):
            self.label = label

        def __str__(self):
            return repos[self.label]

    def restores(label):
        """A check: the repository's only backup restores to the image's bytes."""
        def check(_result):
            repo = repos[label]
            listed = json.loads(subprocess.run([str(env.ferry), "backup", "list", "--json", repo],
                                               check=True, capture_output=True, text=True).stdout)
            if len(listed) != 1:
                return f"{repo} lists {len(listed)} backups, not 1"
            restored = env.target(f"immutable-{label}")
            restored.unlink(missing_ok=True)
            try:
                subprocess.run([str(env.ferry), "backup", "restore", "--no-progress", repo,
                                listed[0]["id"], str(restored)], check=True, capture_output=True)
                cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                      str(image.path), str(restored)],
                                     capture_output=True, text=True)
            finally:
                restored.unlink(missing_ok=True)
            return None if cmp.returncode == 0 else f"qemu-img compare: {cmp.stdout} {cmp.stderr}"
        return check

    name = "backup-immutable-moto-half-4g"
    commands = [
        Command("ferry backup create (immutable)",
                [env.ferry, "backup", "create", "--no-progress", image.path, Repo("immutable")],
                ferry=True, setup=setup("immutable", LOCKED, True), check=restores("immutable"),
                note="30 days, compliance, bucket with Object Lock"),
        Command("ferry backup create (mutable)",
                [env.ferry, "backup", "create", "--no-progress", image.path, Repo("mutable")],
                setup=setup("mutable", PLAIN, False), check=restores("mutable"),
                note="plain bucket"),
    ]

    def judge(results):
        rows = results.get(name, {})
        a = rows.get("ferry backup create (immutable)")
        b = rows.get("ferry backup create (mutable)")
        if not a or not b or not a.runs or not b.runs:
            return None, "not measured"
        r = a.median / b.median
        return r <= 1.15, f"{r:.2f}x ({a.median:.2f} s against {b.median:.2f} s)"

    return [Case(
        name=name,
        title="Full backup into an empty repository on moto's S3 server: immutable (Object Lock) "
              "against mutable, 4 GiB, 50% data",
        commands=commands,
        context=moto.context,
        goals=[Goal("immutable full backup <= 1.15x mutable", judge)],
        notes=["each run starts from a freshly started, empty moto server and an empty repository "
               "(restart and init untimed)",
               "the first timed run of each is restored and compared with the image "
               "(qemu-img compare)"],
    )]
