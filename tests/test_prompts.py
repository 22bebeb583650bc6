"""Prompt loading, validation, stratified sampling, and the torch-free chat-template tokenizer."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pytest

from draftfit.chat_template import ChatTokenizer
from draftfit.errors import DraftfitError
from draftfit.prompts.loading import (
    BUCKETS,
    DEFAULT_THRESHOLDS,
    DEMO_PROMPTS,
    UNCATEGORIZED,
    PromptWarning,
    load_prompts,
)
from draftfit.prompts.sampling import bucket_of, sample_prompts

DATA = Path(__file__).parent / "data" / "prompts"
DEMO = DEMO_PROMPTS
SECRET = "SECRET-PROMPT-TEXT"

# One token per whitespace-separated word; the template adds <s>, one role marker per message
# and <|assistant|>: a one-turn chat of w words is w + 3 tokens, the raw text w tokens.
WORD_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def word_tokenizer(template: str | None = WORD_TEMPLATE, *, bos_post_processor: bool = False) -> ChatTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"v{i}": 10 + i for i in range(1000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>", "<|user|>", "<|system|>", "<|assistant|>"])
    if bos_post_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
        )
    return ChatTokenizer(tok, chat_template=template,
                         special_tokens={"bos_token": "<s>", "eos_token": "</s>"}, name="words")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def known_words(n: int, row: int) -> str:
    """``n`` in-vocabulary words that differ from row to row (distinct token ids)."""
    return " ".join(f"v{(row * 31 + j) % 1000}" for j in range(n))


def quiet_sample(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PromptWarning)
        return sample_prompts(*args, **kwargs)


@pytest.fixture(scope="session")
def smol_dir(smollm2_meta) -> Path:
    """SmolLM2-135M-Instruct tokenizer metadata, read from the bundled GGUF (tests/conftest.py)."""
    return smollm2_meta


# ---------------------------------------------------------------------------------------------
# loading: formats and column kinds
# ---------------------------------------------------------------------------------------------

CHAT_ROWS = [
    (0, "support", 2, "user"),
    (1, "chat", 1, "user"),
    (2, "ko-chat", 3, "user"),
    (3, "chat", 1, "user"),
    (4, UNCATEGORIZED, 1, "user"),
]


def _chat_source_rows() -> list[dict]:
    return [json.loads(line) for line in (DATA / "chat.jsonl").read_text("utf-8").splitlines() if line.strip()]


def chat_as_parquet(tmp: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _chat_source_rows()
    for r in rows:  # Parquet needs one struct type: join the text parts as vLLM does
        for m in r["messages"]:
            if isinstance(m["content"], list):
                m["content"] = "\n".join(p["text"] for p in m["content"])
    pq.write_table(pa.Table.from_pylist(rows), tmp / "chat.parquet")
    return tmp / "chat.parquet"


def chat_as_parquet_json_strings(tmp: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"messages": json.dumps(r["messages"]), "category": r.get("category")} for r in _chat_source_rows()]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "chat_json.parquet")
    return tmp / "chat_json.parquet"


def chat_as_saved_dir(tmp: Path) -> Path:
    import datasets

    rows = [{"messages": json.dumps(r["messages"]), "category": r.get("category")} for r in _chat_source_rows()]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp / "saved"))
    return tmp / "saved"


def chat_as_json_array(tmp: Path) -> Path:
    (tmp / "chat.json").write_text(json.dumps(_chat_source_rows()), encoding="utf-8")
    return tmp / "chat.json"


@pytest.mark.parametrize(
    "make",
    [
        lambda tmp: DATA / "chat.jsonl",
        chat_as_json_array,
        chat_as_parquet,
        chat_as_parquet_json_strings,
        chat_as_saved_dir,
    ],
    ids=["jsonl", "json-array", "parquet", "parquet-json-strings", "saved-dataset-dir"],
)
def test_load_chat_prompts_in_every_format(make, tmp_path: Path) -> None:
    ds = load_prompts(make(tmp_path))
    assert ds.column_names == ["row", "prompt", "messages", "category"]
    got = [(r["row"], r["category"], len(r["messages"]), r["messages"][-1]["role"]) for r in ds]
    assert got == CHAT_ROWS
    assert all(r["prompt"] is None for r in ds)
    # OpenAI text parts are joined with a newline, as vLLM does
    assert ds[3]["messages"][0]["content"] == "Translate to French:\nWhere is the train station?"
    assert ds[2]["messages"][1] == {"role": "assistant", "content": "회의록 내용을 붙여 주세요."}


def text_as_parquet(tmp: Path) -> Path:
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(DATA / "text.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    pq.write_table(pa.Table.from_pylist(rows), tmp / "text.parquet")
    return tmp / "text.parquet"


def text_as_saved_dict_one_split(tmp: Path) -> Path:
    import datasets

    ds = datasets.Dataset.from_parquet(str(text_as_parquet(tmp)), cache_dir=str(tmp / "hf"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp / "saved"))
    return tmp / "saved"


@pytest.mark.parametrize(
    "make", [lambda tmp: DATA / "text.csv", text_as_parquet, text_as_saved_dict_one_split],
    ids=["csv", "parquet", "saved-datasetdict-one-split"],
)
def test_load_text_prompts(make, tmp_path: Path) -> None:
    ds = load_prompts(make(tmp_path))
    assert ds["row"] == [0, 1, 2, 3]
    assert ds["category"] == ["chat", "summarize", "ko-chat", UNCATEGORIZED]
    assert ds["messages"] == [None] * 4
    assert ds["prompt"][1].startswith("Summarize this:\nThe quarterly report")  # quoted newline kept
    assert ds["prompt"][2] == "서울에서 부산까지 KTX로 얼마나 걸려?"


def test_configurable_column_names() -> None:
    ds = load_prompts(DATA / "custom_columns.jsonl", prompt_column="question",
                      messages_column="conversation", category_column="segment")
    assert ds["row"] == [0, 1, 2]
    assert ds["category"] == ["account", "billing", "account"]
    assert ds["prompt"] == ["How do I reset my password?", None, "Can I export my data as CSV?"]
    assert ds["messages"][1] == [{"role": "user", "content": "Is there a student discount?"}]


def test_custom_category_column_that_is_missing_warns() -> None:
    with pytest.warns(PromptWarning, match=r"chat\.jsonl: no 'segment' column"):
        ds = load_prompts(DATA / "chat.jsonl", category_column="segment")
    assert set(ds["category"]) == {UNCATEGORIZED}


def test_messages_win_over_prompt_when_a_row_has_both(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "both.jsonl", [
        {"prompt": "rendered elsewhere", "messages": [{"role": "user", "content": "hello"}]},
        {"prompt": "only text"},
    ])
    ds = load_prompts(path)
    assert ds["messages"][0] == [{"role": "user", "content": "hello"}] and ds["prompt"][0] is None
    assert ds["prompt"][1] == "only text" and ds["messages"][1] is None


# ---------------------------------------------------------------------------------------------
# loading: bad input names the file, the line/row and the column — never the prompt text
# ---------------------------------------------------------------------------------------------

BAD_INPUT = [
    ("empty.jsonl", {}, ["empty.jsonl: the prompts file has no rows"]),
    ("blank_lines.jsonl", {}, ["blank_lines.jsonl: the prompts file has no rows"]),
    ("missing_column.csv", {},
     ["missing_column.csv: no 'prompt' or 'messages' column (columns: 'text', 'label')", "--prompt-column"]),
    ("chat.jsonl", {"prompt_column": "question", "messages_column": "conversation"},
     ["no 'question' or 'conversation' column (columns: 'messages', 'category')"]),
    ("bad_utf8.jsonl", {}, ["bad_utf8.jsonl: 1 unreadable line: line 3: not UTF-8 (byte 23)"]),
    ("bad_json.jsonl", {},
     ["bad_json.jsonl: 2 unreadable lines", "line 2: not valid JSON",
      "line 3: expected a JSON object, got a list"]),
    ("bad_messages.jsonl", {},
     ["bad_messages.jsonl: 7 bad rows",
      "line 2 (row 1): column 'messages': expected a list of messages or its JSON text",
      "line 3 (row 2): column 'messages': empty list of messages",
      "line 4 (row 3): column 'messages': message 0 has no 'role'",
      "line 5 (row 4): column 'messages': message 0 has no 'content'",
      "line 6 (row 5): column 'messages': message 0 has 'content' that is a number",
      "(and 2 more)"]),
    ("bad_messages.csv", {},
     ["bad_messages.csv: 1 bad row: line 3 (row 1): column 'messages': expected a list of messages"]),
    ("nope.jsonl", {}, ["nope.jsonl: no such file or directory"]),
]


@pytest.mark.parametrize("name, kwargs, expected", BAD_INPUT, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUT)])
def test_bad_input_is_an_error_naming_file_row_and_column(name: str, kwargs: dict, expected: list[str]) -> None:
    with pytest.raises(DraftfitError) as info:
        load_prompts(DATA / name, **kwargs)
    message = str(info.value)
    for part in expected:
        assert part in message
    assert SECRET not in message
    assert "\n" not in message
    assert info.value.exit_code == 2


def test_malformed_message_details_beyond_the_first_five(tmp_path: Path) -> None:
    lines = (DATA / "bad_messages.jsonl").read_text("utf-8").splitlines()
    path = tmp_path / "tail.jsonl"
    path.write_text("\n".join(lines[6:]) + "\n", encoding="utf-8")
    with pytest.raises(DraftfitError) as info:
        load_prompts(path)
    assert "line 1 (row 0): column 'messages': message 0 has a non-text content part (image_url)" in str(info.value)
    assert "line 2 (row 1): column 'category': expected text, got a list" in str(info.value)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize(
    "rows, expected",
    [
        ([{"prompt": 17}], "line 1 (row 0): column 'prompt': expected text, got a number"),
        ([{"prompt": "ok"}, {"prompt": "   "}], "line 2 (row 1): no value in 'prompt'"),
        ([{"prompt": None, "messages": None}], "line 1 (row 0): no value in 'prompt' or 'messages'"),
        ([{"messages": [f"{SECRET}"]}], "message 0 is a string, not an object"),
    ],
)
def test_bad_values(rows: list[dict], expected: str, tmp_path: Path) -> None:
    with pytest.raises(DraftfitError) as info:
        load_prompts(write_jsonl(tmp_path / "p.jsonl", rows))
    assert expected in str(info.value)
    assert str(tmp_path / "p.jsonl") in str(info.value)
    assert SECRET not in str(info.value)


def test_unknown_extension_and_plain_directory(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("hello\n")
    with pytest.raises(DraftfitError, match=r"p\.txt: unknown prompts format '\.txt'"):
        load_prompts(tmp_path / "p.txt")
    (tmp_path / "dir").mkdir()
    with pytest.raises(DraftfitError, match="not a saved dataset directory"):
        load_prompts(tmp_path / "dir")


def test_corrupt_parquet(tmp_path: Path) -> None:
    (tmp_path / "p.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DraftfitError, match=r"p\.parquet: not a readable Parquet file"):
        load_prompts(tmp_path / "p.parquet")


def test_saved_dataset_with_several_splits_names_them(tmp_path: Path) -> None:
    import datasets

    one = datasets.Dataset.from_list([{"prompt": "a"}])
    datasets.DatasetDict({"train": one, "test": one}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DraftfitError, match=r"several splits \(train, test\)\. Pass one split's directory"):
        load_prompts(tmp_path / "dd")
    assert load_prompts(tmp_path / "dd" / "test")["prompt"] == ["a"]


# ---------------------------------------------------------------------------------------------
# sampling
# ---------------------------------------------------------------------------------------------


def length_dataset(tmp: Path, spec: dict[tuple[str, int], int]) -> Path:
    """JSONL with ``count`` rows of ``n_words`` words per (category, n_words)."""
    rows: list[dict] = []
    for (category, n_words), count in spec.items():
        rows += [{"prompt": known_words(n_words, len(rows) + i), "category": category} for i in range(count)]
    return write_jsonl(tmp / "lengths.jsonl", rows)


@pytest.mark.parametrize(
    "spec, n, expected",
    [
        # 60/30/10 % of 1,000 rows, n = 100 -> exactly 60/30/10
        ({("a", 2): 600, ("b", 10): 300, ("c", 40): 100}, 100, {"short": 60, "medium": 30, "long": 10}),
        # 50/30/20 %, n = 7 -> 3.5/2.1/1.4 -> floors 3/2/1, the spare row to the largest remainder
        ({("a", 2): 50, ("b", 10): 30, ("c", 40): 20}, 7, {"short": 4, "medium": 2, "long": 1}),
        # buckets mixing categories
        ({("a", 2): 30, ("b", 3): 30, ("a", 12): 40}, 50, {"short": 30, "medium": 20, "long": 0}),
    ],
)
def test_stratified_proportions(spec, n, expected, tmp_path: Path) -> None:
    ds = load_prompts(length_dataset(tmp_path, spec))
    sample = sample_prompts(ds, word_tokenizer(), n=n, seed=7, thresholds=(8, 30),
                            max_input_tokens=1000, template="never")
    by_bucket = sample.summary.by_bucket
    for bucket, count in expected.items():
        assert by_bucket[bucket] == count
    assert sum(by_bucket.values()) == n == len(sample.items)
    assert sample.summary.stratified
    assert [it.id for it in sample.items] == sorted(it.id for it in sample.items)


def test_buckets_use_inclusive_upper_thresholds() -> None:
    assert bucket_of([1, 256, 257, 1024, 1025], DEFAULT_THRESHOLDS).tolist() == [0, 0, 1, 1, 2]


def test_sample_items_and_summary(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": words(3), "category": "chat"},  # 3 + 3 = 6 tokens: short
        {"messages": [{"role": "system", "content": words(4)}, {"role": "user", "content": words(10)}],
         "category": "chat"},  # 1 + 5 + 11 + 1 = 18: medium
        {"prompt": words(40), "category": "summarize"},  # 43: long
        {"prompt": words(5), "category": "summarize"},  # 8: short (boundary, inclusive)
    ])
    sample = sample_prompts(load_prompts(path), word_tokenizer(), n=4, seed=0, thresholds=(8, 30),
                            max_input_tokens=100)
    got = [(it.id, it.category, it.bucket, it.n_input_tokens, it.kind, it.templated) for it in sample.items]
    assert got == [
        (0, "chat", "short", 6, "prompt", True),
        (1, "chat", "medium", 18, "messages", True),
        (2, "summarize", "long", 43, "prompt", True),
        (3, "summarize", "short", 8, "prompt", True),
    ]
    first = sample.items[0]
    assert first.text == "<s><|user|> w0 w1 w2 <|assistant|>"
    assert len(first.input_ids) == first.n_input_tokens
    assert sample.summary.counts == {"short": {"chat": 1, "summarize": 1}, "medium": {"chat": 1},
                                     "long": {"summarize": 1}}
    assert sample.summary.by_category == {"chat": 2, "summarize": 2}
    assert sample.summary.tokens_by_bucket["short"] == {"min": 6, "median": 7.0, "max": 8}
    table = sample.summary.table().splitlines()
    assert table[0].split() == ["category", "short", "≤8", "medium", "≤30", "long", ">30", "total"]
    assert table[-1].split() == ["total", "2", "1", "1", "4"]
    as_dict = sample.summary.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert sample.to_dataset()["n_input_tokens"] == [6, 18, 43, 8]


def test_same_seed_same_sample_other_seed_other_sample(tmp_path: Path) -> None:
    path = length_dataset(tmp_path, {("a", 2): 300, ("b", 12): 200, ("c", 40): 100})
    tok = word_tokenizer()

    def draw(seed: int):
        s = sample_prompts(load_prompts(path), tok, n=60, seed=seed, thresholds=(8, 30), max_input_tokens=100)
        return [it.id for it in s.items], s.prompts_hash

    ids_a, hash_a = draw(3)
    assert draw(3) == (ids_a, hash_a)
    ids_b, hash_b = draw(4)
    assert ids_b != ids_a and hash_b != hash_a
    assert len(hash_a) == 64


def test_prompts_hash_follows_the_engine_input_not_the_labels(tmp_path: Path) -> None:
    rows = [{"prompt": words(4), "category": "a"}, {"prompt": words(6), "category": "b"}]
    relabeled = [{"prompt": r["prompt"], "category": "other"} for r in rows]
    tok = word_tokenizer()
    kw = dict(n=2, seed=0, max_input_tokens=100)
    base = sample_prompts(load_prompts(write_jsonl(tmp_path / "a.jsonl", rows)), tok, **kw)
    same = sample_prompts(load_prompts(write_jsonl(tmp_path / "b.jsonl", relabeled)), tok, **kw)
    raw = sample_prompts(load_prompts(tmp_path / "a.jsonl"), tok, template="never", **kw)
    assert base.prompts_hash == same.prompts_hash
    assert raw.prompts_hash != base.prompts_hash


def test_over_context_rows_are_dropped_and_reported_never_truncated(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": f"{SECRET} " + words(10), "category": "a"},  # 14 tokens
        {"prompt": words(37), "category": "a"},  # 40 tokens: exactly the limit, kept
        {"prompt": f"{SECRET} " + words(40), "category": "b"},  # 44 tokens: dropped
        {"prompt": words(100), "category": "b"},  # 103 tokens: dropped
    ])
    with pytest.warns(PromptWarning) as record:
        sample = sample_prompts(load_prompts(path), word_tokenizer(), n=4, seed=0, max_input_tokens=40)
    assert [it.id for it in sample.items] == [0, 1]
    assert [it.n_input_tokens for it in sample.items] == [14, 40]
    assert [(d.id, d.category, d.n_input_tokens) for d in sample.dropped] == [(2, "b", 44), (3, "b", 103)]
    assert sample.dropped[0].reason == "over context: 44 input tokens > max_input_tokens 40"
    messages = [str(w.message) for w in record]
    assert any("2 row(s) longer than max_input_tokens=40 dropped, not truncated (rows 2, 3)" in m for m in messages)
    assert any("asked for n=4 prompts but only 2 are eligible" in m for m in messages)
    assert all(SECRET not in m for m in messages + sample.warnings)
    assert sample.summary.n_dropped == 2 and sample.summary.n_eligible == 2


def test_all_rows_over_context_is_an_error(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": words(50)}])
    with pytest.raises(DraftfitError, match=r"p\.jsonl: no prompt fits: all 1 rows are over max_input_tokens=10"):
        quiet_sample(load_prompts(path), word_tokenizer(), n=1, seed=0, max_input_tokens=10)


def test_n_larger_than_the_data_warns_and_takes_all(tmp_path: Path) -> None:
    ds = load_prompts(DATA / "text.csv")
    with pytest.warns(PromptWarning, match=r"text\.csv: asked for n=10 prompts but only 4 are eligible .*taking all 4"):
        sample = sample_prompts(ds, word_tokenizer(), n=10, seed=0, max_input_tokens=1000)
    assert [it.id for it in sample.items] == [0, 1, 2, 3]
    assert sample.summary.n_requested == 10 and sample.summary.n_sampled == 4
    assert len(sample.warnings) == 1


def test_singleton_bucket_is_merged_for_the_draw(tmp_path: Path) -> None:
    ds = load_prompts(length_dataset(tmp_path, {("a", 2): 20, ("b", 12): 10, ("c", 40): 1}))
    for n in (2, 10, 29):
        sample = sample_prompts(ds, word_tokenizer(), n=n, seed=1, thresholds=(8, 30), max_input_tokens=100)
        assert len(sample.items) == n and sample.summary.stratified
        assert sample.summary.eligible_by_bucket == {"short": 20, "medium": 10, "long": 1}


@pytest.mark.parametrize("n", [2, 34])
def test_too_few_rows_per_bucket_falls_back_to_a_plain_draw(n: int, tmp_path: Path) -> None:
    ds = load_prompts(length_dataset(tmp_path, {("a", 2): 20, ("b", 12): 10, ("c", 40): 5}))
    with pytest.warns(PromptWarning, match=rf"n={n} of 35 rows cannot give every length bucket "
                      r"\{'short': 20, 'medium': 10, 'long': 5\} a row and leave one out"):
        sample = sample_prompts(ds, word_tokenizer(), n=n, seed=1, thresholds=(8, 30), max_input_tokens=100)
    assert len(sample.items) == n and not sample.summary.stratified


def test_scrub_before_templating(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "mail jane@example.com or call 010-1234-5678", "category": "a"},
        {"messages": [{"role": "user", "content": "card 4111 1111 1111 1111 please"}], "category": "b"},
        {"prompt": "no personal data here", "category": "a"},
    ])
    ds = load_prompts(path)
    plain = sample_prompts(ds, word_tokenizer(), n=3, seed=0, max_input_tokens=100)
    scrubbed = sample_prompts(ds, word_tokenizer(), n=3, seed=0, max_input_tokens=100, scrub=True)
    assert plain.summary.scrubbed is None
    assert scrubbed.summary.scrubbed.to_dict() == {"email": 1, "phone": 1, "card": 1}
    assert scrubbed.items[0].text == "<s><|user|> mail <EMAIL> or call <PHONE> <|assistant|>"
    assert scrubbed.items[1].text == "<s><|user|> card <CARD> please <|assistant|>"
    assert scrubbed.prompts_hash != plain.prompts_hash


def test_template_modes_for_plain_prompts(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "what is two plus two"},
        {"prompt": "<s><|user|> already templated <|assistant|>"},
    ])
    ds = load_prompts(path)
    tok = word_tokenizer(bos_post_processor=True)
    auto = sample_prompts(ds, tok, n=2, seed=0, max_input_tokens=100)
    assert [it.templated for it in auto.items] == [True, False]
    assert auto.items[0].text == "<s><|user|> what is two plus two <|assistant|>"
    # an already templated row is sent as is, tokenized like vLLM's completion API
    # (add_special_tokens=True): this post-processor prepends <s>
    assert auto.items[1].text == "<s><|user|> already templated <|assistant|>"
    assert auto.items[1].input_ids[:2] == [1, 1]
    never = sample_prompts(ds, tok, n=2, seed=0, max_input_tokens=100, template="never")
    assert [it.templated for it in never.items] == [False, False]
    assert never.items[0].n_input_tokens == 6  # <s> + 5 words
    always = sample_prompts(ds, tok, n=2, seed=0, max_input_tokens=100, template="always")
    assert [it.templated for it in always.items] == [True, True]
    # a rendered chat gets no extra special tokens: exactly one <s>
    assert always.items[0].input_ids.count(1) == 1
    base = sample_prompts(ds, word_tokenizer(template=None), n=2, seed=0, max_input_tokens=100)
    assert [it.templated for it in base.items] == [False, False]


def test_chat_rows_need_a_chat_template() -> None:
    ds = load_prompts(DATA / "chat.jsonl")
    with pytest.raises(DraftfitError, match=r"chat\.jsonl: 5 chat prompt\(s\) \(rows 0, 1, 2 and 2 more\) need a chat template"):
        sample_prompts(ds, word_tokenizer(template=None), n=2, seed=0, max_input_tokens=100)


def test_rows_the_template_refuses_are_dropped_with_the_reason(tmp_path: Path) -> None:
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}"
              "{{ raise_exception('System role not supported') }}{% endif %}"
              "<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}<|assistant|>")
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"messages": [{"role": "system", "content": SECRET}, {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "user", "content": "hello there"}]},
    ])
    with pytest.warns(PromptWarning, match=r"1 row\(s\) dropped: empty or refused by the chat template \(row 0\)"):
        sample = sample_prompts(load_prompts(path), word_tokenizer(strict), n=1, seed=0, max_input_tokens=100)
    assert [it.id for it in sample.items] == [1]
    assert sample.dropped[0].id == 0
    assert sample.dropped[0].reason == "the chat template refused the conversation: System role not supported"


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"n": 0}, "n must be a whole number ≥ 1, got 0"),
        ({"seed": -1}, "seed must be a whole number ≥ 0"),
        ({"thresholds": (100, 50)}, "thresholds must satisfy 0 < short_max < medium_max, got (100, 50)"),
        ({"thresholds": (0, 50)}, "thresholds must satisfy 0 < short_max < medium_max"),
        ({"thresholds": (5,)}, "thresholds must be two token counts"),
        ({"max_input_tokens": 0}, "max_input_tokens must be a whole number ≥ 1"),
        ({"template": "sometimes"}, "template must be 'auto', 'always' or 'never'"),
    ],
)
def test_bad_sampling_arguments(kwargs: dict, expected: str) -> None:
    args = {"n": 2, "seed": 0, "max_input_tokens": 100, **kwargs}
    with pytest.raises(DraftfitError) as info:
        sample_prompts(load_prompts(DATA / "text.csv"), word_tokenizer(), **args)
    assert expected in str(info.value)


# ---------------------------------------------------------------------------------------------
# ChatTokenizer
# ---------------------------------------------------------------------------------------------


def _save_word_tokenizer(root: Path, config: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    word_tokenizer()._tokenizer.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return root


def test_from_dir_reads_template_sources_in_transformers_order(tmp_path: Path) -> None:
    cfg = {"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "</s>",
           "chat_template": "CONFIG {{ bos_token }}"}
    root = _save_word_tokenizer(tmp_path / "a", cfg)
    tok = ChatTokenizer.from_dir(root)
    assert tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    assert tok.apply_chat_template([]) == "CONFIG <s>"
    (root / "chat_template.jinja").write_text("FILE {{ eos_token }}", encoding="utf-8")
    assert ChatTokenizer.from_dir(root).apply_chat_template([]) == "FILE </s>"

    named = {"chat_template": [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]}
    assert ChatTokenizer.from_dir(_save_word_tokenizer(tmp_path / "b", named)).apply_chat_template([]) == "DEFAULT"
    no_default = {"chat_template": [{"name": "tool_use", "template": "TOOLS"}]}
    with pytest.raises(DraftfitError, match=r"several chat templates \(tool_use\) and none named 'default'"):
        ChatTokenizer.from_dir(_save_word_tokenizer(tmp_path / "c", no_default))
    bare = ChatTokenizer.from_dir(_save_word_tokenizer(tmp_path / "d", {}))
    assert not bare.has_chat_template and not bare.looks_templated("<s> hi")


def test_from_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(DraftfitError, match=r"no tokenizer\.json\. Point at an HF model directory"):
        ChatTokenizer.from_dir(tmp_path)
    root = _save_word_tokenizer(tmp_path / "x", {"chat_template": "{% for %}"})
    with pytest.raises(DraftfitError, match="chat template syntax error at line 1"):
        ChatTokenizer.from_dir(root).apply_chat_template([])


SMOL_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "회의록을 세 줄로 요약해 줘."},
     {"role": "assistant", "content": "회의록 내용을 붙여 주세요."},
     {"role": "user", "content": "배포는 화요일, QA는 월요일까지입니다."}],
    [{"role": "user", "content": "Fix this:\n```python\ndef f(x):\n    return {x: x**2}\n```\n{{ not jinja }} <|im_end|>"}],
]


@pytest.fixture(scope="module")
def hf_smol(smol_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smol_dir))


@pytest.mark.slow
@pytest.mark.parametrize("messages", SMOL_CONVERSATIONS, ids=["one-turn", "system", "korean-multi-turn", "code-and-braces"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_template_matches_transformers(smol_dir: Path, hf_smol, messages, add_generation_prompt: bool) -> None:
    hf = hf_smol
    ours = ChatTokenizer.from_dir(smol_dir)
    text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    assert text == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    hf_ids = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, return_dict=True)["input_ids"]
    assert ours.encode(text) == list(hf_ids)
    # a plain completion prompt: vLLM tokenizes it with add_special_tokens=True
    assert ours.encode("Hello world", add_special_tokens=True) == hf.encode("Hello world", add_special_tokens=True)


FEATURE_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}"
    "{% if loop.index > 3 %}{% break %}{% endif %}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
    "{% else %}\n  {{ m['role'] }}: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}{% if tools is none and documents is none %}[no tools]{% endif %}"
    "{% if add_generation_prompt %}{{ 'assistant (' ~ strftime_now('%Y') ~ '):' }}{% endif %}{{ eos_token }}"
)


@pytest.mark.slow
def test_template_features_match_transformers(smol_dir: Path, hf_smol) -> None:
    hf = hf_smol
    ours = ChatTokenizer.from_dir(smol_dir)
    ours.chat_template = FEATURE_TEMPLATE
    messages = [{"role": "user", "content": "<b>안녕</b> & \"quotes\""},
                {"role": "assistant", "content": "é <tag> ünïcode"},
                {"role": "user", "content": "third"}, {"role": "user", "content": "cut by break"}]
    expected = hf.apply_chat_template(messages, chat_template=FEATURE_TEMPLATE, tokenize=False,
                                      add_generation_prompt=True)
    assert ours.apply_chat_template(messages) == expected
    bad = [{"role": "tool", "content": SECRET}]
    with pytest.raises(DraftfitError, match="the chat template refused the conversation: bad role") as info:
        ours.apply_chat_template(bad)
    assert SECRET not in str(info.value)


@pytest.mark.slow
def test_smollm2_prompts_sample(smol_dir: Path) -> None:
    tok = ChatTokenizer.from_dir(smol_dir)
    assert tok.has_chat_template and tok.looks_templated("<|im_start|>user\nhi<|im_end|>\n")
    assert not tok.looks_templated("plain question")
    sample = sample_prompts(load_prompts(DATA / "chat.jsonl"), tok, n=5, seed=0, max_input_tokens=8192)
    first = sample.items[0]
    assert first.text.startswith("<|im_start|>system\nYou are a support agent")
    assert first.input_ids[0] == 1 and first.input_ids.count(1) == 3  # <|im_start|> per turn, no extra BOS
    assert first.text.endswith("<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# the shipped demo prompt set
# ---------------------------------------------------------------------------------------------


def _demo_rows() -> list[dict]:
    return [json.loads(line) for line in DEMO.read_text("utf-8").splitlines() if line.strip()]


def _user_text(row: dict) -> str:
    if "prompt" in row:
        return row["prompt"]
    return "\n".join(m["content"] for m in row["messages"])


def _is_korean(row: dict) -> bool:
    return row["category"].startswith("ko-")


def test_demo_prompt_set_shape() -> None:
    rows = _demo_rows()
    ds = load_prompts(DEMO)
    assert len(ds) == len(rows) >= 300
    texts = [_user_text(r) for r in rows]
    assert len(set(texts)) == len(texts)
    korean = sum(_is_korean(r) for r in rows) / len(rows)
    assert 0.25 <= korean <= 0.31
    for r in rows:  # a ko- category means the user wrote Korean
        has_hangul = any("\uac00" <= ch <= "\ud7a3" for ch in _user_text(r))
        assert has_hangul == _is_korean(r), r["category"]
    cats = Counter(r["category"] for r in rows)
    for cat in ("chat", "code", "summarize", "extract", "rewrite", "ko-chat", "ko-summarize",
                "ko-extract", "ko-rewrite", "ko-code"):
        assert cats[cat] >= 8, cat
    assert any(r.get("messages", [{}])[0].get("role") == "system" for r in rows if "messages" in r)
    assert any("prompt" in r for r in rows) and any("messages" in r for r in rows)


def test_demo_prompts_have_no_near_duplicates() -> None:
    def shingles(text: str) -> set[tuple[str, ...]]:
        toks = text.split()
        return {tuple(toks[i:i + 4]) for i in range(max(1, len(toks) - 3))}

    sets = [shingles(_user_text(r)) for r in _demo_rows()]
    worst = 0.0
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            inter = len(sets[i] & sets[j])
            if inter:
                worst = max(worst, inter / len(sets[i] | sets[j]))
    assert worst < 0.5


@pytest.mark.slow
def test_demo_prompts_have_synthetic_personal_data_to_scrub(smol_dir: Path) -> None:
    tok = ChatTokenizer.from_dir(smol_dir)
    full = quiet_sample(load_prompts(DEMO), tok, n=len(_demo_rows()), seed=0, max_input_tokens=8192,
                        scrub=True)
    found = full.summary.scrubbed
    assert found.email >= 5 and found.phone >= 5 and found.card >= 2


@pytest.mark.slow
def test_demo_prompts_fill_all_buckets_for_smollm2(smol_dir: Path) -> None:
    tok = ChatTokenizer.from_dir(smol_dir)
    rows = _demo_rows()
    sample = sample_prompts(load_prompts(DEMO), tok, n=len(rows), seed=0, max_input_tokens=8192)
    assert not sample.dropped
    eligible = sample.summary.eligible_by_bucket
    assert all(eligible[b] >= 30 for b in BUCKETS), eligible
    lengths = [it.n_input_tokens for it in sample.items]
    assert sum(n < 2000 for n in lengths) / len(lengths) >= 0.85
    assert max(lengths) < 4096
