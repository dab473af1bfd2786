"""The compiled extension, imported in one place so a missing build gives one clear error."""
try:
    from kvstore._ext import ffi, lib  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "kvstore's C extension is not built: run `make dev` (or `pip install -e .`) "
        f"from the source tree ({e})"
    ) from e
