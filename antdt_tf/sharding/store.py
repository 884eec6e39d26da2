"""StateStore: the master's durable state in ``--state_dir`` (snapshot + journal).

Files::

    LOCK                  flock()ed by the one master that owns the directory
    snapshot.pb           magic, crc32, length, StateFile proto (state + journal generation)
    journal.<gen>.log     magic + generation, then records: length, crc32, JournalEntry proto

Every event is written to the journal with one ``os.write`` *before* the master
answers the request, so a SIGKILLed master loses nothing it acknowledged (the data is in
the kernel's page cache). ``fsync`` policy decides what survives a machine crash:
``always`` (every event), ``interval`` (dirty journal synced every second) or ``never``.
After ``snapshot_every`` events the state is compacted: a new snapshot is written to a
temporary file, fsynced and renamed, and a new journal generation starts.

A torn last record (a crash in the middle of a write) was never acknowledged and is
dropped with a warning; anything else that does not check out raises
:class:`~antdt_tf.errors.CorruptState` so the master refuses to start rather than lose or
repeat data.
"""

from __future__ import annotations

import fcntl
import logging
import os
import pathlib
import struct
import time
import zlib
from typing import Optional

from google.protobuf.message import DecodeError

from antdt_tf.errors import CorruptState, IncompatibleState, StateDirLocked, bounded
from antdt_tf.proto import sharding_pb2 as pb

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC = b"ANTDT-STATE\x00"
JOURNAL_MAGIC = b"ANTDT-JRNL\x00\x00"
_SNAP_HDR = struct.Struct("<IQ")     # crc32, length
_JOURNAL_HDR = struct.Struct("<Q")   # generation
_RECORD_HDR = struct.Struct("<II")   # length, crc32
FSYNC_MODES = ("always", "interval", "never")


