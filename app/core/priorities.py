"""Job priorities: the levels, their labels and their stored integers."""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """Stored as integers with gaps, so a level can be added without renumbering."""

    LOW = 0
    MEDIUM = 10
    HIGH = 20
    CRITICAL = 30

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def from_label(cls, label: str) -> Priority:
        try:
            return cls[label.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown priority {label!r}") from None


PRIORITY_LABELS = tuple(p.label for p in Priority)
