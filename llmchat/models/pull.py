"""`llmchat models pull hf:ORG/REPO[:QUANT|/FILE.gguf]`: download a GGUF into the Hugging Face cache.

The only code in llmchat that touches the network, and only when `pull` is typed. Everything goes
through `huggingface_hub` (imported here, lazily): the repository's file list (`HfApi.model_info`,
`/api/models/{repo}`), the file's metadata (`get_hf_file_metadata`: commit, ETag, size), the
HTTP transfer (`http_get`, which sends `Range` to continue a partial file and retries a dropped
connection), and the cache layout (`hf_hub_download` makes the `snapshots/` symlink). HF_TOKEN,
HF_ENDPOINT, HF_HUB_CACHE/HF_HOME and HF_HUB_OFFLINE work as in every other tool.

Why the transfer is not simply `hf_hub_download`: since huggingface_hub 1.x/2.x
(huggingface/huggingface_hub#4228) it downloads into a per-process temp file that it deletes on
failure, so a pull interrupted at 3.9 of 4 GB (Ctrl-C, a dead connection, a closed laptop) would
start from zero. Here the partial file is `blobs/<etag>.incomplete` (the name older
huggingface_hub versions used) and is kept; the next `pull` sends `Range: bytes=<have>-` and the
blob is renamed into place only when it has the size the hub announced. Plain HTTP is used, not
Xet: a Xet transfer cannot continue a partial file.

The file is picked as llama.cpp's `-hf` picks it (llmchat/models/quant.py): Q4_K_M by default, then
Q8_0; a missing quantization lists the ones the repository has. The repository's projector
(mmproj) for it comes too, as with `-hf`, so that the model sees where it can (--no-mmproj: not).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from llmchat.edges.safe_text import terminal_safe
from llmchat.errors import LlmchatError, ModelError, UsageError
from llmchat.models import quant
from llmchat.models.hf_cache import hf_download_dir, hf_repo_folder

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class NetworkError(LlmchatError):
    """The hub cannot be reached (offline, DNS, refused, HF_HUB_OFFLINE set)."""


@dataclass(frozen=True)
class PullSpec:
    repo: str
    quant: str | None = None
    file: str | None = None
    revision: str = "main"

    @property
    def text(self) -> str:
        tail = f"/{self.file}" if self.file else f":{self.quant}" if self.quant else ""
        return f"hf:{self.repo}{tail}"


def parse_spec(spec: str) -> PullSpec:
    """`hf:ORG/REPO`, `hf:ORG/REPO:Q8_0`, `hf:ORG/REPO/FILE.gguf` (the `hf:` may be left out)."""
    rest = spec[3:] if spec.startswith("hf:") else spec
    if spec.startswith(("ollama:", "lmstudio:")):
        raise UsageError(f"models pull fetches from Hugging Face only; use `{spec.split(':')[0]}` itself for {spec!r}")
    head, _, tag = rest.partition(":")
    parts = head.split("/")
    if len(parts) < 2 or not all(parts[:2]) or (tag and len(parts) > 2):
        raise UsageError(
            f"{spec!r} is not hf:ORG/REPO[:QUANT] or hf:ORG/REPO/FILE.gguf; e.g. hf:Qwen/Qwen3-4B-GGUF:Q4_K_M"
        )
    file = "/".join(parts[2:]) or None
    if file is not None and not file.lower().endswith(".gguf"):
        raise UsageError(f"{file!r} is not a .gguf file; name a GGUF file of the repository, or a quantization")
    return PullSpec(repo="/".join(parts[:2]), quant=tag or None, file=file)


def _hub() -> Any:
    # Nothing leaves this machine except the requests `pull` makes: no telemetry.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    import huggingface_hub
    from huggingface_hub.utils import logging as hub_logging

    # Its retry warnings span several lines; failures reach the user as llmchat's one error line.
    hub_logging.set_verbosity_error()
    return huggingface_hub


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def translate(err: BaseException, spec: PullSpec, file: str | None = None) -> LlmchatError | None:
    """huggingface_hub's and httpx's exceptions as one actionable line."""
    from huggingface_hub import errors as hub_errors

    name = type(err).__name__
    if isinstance(err, hub_errors.OfflineModeIsEnabled):
        return NetworkError("HF_HUB_OFFLINE is set, so nothing can be downloaded; unset it to pull")
    if isinstance(err, hub_errors.GatedRepoError):
        return ModelError(
            f"{spec.repo} is gated: accept its terms on {_endpoint()}/{spec.repo} and set HF_TOKEN to a token of "
            "that account"
        )
    if isinstance(err, hub_errors.RepositoryNotFoundError):
        token = " (HF_TOKEN is set: does it have access?)" if os.environ.get("HF_TOKEN") else ""
        return ModelError(
            f"no repository {spec.repo} on {_endpoint()}{token}; check the name, or set HF_TOKEN for a private repo"
        )
    if isinstance(err, hub_errors.RevisionNotFoundError):
        return ModelError(f"{spec.repo} has no revision {spec.revision!r}")
    if isinstance(err, hub_errors.RemoteEntryNotFoundError):
        missing = file or spec.file or spec.quant
        return ModelError(f"{spec.repo} lists {missing} but {_endpoint()} has no such file (HTTP 404); try again later")
    if isinstance(err, hub_errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", "?")
        return NetworkError(
            f"{_endpoint()} answered HTTP {status} for {spec.repo}; try again later "
            "(a partial download is kept: the same pull continues it)"
        )
    if name in (
        "ConnectError",
        "ConnectTimeout",
        "ReadTimeout",
        "TimeoutException",
        "RemoteProtocolError",
        "ReadError",
    ):
        return NetworkError(
            f"cannot reach {_endpoint()} ({name}: {err}); check the network connection (or HF_ENDPOINT). "
            "A partial download is kept: run the same pull again to continue it"
        )
    if isinstance(err, OSError) and "Consistency check failed" in str(err):
        return NetworkError(
            f"the download of {spec.repo} ended early; run the same pull again to continue it from where it stopped"
        )
    return None


def choose_files(files: list[str], spec: PullSpec) -> list[str]:
    """The file(s) to download: one, or every part of a split model."""
    chosen = quant.find_file(files, spec.file) if spec.file else quant.pick_file(files, spec.quant)
    if chosen is None:
        choices = quant.quant_choices(files)
        if not choices:
            raise ModelError(f"{spec.repo} has no GGUF model file; pick a repository of GGUF files")
        wanted = f"file {spec.file!r}" if spec.file else f"{spec.quant} file"
        example = f"llmchat models pull hf:{spec.repo}:{choices[0]}"
        raise UsageError(f"{spec.repo} has no {wanted}; choose one of: {', '.join(choices)} (e.g. {example})")
    return quant.split_all_parts(files, chosen)


def pull(spec: PullSpec, *, show_progress: bool = True, projector: bool = True) -> list[Path]:
    """Download the file(s) `spec` means into the HF cache, and with them the repository's
    multimodal projector for that model (`projector`; quant.pick_projector), as llama.cpp's `-hf`
    does; return their snapshot paths, the model's first."""
    hub = _hub()
    current: str | None = None
    try:
        info = hub.HfApi().model_info(spec.repo, revision=spec.revision)
        files = [s.rfilename for s in (info.siblings or [])]
        chosen = choose_files(files, PullSpec(spec.repo, spec.quant, spec.file, spec.revision))
        mmproj = quant.pick_projector(files, chosen[0]) if projector else None
        chosen += [mmproj] if mmproj else []
        commit = info.sha or spec.revision
        pulled: list[Path] = []
        with _progress(show_progress) as bars:
            for current in chosen:
                pulled.append(_fetch(hub, spec, current, commit, bars))
        return pulled
    except LlmchatError:
        raise
    except Exception as err:  # one line for the user; the cause is kept for --debug
        mapped = translate(err, spec, current)
        if mapped is None:
            raise
        raise mapped from err


