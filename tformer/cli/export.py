"""`tformer export`: a tformer checkpoint or training run as a Hugging Face folder.

    tformer export --ckpt runs/shakespeare --out hf/shakespeare
    python -c "import transformers; transformers.AutoModelForCausalLM.from_pretrained('hf/shakespeare')"

The folder holds config.json + model.safetensors in the layout `transformers` loads for the model's
family (GPT-2, LLaMA, BERT, BART or T5, chosen from the config), written atomically; the run's
tformer tokenizer, if any, is saved beside them (tformer-tokenizer.json and its data files).
"""

from __future__ import annotations

from pathlib import Path

from tformer.core.atomic import check_output_dir
from tformer.core.errors import TformerError
from tformer.interop.hf_config import hf_family

NAME = "export"
HELP = "Export a training run or checkpoint to a Hugging Face folder (config.json + model.safetensors)."


def add_arguments(parser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="DIR",
                        help="a training output folder (or its checkpoint/ folder): config.json + model.safetensors")
    parser.add_argument("--out", required=True, metavar="DIR", help="the Hugging Face folder to write")


def run(args) -> int:
    check_output_dir(args.out)  # refuse an unwritable --out in the first second, not after the work
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.interop.checkpoint import load_checkpoint
    from tformer.interop.hf import save_hf

    src, out = Path(args.ckpt), Path(args.out)
    if out.resolve() == src.resolve():
        raise TformerError(f"--out {out} is the checkpoint folder itself; choose a new folder for the export")
    model, tokenizer = load_checkpoint(src)
    model_type, _ = hf_family(model.config)  # a config no Hugging Face family can hold fails here, in one line
    save_hf(model, out)
    with_tokenizer = ""
    if tokenizer is not None:
        with_tokenizer = f" and the tformer tokenizer ({tokenizer.save(out).name})"
    n = sum(p.numel() for p in model.parameters())
    print(f"exported {model.config.name} ({n:,} parameters) as a Hugging Face {model_type} model{with_tokenizer} "
          f"to {out}")
    print(f"load it with: transformers.AutoModel{'' if model.config.has_encoder else 'ForCausalLM'}"
          f".from_pretrained({str(out)!r})")
    return 0
