#!/usr/bin/env bash
# What a newcomer does, before every submission: a clean clone of the committed HEAD, a fresh virtual
# environment (no packages of this machine's), and the README's two quick-start commands exactly as the README
# writes them, each timed; then the times, the torch pip resolved and pytest's summary line.
#
#   bash scripts/fresh_check.sh            # about 25 min on a 2-core CPU (the install is most of the first 3)
#   KEEP=1 bash scripts/fresh_check.sh     # keep the clone and venv (printed) for a look afterwards
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tformer-fresh.XXXXXX")
[ -n "${KEEP:-}" ] || trap 'rm -rf "$work"' EXIT
# The two commands, read from the README's quick start (the first two lines of its first bash block).
mapfile -t cmds < <(awk '/^## Quick start/{q=1} q&&/^```bash/{b=1;next} b&&/^```/{exit} b{print}' "$repo/README.md")
[ "${#cmds[@]}" -eq 2 ] || { echo "fresh_check: the README's quick start should hold exactly two commands, found ${#cmds[@]}"; exit 2; }

git clone -q "$repo" "$work/tformer"
python3 -m venv "$work/venv"
cd "$work/tformer"
# A newcomer has no tformer cache either: the pinned weight and corpus packages are fetched again.
export PATH="$work/venv/bin:$PATH" VIRTUAL_ENV="$work/venv" TFORMER_CACHE="$work/tformer-cache"
unset PYTHONPATH
echo "fresh_check: $(git log -1 --format='%h %s' | cut -c1-80) in $work (CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores)"
status=0
for i in 0 1; do
  echo "fresh_check: command $((i + 1)): ${cmds[$i]}"
  start=$(date +%s)
  bash -c "${cmds[$i]}" > "$work/command$((i + 1)).log" 2>&1
  rc=$?
  secs[$i]=$(( $(date +%s) - start ))
  rcs[$i]=$rc
  [ $rc -eq 0 ] || status=1
  tail -n 3 "$work/command$((i + 1)).log" | sed 's/^/    /'
done
torch=$(python -c "import torch; print(torch.__version__)" 2>/dev/null || echo "none")
summary=$(grep -E "^=*.*(passed|failed|error).* in [0-9.]+s" "$work/command2.log" | tail -n 1)
echo
echo "fresh_check: torch $torch"
printf 'fresh_check: command 1 (install + report): exit %s in %dm%02ds\n' "${rcs[0]}" $((secs[0] / 60)) $((secs[0] % 60))
printf 'fresh_check: command 2 (install + tests):  exit %s in %dm%02ds\n' "${rcs[1]}" $((secs[1] / 60)) $((secs[1] % 60))
echo "fresh_check: tests: ${summary:-no pytest summary (see $work/command2.log)}"
[ -n "${KEEP:-}" ] && echo "fresh_check: kept $work (logs: command1.log, command2.log)"
exit $status
