"""The dashboard in a real browser, as users open it: the shipped notebook
``notebooks/05_live_dashboard.ipynb`` served by ``make app`` (Voila) and opened by ``make lab``
(JupyterLab, then *Run → Run All Cells*), each on the notebook's own model, the workshop model
(SmolLM2-135M), and on icl_lens's default model (``ICL_LENS_WORKSHOP_MODEL=gemma-3-270m``, how a
participant switches). No copy of the notebook stands in for it: the test starts the Makefile's own
targets (with a free port, a token and ``--no-browser`` added).

Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) types a prompt into the
dashboard and the test waits for the FINAL state — the exact token count and the last token's
label in both the token strip and the plotly heatmap — then checks that nothing older is drawn
after it. Then the dashboard's container is narrowed to JupyterLab-like widths (800, 900,
1400 px): the figure must follow it, no two of its subplot titles, colour bars, legend, axis
titles and plot areas may overlap or leave the figure, no control, strip, figure or frame may
stick out of the dashboard, and the attention pattern must fit its frame (no row hidden below a
scroll bar). Screenshots go to artifacts/ (dashboard.png: the app page at 900 px).

The app page shows the dashboard and its one-line explanation, not the exercises (cells tagged
``lesson`` are left out) and no stray output. In JupyterLab, Run All must leave the dashboard
live: a notebook whose last cell closes it fails here.

Compare mode (app page, workshop model): the checkbox puts a second prompt beside the first;
B's token strip and the compare figure (A | B heatmaps, A − B on shared tokens) must hold B's
exact tokens, and fit 800–1400 px like the main figure (artifacts/dashboard_compare.png at
900 px). The saved view: the "view → HTML" button offers the file as a browser download;
opened from disk (file://) in Chromium with every network request refused, it must show the
same tokens (DOM text of both strips) and the same norms (plotly data of both figures) as the
live page.
"""
from __future__ import annotations

import os
import signal
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
NOTEBOOK = ROOT / "notebooks" / "05_live_dashboard.ipynb"
ARTIFACTS = ROOT / "artifacts"
WIDTHS = (800, 900, 1400)  # JupyterLab's output area is about 900 px wide
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
WORKSHOP_MODEL = "smollm2-135m"  # notebook 05's own model, as in the other notebooks and the answer sheet
MODELS = {"default": icl_lens.DEFAULT_MODEL, "workshop": None}  # None: the notebook's own, WORKSHOP_MODEL
PROMPT = "one two three, one two three, one two"
PROMPT_B = "one two four, one two three, one"
FINAL_STATE_S = 120  # after the last keystroke, the final strip and heatmap must be drawn within this

STRIP_STATE = "() => Array.from(document.querySelectorAll('.icl-strip-a .icl-token')).map(e => e.textContent)"
HEATMAP_STATE = """() => {
  const g = Array.from(document.querySelectorAll('.js-plotly-plot'))
    .find(d => d.layout && d.layout.meta === 'icl_lens:figures');
  if (!g || !g.data || !g.data[0]) return null;
  const t = g.data[0], z = t.z || [];
  // plotly may drop an x equal to its default (0, 1, …): what is drawn then has one column per z entry
  const n = t.x ? t.x.length : (z[0] || []).length;
  const ax = g.layout.xaxis || {};
  return {n, rows: z.length, last: ax.ticktext ? ax.ticktext[ax.ticktext.length - 1] : null};
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
  // _fullData: the saved page's arrays arrive base64-encoded ({dtype, bdata}); plotly.js decodes them there.
  // The x drawn: the trace's own, or plotly's default x0 + i·dx (plotly drops an x equal to that default)
  const drawn = t => t.x ? Array.from(t.x, Number)
    : Array.from({length: ((t.z || [])[0] || []).length}, (_, i) => (t.x0 || 0) + i * (t.dx || 1));
  return g._fullData.filter(t => t.type === 'heatmap').map(t => ({z: plain(t.z), x: drawn(t)}));
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


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listened on port {port} within {timeout} s:\n{log.read_text()[-3000:]}")


def _served(target: str, model: str | None, tmp_path: Path, **make_vars: str):
    """``make <target>`` from the checkout (this interpreter's venv), as a user runs it; yields the port."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium chromium-driver)")
    port = _free_port()
    # JupyterLab: a fresh workspace, and autosave off so Run All never writes outputs into the shipped notebook
    settings = tmp_path / "lab-settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    env = dict(os.environ, HF_HUB_OFFLINE="1", JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("ICL_LENS_SOLUTIONS", None)  # as a participant opens it
    env.pop("ICL_LENS_WORKSHOP_MODEL", None)
    if model is not None:
        env["ICL_LENS_WORKSHOP_MODEL"] = model
    log_path = tmp_path / f"{target}.log"
    args = ["make", "--no-print-directory", target, f"VENV={sys.prefix}"]
    args += [f"{k}={v}" for k, v in make_vars.items()]
    with open(log_path, "w") as log:
        proc = subprocess.Popen([a.replace("{port}", str(port)) for a in args], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, proc, log_path, timeout=180)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make, the server and its kernels
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(params=list(MODELS), ids=lambda k: f"{k}-model")
def model_name(request) -> str | None:
    return MODELS[request.param]


@pytest.fixture
def app_url(model_name, tmp_path):
    """``make app``: Voila serves notebook 05 as the dashboard page."""
    for port in _served("app", model_name, tmp_path, APP_PORT="{port}"):
        yield f"http://127.0.0.1:{port}/"


@pytest.fixture
def lab_url(model_name, tmp_path):
    """``make lab``: JupyterLab on notebook 05 (it serves the notebook's folder). The shipped pair is unchanged
    afterwards: the test never saves it."""
    token = "icl-lens-browser-test"
    flags = f"--no-browser --port={{port}} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token}"
    pair = {p: p.read_bytes() for p in (NOTEBOOK, NOTEBOOK.with_suffix(".py"))}
    for port in _served("lab", model_name, tmp_path, LAB_FLAGS=flags):
        yield f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK.name}?token={token}"
    assert all(p.read_bytes() == b for p, b in pair.items()), "JupyterLab wrote into the shipped notebook"


