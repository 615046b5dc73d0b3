//! Runs one copy the way a ferry mover pod does, for the mover-overhead benchmark
//! (tests/bench/cases/mover.py).
//!
//!     ferry-mover-job FERRY SRC DST [DST...]
//!
//! Starts `ferry serve` as the operator's mover pod runs it (a fresh data directory, a
//! bearer token, file endpoints confined to the images' directories, metrics off), waits
//! for the line it prints once it listens, starts the transfer (several DSTs are one
//! fan-out) with `ferry job start --watch` as the operator does over gRPC, and stops the
//! service with SIGTERM when the job has ended. Everything a mover adds to a copy is in
//! the measured time: the service's start, the job's admission and scheduling, the
//! progress stream and the shutdown; nothing else is (a Python driver cost tens of
//! milliseconds of interpreter start on its own). Exit status: the job client's. A
//! SIGTERM to this driver (first_byte.py stops it so) ends the service too.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

/// The service's pid, for the SIGTERM handler.
static SERVE_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn stop_service(_signal: libc::c_int) {
    let pid = SERVE_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill and _exit are async-signal-safe.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::_exit(143);
        }
    }
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(143) }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: ferry-mover-job FERRY SRC DST [DST...]");
        return ExitCode::from(2);
    }
    match run(&args[1], &args[2], &args[3..]) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferry-mover-job: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(ferry: &str, src: &str, dsts: &[String]) -> Result<ExitCode, String> {
    let src = absolute(src)?;
    let dsts = dsts
        .iter()
        .map(|d| absolute(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut roots: Vec<PathBuf> = std::iter::once(&src)
        .chain(&dsts)
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .collect();
    roots.sort();
    roots.dedup();

    let state = tempfile::Builder::new()
        .prefix("ferry-mover-")
        .tempdir()
        .map_err(|e| format!("cannot make a state directory: {e}"))?;
    let token = state.path().join("token");
    write_token(&token)?;

    let mut serve = Command::new(ferry);
    serve
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "off",
        ])
        .arg("--data-dir")
        .arg(state.path().join("data"))
        .arg("--auth-token-file")
        .arg(&token)
        .args(["--log-filter", "warn"]);
    for root in &roots {
        serve.arg("--allow-root").arg(root);
    }
    let mut serve = serve
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {ferry} serve: {e}"))?;
    SERVE_PID.store(serve.id() as i32, Ordering::SeqCst);
    // SAFETY: the handler only calls async-signal-safe functions.
    unsafe {
        libc::signal(
            libc::SIGTERM,
            stop_service as *const () as libc::sighandler_t,
        )
    };

    // Held until the service has ended, so that it never writes into a closed pipe.
    let mut output = BufReader::new(serve.stdout.take().ok_or("no stdout of ferry serve")?);
    let result = listening_address(&mut output).and_then(|addr| {
        Command::new(ferry)
            .args(["job", "--server", &format!("http://{addr}")])
            .arg("--token-file")
            .arg(&token)
            .args(["start", "--watch"])
            .arg(&src)
            .args(&dsts)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {ferry} job: {e}"))
    });
    // SAFETY: plain kill(2) of the child this process started.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let _ = serve.wait();
    drop(output);
    let status = result?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

fn absolute(path: &str) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("{path}: {e}"))
}

fn write_token(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut random))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, hex.as_bytes()))
        .map_err(|e| format!("cannot write the token file: {e}"))
}

/// The gRPC address from the line `ferry serve: grpc=ADDR metrics=...` the service prints
/// once it listens.
fn listening_address(output: &mut impl BufRead) -> Result<String, String> {
    let mut line = String::new();
    output
        .read_line(&mut line)
        .map_err(|e| format!("cannot read ferry serve's output: {e}"))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .map(str::to_string)
        .ok_or_else(|| format!("ferry serve ended before it listened (it printed {line:?})"))
}
