//! `ferry checksum`: the block hash equals an independent implementation of the
//! construction and the FIELD-NOTES vectors; `--algorithm sha256` equals `sha256sum`;
//! the output has sha256sum's `HEXDIGEST  URL` form.

use std::fs;
use std::path::Path;

use ferry_tests::check::{blkhash_file, sha256sum_tool};
use ferry_tests::images::{make, Pattern};
use ferry_tests::{ferry, scratch_dir};

const MIB: u64 = 1 << 20;
const B: usize = 64 * 1024;

fn checksum(path: &Path, extra: &[&str]) -> String {
    let mut args: Vec<&std::ffi::OsStr> = vec!["checksum".as_ref()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    args.push(path.as_os_str());
    let run = ferry!().run(args);
    run.assert_success();
    let expected_suffix = format!("  {}\n", path.display());
    assert!(
        run.stdout.ends_with(&expected_suffix) && run.stdout.lines().count() == 1,
        "output is not 'HEXDIGEST  URL': {run}"
    );
    let digest = run.stdout[..run.stdout.len() - expected_suffix.len()].to_string();
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "not a hex SHA-256 digest: {run}"
    );
    digest
}

#[test]
fn block_hash_matches_the_independent_construction() {
    let dir = scratch_dir();
    for (pattern, size) in [
        (Pattern::Empty, 0),
        (Pattern::Random, 1),
        (Pattern::Empty, 1),
        (Pattern::Random, 4097),
        (Pattern::Empty, 40 * MIB),
        (Pattern::HalfData, 40 * MIB),
        (Pattern::HalfData, 13 * MIB + 4097),
        (Pattern::Random, 9 * MIB + 12345),
    ] {
        let path = dir.path().join(format!("{pattern:?}-{size}.img"));
        make(&path, pattern, size, 21).unwrap();
        assert_eq!(
            checksum(&path, &[]),
            blkhash_file(&path),
            "{pattern:?} {size}"
        );
        assert_eq!(
            checksum(&path, &["--algorithm", "blkhash", "--threads", "1"]),
            blkhash_file(&path),
            "{pattern:?} {size}, one thread"
        );
    }
}

#[test]
fn block_hash_matches_the_field_notes_vectors() {
    let dir = scratch_dir();
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "A-B",
            vec![b'A'; B],
            "2e3a5f57d5e726ee5de62db1a85ff816f4fa6ea4627807d9a51bdc4c883e165e",
        ),
        (
            "zero-B",
            vec![0; B],
            "8ab067ab7939a3d4f40cbb118956c07c06aeae2d075d6e0a2ebbb94bd42832af",
        ),
        (
            "A-half-B",
            vec![b'A'; B / 2],
            "9467334d6d7668a2f06898185b5cddc78cdfbd962f50c6bf250101f03a0e54dc",
        ),
        (
            "zero-half-B",
            vec![0; B / 2],
            "842d185f0ff348b0d689e184bddc47f69a19032a6934c89b879479f1e86f9d56",
        ),
        (
            "zero-8B",
            vec![0; 8 * B],
            "722ac11a3a81034edf196aa3ee68d1a2e345cd0838b0c78c2ce2fb015d4d817d",
        ),
        (
            "zero-8B-half",
            vec![0; 8 * B + B / 2],
            "e623a5702b1feb08fbb3d18e35bbb7ec10146b8cd1bcff811200a3948c78c55c",
        ),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        assert_eq!(checksum(&path, &[]), expected, "{name}");
    }
    // 1 GiB of zeroes, as a hole: no reading needed, and still the vector.
    let path = dir.path().join("zero-1G");
    fs::File::create(&path).unwrap().set_len(1 << 30).unwrap();
    assert_eq!(
        checksum(&path, &[]),
        "c6d6562c3074a2caa0ceea3e1f460f3af678c792ed05e64157eb51e68ae5260d"
    );
}

#[test]
fn sha256_matches_sha256sum() {
    let dir = scratch_dir();
    for (pattern, size) in [
        (Pattern::Empty, 0),
        (Pattern::Random, 1),
        (Pattern::HalfData, 12 * MIB + 4097),
        (Pattern::Random, 3 * MIB),
    ] {
        let path = dir.path().join(format!("{pattern:?}-{size}.img"));
        make(&path, pattern, size, 22).unwrap();
        assert_eq!(
            checksum(&path, &["--algorithm", "sha256"]),
            sha256sum_tool(&path),
            "{pattern:?} {size}"
        );
    }
}

#[test]
fn several_images_and_file_urls() {
    let dir = scratch_dir();
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    make(&a, Pattern::HalfData, 3 * MIB, 23).unwrap();
    make(&b, Pattern::Random, MIB + 1, 24).unwrap();
    let url = format!("file://{}", b.display());
    let run = ferry!().run(["checksum".as_ref(), a.as_os_str(), url.as_ref()]);
    run.assert_success();
    assert_eq!(
        run.stdout,
        format!(
            "{}  {}\n{}  {url}\n",
            blkhash_file(&a),
            a.display(),
            blkhash_file(&b)
        )
    );
}

/// One bad image among good ones: the good ones are still printed, the bad one gets one
/// error line, and the exit code says something failed (as sha256sum does).
#[test]
fn a_missing_image_among_others_fails_the_command() {
    let dir = scratch_dir();
    let a = dir.path().join("a.img");
    make(&a, Pattern::HalfData, MIB, 25).unwrap();
    let missing = dir.path().join("missing.img");
    let run = ferry!().run(["checksum".as_ref(), missing.as_os_str(), a.as_os_str()]);
    assert!(!run.status.success(), "{run}");
    assert!(!run.panicked(), "{run}");
    assert_eq!(
        run.stdout,
        format!("{}  {}\n", blkhash_file(&a), a.display())
    );
    let lines: Vec<_> = run.stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("ferry: ") && lines[0].contains("missing.img"),
        "{run}"
    );
}
