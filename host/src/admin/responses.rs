//! How many responses the admin API holds at once, and for how long.
//!
//! A response is built whole before it is sent (one dead letter in full is
//! tens of megabytes once its payload and headers are escaped), and a client
//! that does not read it kept it in memory for as long as its connection
//! stayed open: a team token opening connection after connection, reading
//! none, held gigabytes (issue 23, the eighteenth read). Every request holds
//! a place from its start until its response is sent or dropped: a team
//! token at most [`TEAM_PLACES`] at once, requests without a known token
//! (`/metrics`, the console's files, refusals) [`OPEN_PLACES`] together;
//! admin tokens are the operator's and are not counted, nor are the probes
//! `/healthz` and `/readyz` and the scrapers' `/metrics`. A request
//! that finds no place within [`PLACE_WAIT`] gets 503. A response not sent
//! within [`SEND_DEADLINE`] is cut off with its connection, and a request
//! body (but an upload's) not read within [`BODY_READ`] fails its request.

use super::auth::Who;
use super::connections::{Marker, Serving};
use super::{ApiError, AppState};
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Requests (with their responses) one team token may have at once.
pub const TEAM_PLACES: usize = 8;
/// Requests without a known token the host serves at once, together
/// (`/metrics` and the probes aside).
pub const OPEN_PLACES: usize = 32;
/// How long a request waits for a place.
const PLACE_WAIT: Duration = Duration::from_secs(10);
/// How long a response may take to be sent, from when it is ready (a client
/// that reads nothing is closed sooner: `serve::SEND_STALL`).
pub const SEND_DEADLINE: Duration = Duration::from_secs(600);
/// How long a request's body may take to arrive, but an upload's (which has
/// its own, longer bound): hyper times nothing after the head, and a team
/// token sending a byte of a 64 KiB body every few seconds held a place and
/// a connection for good (the twentieth read).
pub const BODY_READ: Duration = Duration::from_secs(30);

/// The places: one set per team token, one for requests without one.
pub struct Places {
    teams: Mutex<HashMap<String, Arc<Semaphore>>>,
    open: Arc<Semaphore>,
    wait: Duration,
    deadline: Duration,
}

impl Default for Places {
    fn default() -> Self {
        Self::new(PLACE_WAIT, SEND_DEADLINE)
    }
}

impl Places {
    fn new(wait: Duration, deadline: Duration) -> Self {
        Self {
            teams: Mutex::default(),
            open: Arc::new(Semaphore::new(OPEN_PLACES)),
            wait,
            deadline,
        }
    }

    fn of(&self, who: &Who) -> Option<Arc<Semaphore>> {
        match who {
            Who::Admin => None,
            Who::Unknown => Some(self.open.clone()),
            Who::Team(name) => {
                let mut teams = self.teams.lock().unwrap_or_else(|p| p.into_inner());
                // One entry per configured team token: the names are the config's.
                Some(
                    teams
                        .entry(name.clone())
                        .or_insert_with(|| Arc::new(Semaphore::new(TEAM_PLACES)))
                        .clone(),
                )
            }
        }
    }

    /// A place for a request from `who` (`None`: an admin token needs none),
    /// or 503 after waiting.
    async fn take(&self, who: &Who) -> Result<Option<OwnedSemaphorePermit>, ApiError> {
        let Some(places) = self.of(who) else {
            return Ok(None);
        };
        match tokio::time::timeout(self.wait, places.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            _ => {
                let whose = match who {
                    Who::Team(name) => format!("token {name:?} has {TEAM_PLACES}"),
                    _ => format!("requests without a known token have {OPEN_PLACES}"),
                };
                Err(ApiError::unavailable(format!(
                    "too many requests at once: {whose} in progress or being sent (waited {:?})",
                    self.wait
                )))
            }
        }
    }

    /// `body`, holding `place` (and its connection's `serving` mark) until
    /// it is sent or dropped, and cut off at the deadline.
    fn hold(&self, body: Body, place: Option<OwnedSemaphorePermit>, serving: Option<Serving>) -> Body {
        Body::new(Held {
            body,
            rest: Bytes::new(),
            _place: place,
            _serving: serving,
            deadline: Box::pin(tokio::time::sleep(self.deadline)),
            limit: self.deadline,
        })
    }
}

/// Routes that take no place: the orchestrator's probes answer a few bytes
/// (`/readyz` from a cache), and must answer while others wait, or a flood
/// of requests without a token would get the host restarted; `/metrics`
/// answers from the counts read at most once a second, a few KB per
/// handler, and a scraper must not wait behind clients without a token that
/// hold every open place by reading their responses slowly (the
/// twenty-fourth read).
const PROBES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// The middleware: a place for the request, kept until its response is sent.
pub async fn hold_a_place(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if PROBES.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let who = state.tokens.who(request.headers().get(AUTHORIZATION));
    let place = match state.places.take(&who).await {
        Ok(place) => place,
        Err(refused) => return refused.into_response(),
    };
    // Serving from here, not while waiting for the place: only a request
    // with a place (or an admin token's) keeps its connection from being
    // closed for a newcomer (`connections.rs`), so how many can is bounded.
    let serving = request.extensions().get::<Marker>().map(Marker::serving);
    let request = if is_upload(&request) {
        request
    } else {
        request.map(|body| Body::new(ReadBy::new(body, BODY_READ)))
    };
    let (parts, body) = next.run(request).await.into_parts();
    Response::from_parts(parts, state.places.hold(body, place, serving))
}

