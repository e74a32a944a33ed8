"""`--schema` measured against the JSON Schema Test Suite (draft 2020-12, outside optional/), as
bench/schema_suite.py does, so that a change to the converter, or an upgrade of llama.cpp's grammar
engine, cannot open a hole or lose coverage unseen (figures: docs/structured-output.md).

The suite is fetched once per machine with pip (tests/schema_suite.py); without it this test
fails, saying why, rather than skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.schema_suite import measure_all, suite_cache_root, suite_folder

# Measured on this branch (bench/results/schema_suite.json): 188 of 368 groups converted, no hole.
CONVERTED_FLOOR = 188
REAL_HOME = Path.home()  # read at collection, before a test's HOME is a temp folder (conftest.isolated_home)


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    from llmchat.tools.token_cost import VocabTokenizer

    tokenizer = VocabTokenizer(smollm2_path)
    yield tokenizer.model.vocab
    tokenizer.model.close()


@pytest.mark.slow
def test_the_suite_finds_no_hole_no_unnarrowed_wall_and_keeps_its_coverage(vocab):
    outcomes = measure_all(suite_folder(suite_cache_root(REAL_HOME)), vocab)
    assert len(outcomes) == 368  # the suite's draft 2020-12 groups outside optional/
    holes = [f"{o.case.file} / {o.case.description}: {h}" for o in outcomes for h in o.holes]
    assert holes == [], "the grammar lets invalid instances through:\n" + "\n".join(holes)
    walls = [f"{o.case.file} / {o.case.description}: {w}" for o in outcomes for w in o.walls if w not in o.narrowed]
    assert walls == [], "the grammar refuses valid instances (outside the documented narrowing):\n" + "\n".join(walls)
    assert not [o for o in outcomes if o.status == "unparsed"], (
        "a schema was taken whose grammar llama.cpp cannot parse"
    )
    converted = sum(o.status != "refused" for o in outcomes)
    assert converted >= CONVERTED_FLOOR, f"coverage fell: {converted} schemas converted, was {CONVERTED_FLOOR}"
    refusals = [o.reason for o in outcomes if o.status == "refused"]
    assert all("\n" not in r and r for r in refusals)  # each refusal is one line
