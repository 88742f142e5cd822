"""Models: width-scalable classifiers and the registry they are built from.

- :mod:`fedlmc.models.registry`: :func:`register_model` / :func:`model_entry` (no torch import).
- :mod:`fedlmc.models.classifiers`: the MLP, VGG-11 and ResNet-20 and :func:`build_model`.
- :mod:`fedlmc.models.vit`: the Vision Transformer.
- :mod:`fedlmc.models.sizes`: the built-ins' layouts and parameter counts (no torch).
"""

from fedlmc._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["register_model", "model_entry", "model_names", "NORMS"], ".registry"),
    **dict.fromkeys(
        ["build_model", "MLP", "VGG11", "ResNet20", "BasicBlock", "DenseBlock", "ConvBlock"]
        + ["scaled", "norm_layer"],
        ".classifiers",
    ),
    "ViT": ".vit",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
