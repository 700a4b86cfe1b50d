"""The shared-memory report ring: order, wrap-around, torn and stale records, back-pressure, and
records that outlive a writer killed right after writing them."""

from __future__ import annotations

import os
import signal
import struct
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from trainforge._internal.worker_group import report_ring
from trainforge._internal.worker_group.report_ring import HEADER_BYTES, RingReader, RingWriter, create_ring_fd

RECORD = report_ring._RECORD.size  # bytes of a record's header

pytestmark = pytest.mark.skipif(not report_ring.available(), reason="needs os.memfd_create (Linux)")


def _pair(size: int) -> tuple[RingWriter, RingReader]:
    fd = create_ring_fd(size)
    try:
        return RingWriter(fd), RingReader(fd)
    finally:
        os.close(fd)


@settings(max_examples=examples(60), deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=200),
    drain_every=st.integers(min_value=1, max_value=7),
)
def test_records_come_out_in_order_across_many_wraps(payloads: list[bytes], drain_every: int) -> None:
    # A small ring (1 KiB of data) wraps many times; records straddle the end of the buffer.
    writer, reader = _pair(HEADER_BYTES + 1024)
    got: list[bytes] = []
    for i, p in enumerate(payloads):
        assert writer.fits(len(p))
        writer.put(p)
        if i % drain_every == 0:
            got += reader.drain()
    got += reader.drain()
    assert got == payloads
    assert reader.drain() == []


def test_drain_up_to_a_position_keeps_later_records_for_later() -> None:
    writer, reader = _pair(HEADER_BYTES + 4096)
    writer.put(b"a")
    mark = writer.put(b"b")
    writer.put(b"c")
    assert reader.drain(upto=mark) == [b"a", b"b"]
    assert reader.drain() == [b"c"]


def test_a_record_not_yet_fully_written_is_left_for_the_next_drain() -> None:
    fd = create_ring_fd(HEADER_BYTES + 4096)
    writer, reader = RingWriter(fd), RingReader(fd)
    writer.put(b"first")
    # Publish a write position before the record's bytes are there (as a torn or reordered store
    # would look): the reader must not take the zeros, nor anything else, for a record.
    with open(f"/proc/self/fd/{fd}", "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<Q", writer.position + 40))
    os.close(fd)
    assert reader.drain() == [b"first"]
    assert reader.drain() == []


def test_a_stale_record_from_the_previous_lap_is_not_taken_for_a_new_one() -> None:
    fd = create_ring_fd(HEADER_BYTES + 256)
    writer, reader = RingWriter(fd), RingReader(fd)
    laps = []
    for i in range(40):  # several laps: the buffer is full of valid-looking old records
        writer.put(bytes([i]) * 30)
        laps += reader.drain()
    assert laps == [bytes([i]) * 30 for i in range(40)]
    # Claim one more record of the same size without writing it: what lies there is a record of an
    # earlier lap, with a valid checksum but the wrong position.
    with open(f"/proc/self/fd/{fd}", "r+b") as f:
        f.seek(8)
        f.write(struct.pack("<Q", writer.position + RECORD + 30))
    os.close(fd)
    assert reader.drain() == []


def test_a_full_ring_makes_the_writer_nudge_the_reader_and_wait_for_room() -> None:
    fd = create_ring_fd(HEADER_BYTES + 512)
    nudged = threading.Event()
    writer, reader = RingWriter(fd, nudge=nudged.set), RingReader(fd)
    os.close(fd)
    records = [bytes([i]) * 100 for i in range(4)]  # 4 x 124 bytes: the 5th does not fit
    for r in records:
        writer.put(r)
    done = threading.Event()
    t = threading.Thread(target=lambda: (writer.put(b"last" * 25), done.set()))
    t.start()
    assert nudged.wait(10), "a writer facing a full ring must ask the reader to drain"
    assert not done.is_set(), "the writer must wait for room, not overwrite unread records"
    assert reader.drain() == records
    assert done.wait(10)
    t.join(10)
    assert reader.drain() == [b"last" * 25]


def test_a_record_bigger_than_the_ring_does_not_fit() -> None:
    writer, _ = _pair(HEADER_BYTES + 512)
    assert writer.fits(512 - RECORD)
    assert not writer.fits(512 - RECORD + 1)


def test_records_written_after_a_socket_message_wait_until_the_reader_has_read_it() -> None:
    writer, reader = _pair(HEADER_BYTES + 4096)
    writer.put(b"before")
    writer.tag += 1  # an ordered message went over the socket here
    writer.put(b"after")
    assert reader.drain(max_tag=0) == [b"before"]
    assert reader.drain(max_tag=0) == []
    assert reader.drain(max_tag=1) == [b"after"]


