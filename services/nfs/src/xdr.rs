//! XDR (RFC 4506) encoding and bounded decoding of the few types NFSv3, NFSv4, MOUNT and
//! the portmapper use: 32/64-bit integers, booleans, fixed and variable opaque data, strings.
//!
//! The decoder works on a byte slice that holds a whole reply and never allocates from a
//! length read off the wire: every variable-length item is checked against both the bytes
//! left and a caller-given maximum before it is taken.

use std::fmt;

/// A malformed or oversized XDR item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdrError(pub String);

impl fmt::Display for XdrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for XdrError {}

pub type XdrResult<T> = Result<T, XdrError>;

/// Bytes of padding after `len` bytes of opaque data.
pub fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Appends XDR items to a buffer.
#[derive(Debug, Default)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u32(u32::from(v))
    }

    /// Fixed-length opaque data (no length word), padded to 4 bytes.
    pub fn fixed(&mut self, data: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(data);
        self.buf.extend_from_slice(&[0u8; 3][..padding(data.len())]);
        self
    }

    /// Variable-length opaque data: length word, bytes, padding. Callers bound the length
    /// (file handles, names, paths are all far below 4 GiB).
    pub fn opaque(&mut self, data: &[u8]) -> &mut Self {
        self.u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
        self.fixed(data)
    }

    pub fn string(&mut self, s: &str) -> &mut Self {
        self.opaque(s.as_bytes())
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.buf
    }

    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads XDR items from a slice, checking every length.
#[derive(Debug, Clone)]
pub struct Decoder<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> XdrResult<&'a [u8]> {
        if n > self.remaining() {
            return Err(XdrError(format!(
                "reply too short: {what} needs {n} bytes, {} left",
                self.remaining()
            )));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn u32(&mut self) -> XdrResult<u32> {
        let b = self.take(4, "a 32-bit integer")?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> XdrResult<u64> {
        let b = self.take(8, "a 64-bit integer")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    pub fn bool(&mut self) -> XdrResult<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(XdrError(format!("invalid boolean {v}"))),
        }
    }

    /// Fixed-length opaque data of `n` bytes plus padding.
    pub fn fixed(&mut self, n: usize) -> XdrResult<&'a [u8]> {
        let data = self.take(n, "fixed opaque data")?;
        self.take(padding(n), "padding")?;
        Ok(data)
    }

    /// Variable-length opaque data of at most `max` bytes.
    pub fn opaque(&mut self, max: usize, what: &str) -> XdrResult<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(XdrError(format!(
                "{what} of {len} bytes exceeds the limit of {max}"
            )));
        }
        self.fixed(len)
    }

    /// A string of at most `max` bytes (invalid UTF-8 is replaced, as names are shown only).
    pub fn string(&mut self, max: usize, what: &str) -> XdrResult<String> {
        Ok(String::from_utf8_lossy(self.opaque(max, what)?).into_owned())
    }

    pub fn skip(&mut self, n: usize) -> XdrResult<()> {
        self.take(n, "skipped data").map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut e = Encoder::new();
        e.u32(7)
            .u64(1 << 40)
            .bool(true)
            .opaque(b"abcde")
            .string("xy")
            .fixed(&[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(e.len() % 4, 0);
        let bytes = e.into_vec();
        let mut d = Decoder::new(&bytes);
        assert_eq!(d.u32().unwrap(), 7);
        assert_eq!(d.u64().unwrap(), 1 << 40);
        assert!(d.bool().unwrap());
        assert_eq!(d.opaque(64, "x").unwrap(), b"abcde");
        assert_eq!(d.string(64, "x").unwrap(), "xy");
        assert_eq!(d.fixed(8).unwrap(), &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn lengths_are_bounded() {
        let mut e = Encoder::new();
        e.u32(u32::MAX);
        let bytes = e.into_vec();
        assert!(Decoder::new(&bytes).opaque(64, "file handle").is_err());
        let mut e = Encoder::new();
        e.u32(100).fixed(&[0; 8]);
        let bytes = e.into_vec();
        let err = Decoder::new(&bytes).opaque(1000, "data").unwrap_err();
        assert!(err.0.contains("too short"), "{err}");
        assert!(Decoder::new(&[0, 0, 0, 2]).bool().is_err());
        assert!(Decoder::new(&[0, 0]).u32().is_err());
    }
}
