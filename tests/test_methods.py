"""Every registered draft method, walked from a candidate file to its plan, the engine's
``speculative_config`` and the deploy command — and checked against the installed vLLM's own
``SpeculativeConfig`` fields and method names."""

from __future__ import annotations

import ast
import importlib.util
import typing
from pathlib import Path

import pytest

from draftfit.candidates import DraftSpec, StudySettings, load_candidate
from draftfit.deploy import SpecConfig, vllm_command
from draftfit.errors import DraftfitError
from draftfit.methods import CANDIDATE_METHODS, METHODS, PlanContext, get_method
from draftfit.methods.base import DraftMethod
from draftfit.vllm_versions import installed_vllm_version

# One candidate file per registered method (the derived draft is the early-exit self-draft).
CANDIDATES = {
    "draft_model": "draft: {method: draft_model, model: smollm2}\nk: [2, 3]\n",
    "draft_model-derived": "draft: {method: draft_model, derived: {first_layers: 24}}\nk: [2]\n",
    "ngram": "draft: {method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 4}\nk: [3]\n",
    "suffix": "draft: {method: suffix}\nk: [4]\n",
    "eagle": "draft: {method: eagle, model: smollm2}\nk: [3]\n",
    "eagle3": "draft: {method: eagle3, model: smollm2}\nk: [3]\n",
    "mtp": "draft: {method: mtp, model: smollm2}\nk: [1]\n",
}
# What rank does with each: "scored" (a draft model loads), "simulated" (model-free), "skipped".
HAS_ARCTIC = importlib.util.find_spec("arctic_inference") is not None
ROUTE = {"draft_model": "scored", "draft_model-derived": "scored", "ngram": "simulated",
         "suffix": "simulated" if HAS_ARCTIC else "skipped", "eagle": "skipped", "eagle3": "skipped", "mtp": "skipped"}
# why each skipped one is skipped (the heads here name a plain model: heads are tested in test_eagle3
# and test_eagle)
SKIP_SAYS = {"suffix": "pip install arctic-inference", "eagle": "is not an EAGLE head", "eagle3": "is not an EAGLE-3 head",
             "mtp": "has no MTP layers"}


def _installed_speculative_config() -> tuple[set[str], set[str]]:
    """The installed vLLM's SpeculativeConfig field names and its `method` Literal's names, read
    from its source (no vLLM import)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    source = Path(list(spec.submodule_search_locations)[0]) / "config" / "speculative.py"
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return fields, names


def test_every_candidate_method_has_a_walk_case():
    assert {case.split("-")[0] for case in CANDIDATES} == set(CANDIDATE_METHODS)
    assert set(typing.get_args(DraftSpec.model_fields["method"].annotation)) == set(CANDIDATE_METHODS)


def test_the_registry_is_keyed_by_each_methods_name():
    assert all(isinstance(m, DraftMethod) and name == m.name for name, m in METHODS.items())
    assert not {"medusa", "mlp_speculator"} & set(CANDIDATE_METHODS)  # deploy-only: removed in vLLM 0.33


def test_an_unknown_method_lists_the_known_ones():
    with pytest.raises(DraftfitError, match="unknown speculative method 'lookahead'") as info:
        get_method("lookahead")
    assert all(name in info.value.fix for name in METHODS)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CANDIDATES))
def test_candidate_file_to_plan_to_vllm_config(case, tmp_path, smollm2_ref, smollm2_meta):
    path = tmp_path / f"{case}.yaml"
    path.write_text(f"name: {case}\ntarget: smollm2\n" + CANDIDATES[case])
    candidate, _ = load_candidate(path)
    method = get_method(candidate.draft.method)
    study = StudySettings()
    messages: list[str] = []

    plan = method.plan(candidate, PlanContext(smollm2_ref, smollm2_meta, study, progress=messages.append))
    route = "skipped" if plan.skip_reason else ("scored" if plan.draft_ref is not None else "simulated")
    assert route == ROUTE[case], plan.skip_reason
    if route == "skipped":
        assert SKIP_SAYS[case] in plan.skip_reason
    if route == "scored":
        assert plan.check["verdict"] in ("identical", "compatible") and plan.deploy_model
    if case.endswith("derived"):
        assert messages == [f"deriving {case}: the target's first 24 layers"]

    k = candidate.k[0]
    engine = method.engine_config(candidate, k, smollm2_ref, {})
    assert engine.config["method"] == candidate.draft.method and engine.config["num_speculative_tokens"] == k
    assert (engine.directory is not None) == method.uses_model == ("model" in engine.config)
    if method.uses_model:
        assert Path(engine.config["model"]).is_dir() and (Path(engine.config["model"]) / "config.json").is_file()
    assert engine.draft_is_target == (case == "draft_model")  # `model: smollm2` is the target itself

    fields, names = _installed_speculative_config()
    assert set(engine.config) <= fields
    version = installed_vllm_version() or "0.32.0"
    spec = SpecConfig(method=candidate.draft.method, num_speculative_tokens=k,
                      model=plan.deploy_model or candidate.draft.model, **method.deploy_extra(candidate))
    command = vllm_command("smollm2", spec, version, device="cpu")
    assert command.deployable, command.problem
    assert command.speculative_config["method"] == candidate.draft.method in names
    assert set(command.speculative_config) <= fields
    if case == "ngram":
        assert command.speculative_config["prompt_lookup_min"] == 2 and command.speculative_config["prompt_lookup_max"] == 4


@pytest.mark.parametrize("version, method, refused", [
    ("0.12.0", "draft_model", "refuses separate draft models"),
    ("0.15.0", "draft_model", None),
    ("0.8.1", "suffix", "no flag for suffix decoding"),
    ("0.33.0", "medusa", "removed the medusa method"),
    ("0.32.0", "mlp_speculator", None),
    ("0.12.0", "eagle3", None),
])
def test_each_method_refuses_the_vllm_versions_that_cannot_run_it(version, method, refused):
    spec = SpecConfig(method=method, num_speculative_tokens=2, model=None if get_method(method).model_free else "m")
    command = vllm_command("t", spec, version)
    assert command.deployable == (refused is None)
    if refused:
        assert refused in command.problem