/// `POST /v1/handlers/{name}`: an upload, whose body is read on its own terms.
fn is_upload(request: &Request) -> bool {
    let segments: Vec<&str> = request.uri().path().split('/').collect();
    request.method() == axum::http::Method::POST
        && matches!(segments.as_slice(), ["", "v1", "handlers", name] if !name.is_empty())
}

/// A request body that fails once it has taken `limit` to arrive.
struct ReadBy {
    body: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl ReadBy {
    fn new(body: Body, limit: Duration) -> Self {
        Self {
            body,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
        }
    }
}

impl HttpBody for ReadBy {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(format!(
                "the request's body did not arrive within {:?}",
                self.limit
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// What a response hands hyper at a time. hyper takes a body's frames as
/// fast as it gets them into its write buffer and drops the body once it
/// has the last one: a response of one frame (every response here is built
/// whole) gave its place back before a byte of it was sent (the nineteenth
/// read). In pieces, the body and its place last until its last piece is
/// taken, at most a piece and hyper's buffer from the end.
const PIECE: usize = 64 << 10;

/// A response body holding its request's place until it is sent (or dropped).
struct Held {
    body: Body,
    /// What is left of the last frame taken from `body`.
    rest: Bytes,
    _place: Option<OwnedSemaphorePermit>,
    _serving: Option<Serving>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            let late = format!("the response was not read within {:?}", self.limit);
            return Poll::Ready(Some(Err(axum::Error::new(late))));
        }
        if self.rest.is_empty() {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.rest = data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                other => return other,
            }
        }
        let piece = self.rest.len().min(PIECE);
        let data = self.rest.split_to(piece);
        Poll::Ready(Some(Ok(http_body::Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = http_body::SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A team token's ninth request waits for a place and is refused when
    /// none frees; a place is held by the response until its body is gone,
    /// and another team's places are its own.
    #[tokio::test]
    async fn a_team_has_its_places_and_a_response_holds_one_until_it_is_sent() {
        let places = Places::new(Duration::from_millis(100), SEND_DEADLINE);
        let billing = Who::Team("billing".into());
        let mut held = Vec::new();
        for _ in 0..TEAM_PLACES {
            let place = places.take(&billing).await.unwrap();
            held.push(places.hold(Body::from("x".repeat(1 << 20)), place, None));
        }
        let refused = places.take(&billing).await.unwrap_err();
        assert!(
            refused.message.contains("too many requests at once"),
            "{}",
            refused.message
        );
        assert!(places.take(&Who::Team("notify".into())).await.unwrap().is_some());
        assert!(places.take(&Who::Admin).await.unwrap().is_none(), "not counted");
        // A response is handed over in pieces, and holds its place until the
        // last one is taken.
        let mut body = held.pop().unwrap();
        assert_eq!(body.size_hint().exact(), Some(1 << 20));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), PIECE);
        assert!(places.take(&billing).await.is_err(), "still held");
        let rest = body.collect().await.unwrap().to_bytes();
        assert_eq!(first.len() + rest.len(), 1 << 20);
        assert!(places.take(&billing).await.unwrap().is_some());
    }

    /// A response its client does not read is cut off at the deadline, and
    /// its place is free again.
    #[tokio::test]
    async fn a_response_not_read_in_time_is_cut_off() {
        let places = Places::new(Duration::from_millis(100), Duration::from_millis(200));
        let who = Who::Unknown;
        let never = Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let mut body = places.hold(never, places.take(&who).await.unwrap(), None);
        let error = body.frame().await.unwrap().unwrap_err();
        assert!(error.to_string().contains("not read within 200ms"), "{error}");
        drop(body);
        for _ in 0..OPEN_PLACES {
            std::mem::forget(places.take(&who).await.unwrap());
        }
    }

    /// A request body that does not arrive fails at its deadline; one that
    /// does is read as it is.
    #[tokio::test]
    async fn a_request_body_must_arrive_in_time() {
        let never = Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let mut late = ReadBy::new(never, Duration::from_millis(100));
        let error = late.frame().await.unwrap().unwrap_err();
        assert!(
            error.to_string().contains("did not arrive within 100ms"),
            "{error}"
        );
        let sent = ReadBy::new(Body::from("{}"), Duration::from_millis(100));
        assert_eq!(sent.collect().await.unwrap().to_bytes(), "{}");
    }
}
