"""HTTP import: ferry reading an image from nginx into a file, against the peers users
would otherwise script: `nbdkit curl` (with its readahead filter, as CDI imports) under
`qemu-img convert -m 8 -W`, and `curl -o` followed by `cp --sparse=always` (download, then
make the file sparse).

nginx serves the bench image on loopback (`master_process off`, everything under the bench
directory), with `LIMIT_RATE` per connection when set in the environment (for example
`FERRY_BENCH_HTTP_LIMIT_RATE=200m`) to look like a remote server.
"""

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from harness import GiB, Case, Command, Goal, peer, ratio

NGINX_INSTALL = "apt-get install -y nginx"
NBDKIT_INSTALL = "apt-get install -y nbdkit qemu-utils"
CURL_INSTALL = "apt-get install -y curl"


def cases(env):
    image = env.image("half-4g", "half", env.size(4 * GiB))
    server = Server(env.workdir / "http-root", image.path)
    name = "http-import-half-4g"
    notes = [
        "server: nginx on loopback (sendfile), the image in the page cache; ferry reads 8 MiB "
        "ranged GETs with 8 workers and writes holes for zero blocks",
        "nbdkit curl + qemu-img convert -m 8 -W -t writeback: CDI's import path (CDI runs "
        "qemu-img convert -t writeback, which flushes the target at the end, as ferry does); "
        "curl -o + cp --sparse=always: a download and a second pass to make the file sparse "
        "(no flush)",
    ]
    limit = os.environ.get("FERRY_BENCH_HTTP_LIMIT_RATE")
    if limit:
        notes.append(f"nginx limit_rate {limit} per connection")
    return [Case(name=name, title="HTTP import to file: 4 GiB, 50% data in scattered 1 MiB runs",
                 commands=commands(env, image, server), context=server.context, notes=notes,
                 goals=goals(name))]


class Server:
    """nginx on a free loopback port serving one image."""

    def __init__(self, root: Path, image: Path, limit_rate=None, access_log=False):
        self.root = root
        self.image = image
        self.port = None
        # Log the body bytes of every request to ROOT/access.log (see body_bytes_sent)
        self.access_log = access_log
        # nginx's limit_rate (per connection); default FERRY_BENCH_HTTP_LIMIT_RATE, if set
        self.limit_rate = limit_rate or os.environ.get("FERRY_BENCH_HTTP_LIMIT_RATE")

    def url(self):
        return f"http://127.0.0.1:{self.port}/image.img"

    def log_path(self):
        return self.root / "access.log"

    def reset_log(self):
        """Empties the access log (nginx appends, so the next request starts it again)."""
        if self.log_path().exists():
            os.truncate(self.log_path(), 0)

    def body_bytes_sent(self):
        """The body bytes nginx sent since the last reset_log, and the requests."""
        lines = self.log_path().read_text().splitlines()
        return sum(int(line.split()[0]) for line in lines), len(lines)

    @contextlib.contextmanager
    def context(self):
        nginx = shutil.which("nginx")
        if nginx is None:
            raise RuntimeError(f"nginx is not installed: {NGINX_INSTALL}")
        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "www").mkdir(parents=True)
        (self.root / "tmp").mkdir()
        os.link(self.image, self.root / "www" / "image.img")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        limit = self.limit_rate
        conf = self.root / "nginx.conf"
        r = self.root
        conf.write_text(f"""
master_process off;
pid {r}/nginx.pid;
error_log {r}/error.log warn;
events {{ worker_connections 512; }}
http {{
    {f"log_format sent '$body_bytes_sent $status $request'; access_log {r}/access.log sent;"
      if self.access_log else "access_log off;"}
    client_body_temp_path {r}/tmp/body; proxy_temp_path {r}/tmp/proxy;
    fastcgi_temp_path {r}/tmp/fastcgi; uwsgi_temp_path {r}/tmp/uwsgi; scgi_temp_path {r}/tmp/scgi;
    sendfile on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{self.port};
        root {r}/www;
        {f"limit_rate {limit};" if limit else ""}
    }}
}}
""")
        proc = subprocess.Popen([nginx, "-c", str(conf), "-p", str(r), "-g", "daemon off;"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 10
            while True:
                try:
                    urllib.request.urlopen(urllib.request.Request(self.url(), method="HEAD"), timeout=1)
                    break
                except OSError:
                    if time.time() > deadline or proc.poll() is not None:
                        raise RuntimeError("nginx did not start")
                    time.sleep(0.1)
            yield self
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            shutil.rmtree(self.root, ignore_errors=True)


def compare(a, b):
    cmp = subprocess.run(["qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", str(a), str(b)],
                         capture_output=True, text=True)
    if cmp.returncode != 0:
        return f"qemu-img compare {a} {b}: {cmp.stdout.strip()} {cmp.stderr.strip()}"
    return None


def has_curl_plugin():
    if shutil.which("nbdkit") is None:
        return False
    out = subprocess.run(["nbdkit", "curl", "--version"], capture_output=True, text=True)
    return out.returncode == 0


def commands(env, image, server):
    def cmd(label, name, argv, **kw):
        target = env.target(f"http-import-{name}")
        tmp = env.target(f"http-import-{name}.download")

        def remove():
            for p in (target, tmp):
                if p.exists():
                    p.unlink()

        values = {"TARGET": lambda: target, "TMP": lambda: tmp, "URL": server.url}
        kw.update(setup=remove, cleanup=remove, check=lambda _r: compare(image.path, target))
        argv = LateArgv(argv, values)
        return peer(label, argv, **kw) if "install" in kw else Command(label, argv, **kw)

    nbdkit = ["sh", "-c",
              'nbdkit -U - --filter=readahead --filter=retry curl url="$1" '
              # CDI's command: -t writeback, so the target is flushed at the end, as ferry's is.
              '--run "qemu-img convert -m 8 -W -t writeback -f raw -O raw \\$nbd $2"',
              "sh", "URL", "TARGET"]
    curl_cp = ["sh", "-c", 'curl -sSf -o "$2" "$1" && cp --sparse=always "$2" "$3"',
               "sh", "URL", "TMP", "TARGET"]
    return [
        cmd("ferry copy", "ferry", [env.ferry, "copy", "URL", "TARGET"], ferry=True,
            note="8 workers, 8 MiB ranged GETs"),
        cmd("nbdkit curl + qemu-img convert -m 8 -W -t writeback", "nbdkit", nbdkit, install=NBDKIT_INSTALL,
            available=has_curl_plugin() and bool(shutil.which("qemu-img"))),
        cmd("curl -o + cp --sparse=always", "curl", curl_cp, install=CURL_INSTALL, tool="curl"),
    ]


class LateArgv(list):
    """A command line whose placeholders (URL, TARGET, TMP) are filled in when it runs: the
    server's port is chosen when the case's context starts, after the commands are built."""

    def __init__(self, argv, values):
        super().__init__(argv)
        self._values = values

    def __iter__(self):
        return (self._values[a]() if isinstance(a, str) and a in self._values else a
                for a in super().__iter__())


def goals(case_name):
    def against(label, most):
        def judge(results):
            x = ratio(results, case_name, "ferry copy", label)
            return x <= most, f"{x:.2f}x"
        return Goal(f"HTTP import <= {most}x {label}", judge)

    return [against("nbdkit curl + qemu-img convert -m 8 -W -t writeback", 0.8),
            against("curl -o + cp --sparse=always", 1.0)]
