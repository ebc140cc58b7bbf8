"""``make soak``: the unit suite 5 times in a row, then twice more with both cores kept busy
by a competing CPU load (stress-ng), to show the suite gives the same answer every time.

Prints one line per run (its pytest summary) and a JSON summary at the end; exits 1 when any
run failed. Logs of every run are kept in ``.venv/soak/``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUIET_RUNS = 5
LOADED_RUNS = 2


def _summary(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main() -> int:
    extra = os.environ.get("PYTEST_ARGS", "").split()
    logs = ROOT / ".venv" / "soak"
    logs.mkdir(parents=True, exist_ok=True)
    stress = shutil.which("stress-ng")
    if stress is None:
        print("soak: stress-ng is missing (apt-get install stress-ng; make setup does)",
              file=sys.stderr)
        return 2
    runs = []
    for i in range(QUIET_RUNS + LOADED_RUNS):
        loaded = i >= QUIET_RUNS
        load = None
        if loaded:  # one busy worker per core, for as long as the run lasts
            load = subprocess.Popen([stress, "--cpu", str(os.cpu_count() or 2), "--quiet"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        log = logs / f"run-{i + 1}.log"
        started = time.monotonic()
        with log.open("w") as out:
            code = subprocess.run([sys.executable, "-m", "pytest", "-q", *extra], cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT).returncode
        if load is not None:
            load.terminate()
            load.wait()
        runs.append({"run": i + 1, "loaded": loaded, "exit": code,
                     "seconds": round(time.monotonic() - started), "summary": _summary(log)})
        print(f"soak: run {i + 1} of {QUIET_RUNS + LOADED_RUNS}"
              f"{' (cores busy)' if loaded else ''}: exit {code}, {runs[-1]['summary']}",
              flush=True)
    failed = sum(1 for r in runs if r["exit"] != 0)
    print(json.dumps({"soak": {"runs": len(runs), "failed": failed, "detail": runs}}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
