"""The dashboard in a real browser: Voila serves a notebook on localhost, headless
Chromium (Debian's /usr/bin/chromium, driven by Playwright) types a prompt, and the test
waits for the FINAL state — the exact token count and the last token's label in both the
token strip and the plotly heatmap — then checks that nothing older is drawn after it.
Then the dashboard's container is narrowed to JupyterLab-like widths (800, 900, 1400 px):
the figure must follow it, no two of its subplot titles, colour bars, legend, axis
titles and plot areas may overlap or leave the figure, and no control, strip, figure or
frame may stick out of the dashboard, and the attention pattern must fit its frame (no row
hidden below a scroll bar). Screenshots go to artifacts/ (dashboard.png at 900 px).

Compare mode: the checkbox puts a second prompt beside the first; B's token strip and the
compare figure (A | B heatmaps, A − B on shared tokens) must hold B's exact tokens, and fit
800–1400 px like the main figure (artifacts/dashboard_compare.png at 900 px). The saved view:
the "view → HTML" button offers the file as a browser download; opened from disk (file://)
in Chromium with every network request refused, it must show the same tokens (DOM text of
both strips) and the same norms (plotly data of both figures) as the live page.

Set ICL_LENS_TEST_MODEL=gemma-3-270m to run it on the embedded Gemma (default: tiny-gpt2).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import icl_lens
from icl_lens.ui._panels import short_label

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "tests" / "notebooks" / "dashboard_app.ipynb"
ARTIFACTS = ROOT / "artifacts"
WIDTHS = (800, 900, 1400)  # JupyterLab's output area is about 900 px wide
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
MODEL = os.environ.get("ICL_LENS_TEST_MODEL", "tiny-gpt2")
PROMPT = "one two three, one two three, one two"
PROMPT_B = "one two four, one two three, one"

STRIP_STATE = "() => Array.from(document.querySelectorAll('.icl-strip-a .icl-token')).map(e => e.textContent)"
HEATMAP_STATE = """() => {
  const g = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .find(d => d.layout && d.layout.meta === 'icl_lens:figures');
  if (!g || !g.data || !g.data[0] || !g.data[0].x) return null;
  const ax = g.layout.xaxis || {};
  return {n: g.data[0].x.length, rows: (g.data[0].z || []).length,
          last: ax.ticktext ? ax.ticktext[ax.ticktext.length - 1] : null};
}"""

# Bounding boxes (page pixels) of the figure and of every subplot title, colour bar, legend,
# axis title and plot area in plotly's SVG.
LAYOUT_BOXES = """(meta) => {
  const g = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .find(d => d.layout && d.layout.meta === (meta || 'icl_lens:figures'));
  const box = (kind, name, e) => {
    const r = e.getBoundingClientRect();
    return {kind, name, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom};
  };
  const items = [];
  g.querySelectorAll('g.annotation').forEach(e => items.push(box('title', e.textContent, e)));
  g.querySelectorAll('g.colorbar').forEach(e => items.push(
    box('colorbar', (e.querySelector('.cbtitle') || e).textContent, e)));
  g.querySelectorAll('g.legend').forEach(e => items.push(box('legend', 'legend', e)));
  g.querySelectorAll('.draglayer .nsewdrag').forEach(e => items.push(
    box('plot', e.parentNode.getAttribute('class'), e)));
  g.querySelectorAll('g.infolayer > g').forEach(e => {
    const c = e.getAttribute('class') || '';
    if (/^g-[xy][0-9]*title$/.test(c)) items.push(box('axis title', c + ': ' + e.textContent, e));
  });
  const f = g.querySelector('.main-svg').getBoundingClientRect();
  return {figure: {x0: f.left, y0: f.top, x1: f.right, y1: f.bottom},
          items: items.filter(b => b.x1 - b.x0 > 0.5 && b.y1 - b.y0 > 0.5)};
}"""
# Narrow (or widen) the dashboard's container as JupyterLab's output area would be, without
# a window resize event; resolves once the figure has followed its container's width.
SET_WIDTH = """async (width) => {
  const dash = document.querySelector('.icl-dashboard');
  const cell = dash.closest('.jp-Cell');  // the output area itself is a table cell: size its notebook cell
  const extra = cell.getBoundingClientRect().width - dash.getBoundingClientRect().width;
  Object.assign(cell.style, {boxSizing: 'border-box', width: (width + extra) + 'px'});
  const svg = () => dash.querySelector('.js-plotly-plot .main-svg').getBoundingClientRect().width;
  const follows = () => Math.abs(svg() - dash.getBoundingClientRect().width) <= 1;
  for (let i = 0; i < 100 && !follows(); i++) await new Promise(r => setTimeout(r, 100));
  await new Promise(r => setTimeout(r, 300));  // plotly redraws the subplots after resizing its SVG
  return {dashboard: dash.getBoundingClientRect().width, figure: svg()};
}"""

# The z data of the heatmaps of the figure with this meta (live page and saved page alike).
FIGURE_DATA = """(meta) => {
  const g = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .find(d => d.layout && d.layout.meta === meta);
  if (!g) return null;
  const plain = z => Array.from(z || [], row => Array.from(row, Number));
  // _fullData: the saved page's arrays arrive base64-encoded ({dtype, bdata}); plotly.js decodes them there
  return g._fullData.filter(t => t.type === 'heatmap').map(t => ({z: plain(t.z), x: Array.from(t.x || [], Number)}));
}"""
STRIP_B_STATE = "() => Array.from(document.querySelectorAll('.icl-strip-b .icl-token')).map(e => e.textContent)"

# The attention pattern's own document against its frame's viewport.
ATTENTION_SIZE = """() => ({height: document.documentElement.scrollHeight, view_height: window.innerHeight,
                            width: document.documentElement.scrollWidth, view_width: window.innerWidth})"""

# Controls, token strip and attention frame that stick out of the dashboard's box.
OVERFLOWING = """() => {
  const dash = document.querySelector('.icl-dashboard'), right = dash.getBoundingClientRect().right;
  return Array.from(dash.querySelectorAll('.jupyter-widgets, .icl-token-strip, .js-plotly-plot, iframe'))
    .filter(e => e.getBoundingClientRect().width > 0 && e.getBoundingClientRect().right > right + 1)
    .map(e => `${e.className || e.tagName} ends at ${Math.round(e.getBoundingClientRect().right)}`
              + ` > ${Math.round(right)}`);
}"""


def layout_problems(boxes: dict, tol: float = 1.0) -> list[str]:
    """Every box outside the figure and every pair of overlapping boxes (more than ``tol`` px each way)."""
    fig, items = boxes["figure"], boxes["items"]
    out = [f"{b['kind']} {b['name']!r} lies outside the figure" for b in items
           if b["x0"] < fig["x0"] - tol or b["y0"] < fig["y0"] - tol or b["x1"] > fig["x1"] + tol
           or b["y1"] > fig["y1"] + tol]
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            w = min(a["x1"], b["x1"]) - max(a["x0"], b["x0"])
            h = min(a["y1"], b["y1"]) - max(a["y0"], b["y0"])
            if w > tol and h > tol:
                out.append(f"{a['kind']} {a['name']!r} overlaps {b['kind']} {b['name']!r} ({w:.0f}×{h:.0f} px)")
    return out


def check_layout(page, meta: str, width: int, expected_kinds: tuple[int, int, int], shot: Path) -> None:
    """At ``width`` px: the figure with ``meta`` follows its container, nothing in it overlaps or leaves it,
    and no control of the dashboard sticks out of it (screenshot of the dashboard to ``shot``)."""
    sizes = page.evaluate(SET_WIDTH, width)
    page.wait_for_function("""([meta, width]) => Math.abs(Array.from(document.querySelectorAll('.js-plotly-plot'))
        .find(d => d.layout && d.layout.meta === meta).querySelector('.main-svg').getBoundingClientRect().width
        - width) <= 1""", arg=[meta, width], timeout=20_000)
    time.sleep(0.5)  # plotly redraws the subplots after resizing its SVG
    boxes = page.evaluate(LAYOUT_BOXES, meta)
    kinds = Counter(b["kind"] for b in boxes["items"])
    assert (kinds["title"], kinds["colorbar"], kinds["plot"]) == expected_kinds, (meta, kinds)  # all found
    problems = layout_problems(boxes)
    page.locator(".icl-dashboard").screenshot(path=str(shot))
    assert not problems, f"{meta} at {width} px:\n" + "\n".join(problems)
    overflowing = page.evaluate(OVERFLOWING)
    assert not overflowing, f"at {width} px: {overflowing}"
    assert abs(sizes["dashboard"] - width) <= 1, sizes
    figure = page.evaluate("""(meta) => Array.from(document.querySelectorAll('.js-plotly-plot'))
        .find(d => d.layout && d.layout.meta === meta).querySelector('.main-svg').getBoundingClientRect().width""", meta)
    assert abs(figure - width) <= 1, f"{meta} does not follow its container: {figure} px at {width} px"


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
    env = dict(os.environ, HF_HUB_OFFLINE="1", ICL_LENS_TEST_MODEL=MODEL, ICL_LENS_EXPORT_DIR=str(tmp_path / "exports"),
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


def test_dashboard_in_chromium(voila_url, load, tmp_path):
    from playwright.sync_api import sync_playwright

    model = load(MODEL)
    tokens = icl_lens.token_patches(model, PROMPT).tokens
    n, last = len(tokens), short_label(tokens[-1])
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 4400})  # the whole dashboard in view
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
            try:
                page.wait_for_function(
                    f"""() => {{
                      const s = ({STRIP_STATE})(), h = ({HEATMAP_STATE})();
                      return s.length === {n} && s[s.length - 1] === {last!r} && h && h.n === {n}
                             && h.last === {last!r};
                    }}""", timeout=120_000)
            except Exception as exc:  # say what the page shows instead
                raise AssertionError(f"final state not reached: strip {page.evaluate(STRIP_STATE)}, heatmap "
                                     f"{page.evaluate(HEATMAP_STATE)}, status "
                                     f"{page.inner_text('.icl-status')!r}, text {page.input_value('textarea')!r}") from exc
            # phase 2 done: its status names the predictions (phase 1 says "trajectory and attention next…")
            page.wait_for_function("() => document.querySelector('.icl-status').innerText.includes('next tokens')",
                                   timeout=120_000)
            time.sleep(1.5)  # nothing older may be drawn after the final state
            strip, heat = page.evaluate(STRIP_STATE), page.evaluate(HEATMAP_STATE)
            assert len(strip) == n and strip[-1] == last
            assert heat["n"] == n and heat["last"] == last and heat["rows"] == model.cfg.n_layers
            assert page.locator(".icl-token.icl-selected").get_attribute("data-position") == str(n - 1)
            frame = page.query_selector(".icl-attention iframe").content_frame()  # circuitsvis draws a canvas
            frame.wait_for_function("() => { const c = document.querySelector('canvas');"
                                    " return c && c.getBoundingClientRect().height > 0; }", timeout=60_000)
            ARTIFACTS.mkdir(exist_ok=True)
            for width in WIDTHS:
                sizes = page.evaluate(SET_WIDTH, width)
                boxes = page.evaluate(LAYOUT_BOXES)
                kinds = Counter(b["kind"] for b in boxes["items"])
                assert (kinds["title"], kinds["colorbar"], kinds["plot"]) == (5, 3, 5), kinds  # all found
                problems = layout_problems(boxes)
                shot = ARTIFACTS / ("dashboard.png" if width == 900 else f"dashboard_{width}.png")
                page.locator(".icl-dashboard").screenshot(path=str(shot))
                assert not problems, f"at {width} px:\n" + "\n".join(problems)
                overflowing = page.evaluate(OVERFLOWING)
                assert not overflowing, f"at {width} px: {overflowing}"
                assert abs(sizes["dashboard"] - width) <= 1, sizes
                assert abs(sizes["figure"] - width) <= 1, f"the figure does not follow its container: {sizes}"
                # the attention pattern fits its frame: every row visible without scrolling inside it
                inner = frame.evaluate(ATTENTION_SIZE)
                assert inner["height"] <= inner["view_height"] and inner["width"] <= inner["view_width"], \
                    f"at {width} px the attention pattern is cut off by its frame: {inner}"
            # clicking a token selects it as the query of the trajectory panel
            page.locator(".icl-token[data-position='3']").click()
            page.wait_for_function(
                """() => Array.from(document.querySelectorAll('.js-plotly-plot'))
                     .some(g => g.layout && g.layout.meta === 'icl_lens:figures'
                                && String(g.layout.annotations[1].text).includes('query 3 '))""", timeout=60_000)
            page.wait_for_selector(".icl-predictions[data-query='3']", timeout=60_000)  # top-k at the query
            compare_mode(page, model)
            saved_view_matches(browser, page, tmp_path)
        finally:
            browser.close()
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def compare_mode(page, model) -> None:
    """Compare mode on: B beside A, B's exact tokens, the compare figure fitting 800–1400 px."""
    tokens_b = icl_lens.token_patches(model, PROMPT_B).tokens
    n_b, last_b = len(tokens_b), short_label(tokens_b[-1])
    page.get_by_text("compare with a second prompt").click()
    page.wait_for_selector(".icl-prompt-b textarea", state="visible", timeout=60_000)
    page.locator(".icl-prompt-b textarea").click()
    page.keyboard.type(PROMPT_B, delay=15)
    page.wait_for_function(
        f"""() => {{ const s = ({STRIP_B_STATE})(), f = ({FIGURE_DATA})('icl_lens:compare');
                    return s.length === {n_b} && s[s.length - 1] === {last_b!r} && f && f[1].x.length === {n_b}; }}""",
        timeout=120_000)
    page.wait_for_function("() => document.querySelector('.icl-status').innerText.includes('next tokens')",
                           timeout=120_000)
    time.sleep(1.0)
    a, b = (page.locator(sel).bounding_box() for sel in (".icl-prompt textarea", ".icl-prompt-b textarea"))
    assert b["x"] >= a["x"] + a["width"] - 1 and abs(a["y"] - b["y"]) < 2, "prompts A and B are not side by side"
    for width in WIDTHS:
        shot = ARTIFACTS / ("dashboard_compare.png" if width == 900 else f"dashboard_compare_{width}.png")
        check_layout(page, "icl_lens:compare", width, (3, 2, 3), shot)


