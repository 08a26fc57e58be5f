"""Spike flags: tokens whose patch norm jumps above the tokens just before them, and the answers they flag.

:func:`spike_scores` (robust trailing z-scores of the token-patch norms, docs/design.md §2) with their
:class:`SpikeSettings`,
the shipped per-model thresholds (:func:`spike_threshold`, ``data/spike_thresholds.json``) and
wrong-answer detectors (:func:`spike_detector`, ``data/spike_detectors.json``), and
:func:`generate_with_patches` (generation that records every new token's norms, score and flag); what a
detector reads of an answer (:class:`AnswerReading`, :func:`feature_vector`), the answer-matching rule
(:func:`same_answer`) and the temperature-1 samples behind the sampling-agreement baseline
(:func:`sample_continuations`).
"""
from typing import TYPE_CHECKING

from icl_lens._lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (lazy_exports reads this block)
    from icl_lens.spikes._answer_match import answer_line, matches_alias, normalise_answer, same_answer
    from icl_lens.spikes._detector import (DETECTORS_FILE, FEATURE_BLOCKS, AnswerFlag, AnswerReading, SpikeDetector,
                                           answer_baselines, feature_block, feature_vector, patch_readout,
                                           probe_layer, read_answer, sampling_disagreement, shipped_detectors,
                                           spike_detector, spike_readout)
    from icl_lens.spikes._generation import GenerationPatches, generate_with_patches, predictive_stats
    from icl_lens.spikes._sampling import PromptState, prompt_state, sample_continuations, sample_seed, stopped
    from icl_lens.spikes._scores import SpikeFlags, informative_positions, spike_scores, spike_scores_from_norms
    from icl_lens.spikes._settings import DEFAULT_SPIKE_THRESHOLD, STATISTICS, SpikeSettings
    from icl_lens.spikes._thresholds import THRESHOLDS_FILE, SpikeThreshold, spike_threshold

__getattr__, __dir__, __all__ = lazy_exports(globals())