def test_records_written_by_a_process_killed_right_after_survive() -> None:
    fd = create_ring_fd()
    reader = RingReader(fd)
    pid = os.fork()
    if pid == 0:  # the writer: write, then die without any cleanup
        try:
            w = RingWriter(fd)
            for i in range(1000):
                w.put(b"report %d" % i)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert reader.drain() == [b"report %d" % i for i in range(1000)]


def test_an_fd_that_is_not_a_ring_is_refused() -> None:
    fd = os.memfd_create("not-a-ring", 0)
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(ValueError, match="report ring"):
            RingReader(fd)
    finally:
        os.close(fd)


def _woken(fd: int) -> bool:
    try:
        os.eventfd_read(fd)
    except BlockingIOError:
        return False
    return True


def test_the_writer_wakes_an_armed_reader_only_for_a_record_that_finds_the_ring_empty() -> None:
    fd = create_ring_fd(HEADER_BYTES + 4096)
    wake = report_ring.create_wake_fd()
    assert wake is not None
    reader_wake = os.dup(wake)
    writer, reader = RingWriter(fd, wake_fd=wake), RingReader(fd, wake_fd=reader_wake)
    os.close(fd)
    writer.put(b"unarmed")
    assert not _woken(reader_wake)  # not armed: no system call for it
    assert reader.drain() == [b"unarmed"]
    reader.arm(True)
    writer.put(b"first")
    writer.put(b"second")  # the ring was not empty any more
    assert _woken(reader_wake) and not _woken(reader_wake)
    assert reader.drain() == [b"first", b"second"]
    writer.put(b"third")  # empty again and still armed
    assert _woken(reader_wake)
    reader.arm(False)
    assert reader.drain() == [b"third"]
    writer.put(b"fourth")
    assert not _woken(reader_wake)
    writer.close()
    reader.close()


def test_a_record_written_while_unarmed_is_seen_before_the_reader_sleeps() -> None:
    writer, reader = _pair(HEADER_BYTES + 4096)
    reader.drain()
    writer.put(b"while unarmed")
    reader.arm(True)
    assert reader.written_since_drain()  # so it drains again instead of waiting for a wake-up
    assert reader.drain() == [b"while unarmed"]
    assert not reader.written_since_drain()


def _ring_group(wake_fd: int, ring_fd: int):
    """A SocketWorkerGroup with one worker whose only channel is a ring."""
    from trainforge._internal.worker_group.socket_group import SocketWorkerGroup, WorkerHandle

    class RingOnly(SocketWorkerGroup):
        _launch = _await_exit = _death = _stop = dump_stacks = lambda *a: None  # type: ignore[assignment]

        def _exited(self, workers):
            return set()

    group = RingOnly()
    w = WorkerHandle()
    w.ring = RingReader(ring_fd, wake_fd=wake_fd)
    group._workers = [w]
    return group, w


def test_the_driver_keeps_a_slow_reporters_ring_armed_and_paces_a_busy_one() -> None:
    import pickle

    from trainforge._internal.worker_group import socket_group

    fd = create_ring_fd(HEADER_BYTES + 65536)
    wake = report_ring.create_wake_fd()
    assert wake is not None
    group, w = _ring_group(os.dup(wake), fd)
    writer = RingWriter(fd, wake_fd=wake)
    os.close(fd)

    def report(i: int) -> bytes:
        return pickle.dumps(("report", i, pickle.dumps({"i": i}), False, 0.0))

    w.ring.arm(True)
    writer.put(report(0))
    group._drain_ring(w)
    assert w.ring_busy_until == 0.0  # one record, none drained just before: stays armed
    w.ring_last_records -= socket_group.RING_BUSY_GAP_S  # the next record comes that much later
    writer.put(report(1))
    group._drain_ring(w)
    assert w.ring_busy_until == 0.0
    w.ring_last_records -= socket_group.RING_BUSY_GAP_S
    writer.put(report(2))
    writer.put(report(3))  # two records at one drain: a busy writer
    group._drain_ring(w)
    assert w.ring_busy_until > 0.0
    assert not report_ring._READ_ARMED.unpack_from(w.ring._m, report_ring._READ_OFF)[1]  # disarmed
    assert [e.index for e in group.poll(0)] == [0, 1, 2, 3]
    writer.close()
    w.ring.close()
