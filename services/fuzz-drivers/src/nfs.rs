//! The NFS fuzz targets, on ferry-nfs's pure decoders of server bytes: `nfs_xdr` the XDR
//! primitives and every NFSv3, MOUNT and portmapper reply decoder, `nfs_rpc_reply` an ONC
//! RPC reply as a connection's reader takes it, `nfs4_compound_reply` an NFSv4 COMPOUND
//! reply result by result. Each must return an error, never panic, and never hand back
//! more than the bounds ferry-nfs promises.

use ferry_nfs::rpc::{decode_reply, ReadShape};
use ferry_nfs::v3::proto;
use ferry_nfs::v4::ops::{self, Reply, ReplyError};
use ferry_nfs::xdr::Decoder;

/// XDR primitives in an order the input picks, then every NFSv3, MOUNT and portmapper
/// reply decoder on the whole input.
pub fn nfs_xdr(data: &[u8]) {
    let mut d = Decoder::new(data);
    while let Ok(pick) = d.u32() {
        let before = d.remaining();
        let ok = match pick % 7 {
            0 => d.u32().is_ok(),
            1 => d.u64().is_ok(),
            2 => d.bool().is_ok(),
            3 => d.opaque(1024, "opaque").is_ok_and(|b| b.len() <= 1024),
            4 => d.string(255, "string").is_ok(),
            5 => {
                let n = (pick >> 3) as usize % 64;
                d.fixed(n).is_ok_and(|b| b.len() == n)
            }
            _ => d.skip((pick >> 3) as usize % 64).is_ok(),
        };
        assert!(d.remaining() <= before, "a decoder cannot give bytes back");
        if !ok {
            break;
        }
    }
    let whole = || Decoder::new(data);
    let _ = proto::Attr::decode(&mut whole());
    let _ = proto::post_op_attr(&mut whole());
    let _ = proto::skip_wcc_data(&mut whole());
    if let Ok((fh, _)) = proto::lookup_ok(&mut whole()) {
        assert!(fh.0.len() <= proto::FHSIZE3);
    }
    if let Ok((Some(fh), _)) = proto::create_ok(&mut whole()) {
        assert!(fh.0.len() <= proto::FHSIZE3);
    }
    let _ = proto::fsinfo_ok(&mut whole());
    let _ = proto::write_ok(&mut whole());
    let _ = proto::commit_ok(&mut whole());
    if let Ok(fh) = proto::mount_ok(&mut whole()) {
        assert!(fh.0.len() <= proto::FHSIZE3);
    }
    if let Ok(exports) = proto::exports(&mut whole()) {
        assert!(exports.len() <= proto::MAX_EXPORTS);
    }
}

/// An ONC RPC reply as a connection's reader takes it: without a buffer, and with one
/// for NFSv3 READ data and for NFSv4 READ data (its size picked by the first byte).
pub fn nfs_rpc_reply(data: &[u8]) {
    if let Ok((_, out)) = decode_reply::<Vec<u8>>(data, None, ReadShape::Read3) {
        assert!(out.sink.is_none());
        if let Ok(body) = &out.result {
            assert!(body.len() <= data.len(), "the body comes from the input");
        }
    }
    let len = data.first().map_or(0, |b| usize::from(*b) * 16);
    let compound = ReadShape::Compound4 {
        before: ops::READ_PREFIX,
        read_op: ops::OP_READ,
    };
    for shape in [ReadShape::Read3, compound] {
        if let Ok((_, out)) = decode_reply(data, Some(vec![0u8; len]), shape) {
            let sink = out.sink.expect("a decoded reply hands the buffer back");
            assert_eq!(sink.len(), len, "the buffer keeps its size");
            if let Ok(body) = &out.result {
                assert!(body.len() <= data.len(), "the body comes from the input");
            }
        }
    }
}

/// A COMPOUND4res read result by result with each decoder in turn, and as the reply to
/// a read COMPOUND (SEQUENCE, PUTFH, READ).
pub fn nfs4_compound_reply(data: &[u8]) {
    type Decode = fn(&mut Reply<'_>) -> Result<(), ReplyError>;
    let decoders: [Decode; 14] = [
        |r| r.sequence().map(drop),
        |r| r.getfh().map(|fh| assert!(fh.0.len() <= ops::NFS4_FHSIZE)),
        |r| r.getattr().map(drop),
        |r| r.open().map(drop),
        |r| r.setattr(),
        |r| r.read_into_sink().map(drop),
        |r| r.write().map(drop),
        |r| r.commit().map(drop),
        |r| r.seek().map(drop),
        |r| r.exchange_id().map(drop),
        |r| r.create_session().map(drop),
        |r| r.bind_conn(),
        |r| r.simple(ops::OP_PUTFH),
        |r| r.simple(ops::OP_LOOKUP),
    ];
    for decode in decoders {
        let Ok(mut r) = Reply::parse(data) else {
            return;
        };
        let mut decoded = 0;
        while decode(&mut r).is_ok() {
            decoded += 1;
        }
        assert!(
            decoded <= ops::MAX_RESULTS,
            "no more results than the bound"
        );
    }
    if let Ok(mut r) = Reply::parse(data) {
        let _ = r
            .sequence()
            .and_then(|_| r.simple(ops::OP_PUTFH))
            .and_then(|_| r.read_into_sink());
    }
}
