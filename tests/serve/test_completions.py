"""/v1/completions on a live server: output under load equals generate() alone, streaming, stop strings,
token-id models, the openai client, /health and /metrics."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
from prometheus_client.parser import text_string_to_metric_families

from tformer.generate import generate
from tformer.serve.textstream import IncrementalText


def _complete(server, **body):
    r = server.client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _alone(server, prompt, **settings):
    model = server.app.state.engine.model
    return generate(model, [prompt], **settings).sequences[0]


def test_greedy_under_load_equals_generate_alone(ids_server):
    jobs = [([(7 * i + k) % 40 for k in range(1 + i % 9)], 4 + (5 * i) % 23) for i in range(12)]

    def ask(job):
        prompt, n = job
        return _complete(ids_server, prompt=prompt, max_tokens=n, temperature=0, stop_token_ids=[])

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, jobs))
    for (prompt, n), answer in zip(jobs, answers):
        expected = _alone(ids_server, prompt, max_new_tokens=n, do_sample=False, stop_tokens=[3])
        got = answer["choices"][0]["token_ids"]
        finish = answer["choices"][0]["finish_reason"]
        assert got + ([3] if finish == "stop" else []) == expected
        assert answer["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(got),
                                   "total_tokens": len(prompt) + len(got)}


def test_seeded_sampling_is_reproducible_and_equals_generate(ids_server):
    body = {"prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0.9, "top_k": 12, "top_p": 0.95, "seed": 1234}
    first = _complete(ids_server, **body)["choices"][0]
    second = _complete(ids_server, **body)["choices"][0]
    assert first["token_ids"] == second["token_ids"]
    expected = _alone(ids_server, [5, 6, 7], max_new_tokens=20, do_sample=True, temperature=0.9, top_k=12,
                      top_p=0.95, seed=1234, stop_tokens=[3])
    assert first["token_ids"] + ([3] if first["finish_reason"] == "stop" else []) == expected


def test_text_prompt_answer_and_stream_agree(dec):
    plain = _complete(dec, prompt="to be", max_tokens=12, temperature=0)["choices"][0]
    tok = dec.app.state.info.tokenizer
    assert plain["text"] == tok.decode(plain["token_ids"])
    with dec.client.stream("POST", "/v1/completions",
                           json={"prompt": ["to be"], "max_tokens": 12, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == plain["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["text"]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == plain["token_ids"]


def test_stop_string_cuts_the_text(dec):
    plain = _complete(dec, prompt="to be", max_tokens=20, temperature=0)["choices"][0]
    stop = plain["text"][3:5]
    assert len(stop) == 2
    cut = _complete(dec, prompt="to be", max_tokens=20, temperature=0, stop=[stop, "zzzz"])["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == plain["text"][:plain["text"].find(stop)]


def test_incremental_text_never_splits_a_character():
    class Bytes:
        def decode(self, ids):
            return bytes(ids).decode("utf-8", errors="replace")

    text = IncrementalText(Bytes(), ["END"])
    pieces = [text.push(b) for b in "héllo wörld E".encode()]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + text.finish() == "héllo wörld E"
    text = IncrementalText(Bytes(), ["END"])
    pieces = [text.push(b) for b in b"a ENDb"]
    assert text.stopped and "".join(pieces) == "a "


def test_token_id_model_answers_with_ids_and_empty_text(ids_server):
    choice = _complete(ids_server, prompt=[[1, 2, 3]], max_tokens=5, temperature=0)["choices"][0]
    assert choice["text"] == "" and all(isinstance(t, int) for t in choice["token_ids"])


def test_timeout_ends_with_finish_reason_timeout(slow):
    choice = _complete(slow, prompt=[1, 2, 3], max_tokens=1000, temperature=0)["choices"][0]
    assert choice["finish_reason"] == "timeout", choice
    assert len(choice["token_ids"]) < 1000


def test_health(dec):
    r = dec.client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "model": "tiny-dec", "active": 0, "queued": 0}


def test_openai_client(dec):
    client = openai.OpenAI(base_url=f"{dec.url}/v1", api_key="unused", max_retries=0)
    answer = client.completions.create(model="tiny-dec", prompt="to be", max_tokens=6, temperature=0)
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert answer.usage.completion_tokens >= 1 and answer.model == "tiny-dec"
    stream = client.completions.create(model="tiny-dec", prompt="to be", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == answer.choices[0].text


def test_metrics_count_the_requests(ids_server):
    before = _metric(ids_server, "tformer_requests", path="/v1/completions", status="200")
    tokens_before = _metric(ids_server, "tformer_tokens_generated")
    for n in (3, 4):
        _complete(ids_server, prompt=[1, 2], max_tokens=n, temperature=0, stop_token_ids=[])
    ids_server.client.post("/v1/completions", json={"prompt": [1], "n": 2})
    assert _metric(ids_server, "tformer_requests", path="/v1/completions", status="200") == before + 2
    assert _metric(ids_server, "tformer_tokens_generated") >= tokens_before + 7
    assert _metric(ids_server, "tformer_errors", kind="invalid_value") >= 1
    families = {f.name for f in text_string_to_metric_families(ids_server.client.get("/metrics").text)}
    assert {"tformer_request_seconds", "tformer_time_to_first_token_seconds", "tformer_queue_depth",
            "tformer_active_sequences"} <= families


def test_metrics_set_measured_decode_speed_beside_the_ledgers_prediction(ids_server):
    _complete(ids_server, prompt=[1, 2], max_tokens=5, temperature=0, stop_token_ids=[])
    fams = {f.name: f for f in text_string_to_metric_families(ids_server.client.get("/metrics").text)}
    rate, gain = fams["tformer_decode_tokens_per_second"], fams["tformer_decode_speedup"]
    by = {(s.labels["batch"], s.labels["source"]): s.value for s in rate.samples}
    batches = {b for b, _ in by}
    assert "1" in batches and all((b, "predicted") in by and (b, "measured") in by for b in batches)
    assert all(v > 0 for v in by.values())
    assert {s.value for s in gain.samples if s.labels == {"batch": "1", "source": "predicted"}} == {1.0}


def _metric(server, family, **labels):
    text = server.client.get("/metrics").text
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return sum(s.value for s in fam.samples if s.name.endswith("_total") and
                       all(s.labels.get(k) == v for k, v in labels.items()))
    return 0.0


def test_ignore_eos_leaves_the_end_token_out_of_the_stop_tokens():
    """ignore_eos (as vLLM's and llama.cpp's servers take it, for load tests): the end token is one more token."""
    from types import SimpleNamespace

    from tformer.serve.checks import engine_request
    from tformer.serve.schemas import CompletionRequest

    info = SimpleNamespace(eos_token_id=3)

    def stops(**body):
        return engine_request(CompletionRequest(prompt=[1, 2], **body), [1, 2], info, None).stop_tokens

    assert stops() is None  # the batcher's default: the model's end token
    assert stops(stop_token_ids=[7]) == (3, 7)
    assert stops(ignore_eos=True) == () and stops(ignore_eos=True, stop_token_ids=[7]) == (7,)
