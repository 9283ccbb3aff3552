"""Section 12, "Seeing images": the digit cut into patches and the trained ViT's rollout, embedded in the
Markdown, the HTML and the JSON; --no-train says the maps are of an untrained model."""

import base64
import json
import re
from types import SimpleNamespace

import pytest

from tformer.report import section_vision as V
from tformer.report.build import write_report
from tformer.report.doc import Document, Figure, Table
from tformer.teach import digit_vit

PNG = b"\x89PNG\r\n\x1a\n"


def context(train=True):
    opts = SimpleNamespace(train=train, quick=True, seed=7, threads=None)
    return SimpleNamespace(options=opts, results={}, data={}, say=lambda _m: None)


@pytest.fixture(scope="module")
def trained():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(digit_vit, "QUICK_STEPS", 12)  # the section's path, not its accuracy: a few steps suffice
        ctx = context()
        ctx.results["vision"] = V.measure(ctx)
        sec = V.build(ctx)
    return ctx, sec


def test_section_has_both_pictures_the_accuracy_and_the_json(trained):
    ctx, sec = trained
    assert sec.heading == "12. Seeing images: ViT patches and attention" and sec.anchor == "vision"
    figures = {f.name: f for f in sec.blocks if isinstance(f, Figure)}
    assert set(figures) == {"vit_patches", "vit_rollout"}
    assert all(f.png.startswith(PNG) for f in figures.values())
    run = ctx.results["vision"]["run"]
    assert run.steps == 12 and run.seed == 7
    text = " ".join(b.text for b in sec.blocks if hasattr(b, "text"))
    assert f"{100 * run.accuracy:.1f}% held-out accuracy" in text and "**17 tokens**" in text
    assert "untrained" not in text
    data = ctx.data["vision"]
    assert data["trained"] and data["accuracy"] == run.accuracy and data["config"]["tokens"] == 17
    assert len(data["shown"]) == 6 and all(len(s["rollout"]) == 4 for s in data["shown"])
    table = next(b for b in sec.blocks if isinstance(b, Table))
    assert [r[0] for r in table.rows] == [s["name"] for s in data["shown"]]


def test_pictures_are_embedded_in_markdown_html_and_json(trained, tmp_path):
    ctx, sec = trained
    out = tmp_path / "report"
    write_report(out, Document("t", ["line"], [sec]), {"vision": ctx.data["vision"]})
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## 12. Seeing images: ViT patches and attention" in md
    for name in ("vit_patches", "vit_rollout"):
        assert f"](plots/{name}.png)" in md
        png = (out / "plots" / f"{name}.png").read_bytes()
        assert png.startswith(PNG)
        found = re.search(rf'<figure id="fig-{name}"><img src="data:image/png;base64,([^"]+)"', page)
        assert found and base64.b64decode(found.group(1)) == png
    assert json.loads((out / "report.json").read_text())["vision"]["shown"][0]["rollout"]


def test_no_train_draws_an_untrained_model_and_says_so():
    ctx = context(train=False)
    ctx.results["vision"] = V.measure(ctx)
    sec = V.build(ctx)
    text = " ".join(b.text for b in sec.blocks if hasattr(b, "text"))
    assert ctx.results["vision"]["run"].steps == 0 and "**untrained**" in text
    assert ctx.data["vision"]["trained"] is False
    assert len([b for b in sec.blocks if isinstance(b, Figure)]) == 2


def test_without_a_run_one_line():
    ctx = context()
    sec = V.build(ctx)
    assert [b.text for b in sec.blocks] == ["No ViT pictures: the digits model was not run."]
