"""Choosing a chat template for a model, and probing how it treats a system prompt.

Resolution (`resolve_template`), first that applies wins:
    1. `--template NAME|PATH` (a built-in name, or a path to a .jinja file);
    2. the per-model template from the config file (same NAME|PATH forms);
    3. the model's own GGUF `tokenizer.chat_template` (named variants such as
       `tokenizer.chat_template.tool_use` are reported but not used);
    4. a built-in template matched on the GGUF metadata (marker tokens in the vocabulary first,
       then `general.name`/`general.basename`, then `general.architecture`);
    5. ChatML, with a warning that names the `--template` flag.

Every failure to compile or render is a `TemplateError` that names the template's source and the
`--template` override (llmchat.prompt.sandbox).

System prompts are never lost: each resolved template is probed once with a system message. If
it raises or drops the system text, `system_mode` is "folded" and `render_prompt`
(llmchat.prompt.render) puts the system text in front of the first user message
(system + "\\n" + user, llama.cpp's convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmchat.edges.bounded_input import ANY_TEXT, read_file
from llmchat.errors import TemplateError, UsageError
from llmchat.prompt.builtins import (
    BuiltinTemplate,
    builtin_template,
    builtin_templates,
    infer_stop_strings,
    normalize_model_name,
    parse_template_header,
)
from llmchat.prompt.model_facts import ModelFacts
from llmchat.prompt.render import ResolvedTemplate, template_context
from llmchat.prompt.sandbox import OVERRIDE_HINT, TemplateRenderError, render_compiled

FALLBACK_TEMPLATE = "chatml"

_PROBE_SYSTEM = "llmchat-system-probe-7f3a"
_PROBE_USER = "llmchat-user-probe-91c2"


# =================================================================================================
# System-prompt probe
# =================================================================================================
def _probe_render(compiled: Any, messages: list[dict[str, str]], facts: ModelFacts, label: str) -> str:
    return render_compiled(compiled, template_context(messages, facts, True), label)


def _probe_system_handling(compiled: Any, facts: ModelFacts, label: str) -> tuple[str, list[str]]:
    """("native" | "folded", notes). Raises TemplateError when even a lone user message fails."""
    user = {"role": "user", "content": _PROBE_USER}
    user_only = _probe_render(compiled, [user], facts, label)
    if _PROBE_USER.lower() not in user_only.lower():
        raise TemplateError(f"{label} leaves out the user's message when rendering a conversation; {OVERRIDE_HINT}")

    system = {"role": "system", "content": _PROBE_SYSTEM}
    try:
        with_system = _probe_render(compiled, [system, user], facts, label)
    except TemplateRenderError as err:
        if err.kind not in ("raised", "error"):
            raise
        return "folded", [
            f"the template refuses a system message ({err.detail}); the system prompt is put in front of the first user message"
        ]
    if _PROBE_SYSTEM.lower() not in with_system.lower():
        return "folded", [
            "the template drops the system message; the system prompt is put in front of the first user message"
        ]

    notes = []
    if _adds_default_system_prompt(compiled, facts, label, user_only):
        notes.append(
            "the template adds its own default system prompt when the conversation has none (kept: it is the model's own behaviour)"
        )
    return "native", notes


def _adds_default_system_prompt(compiled: Any, facts: ModelFacts, label: str, user_only: str) -> bool:
    """True when a lone user message gets more text in front of it than a user message after an
    empty system message: the template wrote a system prompt of its own."""
    try:
        empty_system = _probe_render(
            compiled, [{"role": "system", "content": ""}, {"role": "user", "content": _PROBE_USER}], facts, label
        )
    except TemplateError:
        return False
    before_user = user_only.lower().find(_PROBE_USER.lower())
    before_user_with_empty_system = empty_system.lower().find(_PROBE_USER.lower())
    return before_user_with_empty_system >= 0 and before_user > before_user_with_empty_system


# =================================================================================================
# Resolution
# =================================================================================================
@dataclass(frozen=True)
class _Candidate:
    name: str
    source: str
    source_detail: str
    text: str
    stop_strings: tuple[str, ...]
    warning: str | None = None


@dataclass(frozen=True)
class _Match:
    template: BuiltinTemplate
    score: tuple[int, int, int]  # (marker tokens present, name matched, architecture matched)
    reasons: tuple[str, ...]


def _match_builtin(template: BuiltinTemplate, facts: ModelFacts) -> _Match | None:
    if facts.vocab_known and template.match_tokens and not all(facts.has_token(t) for t in template.match_tokens):
        return None  # its turn markers are not in this vocabulary: it cannot be this model's format
    tokens = [t for t in template.match_tokens if facts.has_token(t)]
    model_names = [normalize_model_name(n) for n in (facts.name, facts.basename) if n]
    names = [pattern for pattern in template.match_names if any(pattern in n for n in model_names)]
    arch = bool(facts.architecture) and facts.architecture.lower() in template.match_architectures
    if not (tokens or names or arch):
        return None
    reasons = []
    if tokens:
        reasons.append("tokens " + " ".join(tokens))
    if names:
        reasons.append(f"name contains {names[0]!r}")
    if arch:
        reasons.append(f"architecture {facts.architecture}")
    return _Match(template, (len(tokens), int(bool(names)), int(arch)), tuple(reasons))


def match_builtins(facts: ModelFacts) -> list[_Match]:
    """Built-ins that match the model, best first (ties: alphabetical, so the choice is stable)."""
    matches = [m for m in (_match_builtin(t, facts) for t in builtin_templates()) if m is not None]
    return sorted(matches, key=lambda m: (tuple(-s for s in m.score), m.template.name))


def _choice_candidate(choice: str, source: str) -> _Candidate:
    """A NAME|PATH choice from --template (source "flag") or the config file (source "config")."""
    where = "--template" if source == "flag" else "the config file's template"
    builtin = builtin_template(choice)
    if builtin is not None:
        return _Candidate(
            builtin.name, source, f"built-in template '{builtin.name}' ({where})", builtin.text, builtin.stop_strings
        )
    path = Path(choice).expanduser()
    if path.is_file():
        try:
            text = read_file(path, f"template file {path}", ANY_TEXT, advice="pass a Jinja file").decode("utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read template file {path} ({where}): {err}") from None
        label = f"template file {path} ({where})"
        return _Candidate(path.stem, source, label, text, _declared_or_inferred_stops(text, label))
    names = ", ".join(t.name for t in builtin_templates())
    raise UsageError(f"unknown template {choice!r} ({where}): not a file and not a built-in ({names})")


def _declared_or_inferred_stops(text: str, label: str) -> tuple[str, ...]:
    try:
        declared = parse_template_header(text, label).get("stop", [])
    except TemplateError:
        declared = []
    return tuple(declared) or infer_stop_strings(text)


def _fallback_warning(facts: ModelFacts) -> str:
    described = ", ".join(
        f"{label} {value!r}"
        for label, value in (("architecture", facts.architecture), ("name", facts.name or facts.basename))
        if value
    )
    about = f" ({described})" if described else ""
    return (
        f"this model{about} has no chat template and no built-in template matches it; using ChatML. "
        f"If replies look wrong, pick one with --template NAME (see `llmchat template list`)"
    )


def resolve_template(
    facts: ModelFacts, user_choice: str | None = None, config_choice: str | None = None
) -> ResolvedTemplate:
    """Choose the template (see the module docstring for the order), compile it and probe it."""
    steps: list[str] = []
    candidate: _Candidate | None = None

    if user_choice:
        candidate = _choice_candidate(user_choice, "flag")
        steps.append(f"1. --template {user_choice}: {candidate.source_detail} -> chosen")
    else:
        steps.append("1. --template: not given")

    if config_choice and candidate is None:
        candidate = _choice_candidate(config_choice, "config")
        steps.append(f"2. config file: template {config_choice!r}: {candidate.source_detail} -> chosen")
    else:
        steps.append(
            f"2. config file: template {config_choice!r} (not used: --template wins)"
            if config_choice
            else "2. config file: no template for this model"
        )

    steps.append("3. " + _gguf_step(facts, chosen=candidate is None and bool(facts.chat_template)))
    if candidate is None and facts.chat_template:
        label = "GGUF tokenizer.chat_template"
        candidate = _Candidate(
            "gguf", "gguf", label, facts.chat_template, infer_stop_strings(facts.chat_template, facts.eos_token)
        )

    matches = match_builtins(facts)
    steps.append("4. " + _builtin_step(matches, chosen=candidate is None and bool(matches)))
    if candidate is None and matches:
        best = matches[0].template
        detail = f"built-in template '{best.name}' (matched on {', '.join(matches[0].reasons)})"
        candidate = _Candidate(best.name, "builtin", detail, best.text, best.stop_strings)

    if candidate is None:
        fallback = builtin_template(FALLBACK_TEMPLATE)
        assert fallback is not None, "chatml.jinja ships with llmchat"
        warning = _fallback_warning(facts)
        candidate = _Candidate(
            fallback.name,
            "fallback",
            "built-in template 'chatml' (fallback)",
            fallback.text,
            fallback.stop_strings,
            warning,
        )
        steps.append("5. fallback: ChatML -> chosen")
    else:
        steps.append("5. fallback: not needed")

    return _prepare(candidate, facts, steps)


def _gguf_step(facts: ModelFacts, *, chosen: bool) -> str:
    named = sorted(facts.named_templates)
    named_text = f"; named variants {', '.join(named)} are not used" if named else ""
    if not facts.chat_template:
        return f"GGUF tokenizer.chat_template: not present{named_text}"
    verdict = "chosen" if chosen else "present, not used"
    return f"GGUF tokenizer.chat_template: {len(facts.chat_template):,} characters -> {verdict}{named_text}"


def _builtin_step(matches: list[_Match], *, chosen: bool) -> str:
    if not matches:
        return "built-in match: none"
    best = matches[0]
    text = f"built-in match: '{best.template.name}' ({', '.join(best.reasons)})"
    if len(matches) > 1:
        text += "; also " + ", ".join(f"'{m.template.name}'" for m in matches[1:4])
    return text + (" -> chosen" if chosen else " (not used)")


def _prepare(candidate: _Candidate, facts: ModelFacts, steps: list[str]) -> ResolvedTemplate:
    resolved = ResolvedTemplate(
        name=candidate.name,
        source=candidate.source,
        source_detail=candidate.source_detail,
        text=candidate.text,
        stop_strings=candidate.stop_strings,
        warning=candidate.warning,
        steps=steps,
    )
    mode, notes = _probe_system_handling(resolved.compiled(), facts, resolved.source_detail)
    resolved.system_mode = mode
    resolved.notes.extend(notes)
    if not resolved.stop_strings:
        resolved.notes.append(
            "no stop strings known for this template; generation ends at the model's end-of-generation tokens"
        )
    return resolved
