//! Compiling a component in a worker process with CPU and memory limits.
//!
//! Cranelift's time and memory grow with the shape of a component's code, and
//! a component is a team's input. `super::compile_bounds` refuses the shapes
//! known to be expensive, but it is a model, and every adversarial read of it
//! found a shape it priced too low. This is the wall behind it: the host runs
//! its own executable again as a compile worker, under `RLIMIT_CPU` and
//! `RLIMIT_AS`, hands it the component on stdin and reads the compiled
//! artifact from stdout. A compile that outgrows a limit ends the worker, not
//! the host, and the upload or load fails naming the limit and its key.
//!
//! The worker is `inboxd` itself, found as the running executable, or as an
//! `inboxd` beside it or one folder up (the test and benchmark binaries of
//! this workspace sit in `target/<profile>/deps` and `target/<profile>`). A
//! process that has none (a program embedding the library elsewhere, and this
//! crate's unit tests) compiles in-process behind the static bound alone, and
//! says so once in its log.

use super::engine::compile_config;
use super::{compile_bounds, image_bounds};
use crate::config::WasmConfig;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use wasmtime::Engine;

/// The first argument that makes `inboxd` a compile worker (checked by
/// [`serve_if_asked`] before the command line is parsed).
const WORKER_ARG: &str = "__compile-worker";

/// The worker's exit code for a component it refused or could not compile;
/// its stderr holds the reason.
const REFUSED: i32 = 3;

/// What one compile may spend (`[wasm]` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    pub cpu_seconds: u64,
    pub memory_mb: u64,
}

impl From<&WasmConfig> for CompileLimits {
    fn from(wasm: &WasmConfig) -> Self {
        Self {
            cpu_seconds: wasm.compile_cpu_seconds,
            memory_mb: wasm.compile_memory_mb,
        }
    }
}

impl CompileLimits {
    /// A worker that uses no CPU (blocked, which ours never is) is ended at
    /// this wall-clock time; a busy one meets `RLIMIT_CPU` well before.
    fn wall_clock(&self) -> Duration {
        Duration::from_secs(self.cpu_seconds.saturating_mul(4).max(30))
    }
}

/// Compiles `bytes` into an artifact for `engine`: in a worker process if
/// this process has one, else in-process behind the static bounds.
///
/// One compile at a time per host: each may take `compile_memory_mb` in its
/// worker and the artifact again in the host, and uploads arrive in
/// parallel; the compiler uses every core anyway.
pub(crate) fn precompile(engine: &Engine, limits: &CompileLimits, bytes: &[u8]) -> wasmtime::Result<Vec<u8>> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match worker() {
        Some(exe) => in_worker(exe, limits, bytes).map_err(wasmtime::Error::msg),
        None => {
            static_bounds(bytes).map_err(wasmtime::Error::msg)?;
            let artifact = engine.precompile_component(bytes)?;
            artifact_bound(bytes, &artifact).map_err(wasmtime::Error::msg)?;
            Ok(artifact)
        }
    }
}

/// What is refused before compiling: the compile work of its functions and
/// the zeros of its memory images.
fn static_bounds(bytes: &[u8]) -> Result<(), String> {
    compile_bounds::check(bytes)?;
    image_bounds::check(bytes)
}

/// The largest artifact a component of `component` bytes may compile to:
/// the repository's guests compile to 1.8-3.2 times their size.
fn max_artifact_bytes(component: usize) -> usize {
    component.saturating_mul(4).saturating_add(64 << 20)
}

/// Refuses an artifact past [`max_artifact_bytes`]: the host reads it,
/// keeps it while the version is loaded and stores it in the compile cache,
/// so a shape that compiles far larger than it is (none known past the
/// static bounds) is refused, not kept.
fn artifact_bound(component: &[u8], artifact: &[u8]) -> Result<(), String> {
    let most = max_artifact_bytes(component.len());
    if artifact.len() > most {
        return Err(format!(
            "it compiles to {} MiB, more than 4 times its size plus 64 MiB ({} MiB): the host keeps \
             the compiled form in memory and on disk",
            artifact.len().div_ceil(1 << 20),
            most >> 20
        ));
    }
    Ok(())
}

/// The executable that serves as compile worker, looked for once.
fn worker() -> Option<&'static Path> {
    static WORKER: OnceLock<Option<PathBuf>> = OnceLock::new();
    WORKER
        .get_or_init(|| {
            let found = find_worker();
            if found.is_none() {
                tracing::warn!(
                    "no inboxd executable to compile components in: compiling in-process, \
                     bounded by the static compile bound only"
                );
            }
            found
        })
        .as_deref()
}

