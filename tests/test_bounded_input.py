"""What llmchat reads from outside is read bounded, from regular files only (llmchat.edges.bounded_input).

The runs that would read without end before the bound existed (`-f /dev/zero`, 300 MB on stdin)
run in a child whose address space is capped (RLIMIT_AS): without the bound it dies of a
MemoryError at the cap instead of taking the machine, and the test sees the traceback. Its peak
memory comes from the kernel (wait4). The runs that would wait for ever (a FIFO) have a writer
held open by the test, so that such a child would block in its read; a generous wait on the child
stands guard against that hang, never as a measure of speed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from llmchat.edges.bounded_input import MEDIA_MAX_BYTES, TooLong, read_file, text_bound

ADDRESS_SPACE = 2 << 30  # the child's cap: Python and llmchat's modules take about 300 MiB of it
SMALL_PEAK_MIB = 100  # llmchat refusing early peaks at about 20 MiB resident
HANG_GUARD_S = 120  # against a child that would block for ever; a passing run ends in about a second
MISSING_MODEL = ("-m", "/nonexistent/model.gguf")  # input is read and refused before the model is looked for


# The child's peak must be its own: a process forked (or vforked) from this big pytest process
# starts its peak at this process's resident size, whatever it execs. So a small launcher starts
# it, caps it, and reports its peak from os.wait4 on its own stdout.
LAUNCHER = """
import os, resource, subprocess, sys
def cap():
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
child = subprocess.Popen([sys.executable, "-m", "llmchat", *sys.argv[2:]], preexec_fn=cap)
_, status, usage = os.wait4(child.pid, 0)
sys.stdout.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def _llmchat_capped(*args: str, feed_zeros: int = 0) -> tuple[int, str, int]:
    """Run `llmchat ARGS` in a child capped at ADDRESS_SPACE, with `feed_zeros` bytes of zeros
    written to its stdin (as `head -c N /dev/zero | llmchat ...`); (exit code, stderr, peak MiB).
    The child ends by itself: refused, or killed by its own MemoryError at the cap."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(ADDRESS_SPACE), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert launcher.stdin is not None and launcher.stderr is not None and launcher.stdout is not None

    def feed() -> None:
        chunk = bytes(1 << 20)
        try:
            for _ in range(feed_zeros // len(chunk)):
                launcher.stdin.write(chunk)
        except BrokenPipeError:  # the child stopped reading: what the bound is for
            pass
        finally:
            try:
                launcher.stdin.close()
            except BrokenPipeError:
                pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(launcher.stderr.read()), daemon=True)
    reader.start()
    code, peak_kib = (int(word) for word in launcher.stdout.read().split())
    launcher.wait()
    writer.join()
    reader.join()
    return code, errors[0].decode("utf-8", "replace"), peak_kib // 1024


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


def test_a_device_named_with_f_is_one_line_and_nothing_is_read(isolated_home):
    code, stderr, peak = _llmchat_capped("ask", *MISSING_MODEL, "-f", "/dev/zero", "hi")
    assert code == 2, stderr[-2000:]
    assert _one_line(stderr) == (
        "llmchat: error: /dev/zero is a device, not a regular file; "
        "attach a regular file (pipe a stream's output in with -f -)\n"
    )
    assert peak < SMALL_PEAK_MIB


def test_a_flood_on_stdin_is_read_no_further_than_the_context_could_hold(isolated_home):
    # 300 MB of zeros: `head -c 300000000 /dev/zero | llmchat ask hi`.
    code, stderr, peak = _llmchat_capped("ask", *MISSING_MODEL, "--ctx", "2048", "hi", feed_zeros=300 << 20)
    assert code == 4, stderr[-2000:]  # the prompt cannot fit the context
    limit = text_bound(2048).size
    assert _one_line(stderr) == (
        f"llmchat: error: stdin cannot fit: it holds more than {limit:,} bytes, more than a 2,048-token context "
        "can hold; pipe a part of it (e.g. through head -c)\n"
    )
    assert peak < SMALL_PEAK_MIB


def test_a_batch_input_line_without_end_is_refused_before_the_model(isolated_home):
    code, stderr, peak = _llmchat_capped("batch", "-", *MISSING_MODEL, "--ctx", "2048", feed_zeros=300 << 20)
    assert code == 4, stderr[-2000:]
    assert _one_line(stderr).startswith(
        f"llmchat: error: line 1 of stdin cannot fit: it is longer than {text_bound(2048).size:,} bytes"
    )
    assert peak < SMALL_PEAK_MIB


def _fifo_with_a_writer(path: Path) -> int:
    """A FIFO whose write end the test holds (O_RDWR opens it without waiting): a reader that opens
    it does not block, its read does, for ever."""
    os.mkfifo(path)
    return os.open(path, os.O_RDWR)


def _run_guarded(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-m", "llmchat", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"llmchat {' '.join(args)} blocked on a FIFO (no end after {HANG_GUARD_S} s)")


def test_a_fifo_or_socket_named_with_f_is_one_line(tmp_path, isolated_home):
    fifo = tmp_path / "pipe"
    writer = _fifo_with_a_writer(fifo)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    try:
        for name, kind in (("pipe", "a named pipe (FIFO)"), ("sock", "a socket")):
            result = _run_guarded(["ask", *MISSING_MODEL, "-f", str(tmp_path / name), "hi"])
            assert result.returncode == 2, result.stderr
            assert _one_line(result.stderr).startswith(
                f"llmchat: error: {tmp_path / name} is {kind}, not a regular file;"
            )
    finally:
        os.close(writer)
        listener.close()


def test_a_fifo_inside_a_folder_is_skipped_and_named_and_the_run_goes_on(tmp_path, smollm2_path, isolated_home):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("The sky is green today.\n")
    writer = _fifo_with_a_writer(folder / "b-pipe")
    (folder / "c-zero").symlink_to("/dev/zero")
    try:
        result = _run_guarded(
            ["ask", "-m", str(smollm2_path), "-n", "4", "--temperature", "0", "--json", "-f", str(folder), "colour?"]
        )
    finally:
        os.close(writer)
    assert result.returncode == 0, result.stderr
    assert f"skipped, not regular files: {folder / 'b-pipe'}, {folder / 'c-zero'}\n" in result.stderr
    record = json.loads(result.stdout)
    assert record["stats"]["prompt_tokens"] > 10  # a.txt reached the prompt


def test_the_reader_takes_no_more_than_its_bound(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(b"x" * 1024)
    assert read_file(text, "a.txt", text_bound(16)) == b"x" * 1024  # exactly at the bound (16 x 64 bytes)
    with pytest.raises(TooLong, match=r"a.txt does not fit: it is more than 960 bytes, more than a 15-token context"):
        read_file(text, "a.txt", text_bound(15))
    with pytest.raises(IsADirectoryError):
        read_file(tmp_path, "here", text_bound(15))
    # A bound chosen by the file's first bytes: an image's is its own, whatever the context.
    png = tmp_path / "a.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(4000))
    from llmchat.turn.attachments import collect

    assert collect([str(png)], bound=text_bound(15))[0].media == "image"
    assert text_bound(15).size < 4016 < MEDIA_MAX_BYTES


def test_a_piped_chat_line_longer_than_the_context_could_hold_is_never_held(cli, smollm2_path):
    """`chat` reads its stdin a line at a time, and a line no further than the context could hold:
    a longer one is reported as its turn (exit 4 at the end) and read past, and the chat goes on."""
    limit = text_bound(2048).size
    piped = b"Say hi.\n" + b"x" * (3 * limit) + b"\nSay bye.\n"
    result = cli("chat", "-m", str(smollm2_path), "--ctx", "2048", "-n", "4", "--no-history", "--json", input=piped)
    assert result.returncode == 4, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert [bool(turn["reply"]) for turn in turns] == [True, False, True]
    assert turns[1]["error"] == (
        f"line 2 of stdin cannot fit: it is longer than {limit:,} bytes, more than a 2,048-token context can hold; "
        "split it"
    )
    assert "Traceback" not in result.stderr


def test_an_image_piped_on_stdin_has_the_media_bound_not_the_texts(cli, smollm2_path, puppet_projector):
    """`-f -` is read by its first bytes' bound: an image bigger than what the context could hold
    as text (a photo of megabytes, a 256-token context here) is still an image of a few tokens."""
    from tests.media_fixtures import quadrants

    image = quadrants("red", "green", "blue", "red") + bytes(text_bound(256).size)  # padded after its IEND
    model = ("-m", str(smollm2_path), "--mmproj", str(puppet_projector), "--ctx", "256", "-n", "2")
    result = cli("ask", *model, "--no-history", "--json", "-f", "-", "What colours?", input=image)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["stats"]["media_tokens"] == 4
    too_long = cli("ask", *model, "--no-history", "-f", "-", "What?", input=b"x" * (text_bound(256).size + 1))
    assert too_long.returncode == 2 and "stdin cannot fit: it holds more than 16,384 bytes" in too_long.stderr