def _fetch(hub: Any, spec: PullSpec, name: str, commit: str, bars: RichBars) -> Path:
    from huggingface_hub.file_download import http_get

    cache = hf_download_dir()
    url = hub.hf_hub_url(spec.repo, name, revision=commit)
    headers = hub.utils.build_hf_headers()
    meta = hub.get_hf_file_metadata(url, headers=dict(headers))
    if meta.etag is None:
        raise NetworkError(f"{_endpoint()} gave no ETag for {name}; is HF_ENDPOINT a Hugging Face hub?")
    storage = hf_repo_folder(cache, spec.repo)
    blob = storage / "blobs" / meta.etag
    if not blob.exists():
        download_url, download_headers = url, dict(headers)
        if meta.xet_file_data is None and meta.location and meta.location != url:
            download_url = meta.location  # the CDN address the hub redirected to
            if urlparse(download_url).netloc != urlparse(url).netloc:
                download_headers.pop("authorization", None)  # a signed CDN URL needs no token
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = blob.with_name(blob.name + ".incomplete")
        with open(partial, "ab") as out:
            have = out.tell()
            if meta.size is not None and have > meta.size:  # not this file's bytes: start over
                out.truncate(0)
                have = 0
            bars.resuming = have
            http_get(
                download_url,
                out,
                resume_size=have,
                headers=download_headers,
                expected_size=meta.size,
                displayed_filename=name.rsplit("/", 1)[-1],
                tqdm_class=bars.factory(),
            )
        if meta.size is not None and partial.stat().st_size != meta.size:
            raise NetworkError(f"the download of {name} ended early; run the same pull again to continue it")
        os.replace(partial, blob)
    # The library makes the snapshot symlink (or a copy where symlinks fail) for the blob it finds.
    pointer = Path(hub.hf_hub_download(spec.repo, name, revision=commit, cache_dir=str(cache)))
    if not COMMIT_RE.match(spec.revision):
        _write_ref(storage, spec.revision, commit)
    return pointer


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """`refs/main` -> the commit, as huggingface_hub writes it, so other tools find the snapshot."""
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    temp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    temp.write_text(commit, encoding="utf-8")
    os.replace(temp, ref)


