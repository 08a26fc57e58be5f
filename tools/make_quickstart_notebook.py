"""Write notebooks/01_quickstart.ipynb (kept as code so the notebook stays reviewable)."""
from notebook_cells import code, md, solution, write

cells = [
    md("# 01 · Quickstart: a prompt as weight updates\n\n"
       "A transformer reading a prompt behaves *exactly* as if each MLP's first dense weights had received a "
       "rank-1 update per token, the **token patch** `ΔW = (W δ) aᵀ/‖a‖²` (Dherin et al. 2025, arXiv 2507.16003). "
       "In this notebook you load the embedded Gemma 3 270M (offline), compute the patches of every layer and "
       "token, and check the identity that makes them exact."),
    code("import icl_lens\n\nmodel = icl_lens.load_model(\"gemma-3-270m\")\n"
         "print(model.cfg.n_layers, \"layers,\", model.cfg.d_model, \"model dim,\", model.cfg.d_mlp, \"MLP dim\")"),
    md("## Token patches from one forward pass\n\n`token_patches` reads one contextual forward pass and returns the "
       "factors `u = W δ`, `v = a/‖a‖²` for every layer and position — never a dense matrix per token."),
    code("prompt = \"The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is\"\n"
         "patches = icl_lens.token_patches(model, prompt)\n"
         "frame = patches.to_frame()\nframe.head()"),
    md("## Where does context change the computation?\n\nRows are layers, columns are token positions "
       "(labelled with the token text; repeated tokens stay separate)."),
    code("import plotly.graph_objects as go\n\n"
         "labels = [f\"{i}:{t}\" for i, t in enumerate(patches.tokens)]\n"
         "fig = go.Figure(go.Heatmap(z=patches.norms().numpy(), x=labels, colorscale=\"Viridis\",\n"
         "                           colorbar={\"title\": \"‖ΔW‖_F\"}))\n"
         "fig.update_layout(xaxis_title=\"token\", yaxis_title=\"layer\", height=420)\nfig"),
    md("## The identity\n\nRun the model on the BOS and the query token only (query at its original position), with "
       "every layer's patch applied through hooks. Its logits must equal the contextual logits."),
    code("report = icl_lens.verify_equivalence(model, prompt, patches)\n"
         "print(f\"max |logit difference| {float(report.max_abs_err.max()):.2e}, \"\n"
         "      f\"relative {report.relative_error:.2e} (float32 target 1e-4)\")\nreport.to_frame().tail()"),
    md("## Exercises\n\n1. Which layer has the largest mean patch norm for this prompt? Is it the same for a prompt "
       "with no repeated structure?\n2. Use `remove=` to ablate only the first sentence "
       "(`token_patches(model, prompt, remove=range(1, k))`) and check the identity still holds."),
    solution("by_layer = frame.groupby(\"layer\").norm.mean()\nprint(\"largest mean patch norm at layer\", by_layer.idxmax())\n"
             "other = icl_lens.token_patches(model, \"Green ideas sleep furiously under a quiet bridge\").to_frame()\n"
             "print(\"other prompt:\", other.groupby(\"layer\").norm.mean().idxmax())"),
    solution("k = patches.tokens.index(\".\") + 1  # positions 1..k-1 hold the first sentence\n"
             "ablated = icl_lens.token_patches(model, prompt, remove=range(1, k))\n"
             "print(icl_lens.verify_equivalence(model, prompt, ablated).relative_error)"),
]
write(cells, "notebooks/01_quickstart.ipynb")
