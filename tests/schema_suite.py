"""The JSON Schema Test Suite against `--schema`: which schemas llmchat takes, and whether the grammar
each compiles to lets exactly the valid instances through (llama.cpp's own grammar engine, on a
model's vocabulary: llmchat.engine.grammar_probe).

The suite (draft 2020-12, outside `optional/`) ships inside the `jsonschema` sdist on PyPI, at the
version llmchat verifies (JSONSCHEMA_VERSION). `suite_folder` fetches that sdist once per machine
with pip into `~/.cache/llmchat/test-pypi/` (a file lock keeps parallel workers from fetching
twice) and reuses it after; without it, it raises, saying why: the run that guards `--schema`
fails rather than skips.

For each schema group: `converted` (the grammar holds it exactly as far as the suite shows),
`loose` (taken, with a notice naming what the grammar holds only loosely) or `refused` (one line
naming the keyword). For each instance of a taken schema: the grammar accepts it when it accepts
some standard serialization of it (`serializations`: key orders, compact or spaced separators,
ASCII escapes or not, an integral float written as an integer). A valid instance it refuses is a
*wall*: the model cannot write that reply; an invalid instance it accepts is a *hole*: the model
can write it, and the reply fails validation after the whole decode (exit 5).
A wall inside what llmchat documents as narrowing (`narrowed`) is counted apart from the others.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import subprocess
import sys
import tarfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSONSCHEMA_VERSION = "4.26.0"  # pyproject's verified jsonschema; its sdist carries the suite
DRAFT = "draft2020-12"
FETCH_TIMEOUT_S = 600
MAX_SERIALIZATIONS = 48  # per instance: enough for every key order of the suite's small objects


class SuiteUnavailable(RuntimeError):
    """The suite could not be fetched (no pip, no registry): the guarding test fails with this."""


def suite_cache_root(real_home: Path) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(real_home / ".cache")
    return Path(base) / "llmchat" / "test-pypi" / f"jsonschema-{JSONSCHEMA_VERSION}"


def suite_folder(root: Path) -> Path:
    """The folder of the suite's draft 2020-12 files, fetching the sdist the first time."""
    folder = root / "tests" / DRAFT
    if (folder / "type.json").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "type.json").exists():  # another worker fetched it meanwhile
            return folder
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--quiet"]
            + [f"jsonschema=={JSONSCHEMA_VERSION}", "-d", str(root)],
            capture_output=True,
            text=True,
            timeout=FETCH_TIMEOUT_S,
        )
        sdist = root / f"jsonschema-{JSONSCHEMA_VERSION}.tar.gz"
        if done.returncode != 0 or not sdist.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SuiteUnavailable(
                f"pip could not fetch the jsonschema {JSONSCHEMA_VERSION} sdist (it carries the JSON Schema "
                f"Test Suite): {tail[0]}"
            )
        prefix = f"jsonschema-{JSONSCHEMA_VERSION}/json/tests/{DRAFT}/"
        staging = root / "tests.partial"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                if member.isfile() and member.name.startswith(prefix) and member.name.endswith(".json"):
                    name = member.name[len(prefix) :]
                    target = staging / DRAFT / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = archive.extractfile(member)
                    assert source is not None
                    target.write_bytes(source.read())
        staging.rename(root / "tests")  # whole or not at all
        sdist.unlink()
    return folder


@dataclass(frozen=True)
class Case:
    file: str
    description: str
    schema: Any
    tests: list[dict[str, Any]]


