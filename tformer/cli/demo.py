"""`tformer demo`: build a preset, run it forward, and show what it is made of."""
import time

from tformer.core.config import preset
from tformer.core.errors import TformerError

NAME = "demo"
HELP = "Build a model (default char-small), run a forward pass, print its shape and parameter count."


def add_arguments(parser) -> None:
    parser.add_argument("--preset", default="char-small", help="preset name (see `tformer presets`)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)


def run(args) -> int:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    import torch

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.data.batch import example_batch
    from tformer.model import build, runner_for

    config = preset(args.preset).with_overrides(args.set)
    if args.batch < 1 or args.seq < 1:
        raise TformerError("--batch and --seq must be at least 1")
    model = build(config).eval()
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    runner = runner_for(model)
    batch = example_batch(config, ids, ids)
    start = time.perf_counter()
    with torch.no_grad():
        out = runner.forward(batch)
    elapsed = time.perf_counter() - start
    result = out.logits if out.logits is not None else out.last_hidden_state
    print(f"{config.name}: {config.arch}, {model.num_parameters():,} parameters")
    print(f"input ids {tuple(ids.shape)} -> output {tuple(result.shape)} in {elapsed * 1e3:.1f} ms (CPU, fp32)")
    return 0