class StateStore:
    """Snapshot + journal persistence of a :class:`~antdt_tf.sharding.state.ShardState`."""

    def __init__(self, state_dir: str | os.PathLike, fsync: str = "interval",
                 snapshot_every: int = 100_000):
        if fsync not in FSYNC_MODES:
            raise ValueError(f"fsync must be one of {FSYNC_MODES}, got {fsync!r}")
        if snapshot_every < 1:
            raise ValueError("snapshot_every must be >= 1")
        self.dir = pathlib.Path(state_dir)
        self.fsync = fsync
        self.snapshot_every = snapshot_every
        self.generation = 0
        self.entries_since_snapshot = 0
        self._lock_fd: Optional[int] = None
        self._journal_fd: Optional[int] = None
        self._dirty = False

    # ---------------------------------------------------------------- locking

    def lock(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirLocked(f"state_dir {self.dir} is in use by another master process") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    # ---------------------------------------------------------------- reading

    def _snapshot_path(self) -> pathlib.Path:
        return self.dir / "snapshot.pb"

    def _journal_path(self, generation: int) -> pathlib.Path:
        return self.dir / f"journal.{generation}.log"

    def read(self) -> tuple[Optional[pb.ShardingState], list[pb.JournalEntry]]:
        """Reads the snapshot and the journal that continues it. ``(None, [])`` for an
        empty directory."""
        snapshot: Optional[pb.ShardingState] = None
        path = self._snapshot_path()
        generation = 0
        if path.exists():
            data = path.read_bytes()
            where = f"snapshot {path}"
            if not data.startswith(SNAPSHOT_MAGIC) or len(data) < len(SNAPSHOT_MAGIC) + _SNAP_HDR.size:
                raise CorruptState(f"{where}: not an antdt-tf state snapshot (bad magic)")
            crc, length = _SNAP_HDR.unpack_from(data, len(SNAPSHOT_MAGIC))
            payload = data[len(SNAPSHOT_MAGIC) + _SNAP_HDR.size:]
            if len(payload) != length or zlib.crc32(payload) != crc:
                raise CorruptState(f"{where}: checksum or length mismatch (file damaged)")
            state_file = pb.StateFile()
            try:
                state_file.ParseFromString(payload)
            except DecodeError as e:
                raise CorruptState(f"{where}: cannot parse: {e}") from e
            if state_file.state.format_version != 1:
                raise IncompatibleState(
                    f"{where}: format version {state_file.state.format_version} is not supported "
                    "by this master (reads version 1)")
            snapshot = state_file.state
            generation = state_file.journal_generation
        else:
            journals = sorted(self.dir.glob("journal.*.log"))
            if journals:
                generation = _generation_of(journals[0])
                if len(journals) > 1 or generation != 0:
                    raise CorruptState(f"{self.dir}: journals {[j.name for j in journals]} but no "
                                       "snapshot.pb (was it deleted?)")
        self.generation = generation
        entries = self._read_journal(self._journal_path(generation), generation)
        return snapshot, entries

    def _read_journal(self, path: pathlib.Path, generation: int) -> list[pb.JournalEntry]:
        if not path.exists():
            return []
        data = path.read_bytes()
        head = len(JOURNAL_MAGIC) + _JOURNAL_HDR.size
        if len(data) < head:
            log.warning("journal %s is shorter than its header (torn create); ignoring it", path)
            return []
        if not data.startswith(JOURNAL_MAGIC):
            raise CorruptState(f"journal {path}: not an antdt-tf journal (bad magic)")
        (gen,) = _JOURNAL_HDR.unpack_from(data, len(JOURNAL_MAGIC))
        if gen != generation:
            raise CorruptState(f"journal {path}: header says generation {gen}, expected {generation}")
        entries = []
        pos = head
        while pos < len(data):
            if len(data) - pos < _RECORD_HDR.size:
                log.warning("journal %s: torn record header at byte %d dropped (never acknowledged)",
                            path, pos)
                break
            length, crc = _RECORD_HDR.unpack_from(data, pos)
            end = pos + _RECORD_HDR.size + length
            if end > len(data):
                log.warning("journal %s: torn record at byte %d dropped (never acknowledged)",
                            path, pos)
                break
            payload = data[pos + _RECORD_HDR.size:end]
            if zlib.crc32(payload) != crc:
                raise CorruptState(f"journal {path}: checksum mismatch in record at byte {pos} "
                                   f"(record {len(entries)}); the file is damaged")
            entry = pb.JournalEntry()
            try:
                entry.ParseFromString(payload)
            except DecodeError as e:
                raise CorruptState(f"journal {path}: record {len(entries)} cannot be parsed: {e}") from e
            entries.append(entry)
            pos = end
        return entries

    # ---------------------------------------------------------------- writing

    def write_snapshot(self, state: pb.ShardingState) -> None:
        """Compacts: snapshot ``state`` and continue in a new journal generation."""
        generation = self.generation + 1
        payload = pb.StateFile(state=state, journal_generation=generation).SerializeToString()
        tmp = self.dir / "snapshot.pb.tmp"
        with open(tmp, "wb") as f:
            f.write(SNAPSHOT_MAGIC + _SNAP_HDR.pack(zlib.crc32(payload), len(payload)) + payload)
            f.flush()
            os.fsync(f.fileno())
        # A new journal must exist before the snapshot that points to it.
        new_fd = os.open(self._journal_path(generation), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(new_fd, JOURNAL_MAGIC + _JOURNAL_HDR.pack(generation))
        os.fsync(new_fd)
        os.replace(tmp, self._snapshot_path())
        _fsync_dir(self.dir)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
        old = self._journal_path(self.generation)
        self._journal_fd = new_fd
        self.generation = generation
        self.entries_since_snapshot = 0
        self._dirty = False
        for stale in self.dir.glob("journal.*.log"):
            if _generation_of(stale) < generation:
                stale.unlink()
        log.debug("state snapshot written (%d bytes, journal generation %d, replaced %s)",
                  len(payload), generation, old.name)

    def append(self, entry: pb.JournalEntry) -> None:
        """Persists one event before it is applied and acknowledged."""
        if self._journal_fd is None:
            raise RuntimeError("StateStore.append before write_snapshot opened a journal")
        payload = entry.SerializeToString()
        os.write(self._journal_fd, _RECORD_HDR.pack(len(payload), zlib.crc32(payload)) + payload)
        self.entries_since_snapshot += 1
        if self.fsync == "always":
            os.fsync(self._journal_fd)
        else:
            self._dirty = True

    @property
    def needs_snapshot(self) -> bool:
        return self.entries_since_snapshot >= self.snapshot_every

    def sync(self) -> None:
        """Flushes the journal to disk if anything was written since the last sync."""
        if self._dirty and self._journal_fd is not None and self.fsync != "never":
            os.fsync(self._journal_fd)
        self._dirty = False

    def close(self, final_state: Optional[pb.ShardingState] = None) -> None:
        if final_state is not None:
            self.write_snapshot(final_state)
        if self._journal_fd is not None:
            os.fsync(self._journal_fd)
            os.close(self._journal_fd)
            self._journal_fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def move_aside(self) -> pathlib.Path:
        """Moves the current state files into ``corrupt-<time>/`` (kept, not deleted) so a
        fresh start is possible after an operator decided so."""
        dest = self.dir / time.strftime("corrupt-%Y%m%d-%H%M%S")
        dest.mkdir()
        for path in [self._snapshot_path(), *self.dir.glob("journal.*.log")]:
            if path.exists():
                path.rename(dest / path.name)
        return dest


def _generation_of(path: pathlib.Path) -> int:
    try:
        return int(path.name.split(".")[1])
    except (IndexError, ValueError) as e:
        raise CorruptState(f"unexpected journal file name {path.name}") from e


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_state(store: StateStore, state, discard_corrupt: bool = False) -> dict:
    """Locks ``store``, loads snapshot + journal into ``state`` (a ShardState), starts
    a new journal generation and attaches it. Returns what was recovered.

    With ``discard_corrupt`` a damaged state is moved aside and the job starts fresh.
    """
    store.lock()
    try:
        snapshot, entries = store.read()
        if snapshot is not None:
            try:
                state.load(snapshot)
            except (CorruptState, IncompatibleState):
                raise
            except Exception as e:  # noqa: BLE001 (whatever a bad snapshot breaks)
                raise CorruptState(f"snapshot in {store.dir} does not load "
                                   f"({type(e).__name__}: {bounded(str(e))})") from e
        for i, entry in enumerate(entries):
            try:
                state.apply(entry)
            except Exception as e:  # noqa: BLE001 (an event this master cannot replay)
                raise CorruptState(f"journal {store.dir}: record {i} does not apply to the "
                                   f"state before it ({type(e).__name__}: "
                                   f"{bounded(str(e))})") from e
    except (CorruptState, IncompatibleState) as e:
        if not discard_corrupt:
            store.close()
            raise
        moved = store.move_aside()
        log.error("%s; moved the damaged state to %s and starting fresh", e, moved)
        state.load(pb.ShardingState(format_version=1))
        store.generation, snapshot, entries = 0, None, []
    state.grant_grace()
    store.write_snapshot(state.snapshot())
    state.attach_journal(store.append)
    return {"snapshot": snapshot is not None, "replayed": len(entries)}
