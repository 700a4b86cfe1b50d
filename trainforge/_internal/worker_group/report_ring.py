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
    [24:32)  armed: 1 while the driver wants a wake-up for the next record (the driver's)
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

Wake-up: a driver waiting for reports must not poll the ring. Each ring has a wake-up ``eventfd``
(:func:`create_wake_fd`, passed to the worker beside the ring); the writer signals it only on the
ring's edge from empty to non-empty (the published read position equals the record's position)
and only while the driver has armed the ring (:meth:`RingReader.arm`: it does before it sleeps, but
not for a while after a drain that found a busy writer, so a worker reporting every millisecond wakes
it fifty times a second, not a thousand, while one reporting every 20 ms wakes it for each report;
see socket_group's ``RING_BUSY_GAP_S``). A worker reporting faster than the driver drains makes no system
call per report. The two sides follow Dekker's pattern on the shared header: the writer publishes
its write position, then reads the read position and the armed flag; the reader publishes its read
position and arms, then (:meth:`RingReader.written_since_drain`) reads the write position again
before it sleeps. A full fence between each side's stores and loads (the lock release that follows
the writer's publish; a lock taken and released by the reader) means that one of them always sees
the other: either the writer signals, or the reader drains again instead of sleeping. The driver
also drains at its poll timeout, so a record it was not woken for (an unarmed ring) only waits.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable

MAGIC = 0x54465247_00000002  # "TFRG", version 2 (1 had no armed flag)
HEADER_BYTES = 64
_MAGIC = struct.Struct("<Q")
_POS = struct.Struct("<Q")
_WRITE_OFF, _READ_OFF, _ARMED_OFF = 8, 16, 24
_READ_ARMED = struct.Struct("<QQ")  # read position and armed flag, read together by the writer
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


def create_wake_fd() -> int | None:
    """A new non-blocking ``eventfd`` for a ring's wake-ups (the caller owns it), or None where the
    platform has none (the driver then drains at its poll interval)."""
    if not hasattr(os, "eventfd"):
        return None
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


_fence_lock = threading.Lock()


def _fence() -> None:
    """A full memory fence between a store to the ring's header and a later load from it: taking a
    lock is an atomic read-modify-write (on x86 a locked instruction, which orders every earlier
    store before every later load)."""
    _fence_lock.acquire()
    _fence_lock.release()


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
    """The worker's end. ``nudge`` is called (from the writing thread) when the ring is full;
    ``wake_fd`` (an eventfd, owned by the writer from now on) is signalled when a record is the
    first the reader has not read."""

    def __init__(self, fd: int, nudge: Callable[[], None] | None = None, wake_fd: int | None = None):
        super().__init__(fd)
        self._nudge = nudge
        self._wake_fd = wake_fd
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
            end = self._pos = pos + n
            _POS.pack_into(self._m, _WRITE_OFF, end)  # publish: the record is now the driver's
        if self._wake_fd is not None:
            # The lock's release above is the fence between that store and these loads (module docstring).
            read, armed = _READ_ARMED.unpack_from(self._m, _READ_OFF)
            if armed and read == pos:
                self._wake()  # the ring was empty and the driver waits for it
        return end

    def _wake(self) -> None:
        try:
            os.eventfd_write(self._wake_fd, 1)  # type: ignore[arg-type]
        except OSError:  # the counter is full (it never is: the driver reads it) or the fd is gone
            pass

    def close(self) -> None:
        super().close()
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None

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
    """The driver's end. With a ``wake_fd`` (the eventfd the writer signals; owned by the reader from
    now on), the reader is a waitable object: ``fileno()`` is that fd (select on it, then
    :meth:`clear_wake` and drain)."""

    def __init__(self, fd: int, wake_fd: int | None = None):
        super().__init__(fd)
        self.wake_fd = wake_fd
        self._pos = _POS.unpack_from(self._m, _READ_OFF)[0]
        self._seen = self._pos  # the write position the last drain saw

    def fileno(self) -> int:
        if self.wake_fd is None:
            raise ValueError("this ring has no wake-up fd")
        return self.wake_fd

    def clear_wake(self) -> None:
        """Reset the wake-up fd (after it was readable), so the next wait sleeps until the next signal."""
        if self.wake_fd is None:
            return
        try:
            os.eventfd_read(self.wake_fd)
        except BlockingIOError:  # not signalled since the last clear
            pass

    def close(self) -> None:
        super().close()
        if self.wake_fd is not None:
            os.close(self.wake_fd)
            self.wake_fd = None

    def pending(self) -> bool:
        return _POS.unpack_from(self._m, _WRITE_OFF)[0] > self._pos

    def arm(self, armed: bool) -> None:
        """Ask the writer to signal the wake-up fd for the next record that finds the ring empty (or not)."""
        _POS.pack_into(self._m, _ARMED_OFF, int(armed))

    def written_since_drain(self) -> bool:
        """Whether records were published after the last :meth:`drain` looked: call it after
        :meth:`arm` and before sleeping on the wake-up fd. Their writer may have seen the read
        position from before that drain, or the ring unarmed, and not signalled (module docstring),
        so drain again instead of sleeping."""
        _fence()  # the read position and armed flag stored before, the write position loaded after
        return _POS.unpack_from(self._m, _WRITE_OFF)[0] > self._seen

    def drain(self, upto: int | None = None, max_tag: int | None = None) -> list[bytes]:
        """Payloads of the complete records written so far, in order: up to position ``upto``, and
        stopping before the first record tagged above ``max_tag``."""
        end = self._seen = _POS.unpack_from(self._m, _WRITE_OFF)[0]
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
