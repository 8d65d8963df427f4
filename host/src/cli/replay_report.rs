//! How `inboxd dlq replay` reports its outcomes: each printed as it comes,
//! none kept. A handler may have millions of parked letters, and a report
//! that collected them all held one outcome per letter (issue 23, fifth
//! read); only the counts are kept for the exit status.
//!
//! With `--json` the output is still one JSON array, written element by element.

use super::CliError;
use crate::replay::ReplayOutcome;

pub struct Report {
    json: bool,
    shown: usize,
    failures: usize,
}

impl Report {
    pub fn start(json: bool) -> Self {
        if json {
            println!("[");
        }
        Report {
            json,
            shown: 0,
            failures: 0,
        }
    }

    /// One letter's outcome; `Err` is the host's failure for it.
    pub fn push(&mut self, id: i64, outcome: &Result<ReplayOutcome, String>) {
        if matches!(
            outcome,
            Err(_) | Ok(ReplayOutcome::Failed(_) | ReplayOutcome::NoEventId | ReplayOutcome::HeldBehind(_))
        ) {
            self.failures += 1;
        }
        if self.json {
            let mut value = match outcome {
                Ok(outcome) => serde_json::to_value(outcome).unwrap_or_default(),
                Err(error) => serde_json::json!({ "outcome": "error", "detail": error }),
            };
            value["id"] = id.into();
            let comma = if self.shown == 0 { "" } else { "," };
            println!("{comma}{value}");
        } else {
            println!("{}", line(id, outcome));
        }
        self.shown += 1;
    }

    /// Closes the output; an error when any letter was not replayed.
    pub fn finish(self) -> Result<(), CliError> {
        if self.json {
            println!("]");
        } else if self.shown == 0 {
            println!("no parked dead letters to replay");
        }
        if self.failures > 0 {
            return Err(CliError::Failed(format!(
                "{} of {} dead letters were not replayed; see `inboxd dlq show ID`",
                self.failures, self.shown
            )));
        }
        Ok(())
    }
}

fn line(id: i64, outcome: &Result<ReplayOutcome, String>) -> String {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => return format!("{id}: not replayed, the host failed ({error}); run it again"),
    };
    match outcome {
        ReplayOutcome::Replayed => format!("{id}: replayed"),
        ReplayOutcome::AlreadyApplied => format!("{id}: already applied by another replay; nothing to do"),
        ReplayOutcome::AlreadyResolved(how) => format!("{id}: already {how}; nothing to do"),
        ReplayOutcome::NoEventId => {
            format!("{id}: has no event id, so it can never be deduplicated: discard it")
        }
        ReplayOutcome::Failed(reason) => format!("{id}: failed again, still parked: {reason}"),
        ReplayOutcome::DuplicateByKey => format!(
            "{id}: another event with its business key was applied meanwhile; marked replayed, not run"
        ),
        ReplayOutcome::Discarded => format!("{id}: held behind it, discarded with it"),
        ReplayOutcome::HeldBehind(first) => {
            format!("{id}: held behind dead letter {first} of its key: replay or discard {first} first")
        }
    }
}
