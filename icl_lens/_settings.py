"""Frozen settings objects (:class:`~icl_lens.thought.ThoughtFit`, :class:`~icl_lens.spikes.SpikeSettings`): one
way to build one from another and from keyword arguments, and to read one back from its dict, naming any field
that does not exist. No torch: the command line builds its options from them."""
from __future__ import annotations

from dataclasses import fields, replace


class Settings:
    """Mixin for a frozen settings dataclass; ``_what`` names one of its fields in errors (``"spike setting"``)."""

    _what = "setting"

    @classmethod
    def _unknown(cls, names) -> list[str]:
        return sorted(set(names) - {f.name for f in fields(cls)})

    @classmethod
    def of(cls, settings=None, **changes):
        """``settings`` (default: the class's defaults) with ``changes`` (field names) replaced: how every function
        that takes settings reads its settings argument and its keyword arguments."""
        if settings is not None and not isinstance(settings, cls):
            raise TypeError(f"expected {cls.__name__}, got {type(settings).__name__}")
        settings = settings if settings is not None else cls()
        return settings.replace(**changes) if changes else settings

    def replace(self, **changes):
        """A copy with ``changes`` (field names as keyword arguments; an unknown name is a ``TypeError``)."""
        unknown = self._unknown(changes)
        if unknown:
            raise TypeError(f"unknown {self._what}(s) {unknown}; the settings are {[f.name for f in fields(self)]}")
        return replace(self, **changes)

    @classmethod
    def from_dict(cls, d: dict):
        """The inverse of ``to_dict`` (missing keys take the defaults; an unknown key is a ``ValueError``)."""
        unknown = cls._unknown(d)
        if unknown:
            raise ValueError(f"not {cls._what}s: {unknown}")
        return cls(**cls._from_json(d))

    @classmethod
    def _from_json(cls, d: dict) -> dict:
        """The constructor's keyword arguments from a ``to_dict`` (a hook for fields JSON cannot hold as they are)."""
        return d
