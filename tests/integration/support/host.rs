//! A child `inboxd run` process and its log, killed on drop.

use super::*;
use std::process::{Child, Command, Stdio};

/// Starts `inboxd run` on a config file, logging to a file in `dir`.
pub fn spawn_inboxd(dir: &Path, config_path: &Path, vars: &[(&str, &str)]) -> HostProcess {
    let log_path = dir.join(format!("inboxd-{}.log", uuid::Uuid::new_v4().simple()));
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_inboxd"))
        .args(["run", "--config"])
        .arg(config_path)
        .env("INBOXD_LOG", "info,inboxd=debug")
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn inboxd");
    HostProcess { child, log_path }
}

/// An `inboxd run` child process; killed on drop so a failed test leaves nothing behind.
pub struct HostProcess {
    pub child: Child,
    log_path: PathBuf,
}

impl HostProcess {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Waits (bounded) for the process to exit by itself; returns its status.
    pub async fn exited(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        None
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// SIGKILL: no chance to commit anything.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL inboxd");
        self.child.wait().expect("reap inboxd");
    }

    /// SIGTERM, then waits (bounded) for a clean exit; returns the exit code.
    pub async fn terminate(&mut self, deadline: Duration) -> Option<i32> {
        // SAFETY: kill(2) on the PID of a child this test spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            if started.elapsed() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
