"""The live dashboard: token patches, spike flags and implicit dynamics while typing.

``icl_lens.dashboard()`` shows, for the prompt in its text area (docs/design.md §2–§3;
Dherin et al. 2025, arXiv 2507.16003): a token strip coloured by patch norm
``‖ΔW‖_F = ‖u‖·‖v‖`` with spike-flagged tokens marked (click = choose the query), a
layer × token heatmap of patch (or skip-correction) norms, the meta-gradient norms of
the chosen query vs context length with the fitted decay exponent and consecutive-step
alignment, the token × token patch alignment of one layer, one head's attention, and the
top-k next tokens at the query with and without its context (``ui/_predictions.py``). The
heatmaps show a layer range, on one colour scale or one per layer (``ui/_layer_view.py``).
Compare mode puts a second prompt beside the first, with the difference of their norms on
shared tokens (``ui/_compare.py``). "Who wrote the patch" (``ui/_attribution_view.py``, docs/design.md
§7) splits the selected query's patch at the chosen layer exactly over heads × context tokens, with
a layer × head summary and what the patch writes through the unembedding. ``save_html`` writes one
self-contained HTML file of the view (``ui/_html_export.py``); every export is also offered as a
browser download.

Typing is debounced; each keystroke bumps a generation counter and only the newest
request is computed and drawn (``LatestWins``). Drawing is in phases: the strip, heatmap
and alignment matrix (from the patches alone) first, then the attention pattern (new rows
only, from the PatchSession's cached keys), who wrote the query's patch (when
that panel is on: the query token alone over the PatchSession's keys and values), then the trajectory
of the selected query with the top-k predictions: first at a few log-spaced prefix lengths (``W_i``
exactly as the full trajectory has them, with the two before each, so the meta-gradient norms and step
alignments drawn are exact; its step-0 copy is the predictions' kept-only forward, and its row goes
through the unembedding together with the PatchSession pass's own last row, the contextual logits),
then refined to every prefix length (only the lengths the coarse drawing lacks, joined to
it; only the layers shown, the prompt prefix's keys and values taken from the PatchSession), and last
the check under the predictions (the kept-only forward with every patch, which gives the contextual
logits; "checking…" until then). A later phase is skipped, and a running forward abandoned at the
next block, as soon as a newer keystroke waits.

App mode (Voila, ``make app``; :mod:`icl_lens.ui._app_mode`): the model box loads the embedded
names only unless the operator allows more (``allow_models=`` or ``ICL_LENS_APP_MODELS``),
messages name no server path, and exports go to a private folder per dashboard.
"""
from __future__ import annotations

import html
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import ipywidgets as W

from icl_lens.dynamics._trajectory import Trajectory
from icl_lens.model._loading import DEFAULT_MODEL, load_model
from icl_lens.model._prompts import PromptError
from icl_lens.ui._analysis import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_MAX_TOKENS,
    PromptAnalyzer,
    Superseded,
    alignment_matrix,
    default_threshold,
    spike_flags,
    threshold_note,
    timed,
)
from icl_lens.ui._app_mode import in_app_mode, model_policy, private_export_dir, redact_paths
from icl_lens.ui._attribution_view import AttributionView
from icl_lens.ui._compare import QUANTITIES, CompareView
from icl_lens.ui._export import export_attention, export_csv, export_html, export_png, export_svg
from icl_lens.ui._html_export import download_links, static_strip, view_page
from icl_lens.ui._latest_wins import LatestWins
from icl_lens.ui._layer_view import LayerControls, show_layer_range
from icl_lens.ui._panels import (
    AlignmentPanel,
    AttentionPanel,
    FigureGrid,
    HeatmapPanel,
    StripPanel,
    TrajectoryPanel,
    attention_frame,
    attention_page,
    token_label,
)
from icl_lens.ui._predictions import NextTokenPredictions, PredictionsPanel, predictions_html


