-- Outbox messages are relayed in insert order (`seq`) within their bucket.
--
-- 0001 numbered each bucket's messages from a per-bucket counter row that a
-- publishing transaction held locked until it committed. With partitions
-- processed in parallel, every batch of a busy handler touches most of the
-- 64 buckets, so the batches queued behind each other's commits (measured:
-- 22 of 25 samples of PostgreSQL's active queries waiting on that counter).
-- `seq` needs no lock. A partition's batches run one after another, so for
-- the messages one partition's events publish, insert order is commit
-- order; messages of transactions that ran at the same time have no order
-- between them to keep. The relay never skips a row that commits late: it
-- reads every unpublished row, whatever its seq.
DROP INDEX outbox_pending;
ALTER TABLE outbox DROP COLUMN bucket_seq;
CREATE INDEX outbox_pending ON outbox (bucket, seq) WHERE published_at IS NULL;
DROP TABLE outbox_sequences;
