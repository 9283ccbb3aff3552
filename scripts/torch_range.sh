#!/usr/bin/env bash
# Run the tests that depend on torch's own behaviour (pytest -m torch_behaviour: FLOP formulas, parity with the
# references, torch.compile, the ONNX exporter) on the other end of the torch range pyproject.toml declares:
# on the newest torch pip offers when this environment has the oldest, else on the oldest.
#
# A second virtual environment that sees this one's packages (--system-site-packages) and holds only its own
# torch, so nothing but torch differs. Used by .ci/run; run it by hand after changing what the tests ask of torch.
set -euo pipefail
cd "$(dirname "$0")/.."
have=$(python3 -c "import torch; print(torch.__version__.split('+')[0])")
oldest=$(python3 -c "import re, pathlib; print(re.search(r'\"torch>=([0-9.]+)\"', pathlib.Path('pyproject.toml').read_text()).group(1))")
venv=${TORCH_RANGE_VENV:-${TMPDIR:-/tmp}/tformer-torch-range}
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
if [ "${have%.*}" = "$oldest" ] || [ "$have" = "$oldest" ]; then
  want="torch>$have"  # the newest release pip offers (under this machine's constraints, if any)
else
  want="torch==$oldest.*"
fi
echo "torch range: this environment has torch $have (pyproject: torch>=$oldest); the other end: $want"
"$venv/bin/python" -m pip install -q --upgrade "$want"
other=$("$venv/bin/python" -c "import torch; print(torch.__version__)")
echo "torch range: running the torch_behaviour tests on torch $other"
"$venv/bin/python" -m pytest -q -m torch_behaviour -p no:cacheprovider