@dataclass(frozen=True)
class ViewRequest:
    """Everything one redraw depends on (a snapshot of the controls)."""

    text: str
    model_name: str
    query: int | None  # None: follow the last token
    layer: int
    head: int
    threshold: float
    order: str = "prefix"  # trajectory order: "prefix" or "absorb" (docs/design.md §3)
    compare_text: str | None = None  # compare mode's prompt B (None: compare mode off)
    top_k: int = 8  # next-token predictions shown at the query
    layers: tuple[int, ...] | None = None  # layers the trajectory panel shows (None: all)
    attribution: bool = False  # the "who wrote the patch" panel is on


@dataclass
class Shown:
    """What the figures currently show (the last drawn generation)."""

    generation: int = 0
    text: str | None = None
    model_name: str | None = None
    patches: object = None
    spikes: object = None
    query: int | None = None
    layer: int = 0
    head: int = 0
    alignment: object = None
    trajectory: object = None
    attention: object = None
    notice: str = ""
    patches_b: object = None  # compare mode: prompt B's token patches
    comparison: object = None  # compare mode: icl_lens.ui._compare.PromptComparison
    predictions: object = None  # icl_lens.ui._predictions.NextTokenPredictions at the query
    attribution: object = None  # icl_lens.PatchAttribution of the query (the panel on)
    writes: object = None  # icl_lens.PatchWrites of the query at the shown layer
    texts_drawn: list = field(default_factory=list)  # (generation, text) in drawing order


