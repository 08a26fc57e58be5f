"""The dashboard in a real browser: Voila serves a notebook on localhost, headless
Chromium (Debian's /usr/bin/chromium, driven by Playwright) types a prompt, and the test
waits for the FINAL state — the exact token count and the last token's label in both the
token strip and the plotly heatmap — then checks that nothing older is drawn after it.
A screenshot goes to artifacts/dashboard.png.

Set ICL_LENS_TEST_MODEL=gemma-3-270m to run it on the embedded Gemma (default: tiny-gpt2).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import icl_lens
from icl_lens.ui.panels import token_label

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "tests" / "notebooks" / "dashboard_app.ipynb"
ARTIFACT = ROOT / "artifacts" / "dashboard.png"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
MODEL = os.environ.get("ICL_LENS_TEST_MODEL", "tiny-gpt2")
PROMPT = "one two three, one two three, one two"

STRIP_STATE = "() => Array.from(document.querySelectorAll('.icl-token')).map(e => e.textContent)"
HEATMAP_STATE = """() => {
  const g = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .find(d => d.layout && d.layout.meta === 'icl_lens:figures');
  if (!g || !g.data || !g.data[0] || !g.data[0].x) return null;
  const ax = g.layout.xaxis || {};
  return {n: g.data[0].x.length, rows: (g.data[0].z || []).length,
          last: ax.ticktext ? ax.ticktext[ax.ticktext.length - 1] : null};
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"voila exited with code {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"voila did not listen on port {port} within {timeout} s")


@pytest.fixture
def voila_url(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium chromium-driver)")
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", ICL_LENS_TEST_MODEL=MODEL,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log = open(tmp_path / "voila.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "voila", str(NOTEBOOK), "--no-browser", f"--port={port}", "--Voila.ip=127.0.0.1",
         "--strip_sources=True", f"--Voila.root_dir={NOTEBOOK.parent}"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, proc, timeout=120)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
    assert proc.returncode is not None


def test_dashboard_in_chromium(voila_url, load):
    from playwright.sync_api import sync_playwright

    model = load(MODEL)
    tokens = icl_lens.token_patches(model, PROMPT).tokens
    n, last = len(tokens), token_label(tokens[-1])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1900})
            page.goto(voila_url, timeout=240_000)
            page.wait_for_selector("textarea", timeout=240_000)
            # the figure grid has been drawn once before typing starts
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot .main-svg')).length >= 1",
                timeout=120_000)
            assert "icl_lens.dashboard(" not in page.inner_text("body"), "app mode must not show code"
            page.locator("textarea").first.click()
            page.keyboard.type(PROMPT, delay=15)
            # the FINAL state: exact count and last label in strip and heatmap
            page.wait_for_function(
                f"""() => {{
                  const s = ({STRIP_STATE})(), h = ({HEATMAP_STATE})();
                  return s.length === {n} && s[s.length - 1] === {last!r} && h && h.n === {n}
                         && h.last === {last!r};
                }}""", timeout=120_000)
            page.wait_for_function("() => document.querySelector('.icl-status').innerText.includes('attention')",
                                   timeout=120_000)
            time.sleep(1.5)  # nothing older may be drawn after the final state
            strip, heat = page.evaluate(STRIP_STATE), page.evaluate(HEATMAP_STATE)
            assert len(strip) == n and strip[-1] == last
            assert heat["n"] == n and heat["last"] == last and heat["rows"] == model.cfg.n_layers
            assert page.locator(".icl-token.icl-selected").get_attribute("data-position") == str(n - 1)
            # clicking a token selects it as the query of the trajectory panel
            page.locator(".icl-token[data-position='3']").click()
            page.wait_for_function(
                """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
                     .some(g => g.layout && g.layout.meta === 'icl_lens:figures'
                                && String(g.layout.annotations[1].text).includes('query 3 '))""", timeout=60_000)
            ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACT), full_page=True)
        finally:
            browser.close()
    assert ARTIFACT.stat().st_size > 10_000
