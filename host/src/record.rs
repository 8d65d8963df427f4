//! A Kafka record as the pipeline sees it: owned, so it outlives the consumer's
//! buffer while its transaction (and any retries) run.

#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
    pub timestamp_ms: Option<i64>,
}
