"""The one decode loop (tformer.generate.decode_loop, issue 47): generation and serving both step through it, rows
end at their stop token, budget, or their own reason, and a batch that shares a generator draws as one batch."""

from __future__ import annotations

import threading

import pytest
import torch
from test_generate_cache import PROMPTS, model_for

from tformer.generate import decode_loop
from tformer.generate.continuous import ContinuousBatcher, Request
from tformer.generate.decode_loop import DecodeLoop, Row
from tformer.generate.sampling import Sampling
from tformer.generate.search import generate

V, FILLER = 6, 0


class ScriptedStore:
    """A store whose model puts each row's mass on a scripted token: ``script[i][step]`` for ``rows[i]``, with
    ``runner_up`` a little below it."""

    def __init__(self, keeps_places, script, rows, runner_up=None):
        self.keeps_places, self.script, self.rows, self.runner_up = keeps_places, script, rows, runner_up
        self.placed, self.left, self.read = [], [], []
        self.steps = 0

    def join(self, rows):
        self.placed += [r for r in rows if r.finish_reason is None or self.keeps_places]

    def step(self, rows):
        self.steps += 1
        self.read.append([r.next for r in rows])
        return torch.stack([_onehot(self.script[self.rows.index(r)][self.steps], self.runner_up) for r in rows])

    def leave(self, rows):
        self.left += rows


def _onehot(token, runner_up=None):
    logits = torch.full((V,), -5.0)
    if runner_up is not None:
        logits[runner_up] = 1.0
    logits[token] = 5.0
    return logits


def _run(keeps_places, script, rows, runner_up=None):
    store = ScriptedStore(keeps_places, script, rows, runner_up)
    loop = DecodeLoop(store, FILLER)
    steps = [loop.join(rows, torch.stack([_onehot(s[0], runner_up) for s in script])).tolist()]
    while loop.live:
        steps.append(loop.step().tolist())
    return store, loop, steps


@pytest.mark.parametrize("keeps_places", [True, False])
def test_rows_end_at_their_stop_token_or_budget(keeps_places):
    script = [[1, 2, 5, 3, 3], [4, 4, 4, 4, 4]]  # row 0 stops at 5 (its third token); row 1 runs out at 4 tokens
    rows = [Row(budget=4, stop=frozenset({5})), Row(budget=4, stop=frozenset({5}))]
    store, loop, steps = _run(keeps_places, script, rows)
    assert [r.tokens for r in rows] == [[1, 2], [4, 4, 4, 4]]  # the stop token is not kept
    assert [r.finish_reason for r in rows] == ["stop", "length"]
    assert [s[0] for s in steps[:3]] == [1, 2, 5]  # the step that ends a row still shows its token
    if keeps_places:  # generate's batch: the ended row stays, reading the filler, and shows it
        assert steps[3] == [FILLER, 4] and store.read[-1] == [FILLER, 4] and store.left == []
    else:  # serving: it leaves at once, and the store is told
        assert steps[3] == [4] and store.read[-1] == [4] and store.left == rows  # row 1 after its last token
    assert loop.live is False


def test_a_row_that_ends_on_its_first_token_never_joins_a_store_that_lets_go():
    rows = [Row(budget=3, stop=frozenset({5})), Row(budget=3, stop=frozenset({5}))]
    store, loop, _ = _run(False, [[5], [2, 3, 3]], rows)
    assert store.placed == [rows[1]] and rows[0].finish_reason == "stop" and rows[0].tokens == []


def test_a_row_may_end_for_its_own_reason():
    class Cancelled(Row):
        def ending(self, now):
            return "cancelled" if len(self.tokens) == 1 else None

    told = []
    row = Cancelled(budget=9)
    row.finished = told.append
    _run(False, [[1, 2, 3]], [row])
    assert (row.tokens, told) == ([1], ["cancelled"])


def test_a_batch_sharing_one_generator_draws_as_one_batch_and_a_row_alone_as_alone():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    pick = Sampling(temperature=1.0, top_k=20)
    shared = torch.Generator().manual_seed(7)
    rows = [Row(budget=5, sampling=pick, generator=shared) for _ in range(3)]
    expected = pick.pick(logits, torch.Generator().manual_seed(7))
    assert decode_loop._pick(rows, logits).tolist() == expected.tolist()
    own = [Row(budget=5, sampling=Sampling(temperature=1.0), generator=torch.Generator().manual_seed(s))
           for s in (1, 2)] + [Row(budget=5)]
    alone = [Sampling(temperature=1.0).pick(logits[i:i + 1], torch.Generator().manual_seed(s))[0]
             for i, s in enumerate((1, 2))] + [logits[2].argmax()]
    assert decode_loop._pick(own, logits).tolist() == [int(t) for t in alone]


def test_the_repetition_penalty_sees_each_new_token():
    seen = torch.zeros(V, dtype=torch.bool)
    row = Row(budget=3, sampling=Sampling(repetition_penalty=100.0), seen=seen)
    # 3 leads (5.0), 4 is next (1.0): once 3 is seen its logit is 0.05 and 4 is taken; once both are seen,
    # 0.05 beats 0.01 and 3 comes back
    _run(False, [[3, 3, 3]], [row], runner_up=4)
    assert row.tokens == [3, 4, 3] and bool(seen[3] & seen[4])


def _serve_one(model) -> None:
    """One request of 6 tokens through a started batcher, to its end."""
    batcher = ContinuousBatcher(model, max_batch=4).start()
    done = threading.Event()
    try:
        batcher.submit(Request(PROMPTS[0], max_new_tokens=6, stop_tokens=()),
                       lambda seq, token, finish: finish and done.set())
        assert done.wait(60)
    finally:
        batcher.shutdown()


def test_generate_and_serving_step_through_the_one_loop(monkeypatch):
    calls = []
    step = DecodeLoop.step
    monkeypatch.setattr(DecodeLoop, "step", lambda self: calls.append(type(self.store).__name__) or step(self))
    model = model_for("decoder", "rope")
    out = generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[])
    assert calls == ["BatchRows"] * out.decode_steps == ["BatchRows"] * 5
    calls.clear()
    _serve_one(model)  # a decoder: the slot pool
    assert calls == ["PoolRows"] * 5
    calls.clear()
    _serve_one(model_for("encoder-decoder", "learned"))  # joined growing caches
    assert calls == ["JoinedRows"] * 5
