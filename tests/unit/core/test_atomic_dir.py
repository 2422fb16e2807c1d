"""components.artifacts.atomic_dir under the conditions a pipeline meets: readers polling the output while it
is replaced, two writers at once, a writer killed mid-write. Real processes, a few seconds in all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from components.artifacts import atomic_dir, write_json

REPO = Path(__file__).resolve().parents[3]


def _python(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _write(dest: Path, tag: str, n_files: int = 3) -> None:
    with atomic_dir(dest) as tmp:
        for i in range(n_files):
            (tmp / f"part-{i}").write_text(tag)
        (tmp / "complete").write_text(tag)


def _siblings(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir() if p.name != dest.name)


def test_a_reader_never_finds_the_destination_missing(tmp_path: Path) -> None:
    dest, stop = tmp_path / "out", tmp_path / "stop"
    _write(dest, "initial")
    reader = _python(
        """
        import os, sys
        dest, stop = sys.argv[1], sys.argv[2]
        polls = misses = 0
        while not os.path.exists(stop):
            polls += 1
            if not os.path.exists(os.path.join(dest, "complete")):
                misses += 1
        print(polls, misses)
        """,
        str(dest),
        str(stop),
    )
    time.sleep(0.3)  # the reader is polling
    for i in range(300):
        _write(dest, f"w{i}")
    stop.write_text("")
    out, err = reader.communicate(timeout=30)
    polls, misses = map(int, out.split())
    assert polls > 1000, f"the reader barely ran ({polls} polls): {err}"
    assert misses == 0, f"the destination was missing in {misses} of {polls} polls"
    assert (dest / "complete").read_text() == "w299" and _siblings(dest) == ["stop"]


def test_two_writers_take_turns_and_leave_nothing_behind(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    writer = """
        import sys
        from pathlib import Path
        from components.artifacts import atomic_dir
        dest, tag = Path(sys.argv[1]), sys.argv[2]
        for i in range(300):
            with atomic_dir(dest) as tmp:
                for k in range(3):
                    (tmp / f"part-{k}").write_text(f"{tag}-{i}")
        """
    procs = [_python(writer, str(dest), tag) for tag in ("a", "b")]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    parts = {(dest / f"part-{k}").read_text() for k in range(3)}
    assert len(parts) == 1 and parts.pop() in ("a-299", "b-299"), "one writer's complete output"
    assert _siblings(dest) == [], "no temp, old or lock files left"


def test_the_next_write_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    _write(dest, "kept")
    ready = tmp_path / "ready"
    victim = _python(
        """
        import sys, time
        from pathlib import Path
        from components.artifacts import atomic_dir
        with atomic_dir(Path(sys.argv[1])) as tmp:
            (tmp / "part-0").write_bytes(b"x" * 1_000_000)
            Path(sys.argv[2]).write_text("")
            time.sleep(60)
        """,
        str(dest),
        str(ready),
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert victim.poll() is None and time.monotonic() < deadline, victim.stderr.read()
        time.sleep(0.05)
    ready.unlink()
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert (dest / "complete").read_text() == "kept", "a killed writer never touches the output"
    assert any(".out.tmp-" in name for name in _siblings(dest)), "the kill left its temp directory"
    (tmp_path / ".out.old-deadbeef").mkdir()  # as a crash between the two renames of the fallback leaves
    _write(dest, "next")
    assert (dest / "complete").read_text() == "next"
    assert _siblings(dest) == []


def test_a_failed_write_keeps_the_previous_output(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    _write(dest, "before")
    with pytest.raises(RuntimeError), atomic_dir(dest) as tmp:
        (tmp / "complete").write_text("half")
        raise RuntimeError("boom")
    assert (dest / "complete").read_text() == "before" and _siblings(dest) == []


def test_write_json_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json(path, {1j: 2})  # a key JSON cannot hold: the old file stays
    assert path.read_text().strip().startswith("{") and sorted(os.listdir(tmp_path)) == ["m.json"]
