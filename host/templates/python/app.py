"""{{name}}: one `{{name}}_orders` row and one `orders.recorded` message per order
event, in the host's transaction. Written with the `inboxd_guest` helpers.

The host has already claimed the event id when `on_event` runs, so a
redelivered event never reaches it again.
"""

from inboxd_guest import Handler, log, outbox, reject, sql


class WitWorld(Handler):
    def on_event(self, event):
        order = event.json()  # a payload that is not JSON is rejected: parked at once
        try:
            order_id, amount = order["order_id"], order["amount_cents"]
        except (KeyError, TypeError) as e:
            raise reject(f"not an order event: missing {e}")
        if amount < 0:
            raise reject(f"amount_cents must not be negative, got {amount}")
        sql.execute(
            "INSERT INTO {{name}}_orders (order_id, amount_cents, event_id) VALUES ($1, $2, $3)",
            order_id, amount, event.id,
        )
        outbox.publish_json("orders.recorded", order_id, {"order_id": order_id, "amount_cents": amount})
        log.debug(f"recorded order {order_id}")
