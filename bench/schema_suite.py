#!/usr/bin/env python3
"""`--schema` against the JSON Schema Test Suite (draft 2020-12, outside optional/): which schemas
llmchat takes, and whether each grammar lets exactly the valid instances through.

    python bench/schema_suite.py [--out bench/results/schema_suite.json] [--list walls,holes,refused]

The suite comes from the jsonschema sdist (fetched once into ~/.cache/llmchat/test-pypi/ by
tests/schema_suite.py). Each instance is checked with llama.cpp's own grammar engine on SmolLM2's
vocabulary (llmchat.engine.grammar_probe): accepted when some standard serialization of it passes.
A hole is an invalid instance the grammar accepts; a wall a valid one it refuses; a wall inside
the narrowing llmchat documents (docs/structured-output.md) is counted as "narrowed".
Prints the figures, and writes every outcome (the raw file) to --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "schema_suite.json")
    parser.add_argument("--list", default="holes,walls", help="what to print case by case: holes, walls, refused")
    args = parser.parse_args()

    from llmchat.models.resolve import bundled_default_model
    from llmchat.tools.token_cost import VocabTokenizer
    from tests.schema_suite import JSONSCHEMA_VERSION, measure_all, suite_cache_root, suite_folder

    folder = suite_folder(suite_cache_root(Path.home()))
    vocab = VocabTokenizer(bundled_default_model()).model.vocab
    started = time.perf_counter()
    outcomes = measure_all(folder, vocab)
    seconds = time.perf_counter() - started

    taken = [o for o in outcomes if o.status != "refused"]
    refused = [o for o in outcomes if o.status == "refused"]
    figures = {
        "groups": len(outcomes),
        "instances": sum(len(o.case.tests) for o in outcomes),
        "converted": sum(o.status == "converted" for o in outcomes),
        "loose": sum(o.status == "loose" for o in outcomes),
        "unparsed": sum(o.status == "unparsed" for o in outcomes),
        "refused": len(refused),
        "valid": sum(o.valid for o in taken),
        "valid_accepted": sum(o.valid_accepted for o in taken),
        "invalid": sum(o.invalid for o in taken),
        "invalid_rejected": sum(o.invalid_rejected for o in taken),
        "holes": sum(len(o.holes) for o in taken),
        "walls": sum(len(o.walls) for o in taken),
        "walls_narrowed": sum(len(o.narrowed) for o in taken),
        "refused_by_keyword": dict(collections.Counter(o.keyword for o in refused).most_common()),
    }
    print(f"JSON Schema Test Suite (jsonschema {JSONSCHEMA_VERSION} sdist), draft 2020-12 outside optional/")
    print(f"  schema groups {figures['groups']}, instances {figures['instances']}")
    print(
        f"  converted {figures['converted']}, held loosely {figures['loose']}, refused {figures['refused']}"
        + (f", taken but unparsable by llama.cpp {figures['unparsed']}" if figures["unparsed"] else "")
    )
    print(
        f"  valid instances accepted {figures['valid_accepted']}/{figures['valid']} "
        f"(walls {figures['walls']}, of which inside the documented narrowing {figures['walls_narrowed']})"
    )
    print(f"  invalid instances rejected {figures['invalid_rejected']}/{figures['invalid']} (holes {figures['holes']})")
    print("  refused, by the keyword named: " + ", ".join(f"{k} {n}" for k, n in figures["refused_by_keyword"].items()))
    print(f"  ({seconds:.1f} s)")
    shown = set(args.list.split(","))
    for o in outcomes:
        where = f"{o.case.file} / {o.case.description}"
        for label in o.holes if "holes" in shown else []:
            print(f"HOLE  {where}: {label}")
        for label in o.walls if "walls" in shown else []:
            print(f"WALL{'*' if label in o.narrowed else ' '} {where}: {label}")
        if "refused" in shown and o.status == "refused":
            print(f"REFUSED {where}: {o.reason}")

    raw = {
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d"),
        "figures": figures,
        "outcomes": [
            {
                "file": o.case.file,
                "group": o.case.description,
                "status": o.status,
                "reason": o.reason,
                "keyword": o.keyword,
                "valid_accepted": o.valid_accepted,
                "valid": o.valid,
                "invalid_rejected": o.invalid_rejected,
                "invalid": o.invalid,
                "holes": o.holes,
                "walls": o.walls,
                "walls_narrowed": o.narrowed,
            }
            for o in outcomes
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".partial")
    partial.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(args.out)
    print(f"raw: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
