"""containerDisk import from a local registry into a raw file: `ferry copy docker://...`
against CDI's registry import path (`skopeo copy` of the image to a directory, the disk
extracted from its layer with tar, then `qemu-img convert -m 8 -W -t writeback`).

The disk is the 4 GiB half-data image as a qcow2 (`qemu-img convert -O qcow2`, written in
order as containerDisks are: not `-W`, whose out-of-order writes put data before the L2
tables that map it; made once and reused while newer than the image), built into a
containerDisk with buildah (`FROM scratch`, `ADD disk.qcow2 /disk/`) and pushed twice, with
a gzip and with a zstd layer, to Debian's docker-registry on loopback (plain HTTP, no auth:
ferry gets FERRY_REGISTRY_INSECURE=1, skopeo --src-tls-verify=false). Each push gets an
empty blob-info cache of its own (otherwise the zstd push reuses the gzip layer already in
the registry and the zstd tag names a gzip layer), and the pushed manifest's layer type is
checked. The registry's storage stays in the bench directory between runs; the buildah
storage is removed once the images are pushed. Both sides flush the target; both targets
are compared with the raw image by qemu-img.
"""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

from harness import GiB, Case, Command, Goal, peer, ratio, which

from .http import LateArgv

COMPRESSIONS = ["gzip", "zstd"]
PEER = "skopeo copy + tar -x + qemu-img convert -m 8 -W -t writeback"
INSTALL = "apt-get install -y docker-registry buildah skopeo qemu-utils"
REPO = "bench/disk"
MOST = 0.6  # ferry's time at most this ratio of the peer's
RSS_MIB = 256  # ferry's peak RSS at most this


def qcow2_of(env, image):
    """The image as a qcow2 written in order (no -W), made once and reused while newer than
    the image."""
    path = env.workdir / f"{image.path.stem}.containerdisk.qcow2"
    if env.dry:
        return path
    if not path.exists() or path.stat().st_mtime < image.path.stat().st_mtime:
        env.log(f"making {path}")
        tmp = path.with_name(path.name + ".part")
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2",
                        str(image.path), str(tmp)], check=True)
        os.replace(tmp, path)
    return path


class Registry:
    """docker-registry on a free loopback port (plain HTTP) holding the containerDisk as
    REPO:gzip and REPO:zstd."""

    def __init__(self, env, qcow2):
        self.env = env
        self.qcow2 = qcow2
        self.root = env.workdir / "registry-bench"
        self.port = None

    def host(self):
        return f"127.0.0.1:{self.port}"

    def url(self, compression):
        return f"docker://{self.host()}/{REPO}:{compression}"

    @contextlib.contextmanager
    def context(self, compression):
        for tool, package in (("docker-registry", "docker-registry"), ("buildah", "buildah"),
                              ("skopeo", "skopeo")):
            if which(tool) is None:
                raise RuntimeError(f"{tool} is not installed: apt-get install -y {package}")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = self.root / "config.yml"
        conf.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {self.root / 'data'}\nhttp:\n  addr: {self.host()}\n")
        log = open(self.root / "registry.log", "wb")
        proc = subprocess.Popen(["docker-registry", "serve", str(conf)],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    urllib.request.urlopen(f"http://{self.host()}/v2/", timeout=1)
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise RuntimeError("docker-registry did not start")
                    time.sleep(0.1)
            self.push_image(compression)
            yield self
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()

    def push_image(self, compression):
        """Builds and pushes the containerDisk with a COMPRESSION layer unless the registry
        holds it already (a stamp file per compression, newer than the qcow2). Only the
        case being run pushes its image: each holds another copy of the disk."""
        stamps = {compression: self.root / f"pushed-{compression}"}
        todo = [c for c, st in stamps.items()
                if not st.exists() or st.stat().st_mtime < self.qcow2.stat().st_mtime]
        if not todo:
            return
        store = self.root / "buildah"
        ctx = self.root / "ctx"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir()
        os.link(self.qcow2, ctx / "disk.qcow2")
        (ctx / "Containerfile").write_text("FROM scratch\nADD disk.qcow2 /disk/\n")
        base = ["buildah", "--root", str(store), "--runroot", str(store / "run"),
                "--storage-driver", "vfs"]
        try:
            self.env.log("building the containerDisk with buildah")
            subprocess.run([*base, "bud", "--isolation", "chroot", "-q", "-t", "bench-disk",
                            str(ctx)], check=True, capture_output=True)
            for c in todo:
                self.env.log(f"pushing it with a {c} layer")
                subprocess.run(fresh_blob_cache([*base, "push", "--tls-verify=false",
                                                 "--compression-format", c, "bench-disk",
                                                 f"docker://{self.host()}/{REPO}:{c}"]),
                               check=True, capture_output=True)
                self.check_layer(c)
                stamps[c].write_text("")
        finally:
            shutil.rmtree(store, ignore_errors=True)
            shutil.rmtree(ctx, ignore_errors=True)


    def check_layer(self, compression):
        """Raises unless REPO:COMPRESSION's manifest names one layer of that compression."""
        req = urllib.request.Request(
            f"http://{self.host()}/v2/{REPO}/manifests/{compression}",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                               "application/vnd.docker.distribution.manifest.v2+json"})
        with urllib.request.urlopen(req, timeout=10) as reply:
            layers = json.load(reply).get("layers", [])
        types = [layer.get("mediaType", "") for layer in layers]
        if len(types) != 1 or not types[0].endswith(compression):
            raise RuntimeError(f"{REPO}:{compression} was pushed with layers {types}, "
                               f"not one {compression} layer")


