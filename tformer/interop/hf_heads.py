"""Hugging Face task-head classes <-> tformer's task heads (config.task; tformer.model.task_heads), torch-free.

Each class tformer holds is one Linear over the body's states, named in the file beside the body:

    BertForSequenceClassification  bert.* + pooler, classifier (bias)   task sequence-classification, pooling cls
    BertForTokenClassification     bert.* (no pooler), classifier       task token-classification
    BertForQuestionAnswering       bert.* (no pooler), qa_outputs (2)   task question-answering
    GPT2ForSequenceClassification  transformer.*, score (no bias)       pooling last (the last token not pad_token_id)
    Llama/MistralForSequenceClassification  model.*, score (no bias)    pooling last

Other heads are refused by name: RoBERTa's sequence head is dense + tanh + out_proj, DistilBERT's is
pre_classifier + ReLU + classifier, GPT-2's token and answer heads carry a bias tformer's decoder head has not.
"""

from __future__ import annotations

from tformer.core.errors import TformerError
from tformer.interop.hf_fields import labels_out
from tformer.interop.hf_rules import Rule, linear_rules

# class -> (model_type, task, the head's name in the file)
HEAD_CLASSES = {
    "BertForSequenceClassification": ("bert", "sequence-classification", "classifier"),
    "BertForTokenClassification": ("bert", "token-classification", "classifier"),
    "BertForQuestionAnswering": ("bert", "question-answering", "qa_outputs"),
    "GPT2ForSequenceClassification": ("gpt2", "sequence-classification", "score"),
    "LlamaForSequenceClassification": ("llama", "sequence-classification", "score"),
    "MistralForSequenceClassification": ("mistral", "sequence-classification", "score"),
}
_TASK_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
                  "ForMultipleChoice")
# A decoder's task head reads the last real token (HF's rule: the rightmost id that is not pad_token_id).
_POOLING = {"bert": "cls", "gpt2": "last", "llama": "last", "mistral": "last"}


def _supported() -> str:
    return ", ".join(HEAD_CLASSES)


def head_class(d: dict) -> str | None:
    """The task-head class a config.json's ``architectures`` names, or None for a body / LM / MLM file.
    A task class tformer cannot hold raises, naming it and the ones it can."""
    for name in d.get("architectures") or ():
        if name in HEAD_CLASSES:
            if HEAD_CLASSES[name][0] != d.get("model_type"):
                raise TformerError(f"architectures names {name} but model_type is '{d.get('model_type')}'; "
                                   "config.json is inconsistent")
            return name
        if name.endswith(_TASK_SUFFIXES):
            raise TformerError(f"{name} is a task head tformer does not read or write (tformer's heads are one "
                               f"Linear as these classes have it); supported: {_supported()}")
    return None


def head_fields(d: dict) -> dict:
    """The task fields of ModelConfig for a config.json of a head class (none for other files)."""
    name = head_class(d)
    if name is None:
        return {}
    model_type, task, _ = HEAD_CLASSES[name]
    labels = len(d["id2label"]) if d.get("id2label") else int(d.get("num_labels", 2))
    problem = d.get("problem_type")
    if task == "question-answering":
        if labels != 2:
            raise TformerError(f"{name} with num_labels={labels}: tformer's answer head scores a start and an end "
                               "(num_labels=2)")
        labels = 0  # tformer's default: a question-answering head always has its 2 outputs
    elif task == "token-classification" and labels == 1:
        raise TformerError(f"{name} with num_labels=1 scores one class (its loss is always 0); tformer reads one "
                           "output per token as regression: set num_labels to the number of classes")
    elif problem == "regression" and labels != 1:
        raise TformerError(f"{name} with problem_type='regression' over {labels} outputs: tformer regresses one "
                           "value (num_labels=1); more outputs with float labels are multi-label (BCE)")
    elif problem == "single_label_classification" and labels == 1:
        raise TformerError(f"{name} with problem_type='single_label_classification' and num_labels=1: one output "
                           "is regression in tformer; set num_labels to the number of classes")
    fields = dict(task=task, n_classes=labels)
    if model_type == "bert":  # BertForTokenClassification and ...QuestionAnswering: add_pooling_layer=False
        fields.update(lm_head=False, pooler=task == "sequence-classification", pair_head=False)
    if task == "sequence-classification":
        fields["pooling"] = _POOLING[model_type]
    return fields


def head_class_for(config, model_type: str) -> str:
    """The HF class save_hf writes for a task config (refused where no class holds it)."""
    for name, (mt, task, _) in HEAD_CLASSES.items():
        if mt == model_type and task == config.task:
            break
    else:
        raise TformerError(f"a {model_type} model with task='{config.task}' has no Hugging Face class tformer can "
                           f"write; supported: {_supported()}")
    if config.task == "token-classification" and config.n_classes == 1:
        raise TformerError(f"{name} has no per-token regression (one label is one class, cross-entropy); "
                           "keep tformer's own checkpoint format for n_classes=1")
    if config.task == "sequence-classification":
        if config.pooling != _POOLING[model_type]:
            raise TformerError(f"{name} pools '{_POOLING[model_type]}', not pooling='{config.pooling}'; save with "
                               f"pooling={_POOLING[model_type]} or keep tformer's own checkpoint format")
        if model_type == "bert" and not config.pooler:
            raise TformerError(f"{name} reads the [CLS] state through the pooler; build the model with pooler=true "
                               "or keep tformer's own checkpoint format")
    return name


def head_config_out(config, model_type: str) -> dict:
    """The config.json keys of a task config: its class and its number of labels."""
    name = head_class_for(config, model_type)
    n = 2 if config.task == "question-answering" else config.n_classes
    return {"architectures": [name], **labels_out(n)}


def head_from_file(back, config):
    """The read-back of a saved task config as ``config`` where the file says the same in its own terms:
    an answer head's n_classes (0 and 2 both mean start + end), a token / answer head's unused pooler."""
    if not config.task:
        return back
    changes = {}
    if config.task == "question-answering":
        changes["n_classes"] = config.n_classes
    if config.task != "sequence-classification" and config.traits.text_encoder:
        changes["pooler"] = config.pooler
    return back.replace(**changes) if changes else back


def task_rules(config, model_type: str, rules: list[Rule], aliases: list) -> tuple[list[Rule], list]:
    """A family's body rules with its LM / MLM head swapped for the task head (``rules``, ``aliases``: the
    family table's); token and answer heads keep no pooler (HF builds them with add_pooling_layer=False)."""
    if not config.task:
        return rules, aliases
    name = head_class_for(config, model_type)
    drop = ("lm_head.", "mlm_head.", "pair_head.") + (() if config.task == "sequence-classification" else ("pooler.",))
    body = [r for r in rules if not r.ours[0].startswith(drop)]
    return body + linear_rules(HEAD_CLASSES[name][2], "head", config.traits.text_encoder), []
