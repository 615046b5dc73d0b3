//! Decompression of one compressed cluster (raw deflate, or zstd).
//!
//! The output is exactly one cluster: a stream that would produce more stops there (no
//! decompression bomb), one that produces less is corrupt. Each thread keeps its
//! decoders between clusters: an image holds tens of thousands of compressed clusters,
//! and a fresh zstd context per cluster allocates its window every time.

use std::cell::RefCell;

use ferry_core::Result;

use super::header::Compression;
use super::table::corrupt;

/// Decompresses `input` (a compressed cluster, possibly followed by padding) into `out`,
/// which is one cluster long.
pub fn decompress(kind: Compression, input: &[u8], out: &mut [u8]) -> Result<()> {
    match kind {
        Compression::Deflate => inflate(input, out),
        Compression::Zstd => unzstd(input, out),
    }
}

thread_local! {
    static INFLATE: RefCell<Option<flate2::Decompress>> = const { RefCell::new(None) };
    static UNZSTD: RefCell<Option<zstd::stream::raw::Decoder<'static>>> = const { RefCell::new(None) };
}

fn inflate(input: &[u8], out: &mut [u8]) -> Result<()> {
    INFLATE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let stream = cell.get_or_insert_with(|| flate2::Decompress::new(false));
        stream.reset(false);
        inflate_with(stream, input, out)
    })
}

fn inflate_with(stream: &mut flate2::Decompress, input: &[u8], out: &mut [u8]) -> Result<()> {
    loop {
        let before = stream.total_out();
        let status = stream
            .decompress(
                &input[stream.total_in() as usize..],
                &mut out[stream.total_out() as usize..],
                flate2::FlushDecompress::Finish,
            )
            .map_err(|e| corrupt("a compressed cluster does not inflate").with_source(e))?;
        let done = stream.total_out() as usize;
        if done == out.len() {
            return Ok(());
        }
        if status == flate2::Status::StreamEnd || stream.total_out() == before {
            return Err(corrupt(format!(
                "a compressed cluster inflates to {done} bytes, not {}",
                out.len()
            )));
        }
    }
}

fn unzstd(input: &[u8], out: &mut [u8]) -> Result<()> {
    use zstd::stream::raw::{Decoder, Operation};
    UNZSTD.with(|cell| {
        let mut cell = cell.borrow_mut();
        let decoder = match cell.as_mut() {
            Some(decoder) => {
                decoder
                    .reinit()
                    .map_err(|e| corrupt("cannot reset a zstd decoder").with_source(e))?;
                decoder
            }
            None => cell.insert(
                Decoder::new()
                    .map_err(|e| corrupt("cannot start a zstd decoder").with_source(e))?,
            ),
        };
        unzstd_with(decoder, input, out)
    })
}

fn unzstd_with(
    decoder: &mut zstd::stream::raw::Decoder<'static>,
    input: &[u8],
    out: &mut [u8],
) -> Result<()> {
    use zstd::stream::raw::{InBuffer, Operation, OutBuffer};
    let mut input = InBuffer::around(input);
    let mut output = OutBuffer::around(out);
    loop {
        let before = (input.pos(), output.pos());
        decoder.run(&mut input, &mut output).map_err(|e| {
            corrupt(format!(
                "a zstd compressed cluster does not decompress: {e}"
            ))
        })?;
        if output.pos() == output.capacity() {
            return Ok(());
        }
        if (input.pos(), output.pos()) == before {
            return Err(corrupt(format!(
                "a zstd compressed cluster decompresses to {} bytes, not {}",
                output.pos(),
                output.capacity()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn deflated(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn inflates_exactly_one_cluster_and_ignores_padding() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        let mut input = deflated(&data);
        input.extend_from_slice(&[0xaa; 300]);
        let mut out = vec![0u8; 4096];
        decompress(Compression::Deflate, &input, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn short_or_garbage_streams_are_corrupt() {
        let input = deflated(&[7u8; 1000]);
        let mut out = vec![0u8; 4096];
        let err = decompress(Compression::Deflate, &input, &mut out).unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt);
        assert!(decompress(Compression::Deflate, &[0xff; 64], &mut out).is_err());
        assert!(decompress(Compression::Zstd, &[0xff; 64], &mut out).is_err());
        let short = zstd::bulk::compress(&[7u8; 1000], 3).unwrap();
        let err = decompress(Compression::Zstd, &short, &mut out).unwrap_err();
        assert_eq!(err.kind(), ferry_core::ErrorKind::Corrupt);
    }

    #[test]
    fn unzstd_fills_one_cluster_and_ignores_padding() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 13) as u8).collect();
        let mut input = zstd::bulk::compress(&data, 3).unwrap();
        input.extend_from_slice(&[0u8; 300]);
        let mut out = vec![0u8; 4096];
        decompress(Compression::Zstd, &input, &mut out).unwrap();
        assert_eq!(out, data);
    }

    #[test]
    fn a_bomb_stops_at_one_cluster() {
        let input = deflated(&vec![0u8; 8 << 20]);
        let mut out = vec![1u8; 4096];
        decompress(Compression::Deflate, &input, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
    }
}
