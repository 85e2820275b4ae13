"""Kernel-observed file reads and writes under a directory tree, per tool call (Linux inotify via ctypes).

Details: docs/design.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import hashlib
import os
import stat
import struct

IN_ACCESS = 0x00000001
IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000

_WRITE = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
_MASK = IN_ACCESS | _WRITE | IN_MOVED_FROM | IN_ONLYDIR | IN_DONT_FOLLOW
_HEADER = struct.Struct("iIII")


class TraceUnavailable(OSError):
    """inotify cannot be used here (kernel limit `fs.inotify.max_user_instances` reached, or not Linux)."""


class FileTrace:
    """Watches `root` recursively; `begin()` / `end()` bracket one call and return what it read and wrote.

    Args:
      root: directory to watch (the workspace).
      max_dirs: most directories watched at once.
      max_paths: most paths reported per call in each of reads / writes (more marks the trace incomplete).
    Raises:
      TraceUnavailable: inotify_init1 failed (the message names the kernel limit to raise).
    """

    def __init__(self, root: str, max_dirs: int = 2000, max_paths: int = 5000):
        self.root = os.path.realpath(root)
        self.max_dirs = int(max_dirs)
        self.max_paths = int(max_paths)
        libc_name = ctypes.util.find_library("c") or "libc.so.6"
        self._libc = ctypes.CDLL(libc_name, use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise TraceUnavailable(err, f"inotify_init1 failed: {os.strerror(err)} (raise "
                                        "fs.inotify.max_user_instances if this is EMFILE)")
        self._dirs: dict[int, str] = {}  # watch descriptor -> directory path relative to root ('' = root)
        self._moving: dict[int, str] = {}  # rename cookie -> old path of a directory moved away
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.complete = True
        self._watch_tree("")

    # -- watches ---------------------------------------------------------------------------------------------
    def _watch(self, rel: str) -> bool:
        if len(self._dirs) >= self.max_dirs:
            self.complete = False
            return False
        path = os.path.join(self.root, rel) if rel else self.root
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), _MASK)
        if wd < 0:
            return False
        self._dirs[wd] = rel
        return True

    def _watch_tree(self, rel: str, created: bool = False) -> None:
        """Watches `rel` and every directory below it; with `created`, files found there count as written."""
        stack = [rel]
        while stack:
            cur = stack.pop()
            if not self._watch(cur):
                continue
            try:
                entries = list(os.scandir(os.path.join(self.root, cur) if cur else self.root))
            except OSError:
                continue
            for entry in entries:
                sub = f"{cur}/{entry.name}" if cur else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(sub)
                    elif created:
                        self._add(self.writes, sub)
                except OSError:
                    continue

    def _add(self, bucket: set[str], path: str) -> None:
        if len(bucket) >= self.max_paths:
            self.complete = False
        else:
            bucket.add(path)

    # -- events ----------------------------------------------------------------------------------------------
    def drain(self) -> None:
        """Reads every queued event (non-blocking); call it whenever `fd` is readable."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                break
            if not data:
                break
            off = 0
            while off + _HEADER.size <= len(data):
                wd, mask, cookie, length = _HEADER.unpack_from(data, off)
                name = data[off + _HEADER.size: off + _HEADER.size + length].split(b"\0", 1)[0]
                off += _HEADER.size + length
                self._event(wd, mask, os.fsdecode(name), cookie)
        for old in self._moving.values():  # moved out of the tree: no longer watched
            self._unwatch(old)
        self._moving.clear()

    def _unwatch(self, prefix: str) -> None:
        for wd, rel in list(self._dirs.items()):
            if rel == prefix or rel.startswith(prefix + "/"):
                self._libc.inotify_rm_watch(self.fd, wd)
                self._dirs.pop(wd, None)

    def _event(self, wd: int, mask: int, name: str, cookie: int = 0) -> None:
        if self._moving and not (mask & IN_MOVED_TO and cookie in self._moving):
            for old in self._moving.values():  # the rename's other half never came: moved out of the tree
                self._unwatch(old)
            self._moving.clear()
        if mask & IN_Q_OVERFLOW:
            self.complete = False
            return
        if mask & IN_IGNORED:
            self._dirs.pop(wd, None)
            return
        parent = self._dirs.get(wd)
        if parent is None or not name:
            return
        rel = f"{parent}/{name}" if parent else name
        if mask & IN_ISDIR:
            if mask & IN_MOVED_FROM:
                self._moving[cookie] = rel
            elif mask & IN_MOVED_TO and cookie in self._moving:  # renamed inside the tree: same watches
                old, moved = self._moving.pop(cookie), False
                for d, path in list(self._dirs.items()):
                    if path == old or path.startswith(old + "/"):
                        self._dirs[d] = rel + path[len(old):]
                        moved = True
                if not moved:  # created and renamed before its watch was added: new to us, made by the call
                    self._watch_tree(rel, created=True)
            elif mask & (IN_CREATE | IN_MOVED_TO):
                self._watch_tree(rel, created=True)
            return
        if mask & IN_MOVED_FROM:
            return
        if mask & IN_ACCESS:
            self._add(self.reads, rel)
        if mask & _WRITE:
            self._add(self.writes, rel)

    # -- one call --------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """Starts a call: drops events of whatever happened before it."""
        self.drain()
        self.reads, self.writes, self.complete = set(), set(), len(self._dirs) < self.max_dirs

    def end(self) -> tuple[list[str], list[str], bool]:
        """Ends a call (after its processes are gone): (sorted reads, sorted writes, trace complete)."""
        self.drain()
        return sorted(self.reads), sorted(self.writes), self.complete

    def close(self) -> None:
        """Releases the inotify instance (idempotent; also on garbage collection)."""
        if getattr(self, "fd", -1) >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        self.close()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def digest_files(root: str, paths, max_bytes: int) -> list[list[str]]:
    """[[path, sha256 hex]] of the regular files `paths` (relative to `root`) as they are now.

    Each is opened component by component with O_NOFOLLOW (no symlink anywhere in a path is followed; a FIFO is never
    waited on). A path that is gone, not a regular file, over `max_bytes` bytes or not readable is left out, so a digest
    is only ever given for the bytes that were there. Sorted by path."""
    out = []
    for rel in sorted(set(paths)):
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if not parts or ".." in parts:
            continue
        fd = -1
        try:
            fd = os.open(root, _DIR_FLAGS)
            for part in parts[:-1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            continue
        finally:
            if fd >= 0:
                os.close(fd)
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
                continue
            h, left = hashlib.sha256(), st.st_size + 1
            while left > 0:
                chunk = os.read(f, min(1 << 20, left))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
            if left > 0:  # not grown while read: the digest is of the file's whole content
                out.append([rel, h.hexdigest()])
        except OSError:
            continue
        finally:
            os.close(f)
    return out
