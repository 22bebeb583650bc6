"""``eagle3``: an EAGLE-3 head — fed the target's hidden states of several auxiliary layers, with its
own (possibly reduced) draft vocabulary, chained k times.

Offline (draftfit.eagle_head): one transformers prefill per response gives the target's auxiliary
states; the head then runs as vLLM's proposer does — a chain from every step start, conditioned on
the target's states up to the start and on its own after it — and the walk reads the chains for
every k (draftfit.acceptance_walk.predict_chains). Greedy drafting (vLLM's default, and the only
drafting vLLM allows with a reduced vocabulary). ``trained:`` trains a head here for the target
(draftfit.train_head), on the bundled prompts less the ones the study predicts on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftfit.methods.base import CostTerms, HeadMethod, PlannedDraft, with_extra_params

AUX_LAYERS = 3  # EAGLE-3's default: a low, a middle and a high layer of the target
TRAINED_SUFFIX = "eagle3"


class Eagle3(HeadMethod):
    name = "eagle3"
    trainable = True

    def draft_shape(self, config, name):
        """The head's layer reads [embedding, hidden] (its q/k/v take 2·hidden inputs), its ``fc``
        fuses the auxiliary layers' states (n·hidden → hidden), and its LM head covers the draft
        vocabulary (``draft_vocab_size``) only."""
        from draftfit.compat.heads import layer_config

        config = layer_config(config)
        shape = super().draft_shape(config, name)
        h = shape.hidden_size
        aux = len((config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                  or config.get("eagle_aux_hidden_state_layer_ids") or ()) or AUX_LAYERS
        qkv = shape.num_layers * h * (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
        draft_vocab = int(config.get("draft_vocab_size") or shape.vocab_size)
        return with_extra_params(shape, aux * h * h + qkv - (shape.vocab_size - draft_vocab) * h)

    def skip_reason(self) -> str | None:
        return None

    def plan(self, candidate, ctx) -> PlannedDraft:
        from draftfit.refs import model_dir, resolve

        plan = PlannedDraft(candidate, self.name)
        if ctx.study.temperature > 0 and ctx.study.draft_sample_method == "probabilistic":
            plan.skip_reason = ("probabilistic drafting of an EAGLE-3 head is not predicted by this draftfit version "
                                "(greedy drafting is vLLM's default); measure it with `draftfit verify`")
            return plan
        if candidate.draft.trained is not None and not candidate.draft.model:
            plan, candidate = self._train(plan, candidate, ctx)
        else:
            plan.deploy_model = candidate.draft.model
        head_ref = resolve(candidate.draft.model)
        directory = model_dir(head_ref, trust_remote_code=ctx.trust_remote_code)
        target_config = json.loads((ctx.target_meta / "config.json").read_text(encoding="utf-8"))
        from draftfit.compat.heads import check_head, head_method

        head_config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        if head_method(head_config) != self.name:
            plan.skip_reason = (f"{candidate.draft.model} is not an EAGLE-3 head (its config.json has no speculators "
                                "type eagle3, no Eagle3 architecture and no draft_vocab_size). Point `model` at an "
                                "EAGLE-3 checkpoint, or use method draft_model for a separate draft model")
            return plan
        report = check_head(self.name, directory, target_config, list(candidate.k), ctx.study.max_model_len)
        plan.check = report
        plan.draft_ref = head_ref
        if report["verdict"] == "incompatible":
            plan.skip_reason = f"incompatible with vLLM: {report['summary']}"
        return plan

    def _train(self, plan: PlannedDraft, candidate, ctx):
        import shlex

        from draftfit.engines import EngineConfig
        from draftfit.train_head import HeadRecipe, train_eagle3, training_prompts

        study = ctx.study
        held_out, prompts = training_prompts(study, ctx.target_meta)
        spec = candidate.draft.trained
        recipe = HeadRecipe(max_tokens=spec.max_tokens, draft_vocab=spec.draft_vocab, epochs=spec.epochs, seed=study.seed)
        ctx.progress(f"{candidate.name}: training an EAGLE-3 head for {ctx.target_ref.spec} "
                     f"({len(prompts)} prompts, the study's {len(held_out)} held back; cached after the first run)")
        engine = EngineConfig(backend=study.engine, dtype=study.dtype, max_model_len=study.max_model_len,
                              gpu_memory_utilization=study.engine_memory_utilization, seed=study.seed,
                              trust_remote_code=ctx.trust_remote_code)
        head = train_eagle3(ctx.target_ref, prompts, recipe, engine_config=engine, progress=ctx.progress)
        # the trained head is named by where it lives from here on: verify and the results read `model`
        candidate = candidate.model_copy(update={"draft": candidate.draft.model_copy(update={"model": str(head.path)})})
        plan.candidate = candidate
        plan.deploy_model = f"./{ctx.target_ref.name}-{TRAINED_SUFFIX}"
        plan.prepare = f"cp -r {shlex.quote(str(head.path))} {shlex.quote(plan.deploy_model)}"
        return plan, candidate

    def acceptance(self, plan: PlannedDraft, inputs):
        from draftfit import acceptance_walk
        from draftfit.eagle_head import head_chains
        from draftfit.refs import fingerprint, model_dir

        stops = acceptance_walk.stop_positions(inputs.trajset, inputs.max_tokens)
        target_dir = model_dir(inputs.target_ref)
        chains = head_chains(inputs.trajset, model_dir(plan.draft_ref), target_dir, fingerprint(plan.draft_ref),
                             max(inputs.ks), stops, progress=inputs.progress)
        return acceptance_walk.predict_chains(inputs.trajset, chains, inputs.ks, max_tokens=inputs.max_tokens,
                                              max_model_len=inputs.max_model_len)

    def cost(self, plan: PlannedDraft, step_time, *, trust_remote_code: bool = False) -> CostTerms:
        from draftfit.compat.heads import tensor_names
        from draftfit.costmodel import ModelDraftCost
        from draftfit.refs import fingerprint, model_dir

        directory = Path(model_dir(plan.draft_ref))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        shape = self.draft_shape(config, plan.draft_ref.name)
        if not any(name.endswith("embed_tokens.weight") for name in tensor_names(directory)):
            # no embeddings of its own: vLLM shares the target's, so they cost the head nothing
            shape = with_extra_params(shape, -float(shape.vocab_size * shape.hidden_size))
        return CostTerms(ModelDraftCost(step_time(fingerprint(plan.draft_ref), shape, self.name)), shape, float(shape.params))

    def label(self, draft: dict[str, Any]) -> str:
        if draft.get("trained"):
            return "EAGLE-3 head trained here for the target"
        return super().label(draft)


METHOD = Eagle3()