def saved_view_matches(browser, page, tmp_path: Path) -> None:
    """'view → HTML' offers the file for download; opened from disk with the network refused, it shows the
    live page's tokens and norms."""
    live_a = page.evaluate("() => Array.from(document.querySelectorAll('.icl-strip-a .icl-token'))"
                           ".map(e => e.textContent)")
    live_b = page.evaluate(STRIP_B_STATE)
    assert live_a and live_b
    live = {meta: page.evaluate(FIGURE_DATA, meta) for meta in ("icl_lens:figures", "icl_lens:compare")}
    page.get_by_role("button", name="view → HTML").click()
    link = page.locator("a.icl-download[download='dashboard_view.html']")
    link.wait_for(timeout=120_000)
    with page.expect_download(timeout=120_000) as got:
        link.click()
    saved = tmp_path / "saved_view.html"
    got.value.save_as(saved)
    offline = browser.new_page(viewport={"width": 1200, "height": 2400})
    asked = []

    def refuse(route):
        asked.append(route.request.url)
        route.abort()

    offline.route(lambda url: not url.startswith(("file:", "data:", "blob:", "about:")), refuse)
    offline.goto(saved.as_uri(), timeout=120_000)
    offline.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2",
                              timeout=120_000)
    assert offline.evaluate("() => Array.from(document.querySelectorAll('.icl-strip-a .icl-token'))"
                            ".map(e => e.textContent)") == live_a
    assert offline.evaluate("() => Array.from(document.querySelectorAll('.icl-strip-b .icl-token'))"
                            ".map(e => e.textContent)") == live_b
    for meta, data in live.items():
        got_data = offline.evaluate(FIGURE_DATA, meta)
        assert got_data is not None and len(got_data) == len(data), meta
        for mine, theirs in zip(got_data, data):
            assert mine["x"] == theirs["x"]
            assert len(mine["z"]) == len(theirs["z"]) > 0
            for row_a, row_b in zip(mine["z"], theirs["z"]):
                assert row_a == pytest.approx(row_b, rel=1e-6, abs=1e-9), meta
    assert offline.locator(".icl-predictions").count() == 1
    frame = offline.query_selector(".icl-attention iframe").content_frame()  # circuitsvis' offline bundle draws
    frame.wait_for_function("() => { const c = document.querySelector('canvas');"
                            " return c && c.getBoundingClientRect().height > 0; }", timeout=60_000)
    offline.screenshot(path=str(ARTIFACTS / "saved_view.png"), full_page=False)
    offline.close()
    assert not asked, f"the saved page asked the network for {asked}"
