//! The fuzz smoke: runs a driver on its seeds and then on a fixed number of mutated inputs,
//! each in a worker thread under a wall-clock limit, so that the workspace's tests exercise
//! every fuzz target on stable Rust without libFuzzer. A panic, or an input that does not
//! finish within the limit, is a [`Failure`] that says how to reproduce it.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use crate::mutate::{Mutator, Rng};
use crate::{dict, Driver};

/// How long one input may take. The iSCSI session driver's timeouts are 10 s, so an input
/// that waits on one of them (a bug: the scripted target always closes its side) fails;
/// every other input takes milliseconds, which leaves room for a loaded machine.
pub const INPUT_LIMIT: Duration = Duration::from_secs(8);

/// The base seed of a run unless `FERRY_FUZZ_SMOKE_SEED` gives another (decimal or 0x-hex).
pub const DEFAULT_SEED: u64 = 0x00f3_7272_7966_757a;

/// The environment variable that picks another base seed (to explore, or to reproduce).
pub const SEED_VAR: &str = "FERRY_FUZZ_SMOKE_SEED";

/// The base seed from [`SEED_VAR`], else [`DEFAULT_SEED`].
pub fn seed_from_env() -> Result<u64, String> {
    let Ok(text) = std::env::var(SEED_VAR) else {
        return Ok(DEFAULT_SEED);
    };
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    parsed.map_err(|e| format!("{SEED_VAR}={text}: {e}"))
}

/// What one driver's smoke ran.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub inputs: usize,
    pub elapsed: Duration,
}

/// An input that made a driver panic or hang.
#[derive(Debug)]
pub struct Failure {
    pub driver: &'static str,
    /// The run's base seed: the same seed replays the same inputs.
    pub seed: u64,
    /// `seed-NAME` for a seed input, `mutant-N` for the N-th mutated input.
    pub label: String,
    /// "panicked: MESSAGE" or "did not finish within ...".
    pub what: String,
    pub input: Vec<u8>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let preview: String = self
            .input
            .iter()
            .take(64)
            .map(|b| format!("{b:02x}"))
            .collect();
        write!(
            f,
            "fuzz target {} {} on input {} ({} bytes: {preview}{}); reproduce with \
             {SEED_VAR}={:#x} cargo nextest run -p ferry-fuzz-drivers",
            self.driver,
            self.what,
            self.label,
            self.input.len(),
            if self.input.len() > 64 { "..." } else { "" },
            self.seed,
        )
    }
}

/// Runs `driver` on its seeds, then on `driver.inputs` mutated inputs derived from
/// `seed` and the driver's name; stops at the first input that panics or takes longer
/// than `limit`.
pub fn run(driver: &Driver, seed: u64, limit: Duration) -> Result<Summary, Failure> {
    let started = Instant::now();
    let fail = |label: String, what: String, input: Vec<u8>| Failure {
        driver: driver.name,
        seed,
        label,
        what,
        input,
    };
    let seeds = (driver.seeds)();
    let tokens = dict::parse(driver.dict).map_err(|e| {
        fail(
            "dictionary".into(),
            format!("has a bad dictionary: {e}"),
            vec![],
        )
    })?;
    let worker = Worker::spawn(driver)
        .map_err(|e| fail("none".into(), format!("could not start: {e}"), vec![]))?;
    for s in &seeds {
        worker
            .try_input(&s.bytes, limit)
            .map_err(|what| fail(format!("seed-{}", s.name), what, s.bytes.clone()))?;
    }
    let seed_bytes: Vec<Vec<u8>> = seeds.into_iter().map(|s| s.bytes).collect();
    let mutator = Mutator::new(&seed_bytes, &tokens, driver.max_len);
    let mut rng = Rng::new(seed ^ name_hash(driver.name));
    for n in 0..driver.inputs {
        let input = mutator.input(&mut rng);
        worker
            .try_input(&input, limit)
            .map_err(|what| fail(format!("mutant-{n}"), what, input))?;
    }
    Ok(Summary {
        inputs: seed_bytes.len() + driver.inputs,
        elapsed: started.elapsed(),
    })
}

/// FNV-1a, so that each driver gets its own input stream from one base seed.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A thread that runs the driver on the inputs it is sent, one at a time, and answers
/// each with its outcome. A hung input keeps the thread; the test fails and its process
/// ends, so it is not joined.
struct Worker {
    inputs: Sender<Vec<u8>>,
    outcomes: Receiver<Result<(), String>>,
}

impl Worker {
    fn spawn(driver: &Driver) -> std::io::Result<Self> {
        let (inputs, todo) = mpsc::channel::<Vec<u8>>();
        let (done, outcomes) = mpsc::channel();
        let run = driver.run;
        thread::Builder::new()
            .name(driver.name.to_string())
            .spawn(move || {
                for input in todo {
                    let outcome =
                        panic::catch_unwind(AssertUnwindSafe(|| run(&input))).map_err(message);
                    let failed = outcome.is_err();
                    if done.send(outcome).is_err() || failed {
                        return;
                    }
                }
            })?;
        Ok(Self { inputs, outcomes })
    }

    fn try_input(&self, input: &[u8], limit: Duration) -> Result<(), String> {
        self.inputs
            .send(input.to_vec())
            .map_err(|_| "stopped before this input".to_string())?;
        match self.outcomes.recv_timeout(limit) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(panic)) => Err(format!("panicked: {panic}")),
            Err(RecvTimeoutError::Timeout) => Err(format!("did not finish within {limit:?}")),
            Err(RecvTimeoutError::Disconnected) => Err("stopped on this input".to_string()),
        }
    }
}

fn message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_string()
    }
}
