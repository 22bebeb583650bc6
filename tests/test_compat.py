"""draftfit.compat: tokenizer and config compatibility, on tokenizers built here and on SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import tokfactory as tf

from draftfit.compat import (
    COMPATIBLE,
    IDENTICAL,
    INCOMPATIBLE,
    SCHEMA_VERSION,
    CheckReport,
    compare,
    compare_files,
    load_model_files,
)
from draftfit.compat.schema import TokenDifference
from draftfit.compat.verdicts import VLLM_VOCAB_ERROR, llama_vocab_type
from draftfit.errors import DraftfitError
from draftfit.probe_corpus import FILE_CATEGORY, ProbeText, builtin_probe_texts, read_probe_file

C, I = COMPATIBLE, INCOMPATIBLE  # noqa: E741 - reads as a table of C and I


@pytest.fixture(scope="session")
def bpe() -> dict:
    return tf.train_bpe(600)


@pytest.fixture(scope="session")
def unigram() -> dict:
    return tf.train_unigram(600)


def _nth_tokens(tok_json: dict, *ids: int) -> list[str]:
    by_id = {i: t for t, i in tok_json["model"]["vocab"].items()}
    return [by_id[i] for i in ids]


def _pair(tmp_path: Path, target: tuple[dict, dict], draft: tuple[dict, dict]) -> tuple[Path, Path]:
    return (tf.write_model_dir(tmp_path / "target", target[0], **target[1]),
            tf.write_model_dir(tmp_path / "draft", draft[0], **draft[1]))


# name -> (build(bpe, unigram) -> ((target json, kwargs), (draft json, kwargs)),
#          verdict, (vllm, transformers, llama.cpp), blocking codes, codes that must also appear)
CASES = {
    "identical": (
        lambda b, u: ((b, {}), (b, {})), IDENTICAL, (C, C, C), set(), set()),
    "different special tokens": (
        lambda b, u: ((b, {}), (b, {"tokenizer_config": {"eos_token": "<|endoftext|>"}})),
        COMPATIBLE, (C, C, I), set(), {"eos_token_differs"}),
    "padding-only vocab_size difference": (
        lambda b, u: ((b, {"vocab_size": 640}), (b, {})),
        COMPATIBLE, (I, C, C), set(), {"vocab_size_padding"}),
    "padding beyond llama.cpp's 128": (
        lambda b, u: ((b, {"vocab_size": 800}), (b, {})),
        COMPATIBLE, (I, C, I), set(), {"vocab_size_padding"}),
    "shifted ids": (
        lambda b, u: ((b, {}), (tf.shift_ids(b, 2), {})),
        INCOMPATIBLE, (I, C, I), {"token_ids_differ"}, {"draft_only_tokens"}),
    "shifted ids, equal vocab_size": (
        lambda b, u: ((b, {"vocab_size": 640}), (tf.shift_ids(b, 2), {"vocab_size": 640})),
        INCOMPATIBLE, (I, I, I), {"token_ids_differ"}, set()),
    "different model type": (
        lambda b, u: ((b, {"vocab_size": 640}), (u, {"vocab_size": 640})),
        INCOMPATIBLE, (I, I, I), {"model_type_differs", "token_ids_differ"}, set()),
    "different model type and vocab_size": (
        lambda b, u: ((b, {"vocab_size": 640}), (u, {"vocab_size": 700})),
        INCOMPATIBLE, (I, C, I), {"model_type_differs", "token_ids_differ"}, set()),
    "swapped token strings": (
        lambda b, u: ((b, {}), (tf.swap_tokens(b, *_nth_tokens(b, 300, 400)), {})),
        INCOMPATIBLE, (I, I, I), {"token_ids_differ"}, set()),
    "different chat template": (
        lambda b, u: ((b, {}), (b, {"chat_template": "{{ messages[0]['content'] }}"})),
        COMPATIBLE, (C, C, C), set(), {"chat_template_differs"}),
    "draft has extra added tokens": (
        lambda b, u: ((b, {"vocab_size": 640}), (tf.add_tokens(b, ["<tool>", "</tool>"]), {"vocab_size": 640})),
        COMPATIBLE, (C, C, I), set(), {"draft_only_tokens"}),  # llama.cpp: '<tool>' vs the target's '[PAD600]'
    "target has tokens the draft lacks": (
        lambda b, u: ((tf.add_tokens(b, ["<tool>"]), {"vocab_size": 640}), (b, {"vocab_size": 640})),
        COMPATIBLE, (C, C, I), set(), {"target_only_tokens"}),
    "target ids beyond the draft's rows": (
        lambda b, u: ((tf.add_tokens(b, ["<tool>"]), {}), (b, {})),
        INCOMPATIBLE, (I, C, C), {"target_ids_beyond_draft"}, set()),
    "different normalizer": (
        lambda b, u: ((b, {}), (tf.with_component(b, "normalizer", {"type": "NFKC"}), {})),
        COMPATIBLE, (C, C, C), set(), {"normalizer_differs", "probe_encodings_differ"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_verdicts_on_built_tokenizers(name, bpe, unigram, tmp_path):
    build, verdict, (vllm, hf, llama), blocking, also = CASES[name]
    target, draft = _pair(tmp_path, *build(bpe, unigram))
    report = compare(target, draft, vllm_version="0.32.0")
    codes = {f.code for f in report.blocking + report.warnings + report.harmless}
    assert report.verdict == verdict, report.summary
    assert {f.code for f in report.blocking} == blocking
    assert also <= codes
    assert (report.engines["vllm"].verdict, report.engines["transformers"].verdict,
            report.engines["llama.cpp"].verdict) == (vllm, hf, llama), report.engines
    assert report.compatible_with("vllm") == (vllm == C)


def test_identical_pair_counts(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {}), (bpe, {}))
    report = compare(target, draft)
    n = tf.tokenizer_size(bpe)
    v = report.vocab
    assert (v.identical, v.shared_ids, v.shared_ids_equal, v.shared_ids_different) == (True, n, n, 0)
    assert (v.target_only_ids, v.draft_only_ids, v.merges_equal) == (0, 0, True)
    assert report.probe.identical == report.probe.texts == len(builtin_probe_texts())
    assert report.intersection.size == n and report.intersection.probe_coverage == 1.0
    assert all(c.equal for c in report.tokenizer)
    assert report.summary.startswith("identical")


def test_swapped_tokens_are_listed_with_both_strings(bpe, tmp_path):
    a, b = _nth_tokens(bpe, 300, 400)
    target, draft = _pair(tmp_path, (bpe, {}), (tf.swap_tokens(bpe, a, b), {}))
    v = compare(target, draft).vocab
    assert v.shared_ids_different == 2
    assert v.first_different == [TokenDifference(300, a, b), TokenDifference(400, b, a)]


def test_shifted_ids_every_shared_id_differs(bpe, tmp_path):
    n = tf.tokenizer_size(bpe)
    target, draft = _pair(tmp_path, (bpe, {}), (tf.shift_ids(bpe, 2), {}))
    report = compare(target, draft)
    assert (report.vocab.shared_ids_different, report.vocab.draft_only_range) == (n, [n, n + 1])
    # the token strings are all still there: the intersection is the whole target vocabulary
    assert report.intersection.size == n and report.intersection.probe_coverage == 1.0
    assert report.probe.identical == 0


@pytest.mark.parametrize(
    "version, verdict, pad_fix, hetero_fix",
    [
        ("0.8.5", I, True, False),
        ("0.12.0", I, False, False),  # V1 refuses draft models altogether
        ("0.20.0", I, True, False),
        ("0.27.0", I, True, True),
        ("0.32.0", I, True, True),
    ],
)
def test_vllm_padding_pair_per_version(version, verdict, pad_fix, hetero_fix, bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {"vocab_size": 640}), (bpe, {}))
    v = compare(target, draft, vllm_version=version, draft_label="org/draft").engines["vllm"]
    assert (v.verdict, v.version, v.version_source) == (verdict, version, "requested")
    assert ("`draftfit pad-vocab org/draft --to 640 -o DIR`" in v.fix) == pad_fix
    assert ("use_heterogeneous_vocab" in v.fix) == hetero_fix
    if version != "0.12.0":
        assert v.error == (
            "Target and draft model should have the same vocabulary size. Target model vocab_size=640. "
            "Draft model vocab_size=600. Using models with different tokenizers can cause out-of-bounds "
            "errors during speculative decoding."
        )


def test_vllm_before_015_refuses_even_identical_pairs(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {}), (bpe, {}))
    v = compare(target, draft, vllm_version="0.12.0").engines["vllm"]
    assert v.verdict == I and "NotImplementedError" in v.reason and "0.15.0" in v.fix


def test_transformers_modes(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {"vocab_size": 640}), (bpe, {}))
    t = compare(target, draft).engines["transformers"]
    assert (t.mode, t.verdict) == ("universal_assisted", C)
    assert set(t.requires) == {"tokenizer", "assistant_tokenizer"}
    assert t.error.startswith("The main and assistant models have different tokenizers.")


def test_llama_cpp_reports_first_differing_token_text(bpe, tmp_path):
    a, b = _nth_tokens(bpe, 300, 400)
    target, draft = _pair(tmp_path, (bpe, {}), (tf.swap_tokens(bpe, a, b), {}))
    lc = compare(target, draft).engines["llama.cpp"]
    assert lc.error == (f"draft model vocab must match target model to use speculation but token 300 "
                        f"content differs - target '{a}', draft '{b}'")


def test_llama_cpp_ignores_ids_below_5(bpe, tmp_path):
    # the specials sit at ids 0-2; llama.cpp compares token text only from id 5 on
    renamed = json.loads(json.dumps(bpe).replace("<|endoftext|>", "<|end|>"))
    target, draft = _pair(tmp_path, (bpe, {}), (renamed, {"tokenizer_config": {"unk_token": "<|end|>"}}))
    report = compare(target, draft)
    assert report.verdict == INCOMPATIBLE  # id 0 means another token
    assert report.engines["llama.cpp"].verdict == C


@pytest.mark.parametrize("kind, expected", [("bpe", "BPE"), ("bpe_fallback", "SPM"), ("unigram", "UGM")])
def test_llama_vocab_type(kind, expected, tmp_path):
    tok = {"bpe": lambda: tf.train_bpe(400), "bpe_fallback": lambda: tf.train_bpe(400, byte_fallback=True),
           "unigram": lambda: tf.train_unigram(400)}[kind]()
    assert llama_vocab_type(load_model_files(tf.write_model_dir(tmp_path / "m", tok))) == expected


# --- vocabulary intersection (vLLM's heterogeneous-vocabulary rule) ------------------------------

def _word_pair(tmp_path: Path) -> tuple[Path, Path]:
    target = tf.word_level({"[UNK]": 0, "Ġhello": 1, "Ġworld": 2, "a": 3, "Ġa": 4})
    draft = tf.word_level({"<unk>": 0, "▁hello": 1, "▁a": 2, "xyz": 3}, metaspace=True, unk="<unk>")
    return (tf.write_model_dir(tmp_path / "t", target, tokenizer_config={"unk_token": "[UNK]"}),
            tf.write_model_dir(tmp_path / "d", draft, tokenizer_config={"unk_token": "<unk>"}))


def test_intersection_normalizes_space_markers(tmp_path):
    target, draft = _word_pair(tmp_path)
    texts = [ProbeText("t", " hello world hello")]
    report = compare_files(load_model_files(target), load_model_files(draft), texts)
    inter = report.intersection
    assert (inter.target_space_prefixes, inter.draft_space_prefixes) == (["Ġ"], ["▁"])
    assert inter.size == 2  # " hello" and " a"
    assert (inter.probe_target_tokens, inter.probe_tokens_covered) == (3, 2)  # " world" is not shared
    assert inter.share_of_target == pytest.approx(2 / 5) and inter.share_of_draft == pytest.approx(2 / 4)


class _HFLike:
    """The four things vLLM's VocabMapping asks of a tokenizer, over a `tokenizers.Tokenizer`."""

    def __init__(self, files):
        self._tok = files.tokenizer
        self.unk_token_id = files.tokenizer.token_to_id(files.special_token("unk") or "")
        self.eos_token_id = files.tokenizer.token_to_id(files.special_token("eos") or "")
        vocab = files.tokenizer.get_vocab(with_added_tokens=True)
        self._vocab = dict(sorted(vocab.items(), key=lambda kv: kv[1]))

    def encode(self, text, add_special_tokens=False):
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def convert_ids_to_tokens(self, i):
        return self._tok.id_to_token(i)

    def get_vocab(self):
        return self._vocab


