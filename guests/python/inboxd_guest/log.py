"""Log lines in the host's log, tagged with handler, version and event id."""

from wit_world.imports import log as _log


def debug(message: str) -> None:
    _log.log(_log.Level.DEBUG, message)


def info(message: str) -> None:
    _log.log(_log.Level.INFO, message)


def warn(message: str) -> None:
    _log.log(_log.Level.WARN, message)


def error(message: str) -> None:
    _log.log(_log.Level.ERROR, message)
