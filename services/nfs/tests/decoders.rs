//! Every decoder of network input, fed truncated, oversized-length and garbage input:
//! each must answer a clean error, never panic, never allocate from a length it read.
//! The fuzz targets over the same decoders (`nfs_xdr`, `nfs_rpc_reply`,
//! `nfs4_compound_reply`) live in ferry-fuzz-drivers, whose smoke runs them on every test run.

use ferry_nfs::rpc::{decode_reply, ReadShape, RpcError};
use ferry_nfs::v3::proto;
use ferry_nfs::v4::ops::{self, Reply, ReplyError};
use ferry_nfs::xdr::{Decoder, Encoder};

// ---- fixtures ----

fn fattr3(size: u64) -> Encoder {
    let mut e = Encoder::new();
    e.u32(proto::NF3REG).u32(0o644).u32(1).u32(0).u32(0);
    e.u64(size).u64(size).u32(0).u32(0).u64(1).u64(2);
    for _ in 0..6 {
        e.u32(0);
    }
    e
}

/// An RPC reply record (one fragment) carrying `body` after an accepted, successful
/// header.
fn rpc_reply(xid: u32, body: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(xid).u32(1).u32(0).u32(0).u32(0).u32(0);
    let mut msg = e.into_vec();
    msg.extend_from_slice(body);
    let mut out = (0x8000_0000u32 | msg.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&msg);
    out
}

fn read3_reply(data: &[u8]) -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(0).bool(true).fixed(fattr3(9).as_slice());
    e.u32(data.len() as u32).bool(true).opaque(data);
    rpc_reply(7, e.as_slice())
}

fn compound_header(e: &mut Encoder, status: u32, count: u32) {
    e.u32(status).opaque(b"").u32(count);
}

fn sequence_ok(e: &mut Encoder) {
    e.u32(ops::OP_SEQUENCE).u32(0).fixed(&[1; 16]);
    e.u32(7).u32(0).u32(3).u32(15).u32(0);
}

/// A COMPOUND reply holding one result of every decoder ferry uses.
fn compound_seed() -> Vec<u8> {
    let mut e = Encoder::new();
    compound_header(&mut e, 0, 12);
    sequence_ok(&mut e);
    e.u32(ops::OP_PUTFH).u32(0);
    e.u32(ops::OP_GETFH).u32(0).opaque(&[5; 20]);
    let mut vals = Encoder::new();
    vals.u32(ops::NF4REG).u64(12345);
    e.u32(ops::OP_GETATTR)
        .u32(0)
        .u32(1)
        .u32(0b10010)
        .opaque(vals.as_slice());
    e.u32(ops::OP_OPEN).u32(0).u32(1).fixed(&[3; 12]);
    e.bool(true).u64(1).u64(2).u32(0).u32(0).u32(0);
    e.u32(ops::OP_SETATTR).u32(0).u32(0);
    e.u32(ops::OP_WRITE).u32(0).u32(4096).u32(0).fixed(&[9; 8]);
    e.u32(ops::OP_COMMIT).u32(0).fixed(&[9; 8]);
    e.u32(ops::OP_SEEK).u32(0).bool(false).u64(8192);
    e.u32(ops::OP_EXCHANGE_ID).u32(0).u64(77).u32(1);
    e.u32(ops::OP_CREATE_SESSION)
        .u32(0)
        .fixed(&[2; 16])
        .u32(1)
        .u32(0);
    for _ in 0..2 {
        e.u32(0)
            .u32(1 << 20)
            .u32(1 << 20)
            .u32(4096)
            .u32(8)
            .u32(16)
            .u32(0);
    }
    e.u32(ops::OP_BIND_CONN_TO_SESSION)
        .u32(0)
        .fixed(&[2; 16])
        .u32(1)
        .bool(false);
    e.into_vec()
}

fn xdr_seed() -> Vec<u8> {
    let mut e = Encoder::new();
    e.u32(0).u32(7).u32(1).u64(1 << 40).u32(2).bool(true);
    e.u32(3).opaque(b"abcde").u32(4).string("name");
    e.bool(true)
        .string("/export")
        .bool(true)
        .string("*")
        .bool(false)
        .bool(false);
    e.into_vec()
}

// ---- tests ----

