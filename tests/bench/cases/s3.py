"""S3 upload and download: ferry against rclone and `aws s3 cp`, against one local S3 server.

The server is the standalone s3s-fs (`cargo install s3s-fs@0.14.1 --locked --features binary`,
the same server the tests embed), on 127.0.0.1 with signature checking, storing objects under
the bench directory. Every tool gets the same endpoint and credentials from the environment
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...; rclone through RCLONE_CONFIG_BENCH_*), the same
part size (16 MiB) and the same concurrency (8: ferry's default workers, rclone's
--s3-upload-concurrency / --multi-thread-streams, awscli's max_concurrent_requests).
The download source is uploaded once by ferry before the timed runs.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from harness import GiB, MiB, Case, Command, Goal, peer, ratio, which

BUCKET = "bench"
ACCESS_KEY = "ferry-bench-access-key"
SECRET_KEY = "ferry-bench-secret-key"
CONCURRENCY = 8
PART = 16 * MiB
S3S_FS_INSTALL = "cargo install s3s-fs@0.14.1 --locked --features binary"
RCLONE_INSTALL = "apt-get install -y rclone"
AWS_INSTALL = "pip install awscli"
# ferry's part buffers: one per worker plus one (services/endpoints/src/s3/target.rs).
RSS_LIMIT_MIB = 64 + CONCURRENCY * PART // MiB


def s3s_fs():
    found = which("s3s-fs") or str(Path.home() / ".cargo" / "bin" / "s3s-fs")
    return found if Path(found).exists() else None


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    server = Server(env.workdir / "s3-root")
    up, down = "s3-upload-half-4g", "s3-download-half-4g"
    title = "4 GiB, 50% data in scattered 1 MiB runs"
    notes = [
        f"server: s3s-fs 0.14.1 on loopback, objects on the bench directory's disk; "
        f"part size {PART // MiB} MiB and concurrency {CONCURRENCY} for every tool",
        "ferry uploads zero parts from one shared zero buffer and writes holes when downloading "
        "to a file; the peers read and write every byte",
    ]
    if s3s_fs() is None:
        notes.append(f"s3s-fs is not installed: `{S3S_FS_INSTALL}`")
    return [
        Case(name=up, title=f"Upload file to S3: {title}", commands=upload_commands(env, image, server),
             context=server.context, notes=notes, goals=goals(up, "upload")),
        Case(name=down, title=f"Download S3 to file: {title}",
             commands=download_commands(env, image, server),
             context=lambda: server.context(upload_source=(env, image)), notes=notes,
             goals=goals(down, "download")),
    ]


class Server:
    """s3s-fs on a free loopback port, with the environment every tool reads."""

    def __init__(self, root: Path):
        self.root = root
        self.port = None

    def object_path(self, key):
        return self.root / BUCKET / key

    @contextlib.contextmanager
    def context(self, upload_source=None):
        binary = s3s_fs()
        if binary is None:
            raise RuntimeError(f"s3s-fs is not installed: {S3S_FS_INSTALL}")
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / BUCKET).mkdir(parents=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        proc = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(self.port),
                                 "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, str(self.root)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        saved = dict(os.environ)
        config = self.root.parent / "s3-bench-aws-config"
        config.write_text("[default]\nregion = us-east-1\ns3 =\n"
                          f"  max_concurrent_requests = {CONCURRENCY}\n"
                          f"  multipart_chunksize = {PART // MiB}MB\n"
                          f"  multipart_threshold = {PART // MiB}MB\n")
        endpoint = f"http://127.0.0.1:{self.port}"
        (self.root.parent / "s3-bench-rclone.conf").write_text("")  # the remote is in RCLONE_CONFIG_BENCH_*
        # The endpoint is plain HTTP on loopback: a CA bundle set for the machine is of no
        # use, and rclone 1.60 refuses to start with AWS_CA_BUNDLE set ("unable to load
        # custom CA bundle, HTTPClient's transport unsupported type").
        os.environ.pop("AWS_CA_BUNDLE", None)
        os.environ.update({
            "RCLONE_CONFIG": str(self.root.parent / "s3-bench-rclone.conf"),
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(config),
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
            "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": ACCESS_KEY,
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET_KEY,
            "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
            "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
        })
        try:
            deadline = time.time() + 10
            while True:
                try:
                    urllib.request.urlopen(endpoint, timeout=1)
                    break
                except urllib.error.HTTPError:
                    break  # an S3 error answer: the server is up
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise RuntimeError("s3s-fs did not start")
                    time.sleep(0.1)
            if upload_source is not None:
                env, image = upload_source
                env.log("uploading the download source with ferry")
                subprocess.run([str(env.ferry), "copy", str(image.path), f"s3://{BUCKET}/source.img"],
                               check=True, capture_output=True)
            yield self
        finally:
            os.environ.clear()
            os.environ.update(saved)
            proc.terminate()
            proc.wait(timeout=10)
            shutil.rmtree(self.root, ignore_errors=True)


def compare(a, b):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", str(a), str(b)],
                         capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare {a} {b}: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


def upload_commands(env, image, server):
    def cmd(label, key, argv, **kw):
        path = lambda: server.object_path(key)  # noqa: E731

        def remove():
            if path().exists():
                path().unlink()

        kw.update(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, path()))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    return [
        cmd("ferry copy", "ferry.img", [env.ferry, "copy", image.path, f"s3://{BUCKET}/ferry.img"],
            ferry=True, note=f"{CONCURRENCY} workers, {PART // MiB} MiB parts"),
        # --s3-upload-cutoff: multipart above one part, as ferry and awscli do (rclone's
        # default is 200M); --s3-disable-checksum: no MD5 pass over the whole file before
        # the upload (ferry and awscli make none either).
        cmd(f"rclone copyto --s3-upload-concurrency {CONCURRENCY}", "rclone.img",
            ["rclone", "copyto", "--s3-upload-concurrency", str(CONCURRENCY),
             "--s3-chunk-size", f"{PART // MiB}M", "--s3-upload-cutoff", f"{PART // MiB}M",
             "--s3-disable-checksum", image.path, f"bench:{BUCKET}/rclone.img"],
            install=RCLONE_INSTALL,
            note=f"{PART // MiB} MiB chunks, MD5 of the whole file skipped"),
        cmd("aws s3 cp", "aws.img",
            ["aws", "s3", "cp", "--only-show-errors", image.path, f"s3://{BUCKET}/aws.img"],
            install=AWS_INSTALL,
            note=f"max_concurrent_requests {CONCURRENCY}, {PART // MiB} MB chunks"),
    ]


def download_commands(env, image, server):
    def cmd(label, name, argv, **kw):
        target = env.target(f"s3-download-{name}")

        def remove():
            if target.exists():
                target.unlink()

        argv = [a if a != "TARGET" else target for a in argv]
        kw.update(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    src = f"s3://{BUCKET}/source.img"
    rclone = ["rclone", "copyto", "--multi-thread-streams", str(CONCURRENCY),
              "--multi-thread-cutoff", f"{PART // MiB}M", f"bench:{BUCKET}/source.img", "TARGET"]
    aws = ["aws", "s3", "cp", "--only-show-errors", src, "TARGET"]
    rclone_label = f"rclone copyto --multi-thread-streams {CONCURRENCY}"
    aws_note = f"max_concurrent_requests {CONCURRENCY}, {PART // MiB} MB chunks"
    # ferry fsyncs the file it wrote; the peers never do, so each also runs followed by
    # `sync FILE` (the like-for-like rows).
    synced = lambda argv: ["sh", "-c", 'file="$1"; shift; "$@" && sync "$file"',  # noqa: E731
                           "sh", "TARGET", *argv]
    return [
        cmd("ferry copy", "ferry", [env.ferry, "copy", src, "TARGET"], ferry=True,
            note=f"{CONCURRENCY} workers; fsyncs the file at the end"),
        cmd(rclone_label, "rclone", rclone, install=RCLONE_INSTALL, note="never flushes"),
        cmd(f"{rclone_label} && sync FILE", "rclone", synced(rclone), tool="rclone",
            install=RCLONE_INSTALL),
        cmd("aws s3 cp", "aws", aws, install=AWS_INSTALL, note=f"{aws_note}; never flushes"),
        cmd("aws s3 cp && sync FILE", "aws", synced(aws), tool="aws", install=AWS_INSTALL,
            note=aws_note),
    ]


def goals(case_name, direction):
    # The upload's goal is issue 16's: 0.8x the best peer; the download's, parity.
    most = 0.8 if direction == "upload" else 1.0

    def best_peer(flushing):
        def judge(results):
            rows = results[case_name]
            peers = [s for s in rows.values() if not s.ferry and s.runs
                     and (direction == "upload" or ("sync FILE" in s.label) == flushing)]
            if not peers:
                return None, "no peer ran"
            best = min(peers, key=lambda s: s.median)
            x = ratio(results, case_name, "ferry copy", best.label)
            return x <= most, f"{x:.2f}x {best.label}"
        return judge

    def rss(results):
        mib = results[case_name]["ferry copy"].peak_rss_mib
        return mib <= RSS_LIMIT_MIB, f"{mib:.0f} MiB"

    found = [Goal(f"S3 {direction} <= {most}x the best peer"
                  + (" (peers followed by sync FILE, like ferry's fsync)"
                     if direction == "download" else ""), best_peer(True))]
    if direction == "download":
        found.append(Goal("S3 download at least as fast as the best peer without a flush",
                          best_peer(False)))
    found.append(Goal(f"S3 {direction} peak RSS <= 64 MiB + workers x part size "
                      f"({RSS_LIMIT_MIB} MiB) in every timed run", rss))
    return found