@pytest.mark.slow
@pytest.mark.parametrize("draft_kind", ["unigram", "shifted", "word"])
def test_intersection_matches_vllm_vocab_mapping(draft_kind, bpe, unigram, tmp_path):
    vocab_mapping = pytest.importorskip("vllm.v1.spec_decode.vocab_mapping")
    if draft_kind == "word":
        t_dir, d_dir = _word_pair(tmp_path)
    else:
        draft = unigram if draft_kind == "unigram" else tf.shift_ids(bpe, 3)
        t_dir, d_dir = _pair(tmp_path, (bpe, {}), (draft, {}))
    target, draft_files = load_model_files(t_dir), load_model_files(d_dir)
    ours = compare_files(target, draft_files, builtin_probe_texts()).intersection
    theirs = vocab_mapping.VocabMapping(
        _HFLike(target), _HFLike(draft_files), target.config_vocab_size, draft_files.config_vocab_size, "cpu"
    )
    assert ours.size == theirs.intersection_size


@pytest.mark.slow
def test_vllm_error_text_matches_installed_vllm():
    speculative = pytest.importorskip("vllm.config.speculative")
    stub = SimpleNamespace(
        method="draft_model",
        target_model_config=SimpleNamespace(get_vocab_size=lambda: 152064),
        draft_model_config=SimpleNamespace(get_vocab_size=lambda: 151936),
    )
    with pytest.raises(ValueError) as raised:
        speculative.SpeculativeConfig.verify_equal_vocab_size_if_draft_model(stub)
    assert str(raised.value) == VLLM_VOCAB_ERROR.format(target=152064, draft=151936)


