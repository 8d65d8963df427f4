//! A consumed record's headers, read through librdkafka's C API.
//!
//! rdkafka's own reader (`BorrowedHeaders::try_get`) unwraps each header's
//! name as UTF-8, so one record whose producer named a header with other
//! bytes panicked the partition's task and shut the whole pump down, and
//! the same record came back after every restart (issue 23, fifth read).
//! Here a name that is not UTF-8 is read lossily (Kafka header names are
//! strings; every client that writes them writes UTF-8) and nothing panics.

use crate::record::HEADER_OVERHEAD;
use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;
use std::ffi::CStr;

/// What headers librdkafka cannot read weigh.
pub const UNREADABLE: usize = usize::MAX;

/// The headers of `message`, name and value, in order, as long as together
/// they weigh at most `keep` bytes (as [`crate::record::headers_bytes`] counts them), and
/// the weight of them all: past `keep`, names and values are measured, not copied.
pub fn headers_of(message: &BorrowedMessage<'_>, keep: usize) -> (Vec<(String, Vec<u8>)>, usize) {
    let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message.ptr()` is the live message `message` borrows; librdkafka
    // only writes the pointer to its headers, which live as long as it.
    let err = unsafe { rd::rd_kafka_message_headers(message.ptr(), &mut headers) };
    if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__NOENT {
        return (Vec::new(), 0);
    }
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        // librdkafka could not read them (more than 100,000, or malformed):
        // weighed as more than any bound, so the record is cut and never
        // run, rather than run as if it had none (the twenty-first read).
        return (Vec::new(), UNREADABLE);
    }
    // SAFETY: `headers` is the message's header list, checked non-null.
    let count = unsafe { rd::rd_kafka_header_cnt(headers) };
    let mut out = Vec::new();
    let mut weight = 0usize;
    for idx in 0..count {
        let (mut name, mut value, mut size) = (std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: `idx` is below the count; librdkafka writes a NUL-terminated
        // name and a value pointer (or NULL) with its size, owned by the list.
        let err = unsafe { rd::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: as above; both are copied before the next call.
        let name = unsafe { CStr::from_ptr(name) };
        let size = if value.is_null() { 0 } else { size };
        // A name is kept lossily: each byte that is not UTF-8 becomes three.
        let name_bytes = match name.to_str() {
            Ok(text) => text.len(),
            Err(_) => name.count_bytes().saturating_mul(3),
        };
        weight = weight.saturating_add(HEADER_OVERHEAD + name_bytes + size);
        if weight > keep {
            continue;
        }
        let value = if size == 0 {
            Vec::new()
        } else {
            // SAFETY: librdkafka gives `size` readable bytes at `value`.
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
        };
        out.push((name.to_string_lossy().into_owned(), value));
    }
    (out, weight)
}
