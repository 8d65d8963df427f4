//! CPU time and minor faults of the processes a mode runs on, from `/proc`:
//! the host (or plain consumer) child, every `postgres` process, and the
//! broker. Sampled at the first and the last commit of the backlog, their
//! differences per event are the unit issue 24 cuts cost in.

use serde_json::{Value, json};

/// Cumulative counters of one group of processes.
#[derive(Clone, Copy, Default)]
pub struct Usage {
    /// utime + stime, in clock ticks.
    ticks: u64,
    minflt: u64,
}

impl Usage {
    /// One process's counters; zero once it is gone.
    pub fn of_pid(pid: u32) -> Self {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
            .unwrap_or_default()
    }

    /// The summed counters of every live process whose name is `comm`.
    pub fn of_name(comm: &str) -> Self {
        let mut sum = Self::default();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return sum;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            if stat_comm(&stat) == Some(comm) {
                let one = parse_stat(&stat).unwrap_or_default();
                sum.ticks += one.ticks;
                sum.minflt += one.minflt;
            }
        }
        sum
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            ticks: self.ticks.saturating_sub(earlier.ticks),
            minflt: self.minflt.saturating_sub(earlier.minflt),
        }
    }
}

/// The processes of one run, sampled together.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    host: Usage,
    postgres: Usage,
    broker: Usage,
}

impl Sample {
    pub fn take(host_pid: u32) -> Self {
        Self {
            host: Usage::of_pid(host_pid),
            postgres: Usage::of_name("postgres"),
            broker: Usage::of_name("tansu"),
        }
    }

    /// Microseconds of CPU per event for each process group between two
    /// samples, and the host's minor faults per event.
    pub fn per_event(self, earlier: Self, events: i64) -> Value {
        let events = events.max(1) as f64;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let us = |u: Usage| (u.ticks as f64 / hz * 1e6 / events * 10.0).round() / 10.0;
        let host = self.host.since(earlier.host);
        let postgres = self.postgres.since(earlier.postgres);
        let broker = self.broker.since(earlier.broker);
        json!({
            "host_cpu_us": us(host),
            "postgres_cpu_us": us(postgres),
            "broker_cpu_us": us(broker),
            "host_plus_db_cpu_us": us(Usage { ticks: host.ticks + postgres.ticks, minflt: 0 }),
            "host_minflt": (host.minflt as f64 / events * 10.0).round() / 10.0,
        })
    }
}

/// The name in `/proc/PID/stat`: between the first `(` and the last `)`.
fn stat_comm(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

/// minflt is field 10, utime 14, stime 15 (1-based, proc(5)); the fields
/// after the name are split from its closing parenthesis, which starts at 3.
fn parse_stat(stat: &str) -> Option<Usage> {
    let rest: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3)?.parse::<u64>().ok();
    Some(Usage {
        ticks: field(14)? + field(15)?,
        minflt: field(10)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 777 0 0 0 150 25 0 0 20 0 1 0 1 1 1";
        assert_eq!(stat_comm(stat), Some("a (b) c"));
        let usage = parse_stat(stat).expect("parsed");
        assert_eq!((usage.ticks, usage.minflt), (175, 777));
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(Usage::of_pid(std::process::id()).ticks > 0);
    }
}
