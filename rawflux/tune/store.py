"""A table of tuning results in one JSON file that every process using the cache folder shares.

A put merges one entry into what is on disk under an exclusive lock (fcntl.flock on the sibling
``<file>.lock``) and replaces the file atomically, so ranks tuning different problems at once keep
each other's results. A file this version cannot read is ignored with one warning and rewritten
by the next put; a folder that cannot be written keeps results for this process only.

On disk: ``{"version": 1, "entries": {key: {...}}}``. The flat ``{key: {...}}`` of earlier
releases reads as version-1 entries.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import warnings
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: puts still merge and replace atomically, only unlocked
    fcntl = None

VERSION = 1


class TuneStore:
    """key -> entry (a JSON-able dict) persisted in ``path``. Thread-safe."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, dict] | None = None
        self._warned_bad = False  # one warning per unreadable file, not one per read of it
        self._warned_ro = False

    def get(self, key: str) -> dict | None:
        with self._lock:
            return self._loaded().get(key)

    def entries(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._loaded())

    def put(self, key: str, entry: dict) -> None:
        if not isinstance(entry, dict):
            raise TypeError(f"TuneStore.put: an entry is a dict, got {type(entry).__name__}")
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self._file_lock():
                    merged = self._read()  # what other processes stored since this one read
                    merged[key] = entry
                    self._write(merged)
            except OSError as e:
                if not self._warned_ro:
                    self._warned_ro = True
                    warnings.warn(f"rawflux: cannot write the tuning table {self.path} ({e}); results are kept "
                                  f"for this process only", RuntimeWarning, stacklevel=2)
                self._loaded()[key] = entry
                return
            self._entries = merged
            self._warned_bad = False  # the file is good again: a later corruption is news

    # --- under self._lock ---------------------------------------------------------------------

    def _loaded(self) -> dict[str, dict]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    def _read(self) -> dict[str, dict]:
        """The entries on disk; {} when there is no file or one this version cannot read."""
        try:
            text = self.path.read_bytes().decode()
        except (FileNotFoundError, NotADirectoryError):  # nothing stored yet
            return {}
        except (OSError, ValueError) as e:
            return self._bad(f"cannot be read ({e})")
        try:
            data = json.loads(text)
        except ValueError:
            return self._bad("is not valid JSON")
        if isinstance(data, dict) and "version" in data:
            if data["version"] != VERSION:
                return self._bad(f"has schema version {data['version']!r}, this rawflux reads {VERSION}")
            data = data.get("entries")
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in data.items()):
            return self._bad("is not a table of entries")
        return data

    def _bad(self, why: str) -> dict:
        if not self._warned_bad:
            self._warned_bad = True
            warnings.warn(f"rawflux: the tuning table {self.path} {why}; it is ignored and will be rewritten "
                          f"at the next stored result", RuntimeWarning)
        return {}

    def _write(self, entries: dict[str, dict]) -> None:
        # Same folder, so os.replace is atomic; opened by hand so the umask sets its mode as for any file.
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "w") as f:
                json.dump({"version": VERSION, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _file_lock(self):
        if fcntl is None:
            yield
            return
        # The lock file stays: removing it would let a late process lock a fresh inode alone.
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