def _expected(load, model_name: str | None) -> tuple[object, int, str]:
    model = load(model_name or WORKSHOP_MODEL)
    tokens = icl_lens.token_patches(model, PROMPT).tokens
    return model, len(tokens), short_label(tokens[-1])


def type_and_reach_final_state(page, model, n: int, last: str, shots: str) -> None:
    """Type the prompt, wait for the final strip and heatmap, check nothing older follows, check the layout at
    800–1400 px (screenshots ``artifacts/<shots>[_<width>].png``) and that a click selects the query."""
    # the figure grid has been drawn once before typing starts (its own layout, not plotly's empty placeholder)
    page.wait_for_function("() => Array.from(document.querySelectorAll('.icl-dashboard .js-plotly-plot'))"
                           ".some(g => g.layout && g.layout.meta === 'icl_lens:figures' && g.querySelector('.main-svg'))",
                           timeout=120_000)
    page.locator(".icl-dashboard textarea").first.click()
    page.keyboard.type(PROMPT, delay=15)
    try:  # the FINAL state: exact count and last label in strip and heatmap
        page.wait_for_function(
            f"""() => {{
              const s = ({STRIP_STATE})(), h = ({HEATMAP_STATE})();
              return s.length === {n} && s[s.length - 1] === {last!r} && h && h.n === {n}
                     && h.last === {last!r};
            }}""", timeout=FINAL_STATE_S * 1000)
    except Exception as exc:  # say what the page shows instead
        raise AssertionError(f"final state not reached: strip {page.evaluate(STRIP_STATE)}, heatmap "
                             f"{page.evaluate(HEATMAP_STATE)}, status {page.inner_text('.icl-status')!r}, "
                             f"text {page.input_value('.icl-dashboard textarea')!r}") from exc
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
        page.locator(".icl-dashboard").screenshot(path=str(ARTIFACTS / f"{shots}_{width}.png"))
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


def _browser(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def test_make_app_serves_a_live_dashboard(app_url, model_name, load):
    """``make app``: the page is the dashboard with its one-line explanation, and it answers typing."""
    from playwright.sync_api import sync_playwright

    model, n, last = _expected(load, model_name)
    kind = "default" if model_name else "workshop"
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 4400})  # the whole dashboard in view
            page.goto(app_url, timeout=240_000)
            page.wait_for_function("() => document.querySelector('.icl-dashboard textarea')"
                                   " || document.body.innerText.includes('Error displaying widget')", timeout=240_000)
            body = page.inner_text("body")
            assert "Error displaying widget" not in body, f"the dashboard is dead: {body[-500:]}"
            assert "icl_lens.dashboard(" not in body, "app mode must not show code"
            assert "Type a prompt" in body, "the page lost its one-line explanation"
            for lesson in ("Learning objective", "Exercise 1", "no answer yet", "Paper says"):
                assert lesson not in body, f"the app page shows the lesson ({lesson!r})"
            # no stray output: every rendered output is the dashboard (one output area, holding it)
            outputs = page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
                                    ".map(e => e.querySelector('.icl-dashboard') ? 'dashboard' : e.innerText)")
            assert outputs == ["dashboard"], f"outputs besides the dashboard: {outputs}"
            type_and_reach_final_state(page, model, n, last, shots=f"app_{kind}")
            if kind == "workshop":
                page.evaluate(SET_WIDTH, 900)
                page.locator(".icl-dashboard").screenshot(path=str(ARTIFACTS / "dashboard.png"))
                compare_mode(page, model)
                saved_view_matches(browser, page)
        finally:
            browser.close()


def test_make_lab_run_all_leaves_a_live_dashboard(lab_url, model_name, load):
    """``make lab``, Run → Run All Cells: once every cell has run, the dashboard still answers typing."""
    from playwright.sync_api import sync_playwright

    model, n, last = _expected(load, model_name)
    kind = "default" if model_name else "workshop"
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 4400})
            page.goto(lab_url, timeout=240_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=240_000)
            page.wait_for_function("() => /Idle/.test(document.getElementById('jp-main-statusbar')?.innerText || '')",
                                   timeout=240_000)  # the kernel has started
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            page.wait_for_selector(".icl-dashboard textarea", timeout=240_000)
            # Run All is over when every code cell has its execution count ([n]:, not [*]: or [ ]:)
            page.wait_for_function(
                r"""() => { const p = Array.from(document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell'
                                                                            + ' .jp-InputArea-prompt'));
                           return p.length > 0 && p.every(e => /\[\d+\]/.test(e.textContent)); }""",
                timeout=600_000)
            errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
            assert not tracebacks, tracebacks
            type_and_reach_final_state(page, model, n, last, shots=f"lab_{kind}")
        finally:
            browser.close()


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


def saved_view_matches(browser, page) -> None:
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
    ARTIFACTS.mkdir(exist_ok=True)
    saved = ARTIFACTS / "saved_view.html"
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
        for i, (mine, theirs) in enumerate(zip(got_data, data)):
            assert mine["x"] == theirs["x"], f"{meta} heatmap {i}: saved x {mine['x']}, live x {theirs['x']}"
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