def load_quietly(name: str):
    """``load_model`` without the weight-loading progress bar (it would land in the app page)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        return load_model(name)
    finally:
        hf_logging.enable_progress_bar()


def _row(*children) -> W.HBox:
    """A row of controls that wraps onto more lines when the output area is narrow."""
    return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap", align_items="center"))


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.0f} ms"


class Dashboard:
    """The dashboard object; display it in a notebook (it renders as its widget).

    ``cache_bytes``: cap of the analysis cache in bytes of tensor memory (default 512 MiB,
    :data:`~icl_lens.ui._analysis.DEFAULT_CACHE_BYTES`). ``app``: app mode (default: on in a
    Voila kernel, see :mod:`icl_lens.ui._app_mode`). ``allow_models``: which names the model box
    may load (True: any name, folder or hub id; False: the embedded names; a list: the
    embedded names and these; None: ``ICL_LENS_APP_MODELS`` if set, else embedded names only in
    app mode and any name otherwise). ``export_dir``: where exports go (default: a private
    folder per dashboard in app mode, ``./icl_lens_exports`` otherwise).
    """

    def __init__(self, model=None, *, prompt: str = "", debounce_s: float = 0.15,
                 max_tokens: int | None = DEFAULT_MAX_TOKENS, export_dir: str | Path | None = None,
                 compare: str | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES, app: bool | None = None,
                 allow_models: bool | str | list[str] | None = None):
        self.app = in_app_mode(app)
        self.models = model_policy(allow_models, self.app)
        if model is None or isinstance(model, str):
            model = load_quietly(model or DEFAULT_MODEL)
        self.max_tokens, self.cache_bytes = max_tokens, cache_bytes
        if export_dir is None:
            export_dir = private_export_dir() if self.app else "icl_lens_exports"
        self.export_dir = Path(export_dir)
        self.analyzer = PromptAnalyzer(model, max_tokens, cache_bytes)
        self.shown = Shown(model_name=self.analyzer.name)
        self.timeline: dict[int, dict[str, float]] = {}
        self.last_error: str = ""
        self._query: int | None = None

        a = self.analyzer
        self.text = W.Textarea(value="", placeholder="Type or paste a prompt…", continuous_update=True,
                               layout=W.Layout(width="100%", height="90px"))
        self.text.add_class("icl-prompt")
        self.model_box = W.Combobox(value=a.name, options=list(self.models.names), ensure_option=False,
                                    continuous_update=False, description="model",
                                    placeholder="embedded name or HF id")
        self.layer = W.IntSlider(value=0, min=0, max=a.n_layers - 1, description="layer", continuous_update=False)
        self.head = W.IntSlider(value=0, min=0, max=a.n_heads - 1, description="head", continuous_update=False)
        # Starts at the model's calibrated threshold (icl_lens.spike_threshold), 3.5 for uncalibrated models.
        self.threshold = W.FloatSlider(value=default_threshold(a.name), min=0.0, max=8.0, step=0.05,
                                       description="flag at z >", continuous_update=False)
        self.threshold_note = W.HTML(value=f"<small>{html.escape(threshold_note(a.name))}</small>")
        self.follow_last = W.Checkbox(value=True, description="query = last token", indent=False,
                                      layout=W.Layout(width="auto"))
        self.status = W.HTML(value="<i>Type a prompt.</i>")
        self.status.add_class("icl-status")
        self.notice = W.HTML(value="")
        self.notice.add_class("icl-notice")
        self.strip = StripPanel()
        self.grid = FigureGrid(a.n_layers)
        self.heatmap = HeatmapPanel(self.grid)
        self.trajectory_panel = TrajectoryPanel(self.grid)
        self.alignment = AlignmentPanel(self.grid)
        self.attention = AttentionPanel()
        self.layer_controls = LayerControls(a.n_layers)
        self.compare = CompareView()
        self.predictions = PredictionsPanel()
        self.attribution_view = AttributionView()
        self.downloads = W.HTML(value="")
        self.downloads.add_class("icl-downloads")
        self.export_buttons = [W.Button(description=d, icon=i, layout=W.Layout(width="auto")) for d, i in
                               (("view → HTML", "file-code-o"), ("figures → PNG", "file-image-o"),
                                ("figures → SVG", "file-image-o"), ("attention → HTML", "eye"),
                                ("numbers → CSV", "table"))]
        exports = (self.save_html, self.export_png, self.export_svg, self.export_attention, self.export_csv)
        for button, fn in zip(self.export_buttons, exports):
            button.on_click(lambda _b, fn=fn: self._export(fn))
        self.strip.widget.layout = W.Layout(width="100%")
        self.strip.widget.add_class("icl-strip-a")

        self.widget = W.VBox([
            _row(self.model_box, self.threshold, self.compare.enabled, self.threshold_note),
            W.HBox([self.text, self.compare.text], layout=W.Layout(width="100%")),  # A | B in compare mode
            self.notice,
            self.status,
            W.HBox([self.strip.widget, self.compare.strip], layout=W.Layout(width="100%")),
            self.predictions.widget,
            _row(self.heatmap.widget, self.layer_controls.range, self.layer_controls.scale),
            _row(self.trajectory_panel.widget, self.follow_last, self.predictions.k),
            _row(self.layer, self.head, W.HTML("&nbsp;(layer: alignment matrix, attention, who wrote the patch)"),
                 self.attribution_view.enabled),
            self.grid.fig,
            self.attribution_view.box,
            self.compare.box,
            self.attention.widget,
            _row(*self.export_buttons),
            self.downloads,
        ], layout=W.Layout(width="100%"))
        self.widget.add_class("icl-dashboard")

        self.runner = LatestWins(self._work, self._on_error, debounce_s=debounce_s)
        self.text.observe(lambda _c: self._changed(debounce=True), names="value")
        for control in (self.model_box, self.layer, self.head, self.threshold, self.trajectory_panel.order,
                        self.predictions.k):
            control.observe(lambda _c: self._changed(debounce=False), names="value")
        self.compare.text.observe(lambda _c: self._changed(debounce=True), names="value")
        self.compare.enabled.observe(self._compare_toggled, names="value")
        self.attribution_view.enabled.observe(self._attribution_toggled, names="value")
        self.attribution_view.part.observe(lambda _c: self._redraw_attribution(), names="value")
        self.heatmap.kind.observe(lambda _c: self._redraw_heatmap(), names="value")
        self.layer_controls.observe(self._redraw_heatmap)
        # the trajectory is computed for the layers shown only: a new range asks for it again
        self.layer_controls.range.observe(lambda _c: self._changed(debounce=True), names="value")
        self.trajectory_panel.loglog.observe(lambda _c: self.trajectory_panel.apply_scale(), names="value")
        self.strip.widget.observe(self._clicked, names="selected")
        self.follow_last.observe(self._follow, names="value")
        if compare is not None:
            self.compare.text.value = compare
            self.compare.enabled.value = True
        if prompt:
            self.text.value = prompt

    # ----------------------------------------------------------------- display
    def _repr_mimebundle_(self, **kwargs):
        if self.text.value:  # figures updated before any view existed: draw again once shown
            self.runner.submit(self._request(), debounce=True)
        return self.widget._repr_mimebundle_(**kwargs)

    @property
    def model(self):
        """The model currently analysed (a TransformerBridge)."""
        return self.analyzer.model

    # ------------------------------------------------------------------ public
    def set_prompt(self, text: str) -> int:
        """Set the text area (as typing would); returns the request's generation."""
        self.text.value = text
        return self.runner.generation

    def wait(self, timeout: float = 120.0) -> bool:
        """Block until every queued update is computed and drawn (scripts, tests, benchmarks)."""
        return self.runner.wait_idle(timeout)

    def close(self) -> None:
        self.runner.close()
        self.widget.close()

    # ---------------------------------------------------------------- requests
    def _in_worker(self) -> bool:
        return threading.current_thread() is self.runner._thread

    def _request(self) -> ViewRequest:
        return ViewRequest(text=self.text.value, model_name=(self.model_box.value or "").strip(), query=self._query,
                           layer=int(self.layer.value), head=int(self.head.value),
                           threshold=float(self.threshold.value), order=self.trajectory_panel.order.value,
                           compare_text=self.compare.text.value if self.compare.on else None,
                           top_k=int(self.predictions.k.value), layers=self.visible_layers(),
                           attribution=self.attribution_view.on)

    def _compare_toggled(self, change) -> None:
        self.compare.layout_for(bool(change["new"]), self.text, self.strip.widget)
        self._changed(debounce=False)

    def _attribution_toggled(self, change) -> None:
        self.attribution_view.layout_for(bool(change["new"]))
        self._changed(debounce=False)

    def _redraw_attribution(self) -> None:
        """The patch/correction toggle changed: redraw from what is shown, between the worker's draws."""
        def redraw():
            s = self.shown
            if s.attribution is not None:
                self.attribution_view.show(s.attribution, s.writes, s.layer)
        self.runner.redraw(redraw)

    def visible_layers(self) -> tuple[int, ...] | None:
        """The layers the trajectory panel shows (None: all); only these are computed."""
        shown = tuple(self.layer_controls.view(self.analyzer.n_layers).layers)
        return None if shown == tuple(range(self.analyzer.n_layers)) else shown

    def _changed(self, debounce: bool) -> None:
        if self._in_worker():  # the dashboard itself moved a control while drawing
            return
        submitted = time.perf_counter()
        generation = self.runner.submit(self._request(), debounce=debounce)
        self.timeline[generation] = {"submitted": submitted}

    def _clicked(self, change) -> None:
        if self._in_worker() or change["new"] is None or change["new"] < 0:
            return
        self._query = int(change["new"])
        self.follow_last.value = False  # observer: the query is pinned now, no second request
        self._changed(debounce=False)

    def _follow(self, change) -> None:
        if self._in_worker():
            return
        if change["new"]:
            self._query = None
            self._changed(debounce=False)

    # ------------------------------------------------------------------ worker
    def _say(self, generation: int, text: str, error: bool = False) -> None:
        colour = "#b00020" if error else "#333"
        self.runner.draw(generation, lambda: setattr(
            self.status, "value", f"<span style='color:{colour}'>{text}</span>"))

    def _shown(self, text: str) -> str:
        """A message as the page may show it: no server paths in app mode, HTML-escaped."""
        return html.escape(redact_paths(text) if self.app else text)

    def _switch_model(self, request: ViewRequest, generation: int) -> tuple[ViewRequest, str]:
        """Load the requested model; on failure (or a name the policy refuses) keep the previous one and say why."""
        name = request.model_name
        try:
            if not self.models.allows(name):
                raise PermissionError(self.models.refusal(name))
            model, seconds = timed(load_quietly, name)
        except Exception as exc:  # noqa: BLE001 - any load failure is shown, the old model stays
            previous = self.analyzer.name
            lines = str(exc).splitlines() or [type(exc).__name__]
            message = (f"Could not load model {self._shown(repr(name))}: {self._shown(lines[0])} "
                       f"Keeping {html.escape(previous)}.")

            def revert():
                self.model_box.value = previous
            self.runner.draw(generation, revert)
            return replace(request, model_name=previous), message
        previous_default = default_threshold(self.analyzer.name)
        self.analyzer = PromptAnalyzer(model, self.max_tokens, self.cache_bytes)
        a = self.analyzer
        if abs(request.threshold - previous_default) < 1e-9:  # still at the old model's default: take the new one's
            request = replace(request, threshold=default_threshold(a.name))

        def resize():
            self.layer.max, self.head.max = a.n_layers - 1, a.n_heads - 1
            self.threshold.value = request.threshold
            self.threshold_note.value = f"<small>{html.escape(threshold_note(a.name))}</small>"
            self.layer_controls.resize(a.n_layers)
        self.runner.draw(generation, resize)
        return request, f"loaded {html.escape(name)} ({_ms(seconds)})"

    def _work(self, request: ViewRequest, generation: int) -> None:
        start = time.perf_counter()
        parts: list[str] = []
        error = ""
        if request.model_name and request.model_name != self.analyzer.name:
            request, message = self._switch_model(request, generation)
            if message.startswith("loaded"):
                parts.append(message)
            else:
                error = message
        a = self.analyzer
        try:
            prompt = a.encode(request.text)
        except PromptError as exc:
            self._draw_empty(generation, str(exc), error)
            return
        (patches, fresh), seconds = timed(a.patches, prompt)
        parts.append(f"patches: {a.last_patch_stats} ({_ms(seconds)})" if fresh else "patches: cached")
        spikes, seconds = timed(spike_flags, patches, request.threshold)
        parts.append(f"spike flags ({_ms(seconds)})")
        n = patches.n_positions
        query = request.query if request.query is not None and request.query < n else n - 1
        if request.query is not None and request.query >= n:  # the pinned query was deleted
            self.runner.draw(generation, lambda: self._unpin())
        layer = min(request.layer, a.n_layers - 1)
        matrix = alignment_matrix(patches, layer)
        notice = prompt.notice(a.name, a.n_ctx)
        patches_b = None
        if request.compare_text is not None:
            try:
                prompt_b = a.encode(request.compare_text)
            except PromptError:
                prompt_b = None
            if prompt_b is not None:
                (patches_b, fresh), seconds = timed(self.compare.patches, a.model, prompt_b)
                parts.append(f"prompt B patches ({_ms(seconds)})" if fresh else "prompt B: cached")

        def phase1():
            view = self.layer_controls.view(a.n_layers)
            self.strip.show(patches, spikes, query, view)
            self.heatmap.show(patches, view)
            self.alignment.show(patches, matrix, layer)
            self.shown.patches_b = patches_b
            self._show_compare(patches, view)
            self.notice.value = (f"<div style='background:#fff3cd;padding:4px'>{html.escape(notice)}</div>"
                                 if notice else "")
            s = self.shown
            s.generation, s.text, s.model_name, s.patches, s.spikes = generation, request.text, a.name, patches, spikes
            s.query, s.layer, s.alignment, s.notice = query, layer, matrix, notice
            s.texts_drawn.append((generation, request.text))
            self._set_status(parts, start, error, pending=True)

        if not self.runner.draw(generation, phase1):
            return
        self.timeline.setdefault(generation, {})["phase1"] = time.perf_counter()
        stale = lambda: self.runner.newer_pending(generation)  # noqa: E731
        if stale():
            return
        head = min(request.head, a.n_heads - 1)
        try:
            (pattern, fresh), seconds = timed(a.attention, prompt, layer, stale=stale)
        except Superseded:
            return
        parts.append(f"attention L{layer}" + (f" ({_ms(seconds)})" if fresh else " (cached)"))

        def attention():
            self.attention.show(patches.tokens, pattern, layer, head)
            self.shown.attention, self.shown.head = pattern, head

        if not self.runner.draw(generation, attention) or stale():
            return
        self.timeline[generation]["attention"] = time.perf_counter()

        def predictions_drawn(pred, status: bool = False):
            self.predictions.show(pred, prompt="A" if request.compare_text is not None else "")
            self.shown.predictions = pred
            if status:
                self._set_status(parts, start, error, pending=False)

        def with_predictions(traj: Trajectory | str | None) -> NextTokenPredictions | None:
            """The predictions, drawn; their kept-only logits from ``traj``'s step-0 copy when it kept them, and
            the contextual ones through the unembedding together with them (one read of its weights)."""
            def logits():
                hidden = traj.kept_only_hidden if isinstance(traj, Trajectory) else None
                if hidden is None:
                    return a.session.logits_at(prompt.ids, query), None
                contextual, unpatched = a.session.logits_with(prompt.ids, query, hidden[None])
                return contextual, unpatched[0]

            (pred, fresh), seconds = timed(self.predictions.compute, a.model, prompt.ids, patches, query,
                                           request.top_k, logits)
            parts.append(f"top-{request.top_k} next tokens" + (f" ({_ms(seconds)})" if fresh else " (cached)"))
            if not self.runner.draw(generation, lambda: predictions_drawn(pred)) or stale():
                return None
            self.timeline[generation]["predictions"] = time.perf_counter()
            return pred

        # The predictions come with the trajectory's first drawing, whose step-0 copy is their kept-only forward,
        # unless they are cached (then drawn now).
        predictions = None
        if self.predictions.cached(a.model, prompt.ids, query, request.top_k) is not None:
            predictions = with_predictions(None)
            if predictions is None:
                return
        if request.attribution:
            try:
                (attribution, fresh), seconds = timed(a.attribution, prompt, query, stale)
            except Superseded:
                return
            writes, _ = a.writes(attribution, layer, request.top_k) if attribution.sources else (None, False)
            parts.append(f"who wrote the patch of {query}" + (f" ({_ms(seconds)})" if fresh else " (cached)"))

            def attribution_drawn():
                self.attribution_view.show(attribution, writes, layer)
                self.shown.attribution, self.shown.writes = attribution, writes

            if not self.runner.draw(generation, attribution_drawn) or stale():
                return
            self.timeline[generation]["attribution"] = time.perf_counter()
        elif self.shown.attribution is not None:
            self.runner.draw(generation, lambda: setattr(self.shown, "attribution", None))
        # First a coarse trajectory (a few log-spaced prefix lengths), then the full one, unless it is cached.
        coarse = a.coarse_steps(prompt, query)
        if coarse is not None and a.has_trajectory(prompt, query, request.order, request.layers):
            coarse = None
        for steps in ([coarse] if coarse is not None else []) + [None]:
            try:
                (trajectory, fresh), seconds = timed(a.trajectory, prompt, query, request.order, request.layers, stale,
                                                     steps, readout=predictions is None)
            except Superseded:
                return
            if predictions is None:
                predictions = with_predictions(trajectory)
                if predictions is None:
                    return
            what = f"trajectory of query {query}, {request.order} order"
            if isinstance(trajectory, str):  # no context before the query
                traj_note, trajectory = trajectory, None
                parts.append(f"no trajectory for query {query}")
            elif steps is not None:
                traj_note = (f"coarse: W_i at {len(steps)} of {trajectory.n_context + 1} prefix lengths "
                             f"(refining…)")
                parts.append(f"coarse {what}" + (f" ({_ms(seconds)})" if fresh else " (cached)"))
            else:
                traj_note = ""
                parts.append(what + (f" ({_ms(seconds)})" if fresh else " (cached)"))

            def phase2(trajectory=trajectory, traj_note=traj_note, final=steps is None):
                self.trajectory_panel.show(trajectory, query, patches.tokens, a.n_layers, traj_note)
                show_layer_range(self.trajectory_panel, self.layer_controls.view(a.n_layers))
                self.shown.trajectory = trajectory
                self._set_status(parts, start, error, pending=not final or predictions.patched_error is None,
                                 next_up="the full trajectory" if not final else "the patches' identity check")

            if not self.runner.draw(generation, phase2):
                return
            self.timeline[generation].setdefault("first_paint", time.perf_counter())  # every panel drawn
            if steps is None:
                self.timeline[generation]["phase2"] = time.perf_counter()
            elif stale():
                return
        # Last, the check under the predictions: the kept-only forward with every patch gives the contextual logits.
        if stale():
            return
        (checked, fresh), seconds = timed(self.predictions.check, a.model, prompt.ids, patches, predictions,
                                          request.top_k, lambda: a.session.logits_at(prompt.ids, query))
        if fresh:
            parts.append(f"identity check ({_ms(seconds)})")
            if self.runner.draw(generation, lambda: predictions_drawn(checked, status=True)):
                self.timeline[generation]["checked"] = time.perf_counter()

    def _unpin(self) -> None:
        self._query = None
        self.follow_last.value = True  # runs in the worker thread: no new request

    def _set_status(self, parts: list[str], start: float, error: str, pending: bool,
                    next_up: str = "attention and trajectory") -> None:
        total = time.perf_counter() - start
        tail = f" · {next_up} next…" if pending else ""
        text = "Recomputed " + " · ".join(parts) + f" — {_ms(total)}{tail}"
        if error:
            text = f"<span style='color:#b00020'>{error}</span><br>{text}"
        self.status.value = text

    def _draw_empty(self, generation: int, message: str, error: str) -> None:
        def empty():
            self.strip.show(None, None, None)
            self.heatmap.show(None)
            self.alignment.show(None, None, 0)
            self.trajectory_panel.show(None, None, (), self.analyzer.n_layers)
            self.attention.show((), None, 0, 0)
            self.predictions.show(None)
            self.attribution_view.show(None, None, 0)
            self.shown.patches_b = None
            self._show_compare(None, self.layer_controls.view(self.analyzer.n_layers))
            self.notice.value = ""
            s = self.shown
            s.generation, s.text, s.patches, s.spikes, s.trajectory, s.attention = generation, "", None, None, None, None
            s.model_name, s.query, s.alignment, s.notice = self.analyzer.name, None, None, ""
            s.predictions = s.attribution = s.writes = None
            s.texts_drawn.append((generation, ""))
            msg = f"<i>{html.escape(message)}</i>"
            self.status.value = f"<span style='color:#b00020'>{error}</span><br>{msg}" if error else msg

        if self.runner.draw(generation, empty):
            self.timeline.setdefault(generation, {})["phase1"] = time.perf_counter()

    def _on_error(self, exc: BaseException) -> None:
        self.last_error = "".join(traceback.format_exception(exc))
        generation = self.runner.generation
        self._say(generation, f"Error: {html.escape(type(exc).__name__)}: {self._shown(str(exc))}", error=True)

    def _redraw_heatmap(self) -> None:
        """The heatmap kind, the layer range or the colour scale changed: redraw from what is shown, between the
        worker's draws (a draw that read the old range cannot paint over this one, :meth:`LatestWins.redraw`)."""
        def redraw():
            s = self.shown
            view = self.layer_controls.view(self.analyzer.n_layers)
            if s.patches is not None:
                self.heatmap.show(s.patches, view)
                self.strip.show(s.patches, s.spikes, s.query, view)
            self._show_compare(s.patches, view)
            show_layer_range(self.trajectory_panel, view)
        self.runner.redraw(redraw)

    def _show_compare(self, patches, view) -> None:
        """Prompt B's strip and the compare figure (the strips share one colour scale in compare mode)."""
        quantity = QUANTITIES[self.heatmap.KINDS.index(self.heatmap.kind.value)]
        patches_b = self.shown.patches_b if self.compare.on else None
        self.shown.comparison = self.compare.show(patches, patches_b, quantity, view)
        if patches_b is not None and patches is not None:
            top = max(self.strip.widget.vmax, self.compare.strip.vmax)
            self.strip.widget.vmax = self.compare.strip.vmax = top

    # ------------------------------------------------------------------ export
    def figures(self) -> dict:
        """The dashboard's plotly figures by name (one grid of every plot; in compare mode the compare figure too)."""
        figures = {"dashboard_figures": self.grid.fig}
        if self.compare.on and self.compare.figure is not None:
            figures["compare_figures"] = self.compare.figure.fig
        if self.attribution_view.on and self.attribution_view.figure is not None:
            figures["attribution_figures"] = self.attribution_view.figure.fig
        return figures

    def save_html(self, path: str | Path | None = None) -> Path:
        """Write ONE self-contained HTML file of the current view (default: ``export_dir/dashboard_view.html``).

        The page opens in any browser with no kernel and no network: the plotly figures with
        plotly.js inlined, the token strip(s) and predictions as static HTML, the attention
        pattern with circuitsvis' offline bundle. Use it where widgets cannot run.
        """
        self.wait()
        s = self.shown
        if s.patches is None:
            raise RuntimeError("nothing to save yet: type a prompt first")
        path = Path(path) if path is not None else self.export_dir / "dashboard_view.html"
        strips = [self._static_strip(self.strip.widget, "icl-strip-a")]
        if self.compare.on and s.patches_b is not None:
            strips.append(self._static_strip(self.compare.strip, "icl-strip-b"))
        view = self.layer_controls.view(self.analyzer.n_layers)
        header = (f"model <b>{html.escape(s.model_name or '')}</b> · query {s.query} · layer {s.layer} · head {s.head}"
                  f" · flag at z &gt; {self.threshold.value:g} · heatmap {html.escape(self.heatmap.kind.value)}"
                  f" · layers {view.lo}–{view.hi}, {'per-layer' if view.per_layer else 'global'} colour scale"
                  f"<pre class='icl-saved-prompt' style='white-space:pre-wrap'>A: {html.escape(s.text or '')}</pre>")
        if self.compare.on:
            header += (f"<pre class='icl-saved-prompt-b' style='white-space:pre-wrap'>"
                       f"B: {html.escape(self.compare.text.value)}</pre>")
        sections = [f"<div class='icl-side'>{''.join(strips)}</div>",
                    predictions_html(s.predictions, prompt="A" if self.compare.on else "")]
        after = [] if s.attention is None else [
            attention_frame(attention_page(s.patches.tokens, s.attention, s.head), s.layer, s.head)]
        page = view_page(title=f"icl_lens dashboard — {s.model_name}", header=header, sections=sections,
                         figures=list(self.figures().values()), after=after)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
        return path

    @staticmethod
    def _static_strip(widget, css_class: str) -> str:
        return static_strip(widget.tokens, widget.values, widget.flags, widget.selected, widget.vmax, token_label,
                            css_class=css_class)

    def export_html(self) -> list[Path]:
        return export_html(self.figures(), self.export_dir)

    def export_png(self) -> list[Path]:
        return export_png(self.figures(), self.export_dir)

    def export_svg(self) -> list[Path]:
        return export_svg(self.figures(), self.export_dir)

    def export_attention(self) -> list[Path]:
        """The attention view (the shown layer and head) as a circuitsvis HTML page."""
        s = self.shown
        page = None if s.attention is None else attention_page(s.patches.tokens, s.attention, s.head)
        return export_attention(page, s.layer, s.head, self.export_dir)

    def export_csv(self) -> list[Path]:
        paths = export_csv(self.shown.patches, self.shown.spikes, self.shown.trajectory, self.export_dir)
        for name, result in (("predictions.csv", self.shown.predictions), ("compare.csv", self.shown.comparison),
                             ("attribution.csv", self.shown.attribution), ("writes.csv", self.shown.writes)):
            if result is not None:
                paths.append(self.export_dir / name)
                result.to_frame().to_csv(paths[-1], index=False)
        return paths

    def _export(self, fn) -> None:
        try:
            paths = fn()
        except Exception as exc:  # noqa: BLE001 - shown in the status line
            self.status.value = f"<span style='color:#b00020'>Export failed: {self._shown(str(exc))}</span>"
            return
        paths = paths if isinstance(paths, list) else [paths]
        # app mode: the file names only (the folder is the visitor's private one, a server path)
        self.status.value = "Saved " + ", ".join(html.escape(p.name if self.app else str(p)) for p in paths)
        self.downloads.value = download_links(paths)  # the browser saves them (no server route needed)


def dashboard(model=None, **kwargs) -> Dashboard:
    """The live dashboard (default model: the embedded Gemma 3 270M). See :class:`Dashboard`."""
    return Dashboard(model, **kwargs)
