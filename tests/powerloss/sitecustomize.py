"""A power-loss journal for tests/test_power_loss.py (imported by every Python process whose
PYTHONPATH starts with this directory; inert unless EPOCHAL_POWERLOSS_JOURNAL is set).

A power loss keeps a rename, a hard link or a new file only if the directory holding the
new name was fsynced afterwards. This journal records, in order and across processes,
every such name change under EPOCHAL_POWERLOSS_ROOT and every directory fsync, so that the
test can undo, after killing the job, what a power loss could undo. With
EPOCHAL_POWERLOSS_IGNORE_DIRSYNC set, directory fsyncs are not recorded: the control of a
system that never fsyncs directories.
"""
import builtins
import json
import os
import stat
import uuid

_JOURNAL = os.environ.get("EPOCHAL_POWERLOSS_JOURNAL")

if _JOURNAL:
    _ROOT = os.path.realpath(os.environ["EPOCHAL_POWERLOSS_ROOT"])
    _IGNORE_DIRSYNC = bool(os.environ.get("EPOCHAL_POWERLOSS_IGNORE_DIRSYNC"))
    _open, _replace, _rename, _link, _fsync = builtins.open, os.replace, os.rename, os.link, os.fsync

    def _inside(path) -> bool:
        try:
            return os.path.realpath(os.fspath(path)).startswith(_ROOT + os.sep)
        except TypeError:
            return False

    def _log(*event) -> None:
        with _open(_JOURNAL, "a") as f:  # one short line per O_APPEND write: atomic across processes
            f.write(json.dumps(event) + "\n")

    def _backup(dst):
        if not os.path.exists(dst):
            return None
        kept = f"{_JOURNAL}.bak/{uuid.uuid4().hex}"
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        _link(dst, kept)
        return kept

    def _moving(original, kind):
        def move(src, dst, *args, **kwargs):
            if not _inside(dst):
                return original(src, dst, *args, **kwargs)
            src, dst = os.path.realpath(os.fspath(src)), os.path.realpath(os.fspath(dst))
            kept = _backup(dst)
            original(src, dst, *args, **kwargs)
            _log(kind, src, dst, kept)
        return move

    def link(src, dst, *args, **kwargs):
        _link(src, dst, *args, **kwargs)
        if _inside(dst):
            _log("link", os.path.realpath(os.fspath(src)), os.path.realpath(os.fspath(dst)), None)

    def fsync(fd):
        _fsync(fd)
        if not _IGNORE_DIRSYNC and stat.S_ISDIR(os.fstat(fd).st_mode):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path == _ROOT or _inside(path):
                _log("fsyncdir", path)

    def open_(file, mode="r", *args, **kwargs):
        created = (isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wxa")
                   and _inside(file) and not os.path.exists(file))
        f = _open(file, mode, *args, **kwargs)
        if created:
            _log("create", os.path.realpath(os.fspath(file)))
        return f

    os.replace = _moving(_replace, "rename")
    os.rename = _moving(_rename, "rename")
    os.link = link
    os.fsync = fsync
    builtins.open = open_
