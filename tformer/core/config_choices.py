"""What each ModelConfig field that names a choice may hold (tformer.core.config validates against these): the
vocabularies of architecture parts the model, the ledger and the Hugging Face interop share."""

CELLS = ("lstm", "gru", "rnn")  # tformer.model.rnn: LSTM, GRU, Elman (tanh)
# arch='rnn-seq2seq': how the decoder reads the encoder (tformer.model.rnn_seq2seq)
RNN_ATTENTIONS = ("bahdanau", "luong-dot", "luong-general", "none")
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "relative", "none")
# rmsnorm_offset: x / rms(x) * (1 + w), its weight starting at 0 (Gemma's; checkpoints store w)
NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset")
# sandwich: pre-norm, and a norm on each sublayer's output before the residual add (Gemma 2 and 3)
PLACEMENTS = ("pre", "post", "sandwich")
LAYER_TYPES = ("full", "sliding")  # layer_types: every key, or the last attn_window keys
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "quick_gelu")  # quick_gelu: x * sigmoid(1.702 x) (CLIP)
ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")
# Task heads in place of the LM head (tformer.model.task_heads), as Hugging Face's *ForSequenceClassification,
# *ForTokenClassification and *ForQuestionAnswering; pooling: which vector a sequence classifier reads.
TASKS = ("", "sequence-classification", "token-classification", "question-answering")
POOLINGS = ("cls", "mean", "last")  # cls: the first token (through the pooler if any); last: the last real token

# Shorthands for the feed-forward block, as papers and the oracles name it.
MLP_SHORTHANDS = {
    "relu": ("relu", False),
    "gelu": ("gelu", False),
    "gelu_tanh": ("gelu_tanh", False),
    "silu": ("silu", False),
    "swiglu": ("silu", True),
    "geglu": ("gelu", True),
    "reglu": ("relu", True),
}

__all__ = ["ACTIVATIONS", "CELLS", "LAYER_TYPES", "MLP_SHORTHANDS", "NORMS", "PLACEMENTS", "POOLINGS", "POSITIONS",
           "RNN_ATTENTIONS", "ROPE_SCALINGS", "TASKS"]
