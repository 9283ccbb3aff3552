"""After pretraining: adapt a model to a task cheaply (PEFT: LoRA, adapters, prompt and prefix tuning, BitFit),
make it smaller (quantization, pruning, distillation) and hand it to another runtime (ONNX).

Sits above interop (it reads Hugging Face and peft names) and below measure, teach, generate and train.
"""

from tformer.adapt.peft import apply_peft, trainable_parameters
from tformer.adapt.quantize import dynamic_int8, quantize_model

__all__ = ["apply_peft", "trainable_parameters"]
__all__ += ["dynamic_int8", "quantize_model"]
