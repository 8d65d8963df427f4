"""The invoicing handler in Python: one `invoices` row per order-confirmed
event and one `invoices.created` message, in the host's transaction."""

from inboxd_guest import Handler, log, outbox, reject, sql


class WitWorld(Handler):
    def on_event(self, event):
        order = event.json()
        try:
            order_id, email, amount = order["order_id"], order["customer_email"], order["amount_cents"]
        except (KeyError, TypeError) as e:
            raise reject(f"not an order-confirmed event: missing {e}")
        if amount < 0:
            raise reject(f"amount_cents must not be negative, got {amount}")
        if "@" not in email:
            raise reject(f"customer_email {email!r} is not an email address")
        sql.execute(
            "INSERT INTO invoices (order_id, customer_email, amount_cents, event_id) VALUES ($1, $2, $3, $4)",
            order_id, email, amount, event.id,
        )
        created = {"order_id": order_id, "customer_email": email, "amount_cents": amount, "order_event_id": event.id}
        outbox.publish_json("invoices.created", order_id, created)
        log.debug(f"invoiced order {order_id}")
