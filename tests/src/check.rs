//! Independent checks of what ferry produced.
//!
//! Nothing here uses ferry's own code: bytes are compared by `qemu-img compare`, allocation
//! is read from `st_blocks`, and the block hash is recomputed by the plainest possible
//! reading of the construction in FIELD-NOTES.md, so a bug in the engine cannot hide behind
//! the same bug in the check.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

/// Block size of the block hash (blkhash's default, blksum-compatible).
pub const BLKHASH_BLOCK: usize = 64 * 1024;

/// Panics (failing the test) with the install command when a tool is not on PATH.
pub fn require_tool(tool: &str, debian_package: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: run `apt-get update && apt-get install -y --no-install-recommends {debian_package}` \
         (or the project's test command, which installs everything the tests need)"
    );
}

/// Fails the test, with qemu-img's output, unless the two raw images have the same bytes
/// (by qemu-img's rule, the longer image must read as zeroes past the shorter one's end).
pub fn qemu_img_compare(a: &Path, b: &Path) {
    if let Err(message) = qemu_img_compare_result(a, b) {
        panic!("{message}");
    }
}

/// `qemu-img compare -f raw -F raw A B`: `Ok` when identical, otherwise its output.
pub fn qemu_img_compare_result(a: &Path, b: &Path) -> Result<(), String> {
    require_tool("qemu-img", "qemu-utils");
    let out = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(a)
        .arg(b)
        .output()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "qemu-img compare {} {} failed ({}):\n{}{}",
            a.display(),
            b.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Bytes the filesystem allocated for a file (`st_blocks * 512`).
pub fn allocated_bytes(path: &Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .blocks()
        * 512
}

/// Fails the test unless `path` allocates about `expected` bytes: never less (the data must
/// be there) and at most `expected` plus filesystem metadata slack (1% + 1 MiB).
pub fn assert_allocated_about(path: &Path, expected: u64) {
    let allocated = allocated_bytes(path);
    let slack = expected / 100 + (1 << 20);
    assert!(
        allocated + slack >= expected && allocated <= expected + slack,
        "{} allocates {allocated} bytes; expected about {expected} (the source's non-zero blocks)",
        path.display()
    );
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The block hash of a byte slice, straight from the definition:
/// `SHA-256( SHA-256(b0) || ... || SHA-256(bn-1) || LE64(len) )` over 64 KiB blocks.
pub fn blkhash_bytes(data: &[u8]) -> String {
    let mut outer = Sha256::new();
    for block in data.chunks(BLKHASH_BLOCK) {
        outer.update(Sha256::digest(block));
    }
    outer.update((data.len() as u64).to_le_bytes());
    hex(&outer.finalize())
}

/// The block hash of a file, reading it block by block (no shortcuts for holes).
pub fn blkhash_file(path: &Path) -> String {
    let mut file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut outer = Sha256::new();
    let mut block = vec![0u8; BLKHASH_BLOCK];
    let mut len = 0u64;
    loop {
        let n = read_full(&mut file, &mut block)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        outer.update(Sha256::digest(&block[..n]));
        len += n as u64;
        if n < block.len() {
            break;
        }
    }
    outer.update(len.to_le_bytes());
    hex(&outer.finalize())
}

/// The plain SHA-256 of a file.
pub fn sha256_file(path: &Path) -> String {
    let mut file = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hex(&hasher.finalize())
}

/// The digest `sha256sum` prints for a file.
pub fn sha256sum_tool(path: &Path) -> String {
    require_tool("sha256sum", "coreutils");
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success(), "sha256sum {} failed", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("sha256sum printed nothing")
        .to_string()
}

fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = BLKHASH_BLOCK;

    /// The FIELD-NOTES vectors hold for this implementation, so it can judge ferry's.
    #[test]
    fn field_notes_vectors() {
        let cases: [(Vec<u8>, &str); 6] = [
            (
                vec![b'A'; B],
                "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e",
            ),
            (
                vec![0; B],
                "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af",
            ),
            (
                vec![b'A'; B / 2],
                "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc",
            ),
            (
                vec![0; B / 2],
                "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56",
            ),
            (
                vec![0; 8 * B],
                "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d",
            ),
            (
                vec![0; 8 * B + B / 2],
                "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c",
            ),
        ];
        for (data, expected) in cases {
            assert_eq!(blkhash_bytes(&data), expected, "len {}", data.len());
        }
    }
}
