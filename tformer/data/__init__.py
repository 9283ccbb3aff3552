"""Data: corpora fetched from package registries (pinned, cached), tokenizers, token streams, batches.

Modules: corpora (named and local corpora, splits), tokenizers (char, BPE, GPT-2, WordPiece),
stream (memory-mapped token streams, random and resumable batches), prepare (corpus + tokenizer
-> cached streams), seq2seq (copy/reverse tasks, translation batches), mlm (BERT masking),
packages (download pinned archives). Imports stay inside the modules so `import tformer.data`
is cheap.
"""
