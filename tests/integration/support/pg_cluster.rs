//! A private PostgreSQL cluster for the tests that restart the server.

use super::*;
use std::process::Command;

/// A private PostgreSQL cluster for tests that restart the server, so the
/// shared one stays up for everyone else. Stopped and removed on drop.
pub struct PgCluster {
    bin: PathBuf,
    data: PathBuf,
    /// The server's command-line options, given again when it is started after a stop.
    options: String,
    pub admin_url: String,
}

fn as_postgres(program: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl PgCluster {
    pub fn start() -> Self {
        let bin = PathBuf::from(std::env::var("INBOXD_TEST_PG_BIN").expect(
            "INBOXD_TEST_PG_BIN is not set: run the suite with scripts/test, which finds PostgreSQL",
        ));
        let data = PathBuf::from(format!("/tmp/inboxd-pg-{}", uuid::Uuid::new_v4().simple()));
        let port = free_port();
        let status = as_postgres(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8"])
            .stdout(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed");
        // Commit timestamps: the chaos test judges the order effects were
        // applied in by when their transactions committed (see
        // `chaos::customers_out_of_order`).
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c track_commit_timestamp=on",
            data.display()
        );
        let cluster = Self {
            bin,
            data,
            options,
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        };
        cluster.start_again();
        cluster
    }

    /// `pg_ctl stop -m fast`: every connection is dropped and the server stays down.
    pub fn stop(&self) {
        self.pg_ctl(&["stop", "-m", "fast"]);
    }

    /// Starts the server (again) on the same port and data directory.
    pub fn start_again(&self) {
        self.pg_ctl(&["start", "-o", &self.options]);
    }

    fn pg_ctl(&self, args: &[&str]) {
        let status = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .args(["-w", "-t", "60"])
            .args(args)
            .stdout(Stdio::null())
            .status()
            .expect("run pg_ctl");
        assert!(status.success(), "pg_ctl {args:?} failed");
    }

    /// `pg_ctl restart -m fast`: every connection is dropped, then the server comes back.
    pub fn restart(&self) {
        self.pg_ctl(&["restart", "-m", "fast"]);
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
