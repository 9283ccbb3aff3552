"""Continuous batching: every sequence computes what it would alone, whenever it joined or left the batch."""

import threading
import time

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.generate import generate
from tformer.generate.continuous import FINISH_REASONS, Closed, ContinuousBatcher, QueueFull, Request
from tformer.generate.sampling import Sampling
from tformer.generate.slot_pool import pool_serves
from tformer.model import build, runner_for

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15], [3] * 11, [9, 8, 7, 6, 5]]


def _config(arch="decoder", **kw):
    base = dict(arch=arch, n_layers=2, d_model=24, n_heads=3, d_ff=40, vocab_size=37, max_positions=48,
                decoder_start_token_id=0)
    base.update(kw)
    return ModelConfig(**base)


def _model(**kw):
    torch.manual_seed(0)
    return build(_config(**kw)).eval()


class Recorder:
    """on_event listener: the events of every sequence, in order."""

    def __init__(self):
        self.events = []
        self.lock = threading.Lock()

    def __call__(self, seq, token, finish):
        with self.lock:
            self.events.append((seq.id, token, finish))


def _alone(model, request):
    kw = dict(max_new_tokens=request.max_new_tokens, stop_tokens=list(request.stop_tokens or []))
    pick = request.sampling
    if not pick.greedy:
        kw.update(do_sample=True, temperature=pick.temperature, top_k=pick.top_k, top_p=pick.top_p, seed=request.seed)
    kw.update(repetition_penalty=pick.repetition_penalty)
    out = generate(model, [request.prompt], **kw).sequences[0]
    return [t for t in out if t not in (request.stop_tokens or ())]


def _serve(model, requests, max_batch=3):
    """Queue ``requests``, then start the loop and wait for all. With more requests than max_batch, the later ones
    join a batch already running, at other lengths, as the first rows finish (deterministically: no race with
    arrival times)."""
    batcher = ContinuousBatcher(model, max_batch=max_batch)
    recorder = Recorder()
    seqs = [batcher.submit(r, recorder) for r in requests]
    batcher.start()
    assert batcher.shutdown(drain=True, timeout=60)
    return batcher, seqs, recorder


