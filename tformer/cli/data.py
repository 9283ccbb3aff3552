"""`tformer data list` / `tformer data get NAME`: the corpora, fetched once and cached."""
import json

from tformer.cli._cost_common import console

NAME = "data"
HELP = "List the corpora, or fetch one (pinned sha256, cached) and tokenize it into token streams."


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="<list|get>")
    sub.add_parser("list", help="the named corpora: kind, size, licence, whether cached")
    get = sub.add_parser("get", help="fetch a corpus (or read a local text file/folder) and build its token streams")
    get.add_argument("name", help="a corpus name from `tformer data list`, or a path to a text file or folder")
    get.add_argument("--tokenizer", default="char",
                     help="char (default), bpe (trained on the train split), gpt2, or a tokenizer/BERT folder")
    get.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default 4096)")
    get.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args) -> int:
    command = getattr(args, "data_command", None)
    if command == "get":
        return _get(args)
    return _list()


def _list() -> int:
    # deferred: rich loads only when something is printed with it
    from rich.table import Table

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.data.corpora import REGISTRY, is_cached

    table = Table(title="tformer corpora (or pass a path to any UTF-8 text file or folder)")
    for col in ("name", "kind", "download", "cached", "description", "licence"):
        # Names are what users type: never wrap or elide them.
        table.add_column(col, no_wrap=col in ("name", "kind", "download", "cached"))
    for s in REGISTRY.values():
        table.add_row(s.name, s.kind, s.download, "yes" if is_cached(s.name) else "no", s.description, s.license)
    console().print(table)
    return 0


def _get(args) -> int:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.data.corpora import get_corpus
    from tformer.data.prepare import prepare

    corpus = get_corpus(args.name)
    result = {"corpus": corpus.name, "kind": corpus.kind, "splits_rule": corpus.split_note,
              "folder": str(corpus.directory) if corpus.directory else None, "splits": {}}
    if corpus.kind == "pairs":
        # Pair tokenizers are trained per run (source and target sides); report the pairs.
        for split in corpus.splits:
            result["splits"][split] = {"pairs": len(corpus.pairs(split))}
        first = corpus.pairs("train")[0]
        result["example"] = {"source": first[0], "target": first[1]}
    else:
        data = prepare(args.name, args.tokenizer, args.vocab_size)
        tok = data.tokenizer()
        result.update(tokenizer=tok.kind, vocab_size=tok.vocab_size, streams=str(data.directory))
        for split in corpus.splits:
            stream = data[split]
            result["splits"][split] = {"chars": len(corpus.text(split)), "tokens": len(stream),
                                       "bytes_on_disk": stream.path.stat().st_size, "dtype": stream.dtype.name}
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
        return 0
    print(f"{result['corpus']} ({result['kind']}): splits {result['splits_rule']}")
    if result["folder"]:
        print(f"  text: {result['folder']}")
    for split, info in result["splits"].items():
        print(f"  {split:<10} " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}"
                                            for k, v in info.items()))
    if "streams" in result:
        print(f"  tokenizer {result['tokenizer']}, vocabulary {result['vocab_size']:,}; streams: {result['streams']}")
    if "example" in result:
        print(f"  e.g. {result['example']['source']!r} -> {result['example']['target']!r}")
    return 0
