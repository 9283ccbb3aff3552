"""POST /v1/chat/completions on the real SmolLM2-135M-Instruct: the messages through its chat template, the
reply ending at <|im_end|> and equal to the same conversation through tformer.generate.chat, streamed as
OpenAI's chat.completion.chunk deltas, OpenAI-shaped 400s naming the field, concurrent requests batched, and
OpenAI's own client reading it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from fastapi.testclient import TestClient

from tformer.generate.chat import Chat
from tformer.generate.search import GenerationConfig
from tformer.serve import create_app
from tformer.serve.app import ServeSettings

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(smollm2):
    model, tokenizer = smollm2
    with TestClient(create_app(model, tokenizer, name="smollm2", settings=ServeSettings(max_batch=8))) as c:
        yield c


def test_a_reply_is_the_chat_sessions_reply(client, smollm2):
    r = client.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 32})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    turn = Chat(*smollm2, settings=GenerationConfig(max_new_tokens=32)).send(QUESTION[0]["content"])
    assert choice["message"]["content"] == turn.text and "Paris" in turn.text
    assert body["usage"]["completion_tokens"] == len(turn.ids)
    assert body["usage"]["prompt_tokens"] == len(Chat(*smollm2).prompt_ids(QUESTION))


def test_streaming_sends_deltas_then_usage(client):
    body = {"messages": QUESTION, "temperature": 0, "max_tokens": 32, "stream": True,
            "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert "Paris" in text and "<|im_end|>" not in text
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages"),
    ({"messages": QUESTION, "max_tokens": 100000}, "max_tokens"),
    ({"messages": QUESTION, "temperature": -1}, "temperature"),
    ({"messages": QUESTION, "tools": []}, "tools"),
    ({}, "messages"),
])
def test_bad_requests_are_400_naming_the_field_and_the_server_goes_on(client, body, param):
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = client.post("/v1/chat/completions", json={"messages": QUESTION, "temperature": 0, "max_tokens": 2})
    assert ok.status_code == 200


def test_concurrent_chats_are_batched_and_each_answered(client):
    questions = ["What is the capital of France?", "Name a colour.", "What do bees make?", "Say hello."]

    def ask(q):
        return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": q}],
                                                          "temperature": 0, "max_tokens": 16})
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, questions))
    assert all(a.status_code == 200 for a in answers)
    alone = ask(questions[0]).json()["choices"][0]["message"]["content"]
    assert answers[0].json()["choices"][0]["message"]["content"] == alone


def test_the_openai_client_reads_it(smollm2):
    model, tokenizer = smollm2
    app = create_app(model, tokenizer, name="smollm2")
    with TestClient(app) as c:
        api = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=c)
        out = api.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
        assert "Paris" in out.choices[0].message.content
