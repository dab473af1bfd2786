"""kvstore: a durable in-memory key-value store for IoT ingestion, speaking RESP.

Public API: Store (embedded), Server (serve a Store in this process), Client (redis-py
plus kvstore stats), Node (a server process managed from Python), BlockDevice (a block
device over the store, served by NBD), Cluster / AsyncCluster (a local sharded cluster
that Redis Cluster clients use), bench (C load generator)."""
__version__ = "0.1.0"

from kvstore.errors import (ConfigError, CorruptDataFileError, CorruptLogError, IntegerOverflowError, KVError, NotAnIntegerError,  # noqa: E402
                            OutOfMemoryError, ProtocolError, ServerError, TooLargeError)
from kvstore.store import Store  # noqa: E402
from kvstore.server import Server  # noqa: E402
from kvstore.client import Client  # noqa: E402
from kvstore.node import Node  # noqa: E402
from kvstore.blockdev import BlockDevice  # noqa: E402
from kvstore.cluster import AsyncCluster, Cluster  # noqa: E402

__all__ = ["Store", "Server", "Client", "Node", "BlockDevice", "Cluster", "AsyncCluster", "KVError", "ConfigError", "OutOfMemoryError",
           "NotAnIntegerError", "IntegerOverflowError", "CorruptLogError", "CorruptDataFileError", "TooLargeError", "ServerError", "ProtocolError"]
