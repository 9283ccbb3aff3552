"""How much code and how many ATen ops one decode step takes: a reader's path and the step's own overhead.

    python bench/decode_trace.py                  # SmolLM2-135M's shape (random weights), ~1 minute
    python bench/decode_trace.py --json trace.json

What is counted, in one run:
  1. the tformer source files one ``generate()`` of a small decoder enters (sys.setprofile over the whole call,
     prompt to last token): the files a reader follows from the entry point to a decode step;
  2. ATen ops per decoded token, eager, batch 1, after the prompt: tformer's ``runner.step`` against
     transformers' ``LlamaForCausalLM`` forward with its DynamicCache, both on SmolLM2-135M-Instruct's shape
     (30 layers, d 576, 9 heads over 3 KV heads, SwiGLU 1536, vocabulary 49,152, tied head), the same weights.
     Counted with a TorchDispatchMode (every op that reaches the dispatcher, views included), and as torch.profiler
     records ATen events (nested calls counted again), averaged over steps.

Counts do not depend on the machine's speed: a busy machine gives the same figures.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, write  # noqa: E402

import tformer  # noqa: E402
from tformer.core.config import ModelConfig  # noqa: E402
from tformer.generate import generate  # noqa: E402
from tformer.interop.hf import model_from_hf  # noqa: E402
from tformer.model import build, runner_for  # noqa: E402

PACKAGE = str(Path(tformer.__file__).resolve().parent)
SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
               rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def files_entered() -> list[str]:
    """tformer's files that one generate() of a small decoder (LLaMA's parts, 2 layers) enters."""
    config = ModelConfig(arch="decoder", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64,
                         max_positions=64, position="rope", norm="rmsnorm", gated_mlp=True, activation="silu",
                         bias=False, tied_embeddings=True)
    model = build(config).eval()
    seen: set[str] = set()

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(PACKAGE):
            seen.add(str(Path(name).relative_to(Path(PACKAGE).parent)))

    sys.setprofile(profile)
    try:
        generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=4, stop_tokens=[])
    finally:
        sys.setprofile(None)
    return sorted(seen)


def hf_model_and_ours(attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    theirs = LlamaForCausalLM(LlamaConfig(**SMOLLM2, attn_implementation=attention)).eval()
    ours = model_from_hf(dict(SMOLLM2), theirs.state_dict(), "smollm2-shape")
    return theirs, ours


def ops_per_token(step, steps: int) -> tuple[float, collections.Counter]:
    counter = OpCounter()
    with torch.no_grad(), counter:
        for _ in range(steps):
            step()
    return sum(counter.ops.values()) / steps, counter.ops


def profiled_ops_per_token(step, steps: int) -> float:
    """ATen events per token as torch.profiler records them (nested calls counted too: aten::linear and the
    aten::mm inside it are two), the count the issue quoted."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return sum(1 for e in prof.events() if e.name.startswith("aten::")) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens read before the counted steps")
    parser.add_argument("--steps", type=int, default=8, help="decode steps counted (averaged)")
    parser.add_argument("--hf-attention", default="eager", choices=["eager", "sdpa"],
                        help="transformers' attention implementation (eager: its attention written out; sdpa: fused)")
    parser.add_argument("--json", help="also write the record here")
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = parser.parse_args()
    torch.set_grad_enabled(False)

    files = files_entered()
    print(f"generate() of a small decoder enters {len(files)} tformer files:")
    for f in files:
        print(f"  {f}")

    from transformers import DynamicCache

    theirs, ours = hf_model_and_ours(args.hf_attention)
    prompt = torch.randint(0, SMOLLM2["vocab_size"], (1, args.prompt))
    runner = runner_for(ours)
    cache = runner.new_cache(1, args.prompt + args.steps + 4)
    logits = runner.prefill(cache, prompt)
    token = logits.argmax(-1)

    def ours_step():
        nonlocal token
        token = runner.step(cache, token).argmax(-1)

    hf_cache = DynamicCache()
    out = theirs(prompt, past_key_values=hf_cache, use_cache=True, logits_to_keep=1)
    hf_token = out.logits[:, -1].argmax(-1, keepdim=True)
    position = args.prompt

    def hf_step():
        nonlocal hf_token, position
        pos = torch.tensor([position])
        out = theirs(hf_token, past_key_values=hf_cache, use_cache=True, cache_position=pos,
                     position_ids=pos[None], logits_to_keep=1)
        hf_token = out.logits[:, -1].argmax(-1, keepdim=True)
        position += 1

    ours_ops, ours_kinds = ops_per_token(ours_step, args.steps)
    hf_ops, hf_kinds = ops_per_token(hf_step, args.steps)
    ours_profiled, hf_profiled = profiled_ops_per_token(ours_step, args.steps), profiled_ops_per_token(hf_step, args.steps)
    print(f"\nATen ops per decoded token (eager, batch 1, SmolLM2-135M's shape, after {args.prompt} prompt tokens):")
    print(f"  tformer       {ours_ops:8.0f}")
    print(f"  transformers  {hf_ops:8.0f}   (LlamaForCausalLM, {args.hf_attention} attention, DynamicCache)")
    print(f"  ratio         {ours_ops / hf_ops:8.2f}x")
    print(f"  as torch.profiler counts them (nested calls too): tformer {ours_profiled:.0f}, transformers "
          f"{hf_profiled:.0f} ({ours_profiled / hf_profiled:.2f}x)")
    print("\n  tformer's most frequent ops per token: "
          + ", ".join(f"{k} {v / args.steps:.0f}" for k, v in ours_kinds.most_common(8)))
    print("  transformers' most frequent ops per token: "
          + ", ".join(f"{k} {v / args.steps:.0f}" for k, v in hf_kinds.most_common(8)))
    record = {"files_entered": len(files), "files": files, "ops_per_token": {"tformer": ours_ops,
              "transformers": hf_ops}, "profiler_events_per_token": {"tformer": ours_profiled,
              "transformers": hf_profiled}, "prompt": args.prompt, "steps": args.steps, "hf_attention": args.hf_attention,
              "transformers_version": __import__("transformers").__version__}
    write("decode_trace", record, machine(), args.json, not args.no_save)


if __name__ == "__main__":
    main()
