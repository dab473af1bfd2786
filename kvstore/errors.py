"""Exceptions raised by kvstore, and the one place C error codes become them."""
import errno
import os


class KVError(Exception):
    """Base class of every kvstore error."""


class ConfigError(KVError, ValueError):
    """A setting is invalid; the message says which and what is accepted."""


class OutOfMemoryError(KVError, MemoryError):
    """A write would pass the store's memory bound (nothing was evicted)."""


class NotAnIntegerError(KVError, ValueError):
    """INCR-family operation on a value that is not a 64-bit decimal integer."""


class IntegerOverflowError(KVError, OverflowError):
    """An increment would overflow a signed 64-bit integer."""


class TooLargeError(KVError, ValueError):
    """A key or value is longer than 512 MiB."""


class WrongTypeError(KVError, TypeError):
    """A string operation on a key that holds another type (a hash), as Redis's WRONGTYPE."""


class ServerError(KVError, OSError):
    """The server could not be created, started or reached; .errno holds the C code if any."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.errno = code

    def __str__(self):
        return str(self.args[0])


class CorruptLogError(KVError, ValueError):
    """The durability log is damaged before its end; nothing after the damage was applied."""


class CorruptDataFileError(KVError, ValueError):
    """A block of the BOSC data file failed its checks (checksum, number, chain);
    the message names the file, the block and what was wrong."""


class ProtocolError(KVError, ValueError):
    """Malformed RESP input."""


def raise_for(rc, message="", hint=None, damaged=CorruptDataFileError):
    """Map a negative C return code (-errno) to the matching exception; rc >= 0 is returned.

    message: the C function's own text (its err buffer), if any.
    hint: advice added after the message, as "<message>. <hint>": a string for any code,
    or a dict {errno code: advice} for some codes only.
    damaged: the class for EILSEQ (checks failed on data read back): CorruptDataFileError,
    or CorruptLogError for the log."""
    if rc >= 0:
        return rc
    code = -rc
    if isinstance(hint, dict):
        hint = hint.get(code)
    if hint:
        message = f"{message}. {hint}" if message else hint
    text = message or os.strerror(code)
    if code == errno.ENOMEM:
        raise OutOfMemoryError(text or "out of memory: the store's max_memory bound was reached")
    if code == errno.E2BIG:
        raise TooLargeError(text or "key or value longer than 512 MiB")
    if code == errno.EINVAL:
        raise ConfigError(text)
    if code == errno.EAGAIN:
        raise ServerError(message or "durability log backlog full: write refused, retry", code)
    if code == errno.EILSEQ:
        raise damaged(text)
    if code == errno.EPROTOTYPE:
        raise WrongTypeError(message or "WRONGTYPE Operation against a key holding the wrong kind of value")
    if code == errno.EIO:
        raise ServerError(message or "durability log cannot be written (see the server's log): write refused",
                          code)
    raise ServerError(text, code)
