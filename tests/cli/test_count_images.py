"""`tformer count` for image models: the token count with its formula, the cost against image and patch size,
CLIP's N x N logits, the fusion table; bad image flags are one line and exit 2; none of it imports torch."""

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


def test_vit_at_another_image_size_prints_its_tokens_and_says_seq_is_not_read():
    done = _count("--preset", "vit-base-16", "--image-size", "384")
    assert done.returncode == 0, done.stderr
    assert "n = HW/P^2 + 1 = 384·384/16^2 + 1 = 577 tokens" in done.stdout
    assert "seq is not what sizes a ViT" in done.stdout and "batch x seq" not in done.stdout
    lg = ledger(preset("vit-base-16", image_size=384))
    assert f"{lg.flops['matmul']:,}" in done.stdout


def test_json_has_the_image_the_table_and_clip_logits():
    out = json.loads(_count("--preset", "vit-tiny-16", "--image-size", "224,384", "--patch-size", "16,32",
                            "--json").stdout)
    assert out["image"]["tokens"] == 197
    rows = out["image_sizes"]["rows"]
    assert [(r["image_size"], r["patch_size"], r["tokens"]) for r in rows] == \
        [(224, 16, 197), (224, 32, 50), (384, 16, 577), (384, 32, 145)]
    assert rows[2]["attention_ratio"] == pytest.approx((577 / 197) ** 2)
    clip = json.loads(_count("--preset", "clip-vit-b-32", "--batch", "6", "--phase", "train", "--fusion",
                             "--cross-every", "2", "--json").stdout)
    assert clip["image"]["contrastive"]["logits_bytes"] == 36 * 4 == clip["memory"]["logits"]
    assert [m["mode"] for m in clip["fusion"]["modes"]] == ["early", "late", "cross"]
    assert clip["fusion"]["modes"][1]["params"] == clip["params"]["total"]


def test_tables_print_for_a_sweep_and_fusion():
    done = _count("--preset", "vit-small-16", "--sweep")
    assert done.returncode == 0, done.stderr
    assert "cost against image size and patch size" in done.stdout and "1,025" in done.stdout
    done = _count("--preset", "clip-vit-b-16", "--batch", "8", "--fusion")
    assert done.returncode == 0, done.stderr
    assert "N x N similarity logits take 256 B" in done.stdout and "score 8x8 pairs" in done.stdout


@pytest.mark.parametrize("args,needle", [
    (("--preset", "gpt2", "--image-size", "224"), "reads no images"),
    (("--preset", "vit-base-16", "--image-size", "200"), "does not divide"),
    (("--preset", "vit-base-16", "--image-size", "big"), "--image-size takes whole numbers"),
    (("--preset", "vit-base-16", "--fusion"), "--fusion joins a CLIP"),
    (("--preset", "vit-base-16", "--image-size", "100", "--patch-size", "16,32"), "no patch size given divides"),
])
def test_bad_image_flags_are_one_line_and_exit_2(args, needle):
    done = _count(*args)
    assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
