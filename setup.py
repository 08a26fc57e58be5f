"""The one packaging rule pyproject.toml cannot state on its own: the top-level ``widgets/``
folder (the dashboard's front-end source, anywidget ESM + CSS) is shipped inside the wheel
as the package ``icl_lens.widgets``, so the installed library finds it with
``importlib.resources`` (``pip install .`` copies it; ``pip install -e .`` maps it)."""
from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["icl_lens*"]), "icl_lens.widgets"],
      package_dir={"icl_lens.widgets": "widgets"})
