"""Messages that leave only if the event's transaction commits."""

import json

from componentize_py_types import Err
from wit_world.imports import outbox as _outbox


def publish(topic: str, key: str, payload: bytes) -> str:
    """Publishes `payload` to `topic`; returns the message's event id.
    A refused message (a limit) raises `Retry`."""
    from . import Retry

    try:
        return _outbox.publish(_outbox.Message(topic=topic, key=key.encode(), payload=payload, headers=[]))
    except Err as e:
        raise Retry(f"publishing to {topic} failed: {e.value}") from None


def publish_json(topic: str, key: str, value) -> str:
    return publish(topic, key, json.dumps(value).encode())
