"""The server's log from Python: the same sink and the same line format as the C threads'
(ext/core/log.c: `<pid>:M 24 Nov 2026 10:00:00.123 * message`, one write() per line).

configure() points the process's log at a file or stderr with a level and routes the
"kvstore" logger (Python's own messages: banner, recovery, warnings) into it through a
logging.Handler that calls the C writer; reopen() is what SIGHUP does after logrotate.
The log is process-wide, as Redis's: the last configure() wins."""
import logging

from kvstore import errors
from kvstore._native import ffi, lib
from kvstore.config import LOG_LEVELS

# The levels' names, in the order of ext/core/log.h's KVLOG_DEBUG..KVLOG_WARNING (index = C level).
LEVELS = LOG_LEVELS
VERBOSE = 15  # Python level between DEBUG and INFO for Redis's "verbose"
# Python's level that lets exactly the C level's lines through (INFO is Redis's notice).
_PY_LEVEL = {"debug": logging.DEBUG, "verbose": VERBOSE, "notice": logging.INFO, "warning": logging.WARNING}

logger = logging.getLogger("kvstore")
_FORMATTER = logging.Formatter()


def c_level(levelno):
    """The C level (index in LEVELS) of a Python logging level number."""
    if levelno >= logging.WARNING:
        return 3
    if levelno >= logging.INFO:
        return 2
    return 1 if levelno >= VERBOSE else 0


class Handler(logging.Handler):
    """Writes each record as one line of the server's log (the C writer: same format,
    same file, one write() per line, so Python's lines never interleave with C's)."""

    def emit(self, record):
        try:
            msg = record.getMessage()
            if record.exc_info:  # the traceback on the same line: one record, one line
                msg += " | " + _FORMATTER.formatException(record.exc_info).replace("\n", " | ")
            lib.kvlog_raw(c_level(record.levelno), msg.encode("utf-8", errors="replace"))
        except Exception:  # a log line must never take the server down
            self.handleError(record)


def configure(level="notice", path=""):
    """Send the log (C's and the "kvstore" logger's) to path ("" = stderr) at level
    (debug, verbose, notice or warning). Raises ConfigError/ServerError if the file
    cannot be opened (the log then stays where it was)."""
    if level not in LEVELS:
        raise errors.ConfigError(f"log_level: expected one of {', '.join(LEVELS)}, got {level!r}")
    err = ffi.new("char[512]")
    rc = lib.kvlog_open(path.encode() if path else ffi.NULL, LEVELS.index(level), err, 512)
    errors.raise_for(rc, ffi.string(err).decode(errors="replace"))
    if not any(isinstance(h, Handler) for h in logger.handlers):
        logger.addHandler(Handler())
    # The server's own log: not also through the application's root handlers (twice on stderr).
    logger.propagate = False
    logger.setLevel(_PY_LEVEL[level])


def reopen():
    """Open the log file again by its path (after logrotate moved it away): SIGHUP's
    action. No-op when logging to stderr. Raises ServerError if it cannot be opened
    (the log stays on the old file, which also gets a warning line)."""
    rc = lib.kvlog_reopen()
    if rc < 0:
        raise errors.ServerError("cannot reopen the log file (see the log for why)", -rc)


def write_errors():
    """Lines lost because the log file could not be written."""
    return lib.kvlog_write_errors()
