//! One mode's consumer as a child process of the benchmark (a host from a
//! config file, or the plain consumer), so its CPU time and peak RSS are its
//! own: start it, signal it between phases, read the JSON lines it prints.

use crate::serve::ServeReport;
use anyhow::{Context, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::mpsc;

/// What a child runs.
pub enum Role<'a> {
    /// `inboxd-bench serve --config FILE [--native [--handler-ms MS]]`.
    Host {
        config: &'a Path,
        native: bool,
        handler_ms: u64,
    },
    /// `inboxd-bench serve-plain ...`.
    Plain {
        database: &'a str,
        brokers: &'a str,
        topics: &'a [String],
        group: &'a str,
        fetch_wait_ms: u32,
        /// Mode `po`: the topic its outbox goes to.
        outbox_topic: Option<&'a str>,
    },
}

pub struct Child {
    child: tokio::process::Child,
    pid: u32,
    lines: mpsc::UnboundedReceiver<String>,
    pub log: PathBuf,
}

impl Child {
    pub fn spawn(role: Role<'_>, log: &Path) -> anyhow::Result<Self> {
        let mut command = Command::new(std::env::current_exe()?);
        match role {
            Role::Host {
                config,
                native,
                handler_ms,
            } => {
                command.arg("serve").arg("--config").arg(config);
                if native {
                    command.arg("--native");
                    command.arg("--handler-ms").arg(handler_ms.to_string());
                }
            }
            Role::Plain {
                database,
                brokers,
                topics,
                group,
                fetch_wait_ms,
                outbox_topic,
            } => {
                command
                    .arg("serve-plain")
                    .args(["--database", database, "--brokers", brokers, "--group", group])
                    .arg("--topics")
                    .arg(topics.join(","))
                    .arg("--fetch-wait-ms")
                    .arg(fetch_wait_ms.to_string());
                if let Some(topic) = outbox_topic {
                    command.args(["--outbox-topic", topic]);
                }
            }
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().context("the child exited at once")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (send, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            pid,
            lines,
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fails if the child has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the child exited early ({status}); its log is {}",
                self.log.display()
            );
        }
        Ok(())
    }

    /// Ends a phase: SIGUSR1, then the latency line the child prints for it.
    pub async fn end_phase(&mut self) -> anyhow::Result<Value> {
        self.signal(libc::SIGUSR1)?;
        let line = tokio::time::timeout(Duration::from_secs(30), self.json_line())
            .await
            .context("the child printed no phase line within 30 s")??;
        Ok(line)
    }

    /// Stops the child (SIGTERM: it finishes its batches and leaves the
    /// group) and reads its report.
    pub async fn stop(mut self) -> anyhow::Result<ServeReport> {
        self.signal(libc::SIGTERM)?;
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("the child did not stop within 60 s")??;
        if !status.success() {
            bail!(
                "the child exited with {status}; its log is {}",
                self.log.display()
            );
        }
        let mut last = None;
        while let Some(line) = self.lines.recv().await {
            last = Some(line);
        }
        let line = last.context("the child printed no report")?;
        Ok(serde_json::from_str(&line)?)
    }

    async fn json_line(&mut self) -> anyhow::Result<Value> {
        loop {
            let line = self.lines.recv().await.context("the child closed its output")?;
            if let Ok(value @ Value::Object(_)) = serde_json::from_str(&line) {
                return Ok(value);
            }
        }
    }

    fn signal(&self, signal: libc::c_int) -> anyhow::Result<()> {
        // SAFETY: kill(2) on our own child's pid.
        if unsafe { libc::kill(self.pid as libc::pid_t, signal) } != 0 {
            bail!("signalling the child: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}
