"""Calibration v7's rule (CALIBRATION.md section 13, fixed before its runs): the learning rate is the highest one
at which the no-mismatch reference is stable (not broken, held-out at step 80 at least step 0's minus 0.03) in at
least 3 of 4 seeds; at that lr, section 12's go/no-go rule (go_v6.go) decides whether suite v5 runs.
Usage: PYTHONPATH=. python findings/calib/go_v7.py [/tmp/calib_v7]"""

import sys
from pathlib import Path

from go_v6 import go, runs, table

df = runs(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/calib_v7"))
table(df)
chosen = None
for lr in sorted(set(df.lr), key=float, reverse=True):
    ref = df[(df.lr == lr) & (df.arm == "ref")]
    for arm, d in df[df.lr == lr].groupby("arm"):
        print(f"lr {lr} {arm}: broke {int(d.broke.sum())} of {len(d)}, stable {int(d.stable.sum())} of {len(d)}, "
              f"held-out change median {d.gain.median():+.3f}")  # fmt: skip
    if chosen is None and len(ref) == 4 and ref.stable.sum() >= 3:
        chosen = lr
print(f"chosen lr (highest with the reference stable in >= 3 of 4): {chosen}")
if chosen is not None:
    print(f"GO for suite v5 at lr {chosen}: {go(df[df.lr == chosen])}")
else:
    print("GO for suite v5: False (no lr qualifies)")
