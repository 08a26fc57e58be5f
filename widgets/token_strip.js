// Token strip for the icl_lens dashboard (anywidget ESM).
// Synced traits: tokens [str], values [float], flags [bool], selected (int, -1 = none),
// vmax (float), notice (str). One <span class="icl-token"> per POSITION (tokens repeat),
// coloured by its patch norm; spike-flagged tokens get the "icl-flagged" class; a click
// sets `selected` to that position (the query of the trajectory panel).
//
// The strip also keeps the dashboard's plotly figure as wide as the dashboard (see
// fitFigures): plotly sizes a figure without a layout width once, when it is drawn.

function colour(value, vmax) {
  const x = vmax > 0 ? Math.max(0, Math.min(1, value / vmax)) : 0;
  // white -> deep orange, readable text either way
  const r = 255, g = Math.round(255 - 150 * x), b = Math.round(255 - 220 * x);
  return `rgb(${r},${g},${b})`;
}

function label(token) {
  return token.replace(/\n/g, "⏎").replace(/\t/g, "⇥") || "∅";
}

// The strip spans the dashboard's width. Whenever that width changes (the output area is
// laid out, a JupyterLab side panel opens, the window resizes), or a plotly figure inside the
// dashboard has just been drawn (plotly 7's widget draws it once, often before it has its
// final width), send a window "resize": figures with config.responsive re-fit on it.
function fitFigures(el) {
  let width = -1, timer = null;
  const refit = () => {
    clearTimeout(timer);
    timer = setTimeout(() => window.dispatchEvent(new Event("resize")), 50);
  };
  const observer = new ResizeObserver(() => {
    if (el.clientWidth > 0 && el.clientWidth !== width) {
      width = el.clientWidth;
      refit();
    }
  });
  observer.observe(el);
  const drawn = (event) => {
    const dashboard = el.closest(".icl-dashboard");
    if (dashboard && dashboard.contains(event.detail.element)) refit();
  };
  document.addEventListener("plotlywidget-after-render", drawn);
  return () => {
    observer.disconnect();
    document.removeEventListener("plotlywidget-after-render", drawn);
    clearTimeout(timer);
  };
}

function render({ model, el }) {
  const root = document.createElement("div");
  root.className = "icl-token-strip";
  el.appendChild(root);

  function draw() {
    const tokens = model.get("tokens") || [];
    const values = model.get("values") || [];
    const flags = model.get("flags") || [];
    const selected = model.get("selected");
    const vmax = model.get("vmax");
    root.replaceChildren();
    root.dataset.count = String(tokens.length);
    if (tokens.length === 0) {
      const empty = document.createElement("span");
      empty.className = "icl-token-empty";
      empty.textContent = model.get("empty_text") || "Type a prompt to see its token patches.";
      root.appendChild(empty);
      return;
    }
    tokens.forEach((tok, pos) => {
      const span = document.createElement("span");
      span.className = "icl-token";
      if (flags[pos]) span.classList.add("icl-flagged");
      if (pos === selected) span.classList.add("icl-selected");
      span.dataset.position = String(pos);
      span.textContent = label(tok);
      span.style.background = colour(values[pos] || 0, vmax);
      const v = values[pos] === undefined ? "" : Number(values[pos]).toPrecision(3);
      span.title = `position ${pos} · ${JSON.stringify(tok)} · mean patch norm over layers ${v}` + (flags[pos] ? " · spike" : "");
      span.addEventListener("click", () => {
        model.set("selected", pos);
        model.save_changes();
      });
      root.appendChild(span);
    });
  }

  draw();
  const stopFitting = fitFigures(el);
  for (const name of ["tokens", "values", "flags", "selected", "vmax", "empty_text"]) {
    model.on(`change:${name}`, draw);
  }
  return () => {
    stopFitting();
    for (const name of ["tokens", "values", "flags", "selected", "vmax", "empty_text"]) {
      model.off(`change:${name}`, draw);
    }
  };
}

export default { render };