#[test]
fn fixtures_decode_as_intended() {
    let (xid, out) = decode_reply(&read3_reply(b"hello"), Some(vec![0u8; 8]), ReadShape::Read3)
        .expect("a good READ reply");
    assert_eq!(xid, 7);
    assert!(out.result.is_ok());
    assert_eq!(&out.sink.unwrap()[..5], b"hello");
    let seed = compound_seed();
    let mut r = Reply::parse(&seed).unwrap();
    r.sequence().unwrap();
    r.simple(ops::OP_PUTFH).unwrap();
    assert_eq!(r.getfh().unwrap().0, vec![5; 20]);
    assert_eq!(r.getattr().unwrap().size, Some(12345));
    assert_eq!(r.open().unwrap().1, None);
    r.setattr().unwrap();
    assert_eq!(r.write().unwrap().0, 4096);
    r.commit().unwrap();
    assert_eq!(r.seek().unwrap(), (false, 8192));
    assert_eq!(r.exchange_id().unwrap(), (77, 1));
    assert_eq!(r.create_session().unwrap().1.max_requests, 16);
    r.bind_conn().unwrap();
    assert!(!r.has_more());
}

#[test]
fn xdr_truncated_oversized_and_garbage_input_is_an_error() {
    let seed = xdr_seed();
    let mut d = Decoder::new(&seed[..seed.len() - 1]);
    let mut failed = false;
    for _ in 0..64 {
        if d.u32().is_err() {
            failed = true;
            break;
        }
    }
    assert!(failed, "a truncated stream ends in an error");
    let mut e = Encoder::new();
    e.u32(u32::MAX).fixed(&[0; 8]);
    let err = Decoder::new(e.as_slice())
        .opaque(1024, "a name")
        .unwrap_err();
    assert!(err.0.contains("exceeds the limit"), "{err}");
    let err = Decoder::new(e.as_slice())
        .opaque(usize::MAX, "a name")
        .unwrap_err();
    assert!(err.0.contains("too short"), "{err}");
    assert!(
        Decoder::new(&[0, 0, 0, 9]).bool().is_err(),
        "garbage boolean"
    );
    assert!(Decoder::new(&[0; 7]).u64().is_err());
    assert!(Decoder::new(&[0; 3]).skip(4).is_err());
}