fn find_worker() -> Option<PathBuf> {
    // Unit tests compile in-process: an `inboxd` in the target folder may be
    // from an older build, since `cargo test --lib` does not rebuild it.
    if cfg!(test) {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    if exe.file_name().is_some_and(|name| name == "inboxd") {
        return Some(exe);
    }
    let beside = exe.parent()?;
    [Some(beside), beside.parent()]
        .into_iter()
        .flatten()
        .map(|dir| dir.join("inboxd"))
        .find(|candidate| candidate.is_file())
}

/// Runs one compile in a worker; the error is the message the upload or load
/// reports.
fn in_worker(exe: &Path, limits: &CompileLimits, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new(exe)
        .arg(WORKER_ARG)
        .arg(limits.cpu_seconds.to_string())
        .arg(limits.memory_mb.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the compile worker {}: {e}", exe.display()))?;
    // The worker reads all its input before it writes anything, so stdin is
    // written first; stdout and stderr are drained on threads so that a full
    // pipe never stalls it. One byte past the bound is read to tell a
    // refused artifact from one that fits.
    let most = max_artifact_bytes(bytes.len()) as u64 + 1;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let artifact = std::thread::spawn(move || {
        let mut out = Vec::new();
        (&mut stdout).take(most).read_to_end(&mut out).map(|_| out)
    });
    let reason = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = (&mut stderr).take(64 << 10).read_to_string(&mut text);
        text
    });
    // A worker that ended early (a bad argument) closes its stdin: its exit
    // status below says why, not the broken pipe.
    let _ = child.stdin.take().expect("piped").write_all(bytes);

    let deadline = Instant::now() + limits.wall_clock();
    let (status, killed) = loop {
        match child.try_wait() {
            Ok(Some(status)) => break (status, false),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                break (child.wait().map_err(|e| e.to_string())?, true);
            }
            // Compiles take 0.1-15 s: a 10 ms poll costs nothing beside them.
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(error) => return Err(format!("waiting for the compile worker: {error}")),
        }
    };
    let artifact = artifact.join().expect("reader thread");
    let reason = reason.join().expect("reader thread");
    let reason = reason.trim();
    if killed {
        return Err(format!(
            "compiling the component took longer than {} s and was stopped",
            limits.wall_clock().as_secs()
        ));
    }
    if status.success() {
        let artifact = artifact.map_err(|e| format!("reading the compile worker's output: {e}"))?;
        artifact_bound(bytes, &artifact)?;
        return Ok(artifact);
    }
    if status.code() == Some(REFUSED) {
        // An mmap that `RLIMIT_AS` refused comes back as an error, not an abort.
        if reason.contains("os error 12") {
            return Err(format!(
                "{reason} (compiling the component needed more than {} MiB of memory: wasm.compile_memory_mb)",
                limits.memory_mb
            ));
        }
        return Err(reason.to_owned());
    }
    Err(match status.signal() {
        Some(libc::SIGXCPU) | Some(libc::SIGKILL) => format!(
            "compiling the component took more than {} s of CPU (wasm.compile_cpu_seconds) and was stopped",
            limits.cpu_seconds
        ),
        _ if reason.contains("memory allocation of") => format!(
            "compiling the component needed more than {} MiB of memory (wasm.compile_memory_mb) and was stopped",
            limits.memory_mb
        ),
        _ => format!("the compile worker failed ({status}): {reason}"),
    })
}

/// If this process was started as a compile worker, compiles the component
/// on stdin to stdout and exits; otherwise returns at once. Call it first
/// thing in `main`, before any thread or runtime starts.
pub fn serve_if_asked() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some(WORKER_ARG) {
        return;
    }
    let code = match serve(&args[1..]) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("{message}");
            REFUSED
        }
    };
    std::process::exit(code);
}

fn serve(args: &[String]) -> Result<(), String> {
    let [cpu_seconds, memory_mb] = args else {
        return Err(format!("usage: inboxd {WORKER_ARG} CPU_SECONDS MEMORY_MB"));
    };
    let number = |text: &String| text.parse::<u64>().map_err(|e| format!("{text:?}: {e}"));
    let (cpu_seconds, memory_mb) = (number(cpu_seconds)?, number(memory_mb)?);
    // Before the input is read: from here on, everything this process does
    // is shaped by a team's component. The soft CPU limit sends SIGXCPU,
    // which ends the process; the hard one, a second later, SIGKILL.
    set_limit(libc::RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)?;
    let bytes = memory_mb << 20;
    set_limit(libc::RLIMIT_AS, bytes, bytes)?;

    let mut component = Vec::new();
    std::io::stdin()
        .read_to_end(&mut component)
        .map_err(|e| format!("reading the component: {e}"))?;
    static_bounds(&component)?;
    let engine = Engine::new(&compile_config()).map_err(|e| format!("{e:#}"))?;
    let artifact = engine
        .precompile_component(&component)
        .map_err(|e| format!("{e:#}"))?;
    artifact_bound(&component, &artifact)?;
    // `process::exit` runs no destructors: flush here, not at scope end.
    let mut out = std::io::stdout().lock();
    out.write_all(&artifact)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the artifact: {e}"))
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> Result<(), String> {
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit reads the struct passed by reference and nothing else.
    if unsafe { libc::setrlimit(resource, &limit) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_artifact_past_four_times_its_component_plus_64_mib_is_refused() {
        let component = vec![0u8; 1 << 20];
        assert!(artifact_bound(&component, &vec![0u8; 68 << 20]).is_ok());
        let err = artifact_bound(&component, &vec![0u8; (68 << 20) + 1]).unwrap_err();
        assert!(
            err.contains("more than 4 times its size plus 64 MiB (68 MiB)"),
            "{err}"
        );
    }
}
