// The invoicing handler in JavaScript: one `invoices` row per order-confirmed
// event and one `invoices.created` message, in the host's transaction.
import { handler, log, outbox, reject, sql } from '../inboxd-guest/index.js';

export const handle = handler((event) => {
  const order = event.json();
  const { order_id, customer_email, amount_cents } = order;
  if (typeof order_id !== 'string' || amount_cents === undefined) {
    throw reject('not an order-confirmed event: order_id and amount_cents are required');
  }
  if (amount_cents < 0) throw reject(`amount_cents must not be negative, got ${amount_cents}`);
  if (!customer_email.includes('@')) {
    throw reject(`customer_email ${JSON.stringify(customer_email)} is not an email address`);
  }
  sql.execute(
    'INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1, $2, $3, $4)',
    order_id, customer_email, amount_cents, event.id,
  );
  outbox.publishJson('invoices.created', order_id, { order_id, customer_email, amount_cents, order_event_id: event.id });
  log.debug(`invoiced order ${order_id}`);
});
