"""Models: the registry (``MODELS``, ``build_model``; ``register_model`` for a user's own), the parameter groups a model declares (``param_groups``:
"bn", "attn"), pFedLA's conv nets (``convnets``) and their client-local attention modules (``local_attention``)."""

from fedlib.models.groups import param_groups
from fedlib.models.registry import (
    KERNELS,
    MODELS,
    ModelSpec,
    build_model,
    count_parameters,
    kernel_of,
    linear_chain,
    register_model,
    unregister_model,
)

__all__ = ["KERNELS", "MODELS", "ModelSpec", "build_model", "count_parameters", "kernel_of", "linear_chain",
           "param_groups", "register_model", "unregister_model"]  # fmt: skip
