#!/usr/bin/env python3
"""Does a qcow2 read front to back need scratch space?

Reads the qcow2 headers of each file given and replays how ferry reads a qcow2 from a
stream (a compressed registry layer): the L1 table at open, then in guest order each L2
table when first needed and each data cluster. Prints, per file, whether those file
offsets only ever go forward, and the largest step back (ferry keeps 32 MiB behind the
stream; a larger step back fails the copy with a clear error).

usage: qcow2_order.py IMAGE.qcow2...
"""
import struct
import sys

LOOK_BEHIND = 32 << 20


def shape(path):
    with open(path, "rb") as f:
        h = f.read(104)
        magic, version = struct.unpack(">4sI", h[:8])
        assert magic == b"QFI\xfb", path
        cluster_bits, size = struct.unpack(">IQ", h[20:32])
        l1_size, l1_offset = struct.unpack(">IQ", h[36:48])
        cs = 1 << cluster_bits
        extended = version >= 3 and (struct.unpack(">Q", h[72:80])[0] & 16)
        entry = 16 if extended else 8
        f.seek(l1_offset)
        l1 = struct.unpack(f">{l1_size}Q", f.read(8 * l1_size))
        pos, back, accesses = l1_offset + 8 * l1_size, 0, 0
        for l2_entry in l1:
            l2_off = l2_entry & 0x00FFFFFFFFFFFE00
            if not l2_off:
                continue
            back = max(back, pos - l2_off)
            pos = max(pos, l2_off + cs)
            f.seek(l2_off)
            table = f.read(cs)
            for i in range(cs // entry):
                (e,) = struct.unpack(">Q", table[i * entry:i * entry + 8])
                if e & (1 << 62):  # compressed
                    off = e & ((1 << (62 - (cluster_bits - 8))) - 1)
                else:
                    off = e & 0x00FFFFFFFFFFFE00
                    if e & 1 or not off:
                        continue
                accesses += 1
                back = max(back, pos - off)
                pos = max(pos, off + 1)
        return back, accesses


def main():
    for path in sys.argv[1:]:
        back, n = shape(path)
        verdict = "in order" if back <= 0 else (
            f"steps back {back} bytes ({'within' if back <= LOOK_BEHIND else 'beyond'} 32 MiB)")
        print(f"{path}: {n} clusters, {verdict}")


if __name__ == "__main__":
    main()
