"""Write notebooks/03_implicit_dynamics.ipynb (kept as code so the notebook stays reviewable)."""
from notebook_cells import code, md, solution, write

cells = [
    md("# 03 · Implicit dynamics: in-context learning as online gradient steps\n\n"
       "Reading the context one token at a time turns a query's token patch into a sequence of implicit weights "
       "`W₀, W₁, …, Wₙ`: `Wᵢ` makes the context-free input `[BOS, x_t]` reproduce the model's output with context "
       "`c₁..cᵢ`. The step `Wᵢ − Wᵢ₋₁` is the *meta-gradient* of token `cᵢ` (Dherin et al. 2025, arXiv 2507.16003, "
       "§3). icl_lens computes all n+1 steps for every layer of a real model in one batched forward, factored."),
    code("import icl_lens\nimport plotly.express as px\n\n"
         "model = icl_lens.load_model(\"gemma-3-270m\")\n"
         "prompt = \"France: Paris\\nJapan: Tokyo\\nItaly: Rome\\nSpain: Madrid\\nGermany:\"\n"
         "traj = icl_lens.trajectory(model, prompt)  # query = last token\n"
         "print(f\"query {traj.query} {traj.tokens[traj.query]!r}, n = {traj.n_context} context tokens, \"\n"
         "      f\"{len(traj.layers)} layers\")"),
    md("## Each step is exact\n\nFor a few prefix lengths i, run the model on `[BOS, c₁..cᵢ, x_t]` (query at its "
       "original position) and compare with `[BOS, x_t]` carrying `Wᵢ` in every layer."),
    code("n = traj.n_context\ncheck = icl_lens.verify_trajectory(model, prompt, traj, steps=[1, n // 2, n])\n"
         "check.to_frame()"),
    md("## Meta-gradient norm vs context length\n\n`‖Wᵢ − Wᵢ₋₁‖_F` in closed form from the factors. Hover to see "
       "which token each step consumed."),
    code("frame = traj.to_frame()\nsteps = frame[frame.metric == \"meta_gradient_norm\"]\n"
         "fig = px.line(steps, x=\"step\", y=\"value\", color=\"layer\", hover_data=[\"token\"], log_y=True,\n"
         "              labels={\"value\": \"‖Wᵢ − Wᵢ₋₁‖_F\", \"step\": \"context tokens consumed i\"})\nfig"),
    md("## Do the steps shrink? Decay exponents\n\nPer layer, a least-squares fit of `‖Wᵢ − Wᵢ₋₁‖ ≈ c·i^(−b)` in "
       "log-log space. `b > 0` means convergence; `r_squared` says how well a power law describes the steps."),
    code("fit = traj.decay_fit().to_frame()\n"
         "px.bar(fit, x=\"layer\", y=\"exponent\", hover_data=[\"r_squared\"], title=\"fitted decay exponent b\")"),
    md("## Alignment along the trajectory\n\nCosine of each meta-gradient with the total update `Wₙ − W₀`."),
    code("align = frame[frame.metric == \"total_alignment\"].pivot(index=\"layer\", columns=\"step\", values=\"value\")\n"
         "px.imshow(align, color_continuous_scale=\"RdBu\", zmin=-1, zmax=1, aspect=\"auto\",\n"
         "          labels={\"x\": \"step i\", \"y\": \"layer\", \"color\": \"cos(Gᵢ, Wₙ − W₀)\"})"),
    md("## Implicit vs explicit finetuning\n\n`finetune_alignment` runs plain SGD on `W_gate` and `W_up` of every "
       "layer, on the context-free input, toward the contextual next-token prediction, keeping every update "
       "factored, and compares it with the implicit update `Wₙ − W₀` (per-layer cosine). The model is not modified."),
    code("fa = icl_lens.finetune_alignment(model, prompt, lr=1e-3, steps=3)\n"
         "print(\"target\", repr(fa.target_token), \"loss\", [round(x, 3) for x in fa.losses.tolist()])\n"
         "px.bar(x=list(fa.layers), y=fa.cosine().numpy(), labels={\"x\": \"layer\", \"y\": \"cos(implicit, SGD)\"})"),
    md("## Exercises\n\n1. Compute the trajectory of a free-text prompt (no repeated structure). Do its meta-gradients "
       "decay faster or slower than the few-shot prompt's (compare the mean exponent over layers)?\n"
       "2. Does restricting the SGD update to the query row's gradient terms (`fa.cosine(rows=\"query\")`) change "
       "the alignment? And how does the cosine evolve over SGD steps (`fa.cosine_by_sgd_step()`)?"),
    solution("free = icl_lens.trajectory(model, \"The old lighthouse keeper climbed the stairs every night to light the\")\n"
             "print(\"few-shot mean exponent\", float(traj.decay_fit().exponent.mean()))\n"
             "print(\"free text mean exponent\", float(free.decay_fit().exponent.mean()))"),
    solution("import pandas as pd\n"
             "pd.DataFrame({\"all rows\": fa.cosine().numpy(), \"query row\": fa.cosine(rows=\"query\").numpy(),\n"
             "              \"after SGD step 1\": fa.cosine_by_sgd_step()[:, 0].numpy()}, index=list(fa.layers))"),
]
write(cells, "notebooks/03_implicit_dynamics.ipynb")
