"""A client actor that died is replaced: one dead actor fails one message, not every later one.

Flower 1.42's Ray backend (``flwr.server.superlink.fleet.vce.backend.raybackend.RayBackend``)
puts the actor that ran a message back into its pool whatever happened, a dead one included.
The pool hands out the actor added last first, so after an actor died (its process killed:
out of memory, Ray's memory monitor, a crashed extension) every later message went to the dead
actor first and failed at once: in a sweep, every later cell lost that client. While
:func:`dead_actors_replaced` is active, a message whose actor died still fails (its client is
dropped by name, as any failed client is), and the dead actor's place in the pool goes to a new
actor of the same kind; the new actor starts (imports, data) on its first message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def dead_actors_replaced() -> Iterator[None]:
    """While the block runs, Flower's Ray backend replaces an actor that died on a message
    (module doc); the backend's own method is restored after it."""
    import ray.exceptions
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    process_message = RayBackend.process_message

    def replacing(self: RayBackend, message: Any, context: Any) -> Any:
        try:
            return process_message(self, message, context)
        except ray.exceptions.RayActorError as died:
            replace_dead_actor(self.pool, died.actor_id)
            raise

    RayBackend.process_message = replacing
    try:
        yield
    finally:
        RayBackend.process_message = process_message


def replace_dead_actor(pool: Any, actor_id: str | None) -> bool:
    """Put a new actor in the place of the idle actor ``actor_id`` (hex) of Flower's
    ``BasicActorPool`` ``pool``; ``False`` when no idle actor has that id (nothing changes)."""
    for actor in list(pool.pool):
        if actor_id is not None and actor._actor_id.hex() == actor_id:
            pool.pool.remove(actor)
            pool.pool.append(pool.create_actor_fn())
            return True
    return False
