//! The short fuzz smoke of the README's test command: every fuzz target's body on its
//! seeds and a few thousand deterministic mutations of them, in parallel, each input under
//! [`smoke::INPUT_LIMIT`]. A failing input is saved under the test's temporary directory
//! (replay it with `cargo +nightly fuzz run TARGET FILE` or a unit test calling the
//! driver) and the message names the seed that replays the whole run.

use std::path::PathBuf;
use std::thread;
use std::time::Duration;

use ferry_fuzz_drivers::seeds::Seed;
use ferry_fuzz_drivers::smoke::{self, Failure};
use ferry_fuzz_drivers::{Driver, DRIVERS};

fn save(failure: &Failure) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
    let path = dir.join(format!("{}-{}", failure.driver, failure.label));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &failure.input)) {
        Ok(()) => format!("{failure}; input saved as {}", path.display()),
        Err(e) => format!(
            "{failure}; could not save the input as {}: {e}",
            path.display()
        ),
    }
}

#[test]
fn every_fuzz_target_survives_its_seeds_and_mutations() {
    let seed = smoke::seed_from_env().unwrap_or_else(|e| panic!("{e}"));
    let outcomes: Vec<_> = thread::scope(|scope| {
        let runs: Vec<_> = DRIVERS
            .iter()
            .map(|driver| scope.spawn(move || smoke::run(driver, seed, smoke::INPUT_LIMIT)))
            .collect();
        runs.into_iter().map(|run| run.join()).collect()
    });
    let mut failures = Vec::new();
    for (driver, outcome) in DRIVERS.iter().zip(outcomes) {
        match outcome {
            Ok(Ok(summary)) => eprintln!(
                "{}: {} inputs in {:.1?}",
                driver.name, summary.inputs, summary.elapsed
            ),
            Ok(Err(failure)) => failures.push(save(&failure)),
            Err(_) => failures.push(format!("{}: the smoke itself panicked", driver.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every cargo-fuzz target has a driver here and calls it, and every driver is a target.
#[test]
fn the_driver_table_matches_the_cargo_fuzz_targets() {
    let fuzz = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz");
    let manifest = std::fs::read_to_string(format!("{fuzz}/Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut in_bin = false;
    let mut targets = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if let Some(name) = line.strip_prefix("name = \"").filter(|_| in_bin) {
            targets.push(name.trim_end_matches('"').to_string());
        }
    }
    let mut drivers: Vec<_> = DRIVERS.iter().map(|d| d.name.to_string()).collect();
    targets.sort();
    drivers.sort();
    assert_eq!(targets, drivers, "fuzz/Cargo.toml [[bin]]s vs DRIVERS");
    for name in &targets {
        let path = format!("{fuzz}/fuzz_targets/{name}.rs");
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let call = format!("ferry_fuzz_drivers::{name}(");
        assert!(source.contains(&call), "{path} does not call {call}..)");
    }
}

fn panics_on_x(data: &[u8]) {
    assert!(!data.contains(&b'X'), "found an X");
}

fn sleeps_on_x(data: &[u8]) {
    if data.contains(&b'X') {
        thread::sleep(Duration::from_secs(5));
    }
}

fn abc() -> Vec<Seed> {
    vec![Seed {
        name: "abc".into(),
        bytes: b"abc".to_vec(),
    }]
}

fn fake(name: &'static str, run: fn(&[u8])) -> Driver {
    Driver {
        name,
        run,
        seeds: abc,
        dict: "\"X\"",
        inputs: 10_000,
        max_len: 64,
    }
}

/// The smoke is not vacuous: a driver that panics, or hangs, on some input fails it, and
/// the failure carries that input and the seed.
#[test]
fn the_smoke_catches_a_panic_and_a_hang() {
    // The panic gets the full limit: the panic hook may print a backtrace first.
    let panic = smoke::run(&fake("fake", panics_on_x), 1, smoke::INPUT_LIMIT).expect_err("a panic");
    assert!(panic.what.contains("panicked: found an X"), "{panic}");
    assert!(panic.input.contains(&b'X') && panic.label.starts_with("mutant-"));
    assert!(
        panic.to_string().contains("FERRY_FUZZ_SMOKE_SEED=0x1 "),
        "{panic}"
    );
    let limit = Duration::from_millis(200);
    let hang = smoke::run(&fake("fake", sleeps_on_x), 1, limit).expect_err("a hang");
    assert!(hang.what.contains("did not finish within 200ms"), "{hang}");
    assert_eq!(
        hang.label, panic.label,
        "the same seed gives the same inputs"
    );
}

/// The dictionaries the smoke and libFuzzer share parse, with every token.
#[test]
fn the_dictionaries_parse() {
    let nbd = ferry_fuzz_drivers::dict::parse(ferry_fuzz_drivers::NBD_DICT).expect("nbd.dict");
    let iscsi =
        ferry_fuzz_drivers::dict::parse(ferry_fuzz_drivers::ISCSI_DICT).expect("iscsi.dict");
    let nfs = ferry_fuzz_drivers::dict::parse(ferry_fuzz_drivers::NFS_DICT).expect("nfs.dict");
    assert_eq!((nbd.len(), iscsi.len(), nfs.len()), (11, 36, 28));
    assert!(nbd.contains(&b"base:allocation".to_vec()));
    assert!(iscsi.contains(&vec![0xff; 4]));
    assert!(nfs.contains(&53u32.to_be_bytes().to_vec()), "OP_SEQUENCE");
}
