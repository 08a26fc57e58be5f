"""Helpers shared by the dashboard tests (the fixture that makes dashboards is in conftest.py)."""


def type_prompt(d, text: str) -> None:
    """Set the dashboard's text as typing would and wait until it is drawn, with no error."""
    d.set_prompt(text)
    assert d.wait(180), "dashboard did not finish updating"
    assert d.last_error == "", d.last_error
