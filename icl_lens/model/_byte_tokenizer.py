"""A 259-token byte-level tokenizer (256 bytes + <bos>, <eos>, <pad>) for the tiny models.

Any text round-trips through it, and it prepends ``<bos>`` like the Gemma and Llama
tokenizers do, so the tiny models exercise the same BOS-kept code path.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

BOS, EOS, PAD = "<bos>", "<eos>", "<pad>"
VOCAB_SIZE = 259
BOS_ID, EOS_ID, PAD_ID = 256, 257, 258


def save_byte_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """Write the tokenizer to ``directory`` (once, atomically) and load it back from there.

    TransformerBridge re-loads the tokenizer from ``tokenizer.name_or_path``, so an
    in-memory tokenizer is not enough (docs/design.md §5). Concurrent processes share the
    cached copy: it is written to a temporary folder and renamed into place.
    """
    directory = Path(directory)
    if not (directory / "tokenizer_config.json").exists():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}-"))
        try:
            _build().save_pretrained(tmp)
            if directory.exists():  # an existing folder without a tokenizer (e.g. a model dir): add files
                for f in tmp.iterdir():
                    os.replace(f, directory / f.name)
            else:
                try:
                    os.replace(tmp, directory)
                except OSError:  # another process won the race; its copy is identical
                    pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return AutoTokenizer.from_pretrained(directory)


def _build() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    vocab.update({BOS: BOS_ID, EOS: EOS_ID, PAD: PAD_ID})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, BOS_ID)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def _byte_of(ch: str) -> int:
    """Inverse of GPT-2's bytes→unicode map for one character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))[ch]
