//! Makes a seeded test image: `ferry-mkimage PATTERN SIZE PATH [SEED]`, where PATTERN is
//! empty, half (50% data in scattered 1 MiB runs with zero 4 KiB blocks inside) or random.
//! The benchmark harness uses it so that benchmarks and tests share one image generator.

use std::path::PathBuf;
use std::process::ExitCode;

use ferry_core::size::parse_size;
use ferry_tests::images::{make, Pattern};

const USAGE: &str = "usage: ferry-mkimage empty|half|random SIZE PATH [SEED]";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ferry-mkimage: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let [pattern, size, path, rest @ ..] = args.as_slice() else {
        return Err(USAGE.to_string());
    };
    let pattern: Pattern = pattern.parse()?;
    let size = parse_size(size).map_err(|e| e.to_string())?;
    let seed = match rest {
        [] => 1,
        [seed] => seed
            .parse()
            .map_err(|_| format!("invalid seed '{seed}': expected a number"))?,
        _ => return Err(USAGE.to_string()),
    };
    let path = PathBuf::from(path);
    let image = make(&path, pattern, size, seed).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "{} {:?} size={} nonzero_block_bytes={} written={}",
        path.display(),
        pattern,
        image.size,
        image.nonzero_block_bytes,
        image.written_bytes
    );
    Ok(())
}
