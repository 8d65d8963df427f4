// Write an Inboxd handler in JavaScript.
//
//   import { handler, reject, sql, outbox, log } from '../inboxd-guest/index.js';
//
//   export const handle = handler((event) => {
//     const order = event.json();                     // bad JSON: rejected
//     if (order.amount_cents < 0) throw reject('amount_cents must not be negative');
//     sql.execute('INSERT INTO invoices (order_id) VALUES ($1)', order.order_id);
//     outbox.publishJson('invoices.created', order.order_id, order);
//   });
//
// Everything `sql` writes and `outbox` publishes commits in the host's
// transaction, with its claim on the event id. Throw `reject(...)` for an
// event that can never succeed (dead-lettered at once) and `retry(...)` for a
// transient failure (rolled back, retried with backoff). Any other exception
// is a bug: its stack goes to stderr, which the host puts in the dead letter.
// Build with `jco componentize --bundle` so this module is bundled in.

import * as wit_sql from 'inboxd:handler/sql@0.1.0';
import * as wit_outbox from 'inboxd:handler/outbox@0.1.0';
import * as wit_log from 'inboxd:handler/log@0.1.0';

/** What the host receives: a `handler-error` variant. */
class HandlerError extends Error {
  constructor(tag, message) {
    super(message);
    // jco lowers the thrown value as the `handler-error` variant.
    this.tag = tag;
    this.val = message;
  }
}

export const reject = (message) => new HandlerError('reject', message);
export const retry = (message) => new HandlerError('retry', message);

const decoder = new TextDecoder();
const encoder = new TextEncoder();

/** One Kafka record whose event id the host has already claimed. */
class Event {
  constructor(raw) {
    Object.assign(this, raw);
  }
  /** The payload as JSON; any other payload is rejected, never retried. */
  json() {
    try {
      return JSON.parse(decoder.decode(this.payload));
    } catch (e) {
      throw reject(`the payload is not valid JSON: ${e.message}`);
    }
  }
  text() {
    return decoder.decode(this.payload);
  }
  header(name) {
    const found = this.headers.find(([key]) => key === name);
    return found ? found[1] : undefined;
  }
}

/** Wraps `fn(event)` as the component's `handle` export. */
export function handler(fn) {
  return (raw) => {
    try {
      fn(new Event(raw));
    } catch (e) {
      if (e instanceof HandlerError) throw e;
      // An uncaught exception would trap with the bindings' stack; print the
      // handler's own, so it lands in the dead letter.
      console.error(`${e && e.stack ? `${e}\n${e.stack}` : e}`);
      throw e;
    }
  };
}

function toValue(v) {
  if (v === null || v === undefined) return { tag: 'null' };
  if (typeof v === 'bigint') return { tag: 'int64', val: v };
  if (typeof v === 'number') {
    return Number.isInteger(v) ? { tag: 'int64', val: BigInt(v) } : { tag: 'float64', val: v };
  }
  if (typeof v === 'boolean') return { tag: 'boolean', val: v };
  if (typeof v === 'string') return { tag: 'text', val: v };
  if (v instanceof Uint8Array) return { tag: 'blob', val: v };
  throw new TypeError(`cannot pass ${typeof v} as an SQL parameter`);
}

function fromValue(v) {
  return v.tag === 'null' ? null : v.val;
}

/** Database errors are retried; every other statement failure is rejected. */
function sqlFailure(e) {
  const error = e && e.payload ? e.payload : e;
  if (error && error.tag === 'database') return retry(`database error: ${error.val}`);
  if (error && error.tag) return reject(`statement failed (${error.tag}): ${error.val}`);
  return e;
}

export const sql = {
  /** Runs one statement with `$1, $2, ...` parameters; returns the rows changed. */
  execute(statement, ...params) {
    try {
      return Number(wit_sql.execute(statement, params.map(toValue)));
    } catch (e) {
      throw sqlFailure(e);
    }
  },
  /** Runs one query; returns its rows as arrays of JS values (int64: BigInt). */
  query(statement, ...params) {
    try {
      return wit_sql.query(statement, params.map(toValue)).map((row) => row.map(fromValue));
    } catch (e) {
      throw sqlFailure(e);
    }
  },
  dialect: () => wit_sql.dialect(),
};

export const outbox = {
  /** Publishes bytes or a string; returns the message's event id. A refused message is retried. */
  publish(topic, key, payload) {
    const bytes = typeof payload === 'string' ? encoder.encode(payload) : payload;
    try {
      return wit_outbox.publish({ topic, key: encoder.encode(key), payload: bytes, headers: [] });
    } catch (e) {
      throw retry(`publishing to ${topic} failed: ${e && e.payload !== undefined ? e.payload : e}`);
    }
  },
  publishJson(topic, key, value) {
    return outbox.publish(topic, key, JSON.stringify(value));
  },
};

export const log = {
  debug: (message) => wit_log.log('debug', message),
  info: (message) => wit_log.log('info', message),
  warn: (message) => wit_log.log('warn', message),
  error: (message) => wit_log.log('error', message),
};
