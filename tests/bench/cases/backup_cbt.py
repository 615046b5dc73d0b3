"""Changed-block tracking through the CSI SnapshotMetadata service (issue 32): an incremental
backup of the 4 GiB 50%-data volume after 1% of its 4 MiB chunks changed, the source a file and
the test kit's stand-in of the sidecar (ferry-snapshot-metadata-server, TLS, a token) answering
the delta, against the change-digest incremental of the same file in the same case, and (cross
goals) the dirty-bitmap incremental over NBD of the same kind of change
(backup-dirty-bitmap-nbd-half-4g) and the change-digest incremental of backup-incremental-dir.

The stand-in reads the delta from a list the setup writes as it changes the file, as a driver
that tracks its writes knows it: comparing two 4 GiB snapshot files would time the stand-in,
not ferry. Each run changes another 1% of the chunks and backs up on top of the previous run's
backup; the check reads `bytes_read` of the JSON report against the changed chunks' bytes.
"""

import contextlib
import json
import os
import random
import subprocess

from harness import GiB, Case, Command, copy_keeping_allocation
from cases.backup import CHUNK, CHANGED, Lazy, Where, cross_goal, ferry_init, run, settle, speed_goal

TOKEN = "ferry-bench-snapshot-metadata-token"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    return [cbt_case(env, Where(env, "dir"), image)]


def cbt_case(env, where, image):
    name = "backup-cbt-snapshot-metadata-half-4g"
    work = env.workdir / f"{name}.img"
    delta = env.workdir / f"{name}.delta"
    ca = env.workdir / f"{name}.ca.pem"
    token = env.workdir / f"{name}.token"
    server_bin = env.mkimage.parent / "ferry-snapshot-metadata-server"
    rng = random.Random(11)
    state = {"server": None, "url": None, "changed_chunks": 0}

    def change():
        """Overwrites 4 KiB at the start of 1% of the chunks and lists them as the delta."""
        chunks = max(1, image.size // CHUNK)
        picked = sorted(rng.sample(range(chunks), max(1, int(chunks * CHANGED))))
        with open(work, "r+b") as f:
            for c in picked:
                f.seek(c * CHUNK)
                f.write(rng.randbytes(4096))
        delta.write_text("".join(f"{c * CHUNK} 4096\n" for c in picked))
        state["changed_chunks"] = len(picked)

    def prepare():
        copy_keeping_allocation(image.path, work)
        token.write_text(TOKEN + "\n")
        proc = subprocess.Popen(
            [server_bin, "--ca-out", ca, "--token-file", token, "--namespace", "bench",
             "--snapshot", f"snap-new=h-new={work}", "--snapshot", f"snap-base=h-base={work}",
             "--delta", f"h-base=snap-new={delta}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        state["server"] = proc
        state["url"] = proc.stdout.readline().strip()
        if not state["url"].startswith("https://"):
            raise RuntimeError(f"{server_bin} did not start")
        os.environ["FERRY_SNAPSHOT_METADATA_CA_FILE"] = str(ca)
        os.environ["FERRY_SNAPSHOT_METADATA_TOKEN_FILE"] = str(token)
        ferry_init(env, where, "ferry")
        run([env.ferry, "backup", "create", "--no-progress", "--source-id", "vol", work,
             where.ferry("ferry")])
        settle()

    @contextlib.contextmanager
    def context():
        try:
            with where.context(prepare):
                yield
        finally:
            if state["server"]:
                state["server"].stdin.close()
                state["server"].wait(timeout=30)
            for p in (work, delta, ca, token):
                p.unlink(missing_ok=True)

    def check(result):
        report = json.loads(result.stdout.strip().splitlines()[-1])
        if report.get("changed_block_tracking") != "SnapshotMetadata":
            return f"the service's delta was not used: {report.get('full_reason')}"
        changed = state["changed_chunks"] * CHUNK
        if report["bytes_read"] > 1.05 * changed:
            return f"read {report['bytes_read']} bytes, the changed chunks hold {changed}"
        return None

    create = [env.ferry, "backup", "create", "--no-progress", "--json", "--source-id", "vol"]
    cbt_label = "ferry backup create --snapshot-metadata"
    digest_label = "ferry backup create (change digests)"
    commands = [
        Command(cbt_label,
                [*create, "--snapshot-metadata", Lazy(lambda: state["url"]), "--snapshot", "snap-new",
                 "--namespace", "bench", "--base-snapshot-id", "h-base", work,
                 where.ferry("ferry")],
                ferry=True, setup=change, check=check,
                note="reads only the chunks in the service's delta"),
        Command(digest_label, [*create, work, where.ferry("ferry")], setup=change,
                note="reads every data chunk, compares change digests"),
    ]
    return Case(
        name=name,
        title="Incremental backup after 1% of the chunks changed, changed blocks from the CSI "
              "SnapshotMetadata service (file source, 4 GiB, 50% data), directory repository",
        commands=commands,
        context=context,
        goals=[speed_goal(name, cbt_label, digest_label, 0.2),
               cross_goal(name, cbt_label, "backup-dirty-bitmap-nbd-half-4g",
                          "ferry backup create --dirty-bitmap b0", 1.2),
               cross_goal(name, cbt_label, "backup-incremental-dir-half-4g",
                          "ferry backup create (1% changed)", 0.2)],
    )
