"""Cancel generations: a counter bumped by every barge-in, so work started before it is known to be stale.

One writer (the call's control side), many readers (stage threads, the sender). Every field is a plain int,
bool or None, each read and written whole, so readers need no lock: at worst they see the state from just
before a change, which the next check catches.
"""

from __future__ import annotations

GENERATION_MODULUS = 2**32
"""Generations wrap here, so a long call never grows the counter without bound."""


def precedes(generation: int, other: int) -> bool:
    """Whether `generation` came before `other`, across the wrap (they are never half the range apart)."""
    return 0 < (other - generation) % GENERATION_MODULUS < GENERATION_MODULUS // 2


class CancelScope:
    """The current cancel generation of one call, and whether output of a cancelled response is discarded."""

    def __init__(self) -> None:
        self._generation = 0
        self._discarding = False
        self._discarded_generation: int | None = None

    @property
    def generation(self) -> int:
        """The current generation; starts at 0."""
        return self._generation

    @property
    def discarding(self) -> bool:
        """True from a cancel until the discarded response is done."""
        return self._discarding

    def cancel(self) -> None:
        """Discard the current generation's output and move on to the next generation."""
        self._discarded_generation = self._generation
        # Set before the bump, so no reader sees the new generation without the discard.
        self._discarding = True
        self._generation = (self._generation + 1) % GENERATION_MODULUS

    def is_stale(self, gen: int) -> bool:
        """Whether work tagged with `gen` started before the latest cancel."""
        return gen != self._generation

    def response_done(self, generation: int | None = None) -> None:
        """End the discard; a `generation` that is neither the discarded nor the current one is ignored.

        That keeps a late "done" from an older response from ending the discard of a newer one.
        """
        if generation is not None and generation not in (self._discarded_generation, self._generation):
            return
        self._discarding = False

    def new_response(self) -> None:
        """End the discard: an explicit new response starts."""
        self._discarding = False

    def reset(self) -> None:
        """Clear the discard and the discarded generation; the counter keeps its value."""
        self._discarding = False
        self._discarded_generation = None

    def should_drop(self, gen: int | None) -> bool:
        """Whether output tagged with `gen` (None: untagged) must not reach the caller.

        Dropped when stale, or while discarding when not of the current generation; untagged output is
        dropped while discarding.
        """
        if gen is None:
            return self._discarding
        # "Discarding and not current" adds nothing here: a generation other than the current one is stale.
        return self.is_stale(gen)