# ---------------------------------------------------------------------------------------------
# Progress: a rich bar on stderr, fed through huggingface_hub's tqdm_class hook


class RichBars:
    """One rich Progress for the whole pull; `factory()` gives http_get a tqdm-like class per file."""

    def __init__(self, progress: Progress | None):
        self.progress = progress
        self.resuming = 0

    def factory(self) -> type:
        owner = self

        class _Bar:
            def __init__(self, *args: Any, total: int | None = None, initial: int = 0, desc: str = "", **kw: Any):
                self.task: TaskID | None = None
                if owner.progress is not None:
                    from rich.markup import escape

                    # The repository's file name: terminal-safe, and read by the bar's column as
                    # markup, so its brackets are escaped.
                    label = escape(terminal_safe(desc)) + (" (resuming)" if owner.resuming else "")
                    self.task = owner.progress.add_task(label, total=total, completed=initial)

            def update(self, n: int = 1) -> None:
                if owner.progress is not None and self.task is not None:
                    owner.progress.advance(self.task, n)

            def close(self) -> None:
                pass

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                self.close()

        return _Bar


class _progress:
    """A rich progress display on stderr when it is a terminal (or forced); nothing otherwise."""

    def __init__(self, show: bool):
        self.show = show
        self.progress: Progress | None = None

    def __enter__(self) -> RichBars:
        if self.show:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(file=sys.stderr),
                transient=False,
            )
            self.progress.start()
        return RichBars(self.progress)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.progress is not None:
            self.progress.stop()
