"""A client actor that died is replaced: one dead actor fails one message, not every later one.

Flower 1.42's Ray backend (``flwr.server.superlink.fleet.vce.backend.raybackend.RayBackend``)
puts the actor that ran a message back into its pool whatever happened, a dead one included.
The pool (``flwr.simulation.ray_transport.ray_actor.BasicActorPool``) hands out the actor added
last first, so after an actor died (its process killed: out of memory, Ray's memory monitor, a
crashed extension) every later message went to the dead actor first and failed at once: in a
sweep, every later cell lost that client. While :func:`dead_actors_replaced` is active, a
message whose actor died still fails (its client is dropped by name, as any failed client is),
and the pool's record of which actor ran that message is changed to a new actor of the same
kind before Flower puts "it" back: the dead actor never returns to the pool, and no other
message can be handed the dead actor in between. The new actor starts (imports, data) on its
first message. Only a dead actor (``ray.exceptions.ActorDiedError``) is replaced, not one that
is briefly unreachable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def dead_actors_replaced() -> Iterator[None]:
    """While the block runs, Flower's actor pool replaces an actor that died on a message
    (module doc); the pool's own method is restored after it."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool

    fetch = BasicActorPool.fetch_result_and_return_actor_to_pool

    def fetch_replacing_the_dead(self: BasicActorPool, future: Any) -> Any:
        try:
            return fetch(self, future)
        except ray.exceptions.ActorDiedError:
            if future in self._future_to_actor and ray.is_initialized():
                self._future_to_actor[future] = self.create_actor_fn()
            raise

    BasicActorPool.fetch_result_and_return_actor_to_pool = fetch_replacing_the_dead
    try:
        yield
    finally:
        BasicActorPool.fetch_result_and_return_actor_to_pool = fetch
