"""fedlmc: one-shot merging of independently trained client models and linear mode connectivity.

The science lives in the submodules (``fedlmc.models``, ``fedlmc.data``, ``fedlmc.train``,
``fedlmc.merge``, ``fedlmc.align``, ``fedlmc.calibrate``, ``fedlmc.metrics``,
``fedlmc.diagnostics``); none of them imports Flower.
"""

__version__ = "0.1.0"