# --- the real SmolLM2 tokenizer ----------------------------------------------------------------

SMOL_CASES = {
    # name -> (edit(copy dir), verdict, (vllm, transformers, llama.cpp), a code that must appear)
    "itself": (lambda d: None, IDENTICAL, (C, C, C), None),
    "vocab_size padded in config.json": (
        lambda d: tf.edit_json(d / "config.json", lambda c: c.update(vocab_size=49280)),
        COMPATIBLE, (I, C, C), "vocab_size_padding"),
    "changed eos token": (
        lambda d: tf.edit_json(d / "tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>")),
        COMPATIBLE, (C, C, I), "eos_token_differs"),
    "swapped token strings": (
        lambda d: tf.edit_json(d / "tokenizer.json", lambda t: t["model"]["vocab"].update(
            {"Ġthe": t["model"]["vocab"]["Ġand"], "Ġand": t["model"]["vocab"]["Ġthe"]})),
        INCOMPATIBLE, (I, I, I), "token_ids_differ"),
    "different chat template": (
        lambda d: (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
        COMPATIBLE, (C, C, C), "chat_template_differs"),
}


@pytest.mark.parametrize("name", list(SMOL_CASES))
def test_smollm2_against_modified_copies(name, smollm2_meta, tmp_path):
    edit, verdict, (vllm, hf, llama), code = SMOL_CASES[name]
    draft = tf.copy_model_dir(smollm2_meta, tmp_path / "draft")
    edit(draft)
    report = compare(smollm2_meta, draft, vllm_version="0.32.0")
    assert report.verdict == verdict, report.summary
    assert (report.engines["vllm"].verdict, report.engines["transformers"].verdict,
            report.engines["llama.cpp"].verdict) == (vllm, hf, llama)
    if code:
        assert code in {f.code for f in report.blocking + report.warnings + report.harmless}


