"""After pretraining: adapt a model to a task cheaply (PEFT: LoRA, adapters, prompt and prefix tuning, BitFit),
make it smaller (quantization, pruning, distillation) and hand it to another runtime (ONNX).

Sits above interop (it reads Hugging Face and peft names) and below measure, teach, generate and train.
"""

from tformer.adapt.distill import DistillRunner, distillation_loss, student_from_teacher
from tformer.adapt.peft import apply_peft, merge_peft, trainable_parameters, unmerge_peft
from tformer.adapt.peft_format import load_adapter, save_adapter
from tformer.adapt.prune import importance, magnitude_prune, prune_structured
from tformer.adapt.quantize import dynamic_int8, quantize_model

__all__ = ["apply_peft", "trainable_parameters"]
__all__ += ["merge_peft", "unmerge_peft"]
__all__ += ["load_adapter", "save_adapter"]
__all__ += ["DistillRunner", "distillation_loss", "student_from_teacher"]
__all__ += ["importance", "magnitude_prune", "prune_structured"]
__all__ += ["dynamic_int8", "quantize_model"]
