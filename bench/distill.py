"""Distillation, measured: a 2-layer student of a 4-layer char-level Shakespeare teacher, trained three ways for
the same steps, so that what the copied layers give and what the teacher's soft targets give are told apart.

    python bench/distill.py              # 12 minutes measured on 2 shared, busy cores (teacher 7 of them; cached after)
    python bench/distill.py --quick      # about 1-2 minutes: the mechanics, too few steps to rank the students
    python bench/distill.py --threads 1  # steadier on a machine other work is using

The teacher (bench/_char_teacher.py): char-small narrowed to d_model 128, trained here with the project's training
loop and kept in tformer's cache (bench/prune.py reuses it). The students, each the same 2-layer architecture, each
trained with the same loop (tformer.train.loop.Trainer), batches, learning rate and steps:
  - scratch:    random init, cross-entropy on the next character;
  - copied:     teacher layers 0 and 2 copied with its embeddings, norm and head (student_from_teacher), cross-entropy;
  - distilled:  copied, then alpha CE + (1 - alpha) T^2 KL(teacher || student) (DistillRunner: the loop's runner=).
The table: parameters, validation loss (nats per character, the same held-out windows for every model) before and
after the student's steps, and the training time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from tformer.adapt.distill import DistillRunner, student_from_teacher
from tformer.core.errors import TformerError
from tformer.model import build

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _char_teacher as char  # noqa: E402  (bench/_char_teacher.py: the teacher, the loop, the validation loss)
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

MODES = {"teacher_steps": (400, 60), "steps": (300, 40)}  # (default, --quick)


def students(teacher, source, steps: int, alpha: float, temperature: float, lr: float) -> list[dict]:
    """Train the three students; one record each (val loss before and after, seconds)."""
    out = []
    copied = student_from_teacher(teacher)
    torch.manual_seed(char.SEED)
    scratch = build(copied.config)
    for name, model, runner in [
        ("scratch", scratch, None),
        ("copied", student_from_teacher(teacher), None),
        ("distilled", copied, DistillRunner(copied, teacher, alpha=alpha, temperature=temperature)),
    ]:
        before = char.val_loss(model, source)
        seconds = char.train(model, source, steps, lr=lr, runner=runner)
        after = char.val_loss(model, source)
        out.append({"student": name, "val_loss_before": before, "val_loss": after, "seconds": seconds,
                    "params": sum(p.numel() for p in model.parameters())})
        print(f"  {name}: val loss {before:.3f} -> {after:.3f} in {seconds:.0f} s")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (about 1-2 minutes)")
    p.add_argument("--teacher-steps", type=int, default=None, help="teacher training steps (default 400, quick 60)")
    p.add_argument("--steps", type=int, default=None, help="steps for each student (default 300, quick 40)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the hard-label cross-entropy")
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--fresh", action="store_true", help="train the teacher again even if one is cached")
    _results.add_run_args(p)
    args = p.parse_args(argv)
    mode, machine = _results.begin(args, MODES)
    mode["teacher_steps"] = args.teacher_steps or mode["teacher_steps"]
    mode["steps"] = args.steps or mode["steps"]
    started = time.perf_counter()
    try:
        teacher, source, teacher_s = char.teacher(mode["teacher_steps"], fresh=args.fresh)
        teacher_loss = char.val_loss(teacher, source)
        how = f"trained {mode['teacher_steps']} steps in {teacher_s:.0f} s" if teacher_s else "cached"
        print(f"teacher: {char.description(teacher.config)} ({how}); val loss {teacher_loss:.3f}")
        print(f"students: {mode['steps']} steps each, batch {char.BATCH} x {char.SEQ} characters, "
              f"alpha {args.alpha}, T {args.temperature}")
        rows = students(teacher, source, mode["steps"], args.alpha, args.temperature, args.lr)
    except TformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    student_config = student_from_teacher(teacher).config
    record = {
        "settings": {"quick": args.quick, "threads": torch.get_num_threads(), "alpha": args.alpha,
                     "temperature": args.temperature, "lr": args.lr, "batch": char.BATCH, "seq": char.SEQ,
                     "data": char.DATA, **mode},
        "teacher": {"config": char.description(teacher.config), "val_loss": teacher_loss, "seconds": teacher_s,
                    "params": sum(p.numel() for p in teacher.parameters())},
        "student_config": char.description(student_config),
        "students": rows,
        "seconds": time.perf_counter() - started,
    }
    headers = ["model", "init", "training", "params", "steps", "val loss before", "val loss", "train s"]
    table = [["teacher", "random", "CE", f"{record['teacher']['params']:,}", str(mode["teacher_steps"]), "",
              f"{teacher_loss:.3f}", f"{teacher_s:.0f}" if teacher_s else "cached"]]
    for r in rows:
        init = "random" if r["student"] == "scratch" else "teacher layers 0, 2"
        training = f"distill a={args.alpha} T={args.temperature}" if r["student"] == "distilled" else "CE"
        table.append([f"student ({r['student']})", init, training, f"{r['params']:,}", str(mode["steps"]),
                      f"{r['val_loss_before']:.3f}", f"{r['val_loss']:.3f}", f"{r['seconds']:.0f}"])
    print("\n" + _results.table(headers, table))
    print(f"({record['seconds']:.0f} s; val loss: nats per character on {char.EVAL_BATCHES} held-out batches)")
    _results.write("distill", record, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
