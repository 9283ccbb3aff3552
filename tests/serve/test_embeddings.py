"""/v1/embeddings on a live encoder server: dynamic batches give each input what it gets alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

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
