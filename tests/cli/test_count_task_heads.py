"""`tformer count` with a task head: the head line (task, what it reads, its Linear) beside the ledger's tables,
the classifier in the parameter breakdown and the JSON; a task config that cannot be built is one line, exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tformer.core.config import preset
from tformer.cost.ledger import ledger

ROOT = Path(__file__).resolve().parents[2]


def _count(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run([sys.executable, "-m", "tformer", "count", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def test_bert_sequence_classifier_prints_its_head():
    done = _count("--preset", "bert-base", "--set", "task=sequence-classification", "--set", "n_classes=3")
    assert done.returncode == 0, done.stderr
    assert "task head: sequence-classification on one vector per sequence, cls pooling through the pooler: " \
           "Linear 768 -> 3, 2,307 parameters" in done.stdout
    lg = ledger(preset("bert-base", task="sequence-classification", n_classes=3))
    assert f"{lg.params['total']:,}" in done.stdout and "classifier" in done.stdout


@pytest.mark.parametrize("args,needle,classifier", [
    (("--preset", "gpt2", "--set", "task=sequence-classification", "--set", "n_classes=1"),
     "sequence-classification (regression) on one vector per sequence, last pooling: Linear 768 -> 1 (no bias)", 768),
    (("--preset", "bert-base", "--set", "task=question-answering", "--phase", "train"),
     "question-answering on every token (a start and an end score): Linear 768 -> 2", 768 * 2 + 2),
])
def test_other_heads_print_and_count(args, needle, classifier):
    done = _count(*args)
    assert done.returncode == 0, done.stderr
    assert needle in done.stdout
    out = json.loads(_count(*args, "--json").stdout)
    assert out["params"]["by_component"]["classifier"] == classifier


@pytest.mark.parametrize("sets,message", [
    (("task=token-classification",), "set n_classes"),
    (("task=question-answering", "n_classes=3"), "drop n_classes"),
    (("task=sequence-classification", "n_classes=2", "pooling=max"), "pooling='max' is unknown"),
])
def test_bad_task_settings_are_one_line_exit_2(sets, message):
    done = _count("--preset", "bert-base", *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
