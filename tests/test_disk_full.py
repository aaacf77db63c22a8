"""Issues 6 and 18: a full disk. During a checkpoint (a real file-size limit, RLIMIT_FSIZE: writes past it fail
with EFBIG) the previous checkpoint is kept and training goes on; in the middle of a run (a real full filesystem,
a small tmpfs in a private mount namespace filled by another writer) the run stops resumable with nothing lost.

Kept apart from test_faults.py (the kill drills) so the two long files run on different test workers.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from tests.test_faults import command, metric_steps, start, weights

pytestmark = pytest.mark.slow


def test_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, small_model):
    run_dir = tmp_path / "run"
    first = subprocess.run(
        command(run_dir, small_model, "trainer.total_steps=2"), cwd=tmp_path, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr[-2000:]
    size = (run_dir / "checkpoints" / "step_2" / "model.safetensors").stat().st_size

    def small_disk() -> None:  # logs fit, a model file does not
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    proc = start(
        run_dir, small_model, "trainer.total_steps=4", "trainer.resume=true",
        "trainer.resume_allow=[trainer.total_steps]", preexec_fn=small_disk,
    )  # fmt: skip
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "checkpoint step_4 could not be written" in err and "previous checkpoint is intact" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["checkpoint_failed_steps"] == [4]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "step_2"]  # no temp left
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_2"
    assert set(weights(run_dir, 2)) and metric_steps(run_dir) == [1, 2, 3, 4]


DRIVER = """
import json, os, subprocess, sys, tempfile, time
from pathlib import Path
mount, cmd, resume_cmd = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", mount], check=True)
run_dir = Path(mount) / "run"
err_file = tempfile.TemporaryFile("w+")  # off the full disk, and never a pipe left unread while the filler runs
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
deadline = time.monotonic() + 400
def steps():
    try:
        return [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.endswith("}")]
    except OSError:
        return []
while len(steps()) < 3 and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.02)
# Every free byte, as another job's output would, and kept so until the run ends: a failed checkpoint deletes its
# partial files, and a filler that wrote only once let the run take that space back and finish as if never full.
def fill(fd):
    took = False
    for size in (1 << 16, 4096, 1):
        try:
            while True:
                os.write(fd, bytes(size))
                took = True
        except OSError:
            pass
    return took
fd = os.open(Path(mount) / "filler", os.O_WRONLY | os.O_CREAT)
fill(fd)
deadline = time.monotonic() + 400
while proc.poll() is None and time.monotonic() < deadline:
    if not fill(fd):
        time.sleep(0.005)
os.close(fd)
proc.wait(timeout=10)
err_file.seek(0)
err = err_file.read()
after_failure = {"rc": proc.returncode, "stderr": err, "steps": steps(),
                 "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").iterdir())}
os.remove(Path(mount) / "filler")
res = subprocess.run(resume_cmd, capture_output=True, text=True, timeout=400)
print(json.dumps({"failure": after_failure, "resume_rc": res.returncode, "resume_err": res.stderr[-2000:],
                  "steps": steps(), "summary": json.loads((run_dir / "summary.json").read_text())}))
"""


def private_mounts_work() -> bool:
    probe = ["unshare", "--user", "--map-root-user", "--mount", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not private_mounts_work(), reason="needs unshare with user and mount namespaces (a private tmpfs)")
def test_a_disk_that_fills_mid_run_stops_it_resumable_with_nothing_lost(tmp_path, small_model):
    """The run directory lives on a 48 MB tmpfs; after step 3 another writer takes every free byte. Whatever write
    fails first (a metrics line, a checkpoint, an evaluation), the run keeps every step up to its newest
    checkpoint, says so in one line, and once space is freed continues to the end with every step exactly once."""
    mount = tmp_path / "disk"
    mount.mkdir()
    run_dir = mount / "run"
    steps = 12
    cmd = command(run_dir, small_model, f"trainer.total_steps={steps}", "trainer.checkpoint_every=1")
    resume = [*cmd, "trainer.resume=true"]
    res = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", DRIVER, str(mount),
         json.dumps(cmd), json.dumps(resume)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    failure = out["failure"]
    lines = [line for line in failure["stderr"].splitlines() if line.strip() and "it/s]" not in line]
    assert failure["rc"] != 0 and "Traceback" not in failure["stderr"], failure["stderr"][-3000:]
    assert len([line for line in lines if line.startswith(("error:", "warning:"))]) >= 1, lines
    newest = max(int(name.split("_")[1]) for name in failure["checkpoints"] if name.startswith("step_"))
    assert failure["steps"][:newest] == list(range(1, newest + 1)), "lines before the newest checkpoint were lost"
    assert out["resume_rc"] == 0, out["resume_err"]
    assert out["steps"] == list(range(1, steps + 1)) and out["summary"]["status"] == "completed"
