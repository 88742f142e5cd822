"""A Flower Grid over another Grid (:class:`ForwardingGrid`), stated once for the Grids that
change a few of its calls: :class:`~fedlmc.simulations.records.watched_grid.WatchedGrid` (each
reply told as it arrives) and the sweep engine's
:class:`~fedlmc.simulations.engine.grid_view.CellGrid` (one cell's view of the shared Grid).

Every call of Flower's abstract ``Grid`` goes to the Grid underneath (``self.grid``), except
``create_message``, which builds the ``Message`` itself as Flower 1.42's own Grids do (they
only log first that ``Grid.create_message`` is deprecated in favour of the ``Message``
constructor). A subclass overrides what it changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid


class ForwardingGrid(Grid):
    """A Grid whose calls go to the Grid ``self.grid`` (see the module docstring); a subclass
    sets ``grid``, as an attribute or a property."""

    grid: Grid

    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)