#[test]
fn nfs3_reply_decoders_refuse_truncated_oversized_and_garbage_input() {
    type Decode = fn(&mut Decoder<'_>) -> bool;
    let mut lookup = Encoder::new();
    lookup
        .opaque(&[1; 32])
        .bool(true)
        .fixed(fattr3(5).as_slice());
    let mut create = Encoder::new();
    create.bool(true).opaque(&[1; 32]).bool(false);
    let mut fsinfo = Encoder::new();
    fsinfo.bool(false).u32(1 << 20).u32(1 << 20).u32(1);
    fsinfo
        .u32(1 << 20)
        .u32(1 << 20)
        .u32(1)
        .u32(4096)
        .u64(1 << 40);
    let mut write = Encoder::new();
    write
        .bool(false)
        .bool(false)
        .u32(4096)
        .u32(0)
        .fixed(&[1; 8]);
    let mut exports = Encoder::new();
    exports.bool(true).string("/a").bool(false).bool(false);
    let cases: [(Vec<u8>, Decode); 5] = [
        (lookup.into_vec(), |d| proto::lookup_ok(d).is_ok()),
        (create.into_vec(), |d| proto::create_ok(d).is_ok()),
        (fsinfo.into_vec(), |d| proto::fsinfo_ok(d).is_ok()),
        (write.into_vec(), |d| proto::write_ok(d).is_ok()),
        (exports.into_vec(), |d| proto::exports(d).is_ok()),
    ];
    for (bytes, decode) in cases {
        assert!(decode(&mut Decoder::new(&bytes)), "the whole reply decodes");
        for cut in 0..bytes.len() {
            assert!(!decode(&mut Decoder::new(&bytes[..cut])), "cut at {cut}");
        }
    }
    let mut e = Encoder::new();
    e.u32(u32::MAX);
    assert!(
        proto::mount_ok(&mut Decoder::new(e.as_slice())).is_err(),
        "huge handle"
    );
    let mut e = Encoder::new();
    e.bool(true).opaque(&[0; 65]).bool(false);
    assert!(
        proto::create_ok(&mut Decoder::new(e.as_slice())).is_err(),
        "65-byte handle"
    );
    let mut e = Encoder::new();
    for _ in 0..=proto::MAX_EXPORTS {
        e.bool(true).string("/x").bool(false);
    }
    e.bool(false);
    let err = proto::exports(&mut Decoder::new(e.as_slice())).unwrap_err();
    assert!(err.0.contains("more than"), "{err}");
    let mut e = Encoder::new();
    e.bool(true).string("/x").u32(7);
    assert!(
        proto::exports(&mut Decoder::new(e.as_slice())).is_err(),
        "garbage boolean"
    );
}

#[test]
fn rpc_replies_that_are_truncated_oversized_or_garbage_are_refused() {
    let good = read3_reply(b"hello");
    for cut in 0..good.len() {
        assert!(
            decode_reply(&good[..cut], Some(vec![0u8; 8]), ReadShape::Read3).is_err(),
            "cut at {cut}"
        );
    }
    // A record longer than any reply.
    let err =
        decode_reply::<Vec<u8>>(&0xffff_ffffu32.to_be_bytes(), None, ReadShape::Read3).unwrap_err();
    assert!(err.contains("longer than"), "{err}");
    // More READ data than the buffer holds.
    let err =
        decode_reply(&read3_reply(&[1; 64]), Some(vec![0u8; 8]), ReadShape::Read3).unwrap_err();
    assert!(err.contains("READ reply carries 64 bytes"), "{err}");
    // A verifier over the RFC's 400 bytes.
    let mut e = Encoder::new();
    e.u32(1).u32(1).u32(0).u32(0).u32(100_000);
    let mut rec = (0x8000_0000u32 | e.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(e.as_slice());
    let err = decode_reply::<Vec<u8>>(&rec, None, ReadShape::Read3).unwrap_err();
    assert!(err.contains("verifier"), "{err}");
    // A call where a reply was expected; an unknown reply status.
    for (mtype, stat, what) in [(0, 0, "message type"), (1, 9, "reply status")] {
        let mut e = Encoder::new();
        e.u32(1).u32(mtype).u32(stat).u32(0).u32(0);
        let mut rec = (0x8000_0000u32 | e.len() as u32).to_be_bytes().to_vec();
        rec.extend_from_slice(e.as_slice());
        let err = decode_reply::<Vec<u8>>(&rec, None, ReadShape::Read3).unwrap_err();
        assert!(err.contains(what), "{err}");
    }
    // A denied call is the caller's error, not a broken stream.
    let mut e = Encoder::new();
    e.u32(1).u32(1).u32(1).u32(1).u32(5);
    let mut rec = (0x8000_0000u32 | e.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(e.as_slice());
    let (_, out) = decode_reply::<Vec<u8>>(&rec, None, ReadShape::Read3).unwrap();
    assert!(matches!(out.result, Err(RpcError::Auth { .. })), "{out:?}");
}

#[test]
fn compound_decoders_refuse_every_truncation_and_oversized_lengths() {
    let seed = compound_seed();
    for cut in 0..seed.len() {
        let decoded = Reply::parse(&seed[..cut]).and_then(|mut r| {
            r.sequence()?;
            r.simple(ops::OP_PUTFH)?;
            r.getfh()?;
            r.getattr()?;
            r.open()?;
            r.setattr()?;
            r.write()?;
            r.commit()?;
            r.seek()?;
            r.exchange_id()?;
            r.create_session()?;
            r.bind_conn()
        });
        assert!(
            matches!(decoded, Err(ReplyError::Malformed(_))),
            "cut at {cut}: {decoded:?}"
        );
    }
    let mut e = Encoder::new();
    compound_header(&mut e, 0, 1);
    e.u32(ops::OP_CREATE_SESSION)
        .u32(0)
        .fixed(&[2; 16])
        .u32(1)
        .u32(0);
    e.u32(0).u32(1).u32(1).u32(1).u32(1).u32(1).u32(u32::MAX);
    let err = Reply::parse(e.as_slice())
        .unwrap()
        .create_session()
        .unwrap_err();
    assert!(err.to_string().contains("RDMA"), "{err}");
    let mut e = Encoder::new();
    compound_header(&mut e, 0, 1);
    e.u32(ops::OP_SETATTR).u32(0).u32(1_000_000);
    assert!(
        Reply::parse(e.as_slice()).unwrap().setattr().is_err(),
        "huge bitmap"
    );
}