def test_smollm2_swapped_tokens_show_in_probe_and_ids(smollm2_meta, tmp_path):
    draft = tf.copy_model_dir(smollm2_meta, tmp_path / "draft")
    edit, *_ = SMOL_CASES["swapped token strings"]
    edit(draft)
    report = compare(smollm2_meta, draft)
    vocab = json.loads((smollm2_meta / "tokenizer.json").read_text())["model"]["vocab"]
    lo, hi = sorted([vocab["Ġthe"], vocab["Ġand"]])
    assert [d.id for d in report.vocab.first_different] == [lo, hi]
    assert report.probe.identical < report.probe.texts  # English probes use " the"
    assert "Ġthe" in [r.token for r in report.probe.first_difference.target]


def test_smollm2_summary_facts(smollm2_meta):
    report = compare(smollm2_meta, smollm2_meta)
    t = report.target
    assert (t.tokenizer_model, t.byte_level, t.len_tokenizer, t.config_vocab_size) == ("BPE", True, 49152, 49152)
    roles = {r.role: (r.target.token, r.target.id) for r in report.special_tokens.roles}
    assert roles["bos"] == ("<|im_start|>", 1) and roles["eos"] == ("<|im_end|>", 2)
    assert report.intersection.target_space_prefixes == ["Ġ"]


