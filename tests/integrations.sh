#!/usr/bin/env bash
# make test-integrations: the adapters' tests where their users train. One venv per environment, each with its
# framework's own pins (verl 0.9.1 keeps transformers below 5.11) and the wheel built from this checkout; each is
# built once per requirement line (a stamp inside it) and reused. The tests run from a scratch copy of tests/,
# analysis/ and examples/ (none is in the wheel), so `harness` is imported from the installed wheel, never the
# checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIR=$(realpath -m "${INTEGRATIONS_DIR:-.integrations}")
TORCH=torch==2.13.0  # the CPU wheel on disk (an unpinned torch pulls a CUDA build), installed first
# name | requirements beyond torch (tensordict: verl's, imported by the test) | the wheel's extras | test file
ENVS=(
  "verl|verl==0.9.1 tensordict pytest pytest-timeout||tests/test_integration_verl.py"
  "trl-1.16|trl==1.16.0 pytest pytest-timeout|hf,analysis|tests/test_integration_trl.py"
  # the oldest TRL the adapter supports (TRL_SUPPORTED); trl 1.8.0 imports requests without declaring it
  "trl-1.8|trl==1.8.0 requests pytest pytest-timeout|hf|tests/test_integration_trl.py"
)
t0=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - t0 )) s]"; }

mkdir -p "$DIR"
rm -rf "$DIR/wheel" && "$PY" -c "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])" \
  "$DIR/wheel" > /dev/null
rm -rf build
wheel=$(ls "$DIR"/wheel/*.whl)
# The small tiny model the TRL tests train, built (or found) by the main venv's model builder.
model=$("$PY" -c "from tests.conftest import SMALL_MODEL; from harness.config import compose, validate
from harness.loop.model_path import model_dir; print(model_dir(validate(compose(*SMALL_MODEL))))" 2>/dev/null | tail -1)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r tests analysis examples pyproject.toml "$scratch"/

failed=0
for spec in "${ENVS[@]}"; do
  IFS='|' read -r name requirements extras test_file <<< "$spec"
  venv="$DIR/$name"
  key=$(echo "$TORCH $requirements $(python3.11 --version 2>&1)" | sha1sum | cut -c1-12)
  if [[ ! -f "$venv/.stamp-$key" ]]; then
    echo "integrations: building $venv ($requirements) $(elapsed)"
    rm -rf "$venv" && python3.11 -m venv "$venv"
    "$venv/bin/pip" install -q --no-compile --upgrade pip
    "$venv/bin/pip" install -q --no-compile "$TORCH"
    # shellcheck disable=SC2086  # the requirement line is a word list
    "$venv/bin/pip" install -q --no-compile "$TORCH" $requirements
    touch "$venv/.stamp-$key"
  fi
  "$venv/bin/pip" uninstall -q -y trust-region-harness 2> /dev/null || true
  "$venv/bin/pip" install -q --no-compile "$wheel${extras:+[$extras]}"
  "$venv/bin/pip" check > /dev/null || { "$venv/bin/pip" check; echo "integrations: $name: pip check failed"; exit 1; }
  from=$(cd "$scratch" && "$venv/bin/python" -c "import harness; print(harness.__file__)")
  [[ "$from" == "$venv/"* ]] || { echo "integrations: $name imports harness from $from, not the wheel"; exit 1; }
  versions=$("$venv/bin/pip" list 2> /dev/null | awk '$1 ~ /^(verl|trl|transformers|torch)$/ {printf "%s %s, ", $1, $2}')
  echo "integrations: $name: ${versions%, }; pip check clean $(elapsed)"
  (cd "$scratch" && HARNESS_TEST_MODEL="$model" WANDB_MODE=offline WANDB_SILENT=true \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -rs "$test_file") || failed=1
done
echo "integrations: done $(elapsed)"
exit $failed
