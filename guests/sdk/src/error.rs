//! What a handler returns when it cannot apply an event.

use crate::bindings::HandlerError;

/// `Ok(())` applies the event; an [`Error`] says what the host should do instead.
pub type Result<T = (), E = Error> = core::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Transient: the host rolls back and delivers the event again, with backoff.
    Retry(String),
    /// The event can never succeed: the host dead-letters it at once.
    Reject(String),
}

impl Error {
    pub(crate) fn into_wit(self) -> HandlerError {
        match self {
            Error::Retry(message) => HandlerError::Retry(message),
            Error::Reject(message) => HandlerError::Reject(message),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Retry(m) => write!(f, "retry: {m}"),
            Error::Reject(m) => write!(f, "reject: {m}"),
        }
    }
}

impl std::error::Error for Error {}
