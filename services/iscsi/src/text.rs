//! Text keys (RFC 7143 section 6): `key=value` pairs separated by NUL bytes, as login and
//! text PDUs carry them.

use crate::error::{Error, Result};

/// Longest text we accept in one login or text exchange (all PDUs of it together).
pub const MAX_TEXT: usize = 64 * 1024;

/// Encodes pairs as NUL-terminated `key=value` strings.
pub fn encode(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Decodes NUL-separated `key=value` strings; empty strings are skipped.
pub fn decode(data: &[u8]) -> Result<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for item in data.split(|b| *b == 0) {
        if item.is_empty() {
            continue;
        }
        let item = std::str::from_utf8(item)
            .map_err(|_| Error::Protocol("text key is not UTF-8".into()))?;
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| Error::Protocol(format!("text item without '=': {item:?}")))?;
        pairs.push((k.to_string(), v.to_string()));
    }
    Ok(pairs)
}

/// The value of `key` among `pairs`.
pub fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Decodes a CHAP binary value: `0x` hex or `0b` base64.
pub fn decode_binary(value: &str) -> Result<Vec<u8>> {
    let bad = || Error::Protocol(format!("bad binary value {value:?}"));
    if let Some(hex) = value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        if !hex.is_ascii() || hex.len() % 2 != 0 || hex.len() > 2048 {
            return Err(bad());
        }
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| bad()))
            .collect()
    } else if let Some(b64) = value
        .strip_prefix("0b")
        .or_else(|| value.strip_prefix("0B"))
    {
        decode_base64(b64).ok_or_else(bad)
    } else {
        Err(bad())
    }
}

fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

pub fn encode_hex(bytes: &[u8]) -> String {
    let mut s = String::from("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let pairs = vec![
            ("A".to_string(), "1".to_string()),
            ("B".into(), "x=y".into()),
        ];
        let d = encode(&pairs);
        assert_eq!(decode(&d).unwrap(), pairs);
        assert!(decode(b"novalue\0").is_err());
    }

    #[test]
    fn binary_values() {
        assert_eq!(decode_binary("0x0aFF").unwrap(), vec![10, 255]);
        assert_eq!(decode_binary("0bAQI=").unwrap(), vec![1, 2]);
        assert!(decode_binary("0x0").is_err());
        assert!(decode_binary("12").is_err());
        assert!(decode_binary("0xa\u{e9}b").is_err());
        assert_eq!(encode_hex(&[1, 0xab]), "0x01ab");
    }
}
