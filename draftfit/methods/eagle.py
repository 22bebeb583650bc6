"""``eagle``: an EAGLE(-1) head — one decoder layer over the target's last hidden state and the
next token's embedding, chained k times — and what every EAGLE-family head shares.

Offline (draftfit.eagle_head): one transformers prefill per response gives the target's hidden
states the head reads; the head then runs as vLLM's proposer does — a chain from every step start,
conditioned on the target's states up to the start and on its own after it — and the walk reads
the chains for every k (draftfit.acceptance_walk.predict_chains). Greedy drafting (vLLM's default).
``trained:`` (EAGLE-3 only, see ``Eagle.trainable``) trains a head here for the target
(draftfit.train_head), on the bundled prompts less the ones the study predicts on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftfit.methods.base import CostTerms, HeadMethod, PlannedDraft, with_extra_params


class EagleFamily(HeadMethod):
    proposer_module = "eagle"  # vLLM's EagleProposer serves EAGLE, EAGLE-3 and MTP heads
    """An EAGLE-family head (EAGLE, EAGLE-3): planned, trained, predicted offline and costed alike."""

    trainable = True
    reads_target_states = True
    title = ""  # how progress lines and labels name it
    not_this_head = ""  # why a config is not this method's head

    def skip_reason(self) -> str | None:
        return None

    def plan(self, candidate, ctx) -> PlannedDraft:
        from draftfit.refs import model_dir, resolve

        plan = PlannedDraft(candidate, self.name)
        if ctx.study.temperature > 0 and ctx.study.draft_sample_method == "probabilistic":
            plan.skip_reason = (f"probabilistic drafting of an {self.title} head is not predicted by this draftfit "
                                "version (greedy drafting is vLLM's default); measure it with `draftfit verify`")
            return plan
        if candidate.draft.trained is not None and not candidate.draft.model:
            plan, candidate = self._train(plan, candidate, ctx)
        else:
            plan.deploy_model = candidate.draft.model
        head_ref = resolve(candidate.draft.model)
        directory = model_dir(head_ref, trust_remote_code=ctx.trust_remote_code)
        target_config = json.loads((ctx.target_meta / "config.json").read_text(encoding="utf-8"))
        from draftfit.compat.heads import check_head

        head_config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        if not self.is_head(head_config, directory):
            plan.skip_reason = (f"{candidate.draft.model} is not an {self.title} head ({self.not_this_head}). Point "
                                f"`model` at an {self.title} checkpoint, or use method draft_model for a separate "
                                "draft model")
            return plan
        report = check_head(self.name, directory, target_config, list(candidate.k), ctx.study.max_model_len)
        plan.check = report
        plan.draft_ref = head_ref
        if report["verdict"] == "incompatible":
            plan.skip_reason = f"incompatible with vLLM: {report['summary']}"
        return plan

    def is_head(self, config: dict[str, Any], directory: Path) -> bool:
        """Whether the checkpoint (its ``config.json`` and tensors) is this method's head."""
        from draftfit.compat.heads import head_method

        return head_method(config) == self.name

    def _train(self, plan: PlannedDraft, candidate, ctx):
        import shlex

        from draftfit.engines import EngineConfig
        from draftfit.train_head import HeadRecipe, train_eagle_head, training_prompts

        study = ctx.study
        held_out, prompts = training_prompts(study, ctx.target_meta)
        spec = candidate.draft.trained
        recipe = HeadRecipe(max_tokens=spec.max_tokens, draft_vocab=spec.draft_vocab, epochs=spec.epochs,
                            sampled_vocab=spec.sampled_vocab, seed=study.seed)
        ctx.progress(f"{candidate.name}: training an {self.title} head for {ctx.target_ref.spec} "
                     f"({len(prompts)} prompts, the study's {len(held_out)} held back; cached after the first run)")
        engine = EngineConfig(backend=study.engine, dtype=study.dtype, max_model_len=study.max_model_len,
                              gpu_memory_utilization=study.engine_memory_utilization, seed=study.seed,
                              trust_remote_code=ctx.trust_remote_code)
        head = train_eagle_head(ctx.target_ref, prompts, recipe, method=self.name, engine_config=engine,
                                progress=ctx.progress)
        # the trained head is named by where it lives from here on: verify and the results read `model`
        candidate = candidate.model_copy(update={"draft": candidate.draft.model_copy(update={"model": str(head.path)})})
        plan.candidate = candidate
        plan.deploy_model = f"./{ctx.target_ref.name}-{self.name}"
        plan.prepare = f"cp -r {shlex.quote(str(head.path))} {shlex.quote(plan.deploy_model)}"
        return plan, candidate

    def acceptance(self, plan: PlannedDraft, inputs):
        from draftfit import acceptance_walk
        from draftfit.eagle_head import head_chains
        from draftfit.refs import fingerprint, model_dir

        stops = acceptance_walk.stop_positions(inputs.trajset, inputs.max_tokens)
        target_dir = model_dir(inputs.target_ref)
        chains = head_chains(inputs.trajset, model_dir(plan.draft_ref), target_dir, fingerprint(plan.draft_ref),
                             max(inputs.ks), stops, progress=inputs.progress, method=self.name)
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
            return f"{self.title} head trained here for the target"
        return super().label(draft)


class Eagle(EagleFamily):
    name = "eagle"
    title = "EAGLE"
    # draftfit.train_head can train one (method="eagle"): at lr 3e-3 its heads for SmolLM2 reached AL
    # 1.005–1.009 on held-back prompts; at 5e-4, 1.27 offline. Not offered until ranked and checked
    trainable = False
    not_this_head = "its config.json names another kind of head, or its weights have no fc over [embedding, state]"

    def is_head(self, config: dict[str, Any], directory: Path) -> bool:
        """The original EAGLE checkpoints carry a plain Llama config, which says nothing: the head
        is the one with the ``fc`` fusion."""
        from draftfit.compat.heads import head_method, tensor_names

        return (head_method(config) in (self.name, None)
                and any(name.removeprefix("model.") == "fc.weight" for name in tensor_names(directory)))

    def draft_shape(self, config, name):
        """The head's decoder layer(s) plus its ``fc`` (2·hidden → hidden) over [embedding, hidden
        state]; it reads the target's embedding and, lacking its own, the target's LM head of the
        same vocabulary, as vLLM loads it."""
        from draftfit.compat.heads import layer_config

        shape = super().draft_shape(layer_config(config), name)
        return with_extra_params(shape, 2.0 * shape.hidden_size * shape.hidden_size)


METHOD = Eagle()
