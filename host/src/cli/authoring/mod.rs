//! Commands for the teams that write handlers: `check`, `test`, `new` and
//! `build`. None of them needs a broker or a running host; `check` and
//! `test` upload to a throwaway one ([`scratch`]) through the API's own code.

pub mod build;
pub mod check;
mod events;
mod expect;
pub mod new;
pub mod run_events;
mod scratch;
