//! Log lines in the host's log, tagged with the handler, its version and the
//! event id. Bounded per event by the host (`limits.output_bytes`).

pub use crate::bindings::inboxd::handler::log::Level;

pub fn log(level: Level, message: &str) {
    crate::bindings::inboxd::handler::log::log(level, message);
}

#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Debug, &format!($($arg)+)) };
}

#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Info, &format!($($arg)+)) };
}

#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Warn, &format!($($arg)+)) };
}

#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log::log($crate::log::Level::Error, &format!($($arg)+)) };
}
