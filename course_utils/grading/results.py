"""The results file (`--json FILE`): the gradebook, written as each submission is graded.

The grader keeps its results the way a database keeps its log, not the way a program saves at
exit: the file is rewritten after every submission, to a temporary file that is flushed to disk
and then renamed over the old one, so that a kill at any instant (SIGTERM, SIGINT, SIGKILL, a
power cut, a full disk) leaves either the previous complete file or the new complete file, never a
half-written one. It always holds a row for every submission of the run: graded, not gradable,
or `pending` (not graded yet).

Each graded row records what its grade depends on (`grading`): the submission file's sha256, the
released lesson's and the course's code's sha256, the seed, smoke mode and the time limits. Run
the same command again and a row whose file, lesson, course and seed are unchanged is kept (the
grader says so); the others are graded, and `--regrade` grades them all again. Rows of
submissions not named in a run stay in the file.

While a run writes the file, it holds a lock on `.FILE.lock` beside it: a second grader writing
the same file stops at once instead of losing the first one's rows.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["ResultsError", "ResultsFile", "atomic_write", "KEY_FIELDS", "FORMAT"]

FORMAT = 2                     # the "results_format" this grader writes (1: the files before resuming)
KEY_FIELDS = ("file_sha256", "lesson_sha256", "course_sha256", "seed", "smoke", "cell_timeout_s",
              "notebook_timeout_s")


class ResultsError(RuntimeError):
    """The results file cannot be used (not one of the grader's, locked by another run, not writable)."""


def atomic_write(path, text: str) -> None:
    """Replace `path` with `text` so that no reader, and no kill at any instant, sees a partial file:
    write a temporary file beside it, flush it to disk, rename it over `path`, flush the folder.
    On any error (a full disk) the temporary file is removed, `path` is untouched, and it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode("utf-8")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    try:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError:
        pass


def sha256_file(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class ResultsFile:
    """The results file of one run: `load()` the rows a previous run left, `write()` after every
    submission, `close()` at the end (it releases the lock)."""

    def __init__(self, path):
        self.path = Path(path)
        self.lock_path = self.path.with_name(f".{self.path.name}.lock")
        self._lock_fd = None

    def lock(self) -> None:
        import fcntl
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ResultsError(f"another grader is writing {self.path} now (it holds {self.lock_path}); wait "
                               "for it to finish, or give this run another --json file") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def load(self) -> dict | None:
        """The previous run's content, or None when there is no file yet."""
        if not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not (isinstance(data, dict) and isinstance(data.get("grader"), dict)
                    and isinstance(data.get("submissions"), list)
                    and all(isinstance(s, dict) and "path" in s and "submission" in s for s in data["submissions"])):
                raise ValueError("it has no 'grader' and 'submissions' of the grader's results")
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ResultsError(f"{self.path} exists but is not a results file this grader wrote ({exc}); "
                               "name another --json file, or move that one away") from None
        return data

    def write(self, run: dict, rows: list[dict]) -> None:
        atomic_write(self.path, json.dumps({"results_format": FORMAT, "grader": run, "submissions": rows},
                                           indent=2) + "\n")

    def close(self) -> None:
        if self._lock_fd is not None:
            try:
                self.lock_path.unlink()
            except OSError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = None