def suite_cases(folder: Path) -> list[Case]:
    """Every schema group of the draft outside `optional/`, in file order."""
    cases = []
    for path in sorted(folder.glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            cases.append(Case(path.stem, group["description"], group["schema"], group["tests"]))
    return cases


# --- serializations of an instance --------------------------------------------------------------------
def _variants(value: Any) -> Iterator[Any]:
    """The same JSON value in other shapes a writer may give it: keys in any order, an integral
    float as an integer (JSON has one number type: 1.0 and 1 are the same number)."""
    if isinstance(value, dict):
        keys = list(value)
        per_key = [list(itertools.islice(_variants(value[k]), 4)) for k in keys]
        for order in itertools.permutations(range(len(keys))):
            for values in itertools.product(*(per_key[i] for i in order)):
                yield {keys[i]: v for i, v in zip(order, values)}
    elif isinstance(value, list):
        per_item = [list(itertools.islice(_variants(item), 4)) for item in value]
        for values in itertools.product(*per_item):
            yield list(values)
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        yield int(value)
        yield value
    else:
        yield value


def serializations(value: Any) -> Iterator[str]:
    """Standard JSON texts of `value`, compact and spaced first, each at most once."""
    seen: set[str] = set()
    for variant in itertools.islice(_variants(value), MAX_SERIALIZATIONS):
        for separators in ((", ", ": "), (",", ":")):
            for ascii_only in (False, True):
                text = json.dumps(variant, separators=separators, ensure_ascii=ascii_only)
                if text not in seen:
                    seen.add(text)
                    yield text


# --- measuring ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    case: Case
    status: str  # "converted", "loose", "refused"; "unparsed": taken, but llama.cpp cannot parse its grammar
    reason: str = ""  # the refusal or the looseness notice, as the user sees it
    keyword: str = ""  # the keyword it names
    walls: list[str] = field(default_factory=list)  # valid instances the grammar refuses
    narrowed: list[str] = field(default_factory=list)  # ... of which llmchat documents the narrowing
    holes: list[str] = field(default_factory=list)  # invalid instances the grammar accepts
    valid_accepted: int = 0
    invalid_rejected: int = 0
    valid: int = 0
    invalid: int = 0


_QUOTED = re.compile(r"'([A-Za-z$][\w$]*)'")


def named_keyword(message: str) -> str:
    """The keyword a refusal names (its first quoted word), or what kind of refusal it is."""
    if "converter cannot" in message:
        return "(converter error)"
    if "must be a JSON object" in message:
        return "(boolean schema)"
    if "no JSON value satisfies" in message:
        return "(nothing is valid)"
    match = _QUOTED.search(message)
    return match.group(1) if match else message.split(" at ")[0][:40]


def narrowed(schema: Any) -> Any:
    """The schema as llmchat documents holding it (docs/structured-output.md): an object that
    names its properties takes no other keys unless `additionalProperties` says so. (Formats
    are asserted too: `narrowed_valid` checks them.)"""
    if isinstance(schema, list):
        return [narrowed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: narrowed(value) if key not in ("enum", "const") else value for key, value in schema.items()}
    if ("properties" in schema or "patternProperties" in schema) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def narrowed_valid(schema: Any, instance: Any) -> bool:
    """Whether `instance` is valid under the documented narrowing of `schema`."""
    from jsonschema import Draft202012Validator, FormatChecker

    checker = FormatChecker()

    @checker.checks("date-time")  # its own checker needs a package jsonschema leaves optional
    def date_time(text: object) -> bool:
        if not isinstance(text, str) or len(text) < 11 or text[10] not in "tT":
            return not isinstance(text, str)
        return checker.conforms(text[:10], "date") and checker.conforms(text[11:], "time")

    return Draft202012Validator(narrowed(schema), format_checker=checker).is_valid(instance)


def measure(case: Case, vocab: Any) -> Outcome:
    """What `--schema` does with one group's schema, and with each of its instances."""
    from llmchat.engine.grammar_probe import GrammarProbe
    from llmchat.errors import UsageError
    from llmchat.turn.structured import structured_output

    if not isinstance(case.schema, dict):
        message = "the schema must be a JSON object (a JSON Schema)"
        return Outcome(case, "refused", message, named_keyword(message))
    try:
        with warnings.catch_warnings():  # a suite schema naming a metaschema jsonschema does not have
            warnings.simplefilter("ignore", DeprecationWarning)
            structured = structured_output(schema=json.dumps(case.schema))
    except UsageError as err:
        return Outcome(case, "refused", str(err), named_keyword(str(err)))
    assert structured is not None
    notice = getattr(structured, "notice", None) or ""
    outcome = Outcome(case, "loose" if notice else "converted", notice, named_keyword(notice) if notice else "")
    try:
        probe = GrammarProbe(vocab, structured.grammar.text)
    except UsageError:  # taken by llmchat, then refused by llama.cpp at the first decode
        return Outcome(case, "unparsed", "llama.cpp cannot parse the grammar", "(unparsable grammar)")
    with probe:
        for test in case.tests:
            accepted = any(probe.accepts(text) for text in serializations(test["data"]))
            label = f"{test['description']}: {json.dumps(test['data'])[:80]}"
            if test["valid"]:
                outcome.valid += 1
                if accepted:
                    outcome.valid_accepted += 1
                else:
                    outcome.walls.append(label)
                    if not narrowed_valid(case.schema, test["data"]):
                        outcome.narrowed.append(label)
            else:
                outcome.invalid += 1
                if accepted:
                    outcome.holes.append(label)
                else:
                    outcome.invalid_rejected += 1
    return outcome


def measure_all(folder: Path, vocab: Any) -> list[Outcome]:
    return [measure(case, vocab) for case in suite_cases(folder)]
