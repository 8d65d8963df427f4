//! How a guest call can fail: the guest's own failures, each counted against
//! the handler (the host's failures travel separately, see [`super::Invocation`]).

use crate::metrics::FailureKind;

/// Why a guest call did not succeed. Every variant is the guest's failure,
/// never the host's: database errors outside the guest's statements are
/// reported separately by the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestFailure {
    /// `handler-error::retry`.
    Retry(String),
    /// `handler-error::reject`: never retried.
    Reject(String),
    /// The guest trapped (a panic, `unreachable`, stack overflow...).
    Trap(String),
    /// The guest hit a configured limit.
    Limit(LimitExceeded),
}

impl GuestFailure {
    pub fn kind(&self) -> FailureKind {
        match self {
            GuestFailure::Retry(_) => FailureKind::Retry,
            GuestFailure::Reject(_) => FailureKind::Reject,
            GuestFailure::Trap(_) => FailureKind::Trap,
            GuestFailure::Limit(_) => FailureKind::Limit,
        }
    }
}

impl std::fmt::Display for GuestFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestFailure::Retry(m) => write!(f, "handler asked to retry: {m}"),
            GuestFailure::Reject(m) => write!(f, "handler rejected the event: {m}"),
            GuestFailure::Trap(m) => write!(f, "handler trapped: {m}"),
            GuestFailure::Limit(l) => write!(f, "{l}"),
        }
    }
}

/// A limit the guest ran into, named as in the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitExceeded {
    pub key: &'static str,
    pub detail: String,
}

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "limit {} exceeded: {}", self.key, self.detail)
    }
}
