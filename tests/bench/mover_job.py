#!/usr/bin/env python3
"""Runs one copy the way a ferry mover pod does, for the mover-overhead benchmark.

    mover_job.py FERRY SRC DST [DST...]

Starts `ferry serve` as the operator's mover pod runs it (a fresh data directory, a bearer
token, file endpoints confined to the image's directory, metrics off), waits until it
accepts connections, starts the transfer (one job; several DSTs are one fan-out) with
`ferry job start --watch` as the operator does over gRPC, and stops the service (SIGTERM) when the job has ended. Everything a mover
adds to a copy is inside the measured time: the service's start, the job's admission and
scheduling, the progress stream and the shutdown. Exit status: 0 only if the job succeeded.
SIGTERM (from first_byte.py) kills the service at once and removes its state.
"""

import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, serve: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if serve.poll() is not None:
            sys.exit(f"ferry serve exited {serve.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.002)
    sys.exit(f"ferry serve did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def main() -> int:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    ferry, src = sys.argv[1], Path(sys.argv[2]).resolve()
    dsts = [Path(d).resolve() for d in sys.argv[3:]]
    roots = sorted({str(src.parent), *(str(d.parent) for d in dsts)})
    with tempfile.TemporaryDirectory(prefix="ferry-mover-") as state:
        token = Path(state) / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        port = free_port()
        argv = [ferry, "serve", "--grpc-listen", f"127.0.0.1:{port}", "--metrics-listen", "off",
                "--data-dir", str(Path(state) / "data"), "--auth-token-file", str(token),
                "--log-filter", "warn"]
        for root in roots:
            argv += ["--allow-root", root]
        serve = subprocess.Popen(argv, stdout=subprocess.DEVNULL)

        def stop_now(_signum, _frame):
            serve.kill()
            serve.wait()
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, stop_now)
        try:
            wait_listening(port, serve)
            job = subprocess.run([ferry, "job", "--server", f"http://127.0.0.1:{port}",
                                  "--token-file", str(token), "start", "--watch",
                                  str(src), *(str(d) for d in dsts)],
                                 stdout=subprocess.DEVNULL)
        finally:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
    return job.returncode


if __name__ == "__main__":
    sys.exit(main())
