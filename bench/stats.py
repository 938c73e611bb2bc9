"""Statistics of repeated measurements: every figure is measured several times, beside its
baseline, and shown as a median with its range."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of `values`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Spread:
    """One figure measured once per repeat."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def show(self, digits: int = 0, unit: str = "") -> str:
        if not self.values:
            return "-"
        fmt = f"{{:,.{digits}f}}"
        median = fmt.format(self.median) + unit
        if len(self.values) == 1:
            return median
        return f"{median} [{fmt.format(min(self.values))}-{fmt.format(max(self.values))}]"


def ms(seconds: float) -> float:
    return seconds * 1000.0
