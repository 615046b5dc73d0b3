"""Checksums: ferry's block hash and plain SHA-256 against sha256sum, and blksum when it is
on PATH, with the hashing limit as a computed reference row.

For images with data the limit is the image's data (its 4 KiB blocks holding non-zero bytes:
what must be hashed) divided by twice the single-core SHA-256 rate measured here, on 64 KiB
blocks as the block hash uses, by Python's hashlib (OpenSSL) and `openssl speed` when present;
the faster rate counts, so the limit is the strictest of the two. For the empty 1 TiB image
nothing is read and the only work is the outer hash over one 32-byte digest per 64 KiB block,
in order: one core hashing `size / 64 KiB x 32` bytes. That image is too large for the
SHA-256 rows (sha256sum would read 1 TiB of zeroes), so it has the block hash rows only.
"""

import functools
import hashlib
import os
import re
import subprocess
import time

from harness import GiB, MiB, Case, Command, Goal, Reference, ratio, which

IMAGES = [
    ("half-4g", "half", 4 * GiB, "4 GiB, 50% data in scattered 1 MiB runs"),
    ("empty-4g", "empty", 4 * GiB, "4 GiB, empty"),
    ("random-1g", "random", 1 * GiB, "1 GiB, random data"),
    ("empty-1t", "empty", 1024 * GiB, "1 TiB, empty"),
]
BLOCK = 64 * 1024
DIGEST = 32


def cases(env):
    rate, how = sha256_rate()
    found = []
    for name, pattern, size, title in IMAGES:
        image = env.image(name, pattern, env.size(size))
        case_name = f"checksum-{name}"
        reference = ReferenceDigests(image.path)
        commands = []
        blksum = which("blksum")
        commands.append(Command(
            "ferry checksum", [env.ferry, "checksum", image.path], ferry=True,
            note="blkhash",
            check=reference.check("blksum") if blksum else None))
        if pattern != "empty" or size <= 4 * GiB:
            commands.append(Command(
                "ferry checksum --algorithm sha256",
                [env.ferry, "checksum", "--algorithm", "sha256", image.path],
                check=reference.check("sha256sum")))
            commands.append(Command("sha256sum", ["sha256sum", image.path]))
        if blksum:
            commands.append(Command("blksum", ["blksum", image.path]))
        if image.data_bytes:
            limit = image.data_bytes / (2 * rate)
            reference_row = Reference("two-core SHA-256 limit", limit,
                                      note=f"{image.data_bytes / GiB:.2f} GiB of data blocks")
        else:
            outer = image.size // BLOCK * DIGEST
            limit = outer / rate
            reference_row = Reference("one-core outer-hash limit", limit,
                                      note=f"SHA-256 of {outer / (1 << 20):.0f} MiB of block digests")
        found.append(Case(
            name=case_name,
            title=f"Checksum: {title}",
            commands=commands,
            references=[reference_row],
            goals=goals(name, case_name, limit, blksum),
            notes=[f"single-core SHA-256 rate: {rate / 1e9:.2f} GB/s ({how})"]
                  + ([] if blksum else ["blksum is not on PATH: its row is missing"]),
        ))
    return found


def goals(image_name, case_name, limit, blksum):
    def vs(label, most, judged="ferry checksum"):
        def judge(results):
            if label not in results[case_name]:
                return None, f"no {label} row"
            x = ratio(results, case_name, judged, label)
            return x <= most, f"{x:.2f}x"
        return judge

    def vs_limit_at_most(most):
        def judge(results):
            x = results[case_name]["ferry checksum"].median / limit
            return x <= most, f"{x:.2f}x the limit ({limit:.3f} s)"
        return judge

    if image_name == "empty-1t":
        return [Goal("blkhash checksum of the empty 1 TiB image within 1.2x of the one-core "
                     "outer-hash limit", vs_limit_at_most(1.2))]
    if image_name != "half-4g":
        return []

    def vs_sha256sum(results):
        x = ratio(results, case_name, "sha256sum", "ferry checksum")
        return x >= 8, f"{x:.1f}x faster"

    found = [Goal("blkhash checksum of the 50%-data image >= 8x faster than sha256sum",
                  vs_sha256sum),
             Goal("blkhash checksum of the 50%-data image within 1.5x of the two-core SHA-256 "
                  "limit", vs_limit_at_most(1.5))]
    if blksum:
        found.append(Goal("blkhash checksum of the 50%-data image <= 0.5x blksum",
                          vs("blksum", 0.5)))
    return found


class ReferenceDigests:
    """The digests peers print for one image, computed once, to check ferry's against."""

    def __init__(self, path):
        self.path = path
        self.digests = {}

    def digest(self, tool):
        if tool not in self.digests:
            out = subprocess.run([tool, str(self.path)], capture_output=True, text=True,
                                 check=True).stdout
            self.digests[tool] = out.split()[0]
        return self.digests[tool]

    def check(self, tool):
        """A Command check: the command's digest equals `tool`'s."""
        def check(result):
            got = result.stdout.split()[0]
            want = self.digest(tool)
            return None if got == want else f"digest {got} != {tool}'s {want}"
        return check


@functools.lru_cache(maxsize=1)
def sha256_rate():
    """The fastest single-core SHA-256 rate (bytes/s) measured here, and how."""
    buf = memoryview(os.urandom(64 * MiB))
    hashes = [hashlib.sha256(buf[:BLOCK]).digest()]  # warm up
    rounds = 16  # 1 GiB
    start = time.perf_counter()
    for _ in range(rounds):
        for off in range(0, len(buf), BLOCK):
            hashes.append(hashlib.sha256(buf[off:off + BLOCK]).digest())
    py_rate = rounds * len(buf) / (time.perf_counter() - start)
    rates = [(py_rate, f"hashlib over 1 GiB in 64 KiB blocks: {py_rate / 1e9:.2f} GB/s")]
    if which("openssl"):
        out = subprocess.run(["openssl", "speed", "-evp", "sha256", "-bytes", str(BLOCK),
                              "-seconds", "3"], capture_output=True, text=True).stdout
        m = re.search(r"^sha256\s+([\d.]+)k", out, re.M)
        if m:
            ssl_rate = float(m.group(1)) * 1000
            rates.append((ssl_rate, f"openssl speed -evp sha256: {ssl_rate / 1e9:.2f} GB/s"))
    best = max(r for r, _ in rates)
    return best, "; ".join(how for _, how in rates)
