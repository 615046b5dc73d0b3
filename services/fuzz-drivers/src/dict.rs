//! Reads libFuzzer dictionaries (`fuzz/seeds/*.dict`), so that the smoke mutates with the
//! same tokens `-dict=` gives libFuzzer.
//!
//! The format: one token per line, `"..."` with an optional `name=` before it, `\\`, `\"`
//! and `\xNN` escapes; blank lines and lines starting with `#` are ignored.

/// The tokens of a dictionary, or the first line that is not one (1-based) and why.
pub fn parse(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let token = token(line).map_err(|why| format!("line {}: {why}: {line}", index + 1))?;
        tokens.push(token);
    }
    Ok(tokens)
}

fn token(line: &str) -> Result<Vec<u8>, &'static str> {
    let start = line.find('"').ok_or("no opening quote")?;
    let quoted = line[start + 1..]
        .strip_suffix('"')
        .ok_or("no closing quote at the end")?;
    let mut out = Vec::new();
    let mut bytes = quoted.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'x') => {
                let hex = [bytes.next(), bytes.next()];
                let [Some(hi), Some(lo)] = hex else {
                    return Err("\\x needs two hex digits");
                };
                let digits = std::str::from_utf8(&[hi, lo])
                    .ok()
                    .and_then(|s| u8::from_str_radix(s, 16).ok());
                out.push(digits.ok_or("\\x needs two hex digits")?);
            }
            Some(escaped @ (b'\\' | b'"')) => out.push(escaped),
            _ => return Err("unknown escape"),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_escapes_names_and_comments() {
        let text = "# comment\n\n\"abc\"\nkw=\"\\x00\\xfF\\\\\\\"\"\n";
        let expected = vec![b"abc".to_vec(), vec![0, 0xff, b'\\', b'"']];
        assert_eq!(parse(text), Ok(expected));
    }

    #[test]
    fn malformed_lines_are_reported_with_their_number() {
        assert!(parse("\"ok\"\n\"open").unwrap_err().starts_with("line 2:"));
        assert!(parse("\"\\x4\"").is_err());
        assert!(parse("\"\\q\"").is_err());
        assert!(parse("bare").is_err());
    }
}
