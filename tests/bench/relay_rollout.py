#!/usr/bin/env python3
"""A relayed rollout, as the bench measures it: one seed `ferry copy URL DST...
--relay-listen` reads the origin and serves what it wrote over NBD while GROUPS-1
downstream `ferry copy nbd://... DST...` processes read from it, all started together
(the downstream ones as soon as the seed listens). Exits 0 when every copy did.

    relay_rollout.py FERRY URL PORT GROUPS TARGET...   (TARGETs split evenly into GROUPS)
"""

import subprocess
import sys
import time


def main():
    ferry, url, port, groups, *targets = sys.argv[1:]
    groups = int(groups)
    per = len(targets) // groups
    split = [targets[i * per:(i + 1) * per] for i in range(groups)]
    seed = subprocess.Popen(
        [ferry, "copy", url, *split[0], "--relay-listen", f"127.0.0.1:{port}",
         "--relay-name", "golden", "--relay-linger", "120"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    uri = None
    lines = []
    deadline = time.time() + 120
    while uri is None:
        line = seed.stderr.readline()
        if not line:
            print("".join(lines), file=sys.stderr)
            sys.exit(f"the seed ended before it listened (exit {seed.wait()})")
        lines.append(line)
        if line.startswith("ferry: relaying ") and " at " in line:
            uri = line.split(" at ")[1].split()[0]
        if time.time() > deadline:
            seed.kill()
            sys.exit("the seed named no relay URI within 120 s")
    downstream = [subprocess.Popen([ferry, "copy", "--source-format", "raw", uri, *group], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
                  for group in split[1:]]
    failed = False
    for i, p in enumerate(downstream):
        _, err = p.communicate()
        if p.returncode != 0:
            print(f"downstream {i} exited {p.returncode}: {err}", file=sys.stderr)
            failed = True
    rest = seed.stderr.read()
    if seed.wait() != 0:
        print(f"the seed exited {seed.returncode}: {''.join(lines)}{rest}", file=sys.stderr)
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
