"""Write an Inboxd handler in Python.

Subclass `Handler`, name the class `WitWorld` (componentize-py looks for
it), and implement `on_event`::

    from inboxd_guest import Handler, reject, sql, outbox, log

    class WitWorld(Handler):
        def on_event(self, event):
            order = event.json()                      # bad JSON: rejected
            if order["amount_cents"] < 0:
                raise reject("amount_cents must not be negative")
            sql.execute("INSERT INTO invoices (order_id) VALUES ($1)", order["order_id"])
            outbox.publish_json("invoices.created", order["order_id"], order)

Everything `sql` writes and `outbox` publishes commits in the host's
transaction, together with its claim on the event id. Raise `reject(...)`
for an event that can never succeed (dead-lettered at once) and `retry(...)`
for a transient failure (rolled back and retried with backoff). Any other
exception is a bug: its traceback goes to stderr, which the host puts in the
dead letter, and the event is retried, then parked.
"""

import json as _json
import sys
import traceback

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

from . import log, outbox, sql

__all__ = ["Event", "Handler", "Reject", "Retry", "reject", "retry", "sql", "outbox", "log"]


class Reject(Exception):
    """The event can never succeed: the host dead-letters it at once."""


class Retry(Exception):
    """A transient failure: the host rolls back and delivers the event again."""


def reject(message: str) -> Reject:
    return Reject(message)


def retry(message: str) -> Retry:
    return Retry(message)


class Event:
    """One Kafka record whose event id the host has already claimed."""

    def __init__(self, raw: types.Event):
        self.raw = raw
        self.id = raw.id
        self.topic = raw.topic
        self.partition = raw.partition
        self.offset = raw.offset
        self.key = raw.key
        self.payload = raw.payload
        self.timestamp_ms = raw.timestamp_ms
        self.attempt = raw.attempt

    def header(self, name: str):
        """The first header with this name, as bytes, or None."""
        return next((value for key, value in self.raw.headers if key == name), None)

    def json(self):
        """The payload as JSON; any other payload is rejected, never retried."""
        try:
            return _json.loads(self.payload)
        except ValueError as e:
            raise Reject(f"the payload is not valid JSON: {e}") from None


class Handler(wit_world.WitWorld):
    """Turns `on_event`'s outcome into what the host understands."""

    def on_event(self, event: Event) -> None:
        raise NotImplementedError("implement on_event(self, event)")

    def handle(self, event: types.Event) -> None:
        try:
            self.on_event(Event(event))
        except Reject as e:
            raise Err(types.HandlerError_Reject(str(e))) from None
        except Retry as e:
            raise Err(types.HandlerError_Retry(str(e))) from None
        except sql.SqlError as e:
            raise Err(e.as_handler_error()) from None
        except BaseException:
            # componentize-py turns an uncaught exception into a trap without
            # its traceback; print it first, so it lands in the dead letter.
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            raise
