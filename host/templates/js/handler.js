// {{name}}: one `{{name}}_orders` row and one `orders.recorded` message per order
// event, in the host's transaction. Written with the inboxd-guest helpers.
//
// The host has already claimed the event id when the handler runs, so a
// redelivered event never reaches it again.
import { handler, log, outbox, reject, sql } from './inboxd-guest/index.js';

export const handle = handler((event) => {
  const order = event.json(); // a payload that is not JSON is rejected: parked at once
  const { order_id, amount_cents } = order ?? {};
  if (typeof order_id !== 'string' || typeof amount_cents !== 'number') {
    throw reject('not an order event: order_id (text) and amount_cents (a number) are required');
  }
  if (amount_cents < 0) throw reject(`amount_cents must not be negative, got ${amount_cents}`);
  sql.execute(
    'INSERT INTO {{name}}_orders (order_id, amount_cents, event_id) VALUES ($1, $2, $3)',
    order_id, amount_cents, event.id,
  );
  outbox.publishJson('orders.recorded', order_id, { order_id, amount_cents });
  log.debug(`recorded order ${order_id}`);
});
