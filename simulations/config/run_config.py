"""A validated run config: the read-only mapping that :func:`validate_run_config` returns,
so that a run config is validated once, at the boundary where it enters (the CLI,
``run_federation``, the sweep file, the ServerApp's ``main``), and passed on as it is.

Every later entry point that takes a run config (``run_federation``, the sweep engine's cells,
``run_server``, the ClientApp's config of a message) validates a plain mapping and takes a
:class:`RunConfig` unchanged when it was validated with at least the checks it asks for
(:meth:`RunConfig.covers`). A :class:`RunConfig` cannot be changed in place: a changed copy is
a plain ``dict``, validated again where it enters, or, for a change that no check reads (a path
made absolute), :meth:`RunConfig.with_paths`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RunConfig"]


class RunConfig(Mapping[str, Any]):
    """A validated run config (hyphenated keys -> scalars), read-only.

    ``devices_checked``: the checks about this machine ran (data on disk, memory, CUDA);
    ``whole_run``: the checks about the whole run ran (``fedavg-rounds``, ``warmup-rounds``
    against ``epochs``), as opposed to a client's config of one round."""

    def __init__(
        self, values: Mapping[str, Any], *, devices_checked: bool, whole_run: bool
    ) -> None:
        self._values = dict(values)
        self.devices_checked = bool(devices_checked)
        self.whole_run = bool(whole_run)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"

    def covers(self, *, check_devices: bool, whole_run: bool) -> bool:
        """Whether this config was validated with every check that ``check_devices`` and
        ``whole_run`` ask for (so validating it again would change nothing)."""
        return (self.devices_checked or not check_devices) and (self.whole_run or not whole_run)

    def with_paths(self, paths: Mapping[str, str]) -> RunConfig:
        """A copy with the path keys ``paths`` (``data-root``, ``dataset``, ``model``) replaced
        by the same locations written otherwise (made absolute), still validated; ``KeyError``
        for a key that is not one of those."""
        bad = sorted(set(paths) - PATH_KEYS)
        if bad:
            raise KeyError(f"{bad[0]!r} is not a path key; allowed: {', '.join(sorted(PATH_KEYS))}")
        values = {**self._values, **paths}
        return RunConfig(values, devices_checked=self.devices_checked, whole_run=self.whole_run)


PATH_KEYS = frozenset({"data-root", "dataset", "model"})
"""The keys :meth:`RunConfig.with_paths` may rewrite: where the data and a model factory are."""
