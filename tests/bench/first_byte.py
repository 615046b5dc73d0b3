#!/usr/bin/env python3
"""Runs a copy until its first byte reaches the target, then stops it: the command's wall
time is the copy's time to first byte.

    first_byte.py TARGET -- COMMAND...

Polls TARGET's allocated blocks every millisecond (the target starts absent or empty and
sparse, so the first block allocated is the first byte written); then stops COMMAND
(SIGTERM, which `ferry copy` and ferry-mover-job answer by stopping at once) and exits 0.
Exits 1 if COMMAND ends before writing anything.
"""

import os
import subprocess
import sys
import time


def allocated(path: str) -> int:
    try:
        return os.stat(path).st_blocks
    except FileNotFoundError:
        return 0


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    target, command = sys.argv[1], sys.argv[3:]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    try:
        while allocated(target) == 0:
            if proc.poll() is not None:
                print(f"{command[0]} ended ({proc.returncode}) before writing to {target}",
                      file=sys.stderr)
                return 1
            time.sleep(0.001)
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
