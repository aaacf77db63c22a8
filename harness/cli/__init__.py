"""What `run.py` does around Hydra that is not a job: `checks` before Hydra starts (one-line errors, `mode=plan`'s
argv, torchrun's shared run stamp) and `sweep` after each job and at the end of a multirun (progress lines, the
failed jobs, the exit code). The job itself is `harness.loop.job`."""
