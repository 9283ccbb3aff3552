"""Chat with the real SmolLM2-135M-Instruct from its GGUF file: the prompt is the model's own template
rendered and tokenized as transformers does it, greedy replies equal transformers' generation from its GGUF
loader for ten conversations, replies stop at the end-of-turn token, and the context window is kept by dropping
the oldest turns. The CLI's `generate --chat` and `chat` run on it."""

from __future__ import annotations

import json

import pytest
import torch

from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.generate.chat import Chat, stop_ids
from tformer.generate.search import GenerationConfig
from tformer.model import build

# No digits: transformers' GGUF tokenizer ignores SmolLM2's digit-splitting pre-tokenizer (see
# tests/interop/test_gguf_tokenizer.py), so prompts with numbers would differ by tokenization alone.
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the treasure?"}],
    [{"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke."}],
    [{"role": "user", "content": "Explain gravity in one sentence."}],
    [{"role": "user", "content": "Translate 'good morning' into French."}],
    [{"role": "user", "content": "What do bees make?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
]


@pytest.fixture(scope="module")
def real(smollm2, smollm2_hf):
    return (*smollm2, *smollm2_hf)


def test_prompts_are_transformers_chat_template_ids(real):
    model, tokenizer, _, ref_tok = real
    chat = Chat(model, tokenizer)
    for messages in CONVERSATIONS:
        want = ref_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert chat.prompt_ids(messages) == list(want), messages


def test_greedy_replies_equal_transformers(real):
    """Ten conversations, up to 64 new tokens each, batched on both sides; each reply ends at <|im_end|>."""
    from tformer.generate import generate

    model, tokenizer, ref, ref_tok = real
    chat = Chat(model, tokenizer)
    prompts = [chat.prompt_ids(m) for m in CONVERSATIONS]
    ours = generate(model, prompts, max_new_tokens=64, stop_tokens=chat.stops).sequences
    width = max(map(len, prompts))
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=mask, max_new_tokens=64, do_sample=False, eos_token_id=2,
                           pad_token_id=2)[:, width:].tolist()
    for got, row in zip(ours, out):
        want = row[:row.index(2) + 1] if 2 in row else row
        assert got == want
    assert sum(r[-1] == 2 for r in ours) >= 5  # most replies end at the end-of-turn token, not the length cap


def test_a_reply_stops_at_end_of_turn_and_joins_the_history(real):
    model, tokenizer, _, _ = real
    chat = Chat(model, tokenizer, settings=GenerationConfig(max_new_tokens=48))
    pieces = []
    turn = chat.send("What is the capital of France?", on_text=pieces.append)
    assert turn.finish == "stop" and "Paris" in turn.text and "".join(pieces) == turn.text
    assert "<|im_end|>" not in turn.text and 2 not in turn.ids
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]
    assert stop_ids(tokenizer, 2) == [2]  # <|im_end|> is SmolLM2's EOS


def test_stop_requested_ends_the_reply_and_keeps_it(real):
    model, tokenizer, _, _ = real
    chat = Chat(model, tokenizer, settings=GenerationConfig(max_new_tokens=40))
    seen = []
    turn = chat.send("Write a long story about a dragon.", on_text=seen.append, stop_requested=lambda: len(seen) >= 3)
    assert turn.finish == "interrupted" and 3 <= len(turn.ids) < 40
    assert chat.messages[-1] == {"role": "assistant", "content": turn.text}


def test_the_oldest_turns_go_when_the_window_is_full(smollm2):
    """A small random model with SmolLM2's tokenizer and template and a 96-token window."""
    _, tokenizer = smollm2
    torch.manual_seed(0)
    config = ModelConfig(arch="decoder", vocab_size=49152, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                         max_positions=96, position="rope", norm="rmsnorm", eos_token_id=2)
    chat = Chat(build(config).eval(), tokenizer, system="Be brief.", settings=GenerationConfig(max_new_tokens=8))
    dropped = 0
    for i in range(8):
        turn = chat.send("tell me about the weather today please")
        dropped += turn.dropped
        assert turn.prompt_tokens + 8 <= 96
    assert dropped > 0 and len(chat.messages) < 16
    with pytest.raises(TformerError, match="does not fit the context") as err:
        chat.send("word " * 200)
    assert "\n" not in str(err.value)


def test_generate_chat_and_the_chat_command(capsys, monkeypatch):
    import io

    # fp32 (the file's exact values) answers Paris; the default, the block kernel, rounds activations to 8 bits as
    # llama.cpp does and answers as it does ("L'Étoile, ...": tests/serve/test_served_equals_generated.py)
    fp32 = ["--gguf-weights", "dequantize"]
    assert main(["generate", "--gguf", "smollm2-135m-instruct", *fp32, "--chat", "What is the capital of France?",
                 "--greedy", "--max-new-tokens", "24", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert "Paris" in row["reply"] and row["finish_reason"] == "stop"
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n/reset\n/nope\n"))
    assert main(["chat", "--gguf", "smollm2-135m-instruct", *fp32, "--greedy", "--max-new-tokens", "24"]) == 0
    out, err = capsys.readouterr()
    assert "Paris" in out and "conversation cleared" in err and "unknown command /nope" in err
    assert main(["generate", "--gguf", "smollm2-135m-instruct", "--system", "x", "--prompt", "hi"]) == 2
    assert "--system goes with --chat" in capsys.readouterr().err


def test_stop_ids_end_a_chat_reply_beside_the_end_of_turn(smollm2, capsys, monkeypatch):
    """`--stop-ids` is honoured by --chat and `tformer chat` (added to the template's end-of-turn tokens, not in
    place of them); an id outside the vocabulary is one line, exit 2."""
    import io

    _, tokenizer = smollm2
    paris = tokenizer.encode(" Paris")
    assert len(paris) == 1
    argv = ["--gguf", "smollm2-135m-instruct", "--gguf-weights", "dequantize", "--greedy", "--max-new-tokens", "24",
            "--stop-ids", str(paris[0])]  # fp32: the answer that says Paris (the test above)
    assert main(["generate", *argv, "--chat", "What is the capital of France?", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["reply"] == "The capital of France is" and row["finish_reason"] == "stop"
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\nName three primary colours.\n"))
    assert main(["chat", *argv]) == 0
    replies = capsys.readouterr().out.splitlines()  # the second reply, after the history, runs to its end of turn
    assert replies[0] == "The capital of France is" and len(replies) >= 2 and replies[1].strip()
    assert main(["chat", *argv[:-1], "999999"]) == 2
    err = capsys.readouterr().err
    assert "stop token 999999 is outside the vocabulary [0, 49152)" in err and err.count("\n") == 1