# --- report schema -----------------------------------------------------------------------------

def test_report_round_trips_through_json(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {"vocab_size": 640}), (tf.shift_ids(bpe, 2), {}))
    report = compare(target, draft)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert CheckReport.from_dict(data) == report


def test_report_keys_are_documented(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {}), (tf.swap_tokens(bpe, *_nth_tokens(bpe, 300, 400)), {}))
    doc = (Path(__file__).parents[1] / "docs" / "check-json.md").read_text("utf-8")
    missing = sorted(path for path in _paths(compare(target, draft).to_dict()) if f"`{path}`" not in doc)
    assert missing == []


def _paths(value, prefix=""):
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{prefix}.{key}" if prefix else key
            if prefix == "engines":
                name = "engines.<engine>"
            yield name
            yield from _paths(item, name)
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        yield from _paths(value[0], prefix + "[]")


# --- files and probe texts ---------------------------------------------------------------------

def test_a_tokenizer_only_directory_loads_without_a_config(bpe, tmp_path):
    directory = tf.write_model_dir(tmp_path / "m", bpe, vocab_size=640)
    (directory / "config.json").unlink()
    files = load_model_files(directory)
    assert files.has_config is False and files.config == {} and files.config_vocab_size is None


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: (d / "tokenizer.json").write_text("{ not json"), "tokenizer.json: not valid JSON"),
        (lambda d: (d / "tokenizer.json").write_text("[1, 2]"), "tokenizer.json: expected a JSON object"),
        (lambda d: (d / "tokenizer.json").write_text('{"model": {"type": "Bogus"}}'),
         "tokenizer.json: the tokenizers library cannot load it"),
        (lambda d: (d / "config.json").write_text('{"vocab_size": 6'), "config.json: not valid JSON"),
        (lambda d: (d / "tokenizer_config.json").write_text("nope"), "tokenizer_config.json: not valid JSON"),
        (lambda d: ((d / "tokenizer.json").unlink(), (d / "tokenizer.model").write_bytes(b"x")),
         "no tokenizer.json (only tokenizer.model"),
    ],
)
def test_unreadable_files_name_the_file_and_the_fix(setup, message, bpe, tmp_path):
    directory = tf.write_model_dir(tmp_path / "m", bpe)
    setup(directory)
    with pytest.raises(DraftfitError) as raised:
        load_model_files(directory)
    text = str(raised.value)
    assert message in text and str(directory) in text
    assert "\n" not in text and len(text.split(". ")) >= 2  # what is wrong, then the fix


def test_builtin_probe_corpus_covers_the_required_kinds():
    categories = {t.category for t in builtin_probe_texts()}
    assert {"english", "korean", "chinese", "code", "json", "emoji", "whitespace", "numbers", "urls"} <= categories


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("p.txt", "first line\n\nsecond  line\n", [(FILE_CATEGORY, "first line"), (FILE_CATEGORY, "second  line")]),
        ("p.jsonl", '{"text": "a"}\n{"prompt": "b", "category": "chat"}\n', [(FILE_CATEGORY, "a"), ("chat", "b")]),
        ("p.txt", '{"text": "json without the suffix"}\n', [(FILE_CATEGORY, "json without the suffix")]),
    ],
)
def test_read_probe_file(name, content, expected, tmp_path):
    path = tmp_path / name
    path.write_text(content)
    assert [(t.category, t.text) for t in read_probe_file(path)] == expected


def test_probe_texts_are_added_to_the_builtin_corpus(bpe, tmp_path):
    target, draft = _pair(tmp_path, (bpe, {}), (bpe, {}))
    report = compare(target, draft, probe_texts=["one more text"])
    assert report.probe.texts == len(builtin_probe_texts()) + 1
    assert {c.category: c.texts for c in report.probe.by_category}[FILE_CATEGORY] == 1
