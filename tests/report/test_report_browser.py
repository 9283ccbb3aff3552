"""report.html in a real headless Chromium (Debian's `chromium`, driven by Playwright): it loads
offline with no console errors, every section and plot is there and rendered (section 12's ViT
pictures checked by name), and a screenshot is
taken (to the test's tmp dir, and to docs/report-screenshot.png for the README).

Set TFORMER_REPORT_HTML=path/to/report.html to check (and screenshot) an existing report instead of
the tiny one this test builds."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from test_report import SECTIONS, TINY_RUN, fake_bench

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
DOCS = Path(__file__).resolve().parents[2] / "docs"
# No network, no first-run or background services: the page must stand on its own.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install -y chromium)"),
]


@pytest.fixture(scope="module")
def report_html(tmp_path_factory):
    given = os.environ.get("TFORMER_REPORT_HTML")
    if given:
        return Path(given)
    from tformer.cli import main
    from tformer.machine.profile_store import save_profile

    root = tmp_path_factory.mktemp("browser")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(root / "cache")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        save_profile(fake_bench())
        assert main(["report", "--quick", "--no-train", "--out", str(root / "report"), *TINY_RUN]) == 0
    finally:
        torch.set_num_threads(prev)
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old
    return root / "report" / "report.html"


def test_report_renders_in_chromium(report_html, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    messages, failed = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1600})
            page.on("console", lambda m: messages.append((m.type, m.text)))
            page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))
            page.on("requestfailed", lambda r: failed.append(r.url))
            # Any request leaving the file is a bug (the report must open offline): fail it and record it.
            page.route(lambda url: not url.startswith(("file:", "data:")),
                       lambda route: (failed.append(route.request.url), route.abort()))
            page.goto(report_html.resolve().as_uri(), wait_until="load")
            headings = page.locator("h2").all_inner_texts()
            images = page.evaluate("""() => Array.from(document.images).map(i => ({
                alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,
                shown: i.getBoundingClientRect().width}))""")
            svgs = page.locator("svg").count()
            page.screenshot(path=str(tmp_path / "report.png"), full_page=False)
            page.screenshot(path=str(tmp_path / "report-full.png"), full_page=True)
        finally:
            browser.close()
    assert not [m for m in messages if m[0] in ("error", "pageerror")], messages
    assert not failed, failed
    for heading in SECTIONS:
        assert heading in headings
    expected = report_html.read_text().count('src="data:image/png;base64,')
    assert expected >= 5 and len(images) + svgs == expected
    for img in images:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0 and img["shown"] > 0, img
    # Section 12's two pictures by their alt text: the digit cut into patches, the rollout over held-out digits.
    vit = [img for img in images if "patches" in img["alt"] or "attention rollout" in img["alt"]]
    assert len(vit) == 2 and all(img["w"] > 300 and img["h"] > 200 for img in vit), vit
    shot = tmp_path / "report.png"
    assert shot.stat().st_size > 10_000  # a blank page compresses to far less
    # The README's screenshot: refreshed from a real report (TFORMER_REPORT_HTML), and written from this
    # test's tiny one only when there is none yet, so a plain test run does not replace the real picture.
    target = DOCS / "report-screenshot.png"
    if os.environ.get("TFORMER_REPORT_HTML") or not target.exists():
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(shot, target)
