"""Replication: `ferry backup sync` of a backup of the 4 GiB 50%-data image from a directory
repository into the s3s-fs server, against a fresh `ferry backup create` of the same image
into it (the issue's goals: a sync into an empty S3 repository <= 1.1x the fresh backup,
and a sync of the next backup after 1% of the chunks changed <= 0.1x of that).

Three S3 repositories, all unencrypted with the default 4 MiB chunks (so the sync sends
chunks as stored, as between repositories that share their keys):
- `create`: emptied before every run, then `ferry backup create IMAGE` into it;
- `full`: emptied before every run, then `ferry backup sync SRC full` of the one backup of
  source id `full` that SRC holds;
- `next`: holds every earlier backup of source id `next` (synced while preparing); before
  every run 1% of a working copy's chunks change and a new backup of it goes into SRC
  (untimed), then `ferry backup sync --source-id next SRC next` copies only that backup.
Each copy is restored and compared with its image once (the first run's check).
"""

import contextlib
import json
import random
import subprocess

from harness import GiB, Case, Command, Goal, copy_keeping_allocation

from cases.backup import Where, change_chunks, ferry_init, run, settle, speed_goal

CASE = "backup-sync-s3-half-4g"
CREATE = "ferry backup create (empty S3 repository)"
FULL = "ferry backup sync (empty S3 repository)"
NEXT = "ferry backup sync (next backup, 1% changed)"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    where = Where(env, "s3")
    src = env.workdir / "backup-sync-src"
    work = env.workdir / f"{CASE}.img"
    restored = env.target(CASE)
    rng = random.Random(33)
    state = {}

    def backup(path, source_id):
        out = run([env.ferry, "backup", "create", "--no-progress", "--json", "--source-id",
                   source_id, path, src]).stdout
        return json.loads(out)["id"]

    def prepare():
        copy_keeping_allocation(image.path, work)
        subprocess.run(["rm", "-rf", str(src)], check=True)
        run([env.ferry, "backup", "init", src])
        state["full"] = backup(image.path, "full")
        state["next"] = backup(work, "next")
        ferry_init(env, where, "next")
        run([env.ferry, "backup", "sync", "--source-id", "next", src, where.ferry("next")])
        settle()

    @contextlib.contextmanager
    def context():
        try:
            with where.context(prepare):
                yield
        finally:
            for path in (work, restored):
                path.unlink(missing_ok=True)
            subprocess.run(["rm", "-rf", str(src)], check=True)

    def next_backup():
        change_chunks(work, image.size, rng)
        state["next"] = backup(work, "next")
        settle()

    def restores(repo, key, path):
        """A check: the backup state[key] (or the only one) of REPO restores to PATH's bytes."""
        def check(result):
            backup_id = state.get(key)
            if backup_id is None:
                listed = json.loads(run([env.ferry, "backup", "list", "--json",
                                         where.ferry(repo)]).stdout)
                backup_id = listed[-1]["id"]
            restored.unlink(missing_ok=True)
            run([env.ferry, "backup", "restore", "--no-progress", where.ferry(repo), backup_id,
                 restored])
            cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                                  str(path), str(restored)], capture_output=True, text=True)
            restored.unlink(missing_ok=True)
            return None if cmp.returncode == 0 else f"qemu-img compare: {cmp.stdout} {cmp.stderr}"
        return check

    commands = [
        Command(CREATE, [env.ferry, "backup", "create", "--no-progress", image.path,
                         where.ferry("create")],
                setup=lambda: ferry_init(env, where, "create"),
                cleanup=lambda: where.reset("create"),
                check=restores("create", None, image.path),
                note="8 workers, 4 MiB chunks, zstd level 1; init untimed"),
        Command(FULL, [env.ferry, "backup", "sync", "--source-id", "full", src,
                       where.ferry("full")],
                ferry=True, setup=lambda: ferry_init(env, where, "full"),
                cleanup=lambda: where.reset("full"),
                check=restores("full", "full", image.path),
                note="from a directory repository; chunks sent as stored, each checked"),
        Command(NEXT, [env.ferry, "backup", "sync", "--source-id", "next", src,
                       where.ferry("next")],
                setup=next_backup, check=restores("next", "next", work),
                note="the new backup of a working copy with 1% of its chunks changed (untimed)"),
    ]

    def next_goal(results):
        rows = results[CASE]
        a, b = rows.get(NEXT), rows.get(CREATE)
        if not a or not a.runs or not b or not b.runs:
            return None, "not measured"
        x = a.median / b.median
        return x <= 0.1, f"{x:.3f}x"

    return [Case(
        name=CASE,
        title="Replication: `ferry backup sync` from a directory repository into S3 (s3s-fs) "
              "against a fresh backup into it, 4 GiB, 50% data",
        commands=commands,
        context=context,
        goals=[speed_goal(CASE, FULL, CREATE, 1.1),
               Goal(f"`{NEXT}` <= 0.1x `{CREATE}`", next_goal)],
        notes=["each run of the first two starts from an empty S3 repository (init untimed)"],
    )]
