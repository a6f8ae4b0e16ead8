"""The TCPStores of the learner group and of the broadcast weight push: bound to one address, and
nothing read from them is trusted.

A torch TCPStore has no authentication, and its master listens on every interface unless handed
a socket. So the rank that hosts one first reserves its address (``reserve_address``: a socket
bound to this node's IP, the one the other ranks use, and listening; the OS picks a free port,
with no window in which another process could take it; the address is then published to the other
ranks) and ``open_store`` makes the master store adopt that very socket (``master_listen_fd``).
Where another process starts the ranks (a launcher, a test), it binds the socket the same way and
hands it to the hosting rank (``adopt_listener``). A port chosen free and bound later can be taken
in between, on any node where Ray and other jobs open ports: nothing here does that. Nothing listens
on 0.0.0.0 or [::].

What crosses a store is data, never code: the weight push's bucket metadata is JSON
(``encode_meta``), and ``decode_meta`` accepts only a bounded list of (name, dtype, shape, offset)
entries whose dtypes are plain tensor dtypes and whose tensors lie inside the bucket.
"""
from __future__ import annotations

import json
import socket
from datetime import timedelta
from typing import Any, Optional

import torch
import torch.distributed as dist

MAX_META_BYTES = 16 << 20
MAX_RESERVED = 32  # addresses reserved and not yet adopted by a store (older ones are closed)
DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}
_reserved: dict[tuple[str, int], socket.socket] = {}


def listening_socket(host: str) -> socket.socket:
    """A socket bound to ``host`` at a port the OS picks, listening: from here on no other process
    can take that port. Hand it to the process that hosts the store (``adopt_listener``), or let
    ``reserve_address`` hold it in this one."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(1024)
    return sock


def reserve_address(host: str) -> tuple[str, int]:
    """(host, port) of a socket bound to ``host`` and listening, held for ``open_store``."""
    return adopt_listener(listening_socket(host), host)


def adopt_listener(sock: socket.socket | int, host: Optional[str] = None) -> tuple[str, int]:
    """Hold a listening socket (``listening_socket``'s, or its descriptor inherited from a launcher
    that bound it for the ranks it starts) for ``open_store`` at its (host, port); returns them."""
    sock = sock if isinstance(sock, socket.socket) else socket.socket(fileno=sock)
    address = (host or sock.getsockname()[0], int(sock.getsockname()[1]))
    _reserved[address] = sock
    while len(_reserved) > MAX_RESERVED:
        _reserved.pop(next(iter(_reserved))).close()
    return address


def open_store(host: str, port: int, *, is_master: bool, timeout: timedelta, world_size: Optional[int] = None,
               wait_for_workers: bool = False) -> dist.TCPStore:
    """The store at (host, port); the master adopts the socket ``reserve_address`` bound there
    (or binds one to ``host`` itself), so it never listens on every interface."""
    if not is_master:
        return dist.TCPStore(host, port, world_size=world_size, is_master=False, timeout=timeout)
    sock = _reserved.pop((host, port), None)
    if sock is None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
    fd = sock.detach()  # the store owns the descriptor from here on
    return dist.TCPStore(host, port, world_size=world_size, is_master=True, timeout=timeout,
                         wait_for_workers=wait_for_workers, master_listen_fd=fd)


def encode_meta(entries: Optional[list[tuple]], nbytes: int = 0) -> bytes:
    """A bucket's metadata as JSON: [(name, dtype, shape, offset)], its byte count; None: the end."""
    if entries is None:
        return b"null"
    return json.dumps([[[name, str(dtype).removeprefix("torch."), list(shape), int(offset)]
                        for name, dtype, shape, offset in entries], int(nbytes)]).encode()


def decode_meta(data: bytes, what: str) -> Optional[tuple[list[tuple[str, torch.dtype, tuple[int, ...], int]], int]]:
    """The inverse of ``encode_meta``, checked: ValueError naming ``what`` for anything else."""
    if len(data) > MAX_META_BYTES:
        raise ValueError(f"{what}: metadata of {len(data)} bytes (at most {MAX_META_BYTES})")
    try:
        meta = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{what}: metadata is not JSON") from None
    if meta is None:
        return None
    if not (isinstance(meta, list) and len(meta) == 2 and isinstance(meta[0], list) and _is_int(meta[1])):
        raise ValueError(f"{what}: metadata must be [entries, nbytes]")
    nbytes, entries = meta[1], []
    for entry in meta[0]:
        entries.append(_entry(entry, nbytes, what))
    return entries, nbytes


def _entry(entry: Any, nbytes: int, what: str) -> tuple[str, torch.dtype, tuple[int, ...], int]:
    ok = isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str) and entry[1] in DTYPES
    ok = ok and isinstance(entry[2], list) and all(_is_int(s) for s in entry[2]) and _is_int(entry[3])
    if not ok:
        raise ValueError(f"{what}: malformed entry {str(entry)[:200]}")
    name, dtype, shape, offset = entry[0], DTYPES[entry[1]], tuple(entry[2]), entry[3]
    itemsize = torch.empty((), dtype=dtype).element_size()
    size = itemsize
    for s in shape:
        size *= s
    if offset % itemsize or offset + size > nbytes:
        raise ValueError(f"{what}: {name} ({entry[1]}, {list(shape)}) at offset {offset} does not fit the "
                         f"bucket's {nbytes} bytes")
    return name, dtype, shape, offset


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62
