"""Candidate files and study settings: valid files load; every mistake names the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftfit.candidates import build_study, load_candidate, load_candidates
from draftfit.errors import DraftfitError


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = [
    ("name: ng\ntarget: smollm2\ndraft: {method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 4}\nk: [1, 2, 4]\n",
     {"method": "ngram", "k": (1, 2, 4), "lookup": (2, 4)}),
    ("name: ng5\ntarget: smollm2\ndraft: {method: ngram}\n", {"method": "ngram", "k": tuple(range(1, 9)), "lookup": (5, 5)}),
    ("name: ee8\ntarget: smollm2\ndraft: {derived: {first_layers: 8}}\nk: 3\n", {"method": "draft_model", "k": (3,)}),
    ("name: self\ntarget: smollm2\ndraft: {model: smollm2}\nk: [4, 2, 2]\n", {"method": "draft_model", "k": (2, 4)}),
]


@pytest.mark.parametrize("text, expected", GOOD)
def test_valid_candidate_files(tmp_path, text, expected):
    candidate, study = load_candidate(write(tmp_path, "c.yaml", text))
    assert candidate.draft.method == expected["method"]
    assert candidate.k == expected["k"]
    if "lookup" in expected:
        assert candidate.draft.lookup == expected["lookup"]
    assert study is None


BAD = [
    ("name: a\ntarget: smollm2\ndraft: {method: ngram}\nk: [1, 0]\n", "k: entry [1] is 0: must be between 1 and 16"),
    ("name: a\ntarget: smollm2\ndraft: {method: ngram}\nk: [100]\n", "k: entry [0] is 100"),
    ("name: a\ntarget: smollm2\ndraft: {method: ngram}\nspeed: 3\n", "speed: unknown key"),
    ("name: a\ntarget: smollm2\ndraft: {method: ngram, model: x}\n", "draft: method ngram uses no model"),
    ("name: a\ntarget: smollm2\ndraft: {method: draft_model}\n", "needs exactly one of `model` or `derived`"),
    ("name: a\ntarget: smollm2\ndraft: {method: ngram, prompt_lookup_min: 5, prompt_lookup_max: 2}\n", "prompt_lookup_min 5 > prompt_lookup_max 2"),
    ("name: a\ntarget: smollm2\ndraft: {derived: {first_layers: 0}}\n", "draft.derived.first_layers: Input should be greater than or equal to 1"),
    ("name: a\ntarget: smollm2\ndraft: {method: medusa, model: x}\n", "draft.method: Input should be"),
    ("name: a\ntarget: smollm2\ndraft: {method: ngram}\nk: three\n", "k: Input should be a valid tuple"),
    ("name: a\ntarget: smollm2\ndraft: [ngram\n", "YAML syntax error"),
    ("- just\n- a list\n", "must be a mapping"),
    ("name: a\ndraft: {method: ngram}\n", "target: Field required"),
]


@pytest.mark.parametrize("text, words", BAD)
def test_bad_candidate_files_name_file_and_field(tmp_path, text, words):
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(DraftfitError) as info:
        load_candidate(path)
    message = str(info.value)
    assert str(path) in message and words in message and "\n" not in message


def test_binary_and_missing_files(tmp_path):
    with pytest.raises(DraftfitError, match="binary file"):
        load_candidate(write(tmp_path, "b.yaml", "\0\1\2"))
    with pytest.raises(DraftfitError, match="no such file"):
        load_candidate(tmp_path / "missing.yaml")


def test_duplicate_names_and_disagreeing_study_blocks(tmp_path):
    a = write(tmp_path, "a.yaml", "name: a\ntarget: smollm2\ndraft: {method: ngram}\nstudy: {max_tokens: 64}\n")
    b = write(tmp_path, "b.yaml", "name: a\ntarget: smollm2\ndraft: {method: ngram}\n")
    c = write(tmp_path, "c.yaml", "name: c\ntarget: smollm2\ndraft: {method: ngram}\nstudy: {max_tokens: 32}\n")
    with pytest.raises(DraftfitError, match="also used by"):
        load_candidates([a, b])
    with pytest.raises(DraftfitError, match="study.max_tokens = 32 disagrees"):
        load_candidates([a, c])


def test_study_precedence(tmp_path):
    study_file = write(tmp_path, "study.yaml", "max_tokens: 64\nseed: 3\ntemperature: 0.5\n")
    study = build_study(study_file=study_file, from_candidates={"seed": 4}, overrides={"temperature": 0.0, "top_p": None})
    assert (study.max_tokens, study.seed, study.temperature, study.top_p) == (64, 4, 0.0, 1.0)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"concurrency": (1, 4), "primary_concurrency": 8}, "primary_concurrency 8 is not among"),
        ({"latency_source": "roofline"}, "needs `gpu`"),
        ({"length_thresholds": (500, 100)}, "length_thresholds must rise"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_bad_study_settings(overrides, words):
    with pytest.raises(DraftfitError, match=words.replace("`", ".")):
        build_study(study_file=None, from_candidates={}, overrides=overrides)


@settings(max_examples=60, deadline=None)
@given(
    ks=st.lists(st.integers(-3, 40), min_size=0, max_size=6),
    method=st.sampled_from(["ngram", "draft_model", "suffix", "eagle", "bogus"]),
    extra=st.dictionaries(st.sampled_from(["zzz", "speed", "notes"]), st.integers(), max_size=1),
)
def test_generated_candidate_files_load_or_fail_cleanly(tmp_path_factory, ks, method, extra):
    import yaml

    body = {"name": "gen", "target": "smollm2", "draft": {"method": method}, "k": ks, **extra}
    path = tmp_path_factory.mktemp("gen") / "gen.yaml"
    path.write_text(yaml.safe_dump(body))
    try:
        candidate, _ = load_candidate(path)
    except DraftfitError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
    else:
        assert ks and all(1 <= k <= 16 for k in ks) and method in ("ngram", "suffix")
        assert set(candidate.k) == set(ks) and not set(extra) - {"notes"}
