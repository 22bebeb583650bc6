"""Generated candidate files and prompt files either load or fail with a DraftfitError that names
the file (and, for a bad record, its line or row) on one line — never any other exception."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftfit.candidates import Candidate, build_study, load_candidate, load_candidates
from draftfit.errors import DraftfitError
from draftfit.prompts.loading import load_prompts

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# --- candidate files ----------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**25), 10**25), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["smollm2", "ngram", "draft_model", "eagle", "bfloat16", "auto", "1e3"]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=8)
k_lists = st.one_of(st.lists(st.integers(-5, 40), max_size=6), st.integers(-5, 40), values)
drafts = st.one_of(
    st.fixed_dictionaries({"method": st.sampled_from(["ngram", "suffix", "draft_model", "eagle", "mtp", "medusa"])},
                          optional={"model": st.sampled_from(["smollm2", "x/y"]) | values,
                                    "derived": st.fixed_dictionaries({"first_layers": st.integers(-2, 40) | values}),
                                    "prompt_lookup_min": st.integers(-1, 8) | values,
                                    "prompt_lookup_max": st.integers(-1, 8) | values,
                                    "bogus": values}),
    values,
)
documents = st.fixed_dictionaries(
    {},
    optional={"name": st.sampled_from(["a", "ee-8", "bad name!", ""]) | values, "target": st.just("smollm2") | values,
              "draft": drafts, "k": k_lists, "dtype": st.sampled_from(["auto", "bfloat16", "int3"]) | values,
              "notes": values, "speed": values,
              "study": st.dictionaries(st.sampled_from(["seed", "max_tokens", "temperature", "gpu", "concurrency", "zzz"]),
                                       values, max_size=3) | values},
)
raw_yaml = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["name: [a\n", "k: !!python/object:os.system {}\n", "a: &x [*x]\n", "[" * 200, "? [a, b]\n: c\n",
                     "name: a\n\tk: 1\n", "---\n- 1\n---\n- 2\n", "key: \"unterminated\n"]),
)


def _one_line_naming(exc: DraftfitError, path) -> None:
    text = str(exc)
    assert "\n" not in text, text
    assert str(path) in text, text


@SETTINGS
@given(doc=documents)
def test_generated_candidate_documents_load_or_name_the_file(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("cand") / "c.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    try:
        candidate, study = load_candidate(path)
    except DraftfitError as exc:
        _one_line_naming(exc, path)
        return
    assert isinstance(candidate, Candidate)
    assert all(1 <= k <= 16 for k in candidate.k) and list(candidate.k) == sorted(set(candidate.k))
    try:  # the study block reaches the settings without any other exception
        build_study(study_file=None, from_candidates=study or {}, overrides={})
    except DraftfitError as exc:
        assert "\n" not in str(exc)


@SETTINGS
@given(text=raw_yaml)
def test_arbitrary_yaml_text_loads_or_names_the_file(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("raw") / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_candidates([path])
    except DraftfitError as exc:
        _one_line_naming(exc, path)


# --- prompt files ------------------------------------------------------------------------------

texts = st.text(max_size=40)  # any unicode, newlines and quotes included
messages = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": texts}),
             min_size=1, max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), values, max_size=3), max_size=3),
    values,
    st.just("[not json"),
)
records = st.dictionaries(
    st.sampled_from(["prompt", "messages", "category", "text", "id"]),
    st.one_of(texts, messages, values),
    max_size=4,
)
json_lines = st.one_of(
    records.map(lambda r: json.dumps(r, ensure_ascii=False)),
    records.map(json.dumps),  # ASCII with escapes
    st.sampled_from(["", "   ", "[1, 2]", '"just a string"', "{not json", '{"prompt": "\\ud800 lone surrogate"}',
                     '{"messages": [{"role": "user", "content": "\\udfff"}]}', "null", "[" * 5000 + "]" * 5000]),
    texts,
)
LOCATION = re.compile(r"\b(line|lines|row) \d+")
FILE_LEVEL = ("has no rows", "column (columns:", "is a binary file", "malformed CSV", "not UTF-8", "expected a list of objects",
              "nested too deeply")


def _check_prompt_error(exc: DraftfitError, path) -> None:
    _one_line_naming(exc, path)
    text = str(exc)
    assert LOCATION.search(text) or any(phrase in text for phrase in FILE_LEVEL), text


def _loaded(dataset) -> None:
    assert len(dataset) >= 1
    for prompt, chat in zip(dataset["prompt"], dataset["messages"], strict=True):
        assert (prompt is None) != (chat is None)
        assert chat is None or all(isinstance(m["content"], str) for m in chat)


@SETTINGS
@given(lines=st.lists(json_lines, max_size=8))
def test_generated_jsonl_files_load_or_name_file_and_row(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("jsonl") / "p.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    try:
        _loaded(load_prompts(path))
    except DraftfitError as exc:
        _check_prompt_error(exc, path)


@SETTINGS
@given(
    header=st.lists(st.sampled_from(["prompt", "messages", "category", "text", ""]), min_size=1, max_size=4),
    rows=st.lists(st.lists(st.one_of(texts, messages.map(json.dumps)), max_size=5), max_size=6),
    quoting=st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONE]),
)
def test_generated_csv_files_load_or_name_file_and_row(tmp_path_factory, header, rows, quoting):
    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=quoting, escapechar="\\")
    try:
        writer.writerow(header)
        writer.writerows(rows)
    except csv.Error:  # QUOTE_NONE cannot write some cells; write them raw, as a careless exporter would
        buffer = io.StringIO(",".join(header) + "\n" + "\n".join(",".join(r) for r in rows) + "\n")
    path = tmp_path_factory.mktemp("csv") / "p.csv"
    path.write_text(buffer.getvalue(), encoding="utf-8")
    try:
        _loaded(load_prompts(path))
    except DraftfitError as exc:
        _check_prompt_error(exc, path)


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"prompt": "\\ud800 lone surrogate"}', "line 1 (row 0): column 'prompt': text holds an unpaired surrogate"),
        ('{"messages": [{"role": "user", "content": "\\udfff"}]}', "message 0's content holds an unpaired surrogate"),
        ('{"prompt": ' + "[" * 5000 + "]" * 5000 + "}", "line 1: not valid JSON (nested too deeply)"),
    ],
)
def test_records_json_accepts_but_text_cannot_hold_are_bad_rows(tmp_path, line, words):
    """Found by the properties above: JSON escapes that are not Unicode, and nesting past the parser."""
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(DraftfitError) as info:
        load_prompts(path)
    assert words in str(info.value) and str(path) in str(info.value)
