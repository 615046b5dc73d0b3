#!/usr/bin/env python3
"""Writes seed inputs for the fuzz targets (NBD and iSCSI): valid handshakes and reply streams for
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


def pdu(opcode, flags, data=b"", itt=1, extra=b""):
    bhs = bytearray(48)
    bhs[0], bhs[1] = opcode, flags
    bhs[5:8] = len(data).to_bytes(3, "big")
    bhs[16:20] = itt.to_bytes(4, "big")
    bhs[20:20 + len(extra)] = extra
    return bytes(bhs) + data + b"\0" * ((4 - len(data) % 4) % 4)


def iscsi_seeds(root):
    """Seeds for iscsi_pdu: the first byte picks the parser (see the target)."""
    d = os.path.join(root, "iscsi_pdu")
    os.makedirs(d, exist_ok=True)
    text = b"TargetName=iqn.2026-01.test:disk\0TargetAddress=127.0.0.1:3260,1\0"
    seeds = {
        "pdu": bytes([0]) + pdu(0x24, 0x80, text) + pdu(0x25, 0x81, b"x" * 5, itt=2),
        "text": bytes([2]) + text,
        "chap": bytes([3]) + b"0x0102030405060708090a0b0c0d0e0f10",
        "chap64": bytes([3]) + b"0bAQIDBAUGBwgJCgsMDQ4PEA==",
        "sense": bytes([4]) + bytes([0x70, 0, 5] + [0] * 9 + [0x21, 0, 0, 0, 0, 0]),
        "vpd": bytes([5]) + bytes([0, 0xb0, 0, 0x3c] + [0] * 60),
        "capacity": bytes([6]) + struct.pack(">QI", 2047, 512) + bytes([0, 0, 0xc0, 0] + [0] * 16),
        "lba": bytes([7]) + struct.pack(">I", 36) + bytes(4)
        + struct.pack(">QIB3x", 8, 16, 1) + struct.pack(">QIB3x", 24, 8, 0),
    }
    for name, body in seeds.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(body)


def bhs(opcode, flags, data=b"", **fields):
    """A PDU without digests; fields maps a byte offset (as _N) to a 32-bit value."""
    b = bytearray(48)
    b[0], b[1] = opcode, flags
    b[5:8] = len(data).to_bytes(3, "big")
    for k, v in fields.items():
        at = int(k[1:])
        b[at:at + 4] = v.to_bytes(4, "big")
    return bytes(b) + data + b"\0" * ((4 - len(data) % 4) % 4)


def login_rsp(flags, sn, text):
    b = bytearray(bhs(0x23, flags, text, _24=sn, _28=1, _32=64))
    b[8] = 0x80
    b[14:16] = (1).to_bytes(2, "big")
    return bytes(b)


def login_prefix(chap, discovery):
    """Mirrors ferry_fuzz::iscsi::login_prefix without digests."""
    out, sn = b"", 0
    if chap:
        out += login_rsp(0x00, 0, b"AuthMethod=CHAP\0")
        out += login_rsp(0x00, 1, b"CHAP_A=5\0CHAP_I=7\0CHAP_C=0x0102030405060708090a0b0c0d0e0f10\0")
        out += login_rsp(0x81, 2, b"")
        sn = 3
    else:
        out += login_rsp(0x81, 0, b"AuthMethod=None\0")
        sn = 1
    keys = b"HeaderDigest=None\0DataDigest=None\0MaxRecvDataSegmentLength=65536\0"
    if not discovery:
        keys += b"InitialR2T=No\0ImmediateData=Yes\0MaxBurstLength=262144\0FirstBurstLength=4096\0"
    return out + login_rsp(0x87, sn, keys)


def full_feature():
    """Target answers for ferry_fuzz::iscsi::session: READ (tag 0x100) in two Data-In
    PDUs, the last with status; WRITE (0x101) gets an R2T for its second half, then a
    SCSI response; the ping (0x102) a NOP-In; a target ping; logout (0x103)."""
    sn = dict(_28=1, _32=64)
    out = bhs(0x25, 0x00, b"\x11" * 2048, _16=0x100, _20=0xffffffff, _36=0, _40=0, **sn)
    out += bhs(0x25, 0x81, b"\x22" * 2048, _16=0x100, _20=0xffffffff, _24=1, _36=1, _40=2048, **sn)
    out += bhs(0x31, 0x80, _16=0x101, _20=0x55, _24=2, _36=0, _40=4096, _44=4096, **sn)
    out += bhs(0x20, 0x80, _16=0xffffffff, _20=0x77, _24=2, **sn)
    out += bhs(0x21, 0x80, _16=0x101, _24=2, **sn)
    out += bhs(0x20, 0x80, _16=0x102, _20=0xffffffff, _24=3, **sn)
    out += bhs(0x26, 0x80, _16=0x103, _24=4, **sn)
    return out


def check_condition():
    """The READ fails with CHECK CONDITION and sense data; the rest is a Reject."""
    sense = struct.pack(">H", 18) + bytes([0x70, 0, 5] + [0] * 9 + [0x21, 0, 0, 0, 0, 0])
    out = bhs(0x21, 0x80, sense, _16=0x100, _24=1, _28=1, _32=64)
    b = bytearray(out)
    b[3] = 0x02
    rejected = bhs(0x01, 0x80, _16=0x101)[:48]
    return bytes(b) + bhs(0x3f, 0x80, rejected, _16=0xffffffff, _24=2, _28=1, _32=64)


def send_targets():
    text = b"TargetName=iqn.2026-01.test:disk\0TargetAddress=127.0.0.1:3260,1\0"
    out = bhs(0x24, 0x40, text[:20], _16=1, _20=9, _24=1, _28=1, _32=64)
    out += bhs(0x24, 0x80, text[20:], _16=1, _20=0xffffffff, _24=2, _28=1, _32=64)
    return out + bhs(0x26, 0x80, _16=2, _24=3, _28=1, _32=64)


def iscsi_session_seeds(root):
    d = os.path.join(root, "iscsi_session")
    os.makedirs(d, exist_ok=True)
    for chap in (0, 1):
        for raw in (0, 1):
            for disc in (0, 1):
                mode = raw | disc << 1 | chap << 2
                body = send_targets() if disc else full_feature()
                if raw:
                    body = login_prefix(chap, disc) + body
                with open(os.path.join(d, "seed-%02x" % mode), "wb") as f:
                    f.write(bytes([mode]) + body)
    with open(os.path.join(d, "seed-check"), "wb") as f:
        f.write(bytes([0]) + check_condition())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    iscsi_seeds(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    iscsi_session_seeds(sys.argv[1] if len(sys.argv) > 1 else "corpus")
