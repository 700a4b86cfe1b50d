"""A shared-memory ring that carries a local worker's reports to the driver without a system call.

Why: ``report()`` must not return before its message is safe from the worker's death (a checkpoint
every rank reported is then committed even if a rank dies the next instant). A socket write gives
that, but costs ~60 us of CPU per report on a busy core (Python's ``Connection.send_bytes``, the
kernel's loopback path, and three more system calls and two wake-ups on the driver per message). A
record copied into memory that the driver maps too is just as safe: the pages outlive the worker.

The ring lives in an anonymous memory file (``memfd``) that the driver creates for each local worker
process and passes to it at spawn, so nothing is left in the file system whatever happens. Layout::

    [0:8)    magic
    [8:16)   write position (bytes ever written; the worker's)
    [16:24)  read position  (bytes ever read; the driver's)
    [64:)    data, a circular buffer of records:
             u32 length, u32 crc32(payload), u64 position, u64 tag, payload

The worker (single writer, under a lock: the uploader thread writes too) copies a record in, then
publishes the new write position. The tag orders records against messages that take the socket
(see worker_main's ``_Channel``): it counts the ordered socket messages sent before the record, and
the driver does not read past a record until it has read that many from the socket. The driver reads records up to the write position and publishes
its read position. A record is accepted only if its stored position is the one expected and its
checksum matches, so a torn or stale record (a previous lap) is never taken for a new one; the
driver then simply tries again at the next drain. When the ring is full the writer asks the driver
to drain (``nudge``) and waits for room: back-pressure, as a full socket buffer would give.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable

MAGIC = 0x54465247_00000001  # "TFRG", version 1
HEADER_BYTES = 64
_MAGIC = struct.Struct("<Q")
_POS = struct.Struct("<Q")
_WRITE_OFF, _READ_OFF = 8, 16
_RECORD = struct.Struct("<IIQQ")  # length, crc32, position, tag
DEFAULT_BYTES = 2 * 1024 * 1024  # pages are only made resident as the ring is used


def create_ring_fd(size: int = DEFAULT_BYTES) -> int:
    """A new anonymous memory file of ``size`` bytes holding an empty ring; the caller owns the fd."""
    fd = os.memfd_create("trainforge-reports", 0)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as m:
            _MAGIC.pack_into(m, 0, MAGIC)
    except BaseException:
        os.close(fd)
        raise
    return fd


def available() -> bool:
    """Whether this platform can make rings (Linux's memfd)."""
    return hasattr(os, "memfd_create")


class _Ring:
    def __init__(self, fd: int):
        self._m = mmap.mmap(fd, 0)
        if len(self._m) <= HEADER_BYTES or _MAGIC.unpack_from(self._m, 0)[0] != MAGIC:
            self._m.close()
            raise ValueError(f"fd {fd} does not hold a trainforge report ring")
        self._cap = len(self._m) - HEADER_BYTES

    @property
    def capacity(self) -> int:
        return self._cap

    def _copy_in(self, pos: int, data: bytes) -> None:
        m, cap = self._m, self._cap
        at = pos % cap
        first = min(len(data), cap - at)
        m[HEADER_BYTES + at : HEADER_BYTES + at + first] = data[:first]
        if first < len(data):
            m[HEADER_BYTES : HEADER_BYTES + len(data) - first] = data[first:]

    def _copy_out(self, pos: int, n: int) -> bytes:
        m, cap = self._m, self._cap
        at = pos % cap
        first = min(n, cap - at)
        out = m[HEADER_BYTES + at : HEADER_BYTES + at + first]
        if first < n:
            out += m[HEADER_BYTES : HEADER_BYTES + n - first]
        return out

    def close(self) -> None:
        try:
            self._m.close()
        except BufferError:  # pragma: no cover - a view still exported; the mapping goes with the GC
            pass


class RingWriter(_Ring):
    """The worker's end. ``nudge`` is called (from the writing thread) when the ring is full."""

    def __init__(self, fd: int, nudge: Callable[[], None] | None = None):
        super().__init__(fd)
        self._nudge = nudge
        self.lock = threading.Lock()  # held by put(); hold it to send something that must keep its place
        self.tag = 0  # stamped on every record written from now on
        self._pos = _POS.unpack_from(self._m, _WRITE_OFF)[0]
        self._room_until = 0  # write position up to which there is known room (saves a read)

    @property
    def position(self) -> int:
        """Bytes written so far: a socket message sent after a record carries this, so the driver
        reads the ring up to it first and keeps the order."""
        return self._pos

    def fits(self, n: int) -> bool:
        return _RECORD.size + n <= self._cap

    def put(self, payload: bytes) -> int:
        """Append one record (``fits(len(payload))`` must hold); return the new write position."""
        n = _RECORD.size + len(payload)
        with self.lock:
            pos = self._pos
            if pos + n > self._room_until:
                self._wait_for_room(pos, n)
            self._copy_in(pos, _RECORD.pack(len(payload), zlib.crc32(payload), pos, self.tag) + payload)
            self._pos = pos + n
            _POS.pack_into(self._m, _WRITE_OFF, self._pos)  # publish: the record is now the driver's
            return self._pos

    def _wait_for_room(self, pos: int, n: int) -> None:
        nudged = False
        delay = 0.0002
        while True:
            read = _POS.unpack_from(self._m, _READ_OFF)[0]
            self._room_until = read + self._cap
            if pos + n <= self._room_until:
                return
            if not nudged and self._nudge is not None:
                self._nudge()
                nudged = True
            time.sleep(delay)
            delay = min(delay * 2, 0.01)


class RingReader(_Ring):
    """The driver's end."""

    def __init__(self, fd: int):
        super().__init__(fd)
        self._pos = _POS.unpack_from(self._m, _READ_OFF)[0]

    def pending(self) -> bool:
        return _POS.unpack_from(self._m, _WRITE_OFF)[0] > self._pos

    def drain(self, upto: int | None = None, max_tag: int | None = None) -> list[bytes]:
        """Payloads of the complete records written so far, in order: up to position ``upto``, and
        stopping before the first record tagged above ``max_tag``."""
        end = _POS.unpack_from(self._m, _WRITE_OFF)[0]
        if upto is not None:
            end = min(end, upto)
        out: list[bytes] = []
        pos = self._pos
        while pos + _RECORD.size <= end:
            length, crc, rec_pos, tag = _RECORD.unpack(self._copy_out(pos, _RECORD.size))
            if rec_pos != pos or pos + _RECORD.size + length > end:
                break  # not yet fully visible (or torn): try again at the next drain
            if max_tag is not None and tag > max_tag:
                break  # comes after a socket message not read yet
            payload = self._copy_out(pos + _RECORD.size, length)
            if zlib.crc32(payload) != crc:
                break
            out.append(payload)
            pos += _RECORD.size + length
        if pos != self._pos:
            self._pos = pos
            _POS.pack_into(self._m, _READ_OFF, pos)
        return out
