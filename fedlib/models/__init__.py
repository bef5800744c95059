"""Models: the registry (``MODELS``, ``build_model``), the parameter groups a model declares (``param_groups``:
"bn", "attn"), pFedLA's conv nets (``convnets``) and their client-local attention modules (``local_attention``)."""

from fedlib.models.groups import param_groups
from fedlib.models.registry import KERNELS, MODELS, ModelSpec, build_model, count_parameters, kernel_of, linear_chain

__all__ = ["KERNELS", "MODELS", "ModelSpec", "build_model", "count_parameters", "kernel_of", "linear_chain",
           "param_groups"]  # fmt: skip
