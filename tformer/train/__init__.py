"""Training: the loop, the objectives' data sources, optimizers and schedules, resumable checkpoints
(optimizer, RNG and FSDP state beside interop's model files), torchrun/DDP/FSDP, progress and metrics;
a run's lock on its folder (run_lock) and its clean stop on SIGINT/SIGTERM (interrupt).

    from tformer.train import TrainArgs, Trainer, base_config, build_run
    run = build_run("shakespeare", base_config("char-small", None, None, []), seq_len=128, seed=0)
    Trainer(run.model, run.source, TrainArgs(...)).run()   # final metrics; checkpoints, metrics.jsonl in out
"""

from tformer.train.checkpoint import load_checkpoint, save_checkpoint, save_weights
from tformer.train.evaluate import DecodeScores, decode_scores
from tformer.train.interrupt import stop_on_signals
from tformer.train.loop import TrainArgs, Trainer, enable_activation_checkpointing, find_checkpoint
from tformer.train.optim import make_optimizer, parameter_groups
from tformer.train.schedule import make_schedule
from tformer.train.setup import Run, base_config, build_run, resume_args, save_run_files, saved_run_args
from tformer.train.sources import CausalLMSource, MaskedLMSource, Seq2SeqSource

__all__ = ["CausalLMSource", "DecodeScores", "MaskedLMSource", "Run", "Seq2SeqSource", "TrainArgs", "Trainer",
           "base_config", "build_run", "decode_scores", "enable_activation_checkpointing", "find_checkpoint",
           "load_checkpoint", "make_optimizer", "make_schedule", "parameter_groups", "resume_args", "save_checkpoint",
           "save_run_files", "save_weights", "saved_run_args", "stop_on_signals"]
