#!/usr/bin/env python3
"""Writes seed inputs for the NBD fuzz targets: valid handshakes and reply streams for
the requests ferry_fuzz::session sends (cookies 1..7: read 0+4096, read 1M-4096+4096,
block status 0+1M, write, write zeroes, trim, flush)."""
import os, struct, sys

NBDMAGIC = 0x4E42444D41474943
IHAVEOPT = 0x49484156454F5054
REPLY_MAGIC = 0x3E889045565A9
SIMPLE, STRUCT, EXT = 0x67446698, 0x668E33EF, 0x6E8A278C
DONE = 1

def opt(o, rep, data=b""):
    return struct.pack(">QIII", REPLY_MAGIC, o, rep, len(data)) + data

def handshake(extended):
    out = struct.pack(">QQH", NBDMAGIC, IHAVEOPT, 3)
    if extended:
        out += opt(11, 1)
    else:
        out += opt(11, (1 << 31) | 1) + opt(8, 1)
    out += opt(10, 4, struct.pack(">I", 1) + b"base:allocation") + opt(10, 1)
    out += opt(7, 3, struct.pack(">HQH", 0, 1 << 20, 0xFFFF))
    out += opt(7, 3, struct.pack(">HIII", 3, 512, 4096, 1 << 20))
    out += opt(7, 1)
    return out

REQ_OFFSETS = {1: 0, 2: (1 << 20) - 4096, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0}

def chunk(ext, cookie, flags, kind, payload):
    if ext:
        return struct.pack(">IHHQQQ", EXT, flags, kind, cookie, REQ_OFFSETS[cookie], len(payload)) + payload
    return struct.pack(">IHHQI", STRUCT, flags, kind, cookie, len(payload)) + payload

def replies(ext, variant):
    out = b""
    # 1: data split in two chunks, out of order.
    out += chunk(ext, 1, 0, 1, struct.pack(">Q", 2048) + b"\xab" * 2048)
    out += chunk(ext, 1, DONE, 1, struct.pack(">Q", 0) + b"\xcd" * 2048)
    # 2: a hole, then NONE.
    off = (1 << 20) - 4096
    out += chunk(ext, 2, 0, 2, struct.pack(">QI", off, 4096))
    out += chunk(ext, 2, DONE, 0, b"")
    # 3: block status for context 1.
    if ext:
        out += chunk(ext, 3, DONE, 6, struct.pack(">IIQQQQ", 1, 2, 65536, 3, 1 << 20, 0))
    else:
        out += chunk(ext, 3, DONE, 5, struct.pack(">IIIII", 1, 65536, 3, 1 << 20, 0))
    # 4: an error with an offset; 5: a plain error; 6, 7: success.
    msg = b"injected"
    out += chunk(ext, 4, DONE, 0x8002, struct.pack(">IH", 5, len(msg)) + msg + struct.pack(">Q", 512))
    out += chunk(ext, 5, DONE, 0x8001, struct.pack(">IH", 28, len(msg)) + msg)
    if ext or variant:
        out += chunk(ext, 6, DONE, 0, b"") + chunk(ext, 7, DONE, 0, b"")
    else:
        out += struct.pack(">IIQ", SIMPLE, 0, 6) + struct.pack(">IIQ", SIMPLE, 0, 7)
    return out

def main(root):
    for target in ("nbd_replies", "nbd_handshake"):
        os.makedirs(os.path.join(root, target), exist_ok=True)
    for ext in (0, 1):
        for variant in (0, 1):
            body = replies(bool(ext), variant)
            with open(os.path.join(root, "nbd_replies", f"seed-{ext}{variant}"), "wb") as f:
                f.write(bytes([ext]) + body)
            with open(os.path.join(root, "nbd_handshake", f"seed-{ext}{variant}"), "wb") as f:
                f.write(handshake(bool(ext)) + body)
    os.makedirs(os.path.join(root, "nbd_parsers"), exist_ok=True)
    with open(os.path.join(root, "nbd_parsers", "seed-info"), "wb") as f:
        f.write(bytes([2]) + struct.pack(">HQH", 0, 1 << 20, 0xFFFF))
    with open(os.path.join(root, "nbd_parsers", "seed-status"), "wb") as f:
        f.write(bytes([8]) + struct.pack(">IIIII", 1, 65536, 3, 1 << 20, 0))

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "corpus")