MODELS = {
    "gpt-learned": dict(position="learned"),
    "llama-rope-gqa": dict(position="rope", norm="rmsnorm", n_heads=4, n_kv_heads=2, d_model=32, d_ff=48),
    "alibi": dict(position="alibi"),
    "sinusoidal": dict(position="sinusoidal"),
    "rnn-lstm": dict(arch="rnn", cell="lstm"),
    "sliding-rolling": dict(position="rope", attn_impl="sliding", attn_window=4, attn_block=4),
    "linear-state": dict(position="rope", attn_impl="linear", attn_block=4),
    "encoder-decoder": dict(arch="encoder-decoder", position="sinusoidal"),
    "rnn-seq2seq": dict(arch="rnn-seq2seq", cell="gru"),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_under_load_equals_alone(name, monkeypatch):
    model = _model(**MODELS[name])
    cache_type = type(runner_for(model).new_cache(1))
    joins, join = [], cache_type.join

    def counted(self, other):
        joins.append((self.rows, other.rows))
        return join(self, other)

    monkeypatch.setattr(cache_type, "join", counted)
    requests = [Request(p, max_new_tokens=4 + 3 * i, stop_tokens=()) for i, p in enumerate(PROMPTS)]
    batcher, seqs, _ = _serve(model, requests)
    for seq in seqs:
        assert seq.finish_reason == "length"
        assert seq.tokens == _alone(model, seq.request), name
    assert max(batcher.stats.steps) == 3
    # Caches that can join take the last three requests into the running batch, one at a time as rows
    # finish; the others wait for the batch to empty (one group at a time).
    runner = runner_for(model)
    cache = runner.new_cache(1)
    if runner.takes_source:
        runner.prefill(cache, torch.tensor([[0]]), source=torch.tensor([[1, 2]]))
    else:
        runner.prefill(cache, torch.tensor([[1, 2]]))
    if pool_serves(model.config):
        # Decoder-only attention decodes over the KV pool: the later requests take the rows the first ones give
        # back, with no join: the batch stays full for 15 steps (one group after another: 3 + 3).
        assert name in ("gpt-learned", "llama-rope-gqa", "alibi", "sinusoidal", "sliding-rolling")
        assert joins == [] and batcher.stats.steps[3][0] == 15
        return
    joinable = cache.joinable  # asked of a cache that has read something (a recurrent state exists then)
    assert joinable == (name == "rnn-lstm")
    assert joins == ([(2, 1)] * 3 if joinable else [])


def test_a_shared_prompt_start_is_computed_once_and_changes_nothing():
    """Prefix caching: requests whose prompts start alike (a chat's system prompt) copy the first one's keys."""
    model = _model(position="rope", norm="rmsnorm", n_heads=4, n_kv_heads=2, d_model=32, d_ff=48)
    system = [(5 * i + 3) % 37 for i in range(20)]
    requests = [Request(system + tail, max_new_tokens=6, stop_tokens=()) for tail in ([1, 2], [9], [4, 4, 4], system)]
    batcher, seqs, _ = _serve(model, requests, max_batch=1)  # one at a time: each later prompt finds the first's
    assert batcher.stats.prefix_tokens == 3 * 20 and batcher._pool.prefixes.hits == 3
    for seq in seqs:
        assert seq.tokens == _alone(model, seq.request)
    assert batcher.stats.prefill_tokens == sum(len(r.prompt) for r in requests) - 60


def test_a_long_prompt_is_read_in_chunks_between_steps(monkeypatch):
    """Chunked prefill: a prompt longer than PREFILL_CHUNK is read over several rounds while a running request
    keeps decoding, and both compute what they compute alone."""
    import tformer.generate.continuous as continuous

    monkeypatch.setattr(continuous, "PREFILL_CHUNK", 8)
    model = _model()
    batcher = ContinuousBatcher(model, max_batch=2)
    rec = Recorder()
    running = batcher.submit(Request([1, 2, 3], 20, stop_tokens=()), rec)
    batcher.start()
    while not running.tokens:
        time.sleep(0.005)
    long = batcher.submit(Request([(3 * i + 1) % 37 for i in range(27)], 5, stop_tokens=()), rec)
    assert batcher.shutdown(drain=True, timeout=60)
    assert running.tokens == _alone(model, running.request) and long.tokens == _alone(model, long.request)
    ids = [e[0] for e in rec.events if e[1] is not None]
    first_long = ids.index(long.id)
    # the running request went on producing tokens while the long prompt was read (4 chunks of <= 8 tokens)
    assert ids[:first_long].count(running.id) >= 4


def test_seeded_sampling_is_reproducible_under_load():
    model = _model(position="rope")
    sampled = [Request([7, 8, 9][: i + 1], 12, Sampling(temperature=0.9, top_k=6, top_p=0.95), seed=40 + i,
                       stop_tokens=()) for i in range(3)]
    greedy = [Request(p, 6, stop_tokens=()) for p in PROMPTS[:3]]
    _, first, _ = _serve(model, [x for pair in zip(sampled, greedy) for x in pair])
    _, second, _ = _serve(model, sampled + greedy, max_batch=5)
    by_prompt = {tuple(s.request.prompt): s.tokens for s in second if not s.request.sampling.greedy}
    for seq in first[::2]:
        assert seq.tokens == _alone(model, seq.request) == by_prompt[tuple(seq.request.prompt)]


def test_a_request_s_repetition_penalty_is_generate_s():
    """One Sampling record for both: a served row with a repetition penalty (greedy or sampled) picks what
    generate picks alone with the same settings; a bad setting is refused by name at submission."""
    model = _model(position="rope")
    requests = [Request(PROMPTS[2], 10, Sampling(repetition_penalty=1.8), stop_tokens=()),
                Request(PROMPTS[1], 10, Sampling(temperature=0.8, repetition_penalty=1.3), seed=7, stop_tokens=()),
                Request(PROMPTS[0], 10, stop_tokens=())]
    _, seqs, _ = _serve(model, requests)
    for seq in seqs:
        assert seq.tokens == _alone(model, seq.request)
    assert seqs[0].tokens != _alone(model, Request(PROMPTS[2], 10, stop_tokens=()))  # the penalty does change it
    with pytest.raises(TformerError, match="top_p must be in"):
        ContinuousBatcher(model).submit(Request([1, 2], 5, Sampling(top_p=0.0)), Recorder())


def test_stop_token_ends_a_row_and_is_not_reported():
    model = _model()
    probe = generate(model, [PROMPTS[1]], max_new_tokens=6, stop_tokens=[]).sequences[0]
    stop = probe[2]
    _, seqs, rec = _serve(model, [Request(PROMPTS[1], 6, stop_tokens=(stop,)), Request(PROMPTS[0], 6, stop_tokens=())])
    assert seqs[0].finish_reason == "stop"
    assert seqs[0].tokens == probe[: probe.index(stop)]
    events = [e for e in rec.events if e[0] == seqs[0].id]
    assert [t for _, t, f in events if f is None] == seqs[0].tokens
    assert events[-1] == (seqs[0].id, None, "stop") and len(seqs[1].tokens) == 6


def test_context_window_caps_the_new_tokens():
    model = _model()
    seq = _serve(model, [Request([t % 37 for t in range(44)], 100, stop_tokens=())])[1][0]
    assert seq.finish_reason == "length" and len(seq.tokens) == 48 - 44
    with pytest.raises(TformerError, match="context window"):
        ContinuousBatcher(model).submit(Request([1] * 48, 5), Recorder())
    with pytest.raises(TformerError, match=r"token id 37 is outside the vocabulary \[0, 37\)"):
        ContinuousBatcher(model).submit(Request([1, 37], 5), Recorder())


def test_rows_leave_and_the_cache_shrinks_to_the_longest_row_left():
    model = _model()
    runner = runner_for(model)
    long_cache, short_cache = runner.new_cache(1), runner.new_cache(1)
    runner.prefill(long_cache, torch.tensor([list(range(1, 21))]))
    runner.prefill(short_cache, torch.tensor([[5, 6, 7]]))
    joined = long_cache.join(short_cache)
    assert joined.kv.length == 20 and joined.kv.keep.long().tolist()[1] == [0] * 17 + [1] * 3
    assert joined.kv.positions.tolist()[1][-3:] == [0, 1, 2]
    logits = runner.step(joined, torch.tensor([21, 8]))
    joined.select(torch.tensor([1]))
    joined.compact()
    assert joined.kv.length == 4 and joined.kv.keep.long().tolist() == [[1, 1, 1, 1]]
    alone = runner.new_cache(1)
    runner.prefill(alone, torch.tensor([[5, 6, 7]]))
    torch.testing.assert_close(logits[1], runner.step(alone, torch.tensor([8]))[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runner.step(joined, torch.tensor([9])), runner.step(alone, torch.tensor([9])),
                               rtol=1e-5, atol=1e-5)


def test_caches_that_cannot_join_are_refused_by_name():
    model = _model(arch="encoder-decoder", position="sinusoidal")
    runner = runner_for(model)
    assert not runner.new_cache(1).joinable
    with pytest.raises(TformerError, match="encoder-decoder sequences cannot join a running batch; serve them one group"):
        runner.new_cache(1).join(runner.new_cache(1))


def test_cancel_and_timeout_free_the_rows():
    model = _model()
    batcher = ContinuousBatcher(model, max_batch=4).start()
    rec = Recorder()
    long = batcher.submit(Request([1, 2], 40, stop_tokens=()), rec)
    timed = batcher.submit(Request([3, 4], 40, stop_tokens=(), timeout=0.0), rec)
    long.cancel()
    assert batcher.shutdown(drain=True, timeout=30)
    assert long.finish_reason == "cancelled" and len(long.tokens) < 40
    assert timed.finish_reason == "timeout" and len(timed.tokens) <= 1
    assert batcher.active == 0 and batcher.queue_depth == 0


def test_queue_full_and_closed():
    model = _model()
    batcher = ContinuousBatcher(model, max_batch=1, max_queue=2)  # not started: the queue only fills
    for _ in range(2):
        batcher.submit(Request([1], 3), Recorder())
    with pytest.raises(QueueFull, match="max_queue 2"):
        batcher.submit(Request([1], 3), Recorder())
    # Closed before its loop runs (a loop started first may finish a request before the close reaches it): the
    # loop's first look then finds the close, without drain, and cancels both.
    assert batcher.shutdown(drain=False)
    with pytest.raises(Closed, match="shutting down"):
        batcher.submit(Request([1], 3), Recorder())
    batcher.start()
    assert batcher.shutdown(drain=False, timeout=30)
    assert batcher.stats.finished["cancelled"] == 2


def test_a_failing_step_ends_its_sequences_and_the_loop_goes_on(monkeypatch):
    model = _model()
    batcher = ContinuousBatcher(model, max_batch=4)
    real_step, calls = batcher._pool.step, []

    def flaky(tokens, filler):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated out of memory")
        return real_step(tokens, filler)

    monkeypatch.setattr(batcher._pool, "step", flaky)
    batcher.start()
    first = batcher.submit(Request([1, 2], 5, stop_tokens=()), Recorder())
    while not first.done:
        time.sleep(0.01)
    after = batcher.submit(Request([1, 2], 5, stop_tokens=()), Recorder())
    assert batcher.shutdown(drain=True, timeout=30)
    assert first.finish_reason == "error" and "simulated out of memory" in first.error
    assert after.finish_reason == "length" and after.tokens == _alone(model, after.request)


def test_a_listener_that_raises_cancels_only_its_sequence():
    model = _model()

    def broken(seq, token, finish):
        raise BrokenPipeError("client gone")

    batcher = ContinuousBatcher(model, max_batch=2).start()
    bad = batcher.submit(Request([1, 2], 20, stop_tokens=()), broken)
    good = batcher.submit(Request([3, 4], 5, stop_tokens=()), Recorder())
    assert batcher.shutdown(drain=True, timeout=30)
    assert bad.finish_reason == "cancelled" and good.finish_reason == "length"
    assert set(batcher.stats.finished) == set(FINISH_REASONS)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_batcher_settings(bad):
    with pytest.raises(TformerError, match="max_batch must be"):
        ContinuousBatcher(_model(), max_batch=bad)


def test_encoder_models_are_refused():
    with pytest.raises(TformerError, match="cannot generate"):
        ContinuousBatcher(_model(arch="encoder", lm_head=True))


def test_a_config_whose_pad_and_end_ids_lie_outside_the_vocabulary_still_batches():
    """A config cut from a larger model keeps its pad and end ids (GPT-2's 50256 with 37 tokens here): padding joined
    rows with them failed every concurrent request. Padding takes an id inside the vocabulary; each row computes
    what it computes alone."""
    model = _model(pad_token_id=50256, eos_token_id=50256, bos_token_id=50256)
    requests = [Request(p, max_new_tokens=5, stop_tokens=()) for p in PROMPTS]
    _, seqs, _ = _serve(model, requests)
    assert [s.finish_reason for s in seqs] == ["length"] * len(PROMPTS)
    for seq in seqs:
        assert seq.tokens == _alone(model, seq.request)
    batched = generate(model, PROMPTS, max_new_tokens=5, stop_tokens=[]).sequences  # generate's own left padding
    assert batched == [_alone(model, r) for r in requests]


def test_a_compiled_pool_step_is_two_graphs_for_every_batch_and_length():
    """--compile in serving: the model's forward over the KV pool traced twice at start-up, for one row and for any
    rows from two (columns dynamic in both), while rows join and leave at other lengths; every request computes what
    it computes alone. The "eager" backend traces the graph (fullgraph) and runs it with ATen: the check takes
    seconds, not the minutes inductor takes."""
    from torch._dynamo.utils import counters

    model = _model(position="rope", norm="rmsnorm", n_heads=4, n_kv_heads=2, d_model=32, d_ff=48, max_positions=200)
    torch._dynamo.reset()
    counters.clear()
    requests = [Request(p, max_new_tokens=4 + 3 * i, stop_tokens=()) for i, p in enumerate(PROMPTS)]
    requests.append(Request([(3 * i + 1) % 37 for i in range(70)], max_new_tokens=6, stop_tokens=()))  # columns > 64
    batcher = ContinuousBatcher(model, max_batch=3, compile="eager")
    rec = Recorder()
    seqs = [batcher.submit(r, rec) for r in requests]
    batcher.start()
    assert batcher.shutdown(drain=True, timeout=120)
    for seq in seqs:
        assert seq.finish_reason == "length" and seq.tokens == _alone(model, seq.request)
    assert set(batcher.stats.steps) >= {1, 2, 3}  # steps of different row counts and cache lengths ...
    assert counters["stats"]["unique_graphs"] == 2  # ... through the two graphs compiled in start()
    assert batcher.compile_seconds > 0  # compiled in start(), before any request: what `tformer serve` reports
    assert ContinuousBatcher(model, max_batch=3).compile_seconds is None


def test_compile_is_refused_where_the_pool_does_not_serve():
    with pytest.raises(TformerError, match="drop --compile"):
        ContinuousBatcher(_model(arch="encoder-decoder", position="sinusoidal"), compile="eager")


def test_newcomers_prompts_are_read_together_in_one_forward(monkeypatch):
    """Chunked prefill batches: the prompts that arrived together (different lengths, right-padded in one forward)
    are read by one call, and each row still computes what it computes alone."""
    from tformer.generate.slot_pool import SlotPool

    calls, real = [], SlotPool.prefill

    def counted(self, chunks):
        calls.append(sorted(map(len, chunks.values())))
        return real(self, chunks)

    monkeypatch.setattr(SlotPool, "prefill", counted)
    model = _model(position="alibi")
    requests = [Request(p, max_new_tokens=5, stop_tokens=()) for p in PROMPTS[:3]]
    _, seqs, _ = _serve(model, requests)
    assert calls == [sorted(len(p) for p in PROMPTS[:3])]  # [1, 3, 7]: one forward for the three
    for seq in seqs:
        assert seq.tokens == _alone(model, seq.request)


def test_the_prefix_store_holds_at_most_its_token_budget_most_recent_first():
    from tformer.generate.slot_pool import PrefixStore

    store = PrefixStore(max_tokens=30, min_tokens=4)
    a, b, c = list(range(10)), list(range(100, 115)), list(range(200, 210))
    for prompt in (a, b):
        store.add(prompt, [("k", "v")])
    assert store.longest(a + [99])[1] == 10  # a is now the most recent
    store.add(c, [("k", "v")])  # 35 tokens > 30: the least recently used (b) goes
    assert store.tokens == 20 and store.longest(b + [1])[1] == 0 and store.longest(c + [1])[1] == 10
    store.add(list(range(31)), [("k", "v")])  # longer than the whole budget: not kept
    assert store.tokens == 20 and store.longest([1, 2, 3, 4, 5]) == (None, 0)  # shorter than min_tokens
