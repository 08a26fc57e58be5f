"""Typed public API: mypy accepts every README Python sample, and sees icl_lens's real types.

One mypy run (fresh cache in a temporary folder) checks the README's ```python blocks and a
canary file. The canary pins what a user's type checker must see: ``token_patches`` gives a
``TokenPatches`` for one prompt and a ``list[TokenPatches]`` for a list (its overloads),
``model`` is a ``TransformerBridge`` (an ``Any`` would fail ``assert_type``), and a wrong
``model`` is rejected (a ``# type: ignore`` that mypy finds unused is an error here). icl_lens
is found as an installed package on the path, so it counts as typed only through its
``py.typed`` marker.
"""
import inspect
import pathlib
import re
import subprocess
import sys

import icl_lens

ROOT = pathlib.Path(__file__).parents[1]
PACKAGE_ROOT = pathlib.Path(icl_lens.__file__).parents[1]  # the checkout whose icl_lens the tests import

CANARY = '''\
from typing import assert_type

from transformer_lens.model_bridge import TransformerBridge

import icl_lens
from icl_lens import TokenPatches

model = icl_lens.load_model("tiny-llama")
assert_type(model, TransformerBridge)
assert_type(icl_lens.token_patches(model, "one prompt", layers=[-1]), TokenPatches)
assert_type(icl_lens.token_patches(model, [1, 2, 3]), TokenPatches)
patches = icl_lens.token_patches(model, ["a list", "of prompts"])
assert_type(patches, list[TokenPatches])
assert_type(len(patches[0]), int)
assert_type(patches[0].select(layers=[0, -1], positions=-1), TokenPatches)
assert_type(patches[0].layers, tuple[int, ...])
icl_lens.token_patches("not a model", "a prompt")  # type: ignore[call-overload]
icl_lens.patch_norms(object(), ["a prompt"])  # type: ignore[arg-type]
'''

CONFIG = '''\
[mypy]
python_version = {version}
cache_dir = {cache}
warn_unused_ignores = True
ignore_missing_imports = True

[mypy-icl_lens.*]
ignore_missing_imports = False

; transformers is typed but huge: read as Any, which keeps the run to about 20 s of CPU
[mypy-transformers.*]
follow_imports = skip
'''


def readme_samples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_mypy_accepts_the_readme_samples(tmp_path):
    samples = readme_samples()
    assert len(samples) >= 5
    files = []
    for i, source in enumerate([*samples, CANARY]):
        path = tmp_path / (f"readme_{i}.py" if i < len(samples) else "canary.py")
        path.write_text(source)
        files.append(path.name)
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG.format(version=f"{sys.version_info.major}.{sys.version_info.minor}",
                                    cache=tmp_path / "mypy_cache"))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(PACKAGE_ROOT), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(config), "--no-error-summary",
                           "--show-error-codes", *files], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_public_functions_type_their_model():
    """Every public function taking ``model`` (and ``PatchSession``) annotates it with the bridge type."""
    targets = {name: getattr(icl_lens, name) for name in icl_lens.__all__ if inspect.isfunction(getattr(icl_lens, name))}
    targets["PatchSession"] = icl_lens.PatchSession.__init__
    taking = {name: inspect.signature(f).parameters["model"].annotation for name, f in targets.items()
              if "model" in inspect.signature(f).parameters}
    assert len(taking) >= 14
    assert not [name for name, annotation in taking.items() if "Model" not in str(annotation)]
