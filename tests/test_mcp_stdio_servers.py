"""Reference servers over stdio through `llmchat mcp call`, with no model: mcp-server-time and
mcp-server-git (PyPI, pure Python) and @modelcontextprotocol/server-filesystem (npm, pinned)."""

from __future__ import annotations

import json
import subprocess


def call(cli, spec: str, server: str, tool: str, arguments: dict, *extra: str):
    run = cli("mcp", "call", server, tool, "--mcp", spec, "--args", json.dumps(arguments), *extra)
    assert "Traceback" not in run.stderr, run.stderr
    return run


def test_time_answers_and_reports_its_errors(cli):
    run = call(cli, "mcp-server-time --local-timezone UTC", "time", "get_current_time", {"timezone": "UTC"})
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["timezone"] == "UTC" and answer["datetime"].endswith("+00:00")
    bad = call(cli, "mcp-server-time", "time", "get_current_time", {"timezone": "Nowhere/Atlantis"})
    assert bad.returncode == 1 and bad.stdout == ""
    assert (
        bad.stderr.startswith("llmchat: time_get_current_time reported an error:") and "Invalid timezone" in bad.stderr
    )


def test_git_reads_a_real_repository(cli, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["config", "user.email", "t@example.com"], ["config", "user.name", "T"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    (repo / "notes.txt").write_text("first\n", encoding="utf-8")
    subprocess.run(["git", "add", "notes.txt"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "the first note"], cwd=repo, check=True)
    (repo / "notes.txt").write_text("first\nsecond\n", encoding="utf-8")
    spec = f"mcp-server-git --repository {repo}"
    status = call(cli, spec, "git", "git_status", {"repo_path": str(repo)})
    assert status.returncode == 0, status.stderr
    assert "notes.txt" in status.stdout
    log = call(cli, spec, "git", "git_log", {"repo_path": str(repo), "max_count": 1}, "--json")
    assert log.returncode == 0, log.stderr
    assert "the first note" in json.loads(log.stdout)["text"]
    diff = call(cli, spec, "git", "git_diff_unstaged", {"repo_path": str(repo)})
    assert "+second" in diff.stdout


def test_filesystem_reads_inside_its_folder_and_refuses_outside(cli, npm_mcp_bin, tmp_path, monkeypatch):
    """Started as a new user would (`mcp-server-filesystem NOTES`, llmchat run from another
    folder), the server works in its own folder: llmchat declares no roots it was not given, and
    the server replaces its folders with the client's roots when there are any (docs/mcp.md: roots)."""
    notes, work = tmp_path / "notes", tmp_path / "work"
    notes.mkdir()
    work.mkdir()
    (notes / "hello.txt").write_text("hello from the filesystem server\n", encoding="utf-8")
    (work / "secret.txt").write_text("not the server's\n", encoding="utf-8")
    monkeypatch.chdir(work)
    spec = f"{npm_mcp_bin / 'mcp-server-filesystem'} {notes}"
    read = call(cli, spec, "filesystem", "read_text_file", {"path": str(notes / "hello.txt")})
    assert read.returncode == 0, read.stderr
    assert read.stdout.startswith("hello from the filesystem server")
    outside = call(cli, spec, "filesystem", "read_text_file", {"path": str(work / "secret.txt")}, "--json")
    assert outside.returncode == 1 and json.loads(outside.stdout)["is_error"] is True
    assert "Access denied" in outside.stderr and "not the server's" not in outside.stdout
    # A --root is the user saying so: the server works there instead.
    given = call(cli, spec, "filesystem", "read_text_file", {"path": str(work / "secret.txt")}, "--root", str(work))
    assert given.returncode == 0 and given.stdout.startswith("not the server's"), given.stderr


def test_a_server_that_cannot_start_is_exit_2_in_one_line(cli):
    run = cli("mcp", "tools", "--mcp", "/nonexistent/mcp-server-gone")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        "llmchat: error: MCP server gone (/nonexistent/mcp-server-gone) did not start: "
        "program not found (/nonexistent/mcp-server-gone)\n"
    )
    unknown = cli("mcp", "call", "nowhere", "tool")
    assert unknown.returncode == 2 and "no MCP server named 'nowhere'" in unknown.stderr