def fresh_blob_cache(argv):
    """ARGV run with an empty blob-info cache of its own. buildah 1.28 has no
    --force-compression: with the shared cache, a push in another compression reuses the
    layer the registry already holds. Root's cache is /var/lib/containers/cache (hidden here
    by a tmpfs in a private mount namespace); other users' is under XDG_DATA_HOME."""
    if os.geteuid() == 0:
        if which("unshare") is None:
            raise RuntimeError("unshare is not installed: apt-get install -y util-linux")
        cache = "/var/lib/containers/cache"
        return ["unshare", "-m", "sh", "-c",
                f'mkdir -p {cache} && mount -t tmpfs ferry-bench {cache} && exec "$@"',
                "sh", *argv]
    return ["env", f"XDG_DATA_HOME={tempfile.mkdtemp(prefix='ferry-bench-xdg-')}", *argv]


def compare(image, target):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw",
                          str(image), str(target)], capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


# CDI's path: the image into a directory, the disk out of the (largest) layer, then
# qemu-img; the scratch files are removed after each run, untimed.
CDI = ('skopeo copy -q --src-tls-verify=false "$1" "dir:$2" && mkdir "$3" '
       '&& tar -xf "$2/$(ls -S "$2" | head -n 1)" -C "$3" '
       '&& qemu-img convert -m 8 -W -t writeback -f qcow2 -O raw "$3"/disk/disk.qcow2 "$4"')


def cases(env):
    if not which("qemu-img") and not env.dry:
        raise RuntimeError("qemu-img is not installed: apt-get install -y qemu-utils")
    image = env.image("half-4g", "half", env.size(4 * GiB))
    qcow2 = qcow2_of(env, image)
    registry = Registry(env, qcow2)
    found = []
    for c in COMPRESSIONS:
        case_name = f"registry-{c}-qcow2-to-raw-half-4g"
        target = env.target(case_name)
        skopeo_dir = env.workdir / f"{case_name}.skopeo"
        extracted = env.workdir / f"{case_name}.extracted"

        def remove(target=target, skopeo_dir=skopeo_dir, extracted=extracted):
            if not env.keep_targets and target.exists():
                target.unlink()
            shutil.rmtree(skopeo_dir, ignore_errors=True)
            shutil.rmtree(extracted, ignore_errors=True)

        def check(_result, target=target):
            return compare(image.path, target)

        values = {"URL": lambda c=c: registry.url(c), "TARGET": lambda t=target: t,
                  "DIR": lambda d=skopeo_dir: d, "EX": lambda e=extracted: e}
        ferry = LateArgv(["env", "FERRY_REGISTRY_INSECURE=1", env.ferry, "copy", "URL",
                          "TARGET"], values)
        cdi = LateArgv(["sh", "-c", CDI, "sh", "URL", "DIR", "EX", "TARGET"], values)
        found.append(Case(
            name=case_name,
            title=f"containerDisk from a local registry to a raw file: the 4 GiB half-data "
                  f"image as a qcow2 in a {c} layer; target flushed by both",
            commands=[
                Command("ferry copy", ferry, ferry=True, setup=remove, cleanup=remove,
                        check=check, note="the layer streamed, decompressed and read as qcow2"),
                peer(PEER, cdi, INSTALL, tool="skopeo", setup=remove, cleanup=remove,
                     check=check, note="CDI's registry import"),
            ],
            context=lambda c=c: registry.context(c),
            notes=[f"docker-registry {REPO}:{c} on loopback (plain HTTP); the qcow2 is "
                   f"`qemu-img convert -O qcow2` of the raw image, pushed by buildah"],
            goals=[_time_goal(c, case_name), _rss_goal(c, case_name)],
        ))
    return found


def _time_goal(c, case_name):
    def judge(results):
        x = ratio(results, case_name, "ferry copy", PEER)
        return x <= MOST, f"{x:.2f}x"
    return Goal(f"registry {c} containerDisk to raw <= {MOST}x {PEER}", judge)


def _rss_goal(c, case_name):
    def judge(results):
        st = results[case_name]["ferry copy"]
        if not st.runs:
            raise KeyError("no runs of ferry copy")
        return st.peak_rss_mib <= RSS_MIB, f"{st.peak_rss_mib:.0f} MiB"
    return Goal(f"registry {c} containerDisk: ferry peak RSS <= {RSS_MIB} MiB", judge)
