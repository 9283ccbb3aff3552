"""Every record filed under bench/results/ names the command that made it and the commit it ran on, and that
command's script and flags still exist (run by .ci/run): a figure measured by a script since renamed, or with a
flag since removed, is a figure nobody can re-measure, and the check fails naming it.

    python scripts/check_bench_records.py            # exit 0, or one line per stale record and exit 1

A script's flags are read from its source (the ``add_argument("--flag"`` calls, and bench/_results.py's
add_run_args where the script calls it), so the check imports nothing and runs in a second.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
FLAG = re.compile(r"""add_argument\(\s*["'](--[A-Za-z0-9][A-Za-z0-9-]*)["']""")


def flags_of(script: Path) -> set[str]:
    """The long options ``script`` declares (argparse's own --help included)."""
    text = script.read_text(encoding="utf-8")
    found = set(FLAG.findall(text)) | {"--help"}
    if "add_run_args(" in text:
        found |= set(FLAG.findall((BENCH / "_results.py").read_text(encoding="utf-8")))
    return found


def problems(section: str, record: dict) -> list[str]:
    """What is wrong with one record: no command or commit, a script that is gone, a flag it no longer takes."""
    out = []
    if not record.get("commit"):
        out.append("names no commit")
    command = record.get("command")
    if not isinstance(command, str) or not command.strip():
        return out + ["names no command"]
    words = shlex.split(command)
    script = next((w for w in words if w.startswith("bench/") and w.endswith(".py")), None)
    if script is None:
        return out + [f"its command {command!r} runs no bench/ script"]
    path = ROOT / script
    if not path.is_file():
        return out + [f"its script {script} no longer exists"]
    known = flags_of(path)
    for word in words[words.index(script) + 1:]:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in known:
            out.append(f"{script} no longer takes {flag}")
    return out


def main() -> int:
    bad = 0
    for file in sorted(RESULTS.glob("*.json")):
        doc = json.loads(file.read_text(encoding="utf-8"))
        for section, record in doc.items():
            if section == "machine" or not isinstance(record, dict):
                continue
            for problem in problems(section, record):
                print(f"{file.relative_to(ROOT)} [{section}]: {problem}; re-measure it or remove the record")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
