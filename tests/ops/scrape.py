"""Reading a /metrics answer in tests."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """The samples of one exposition, looked up by sample name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def get(self, name: str, default: float | None = None, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())), default)

    def names(self) -> set[str]:
        return {name for name, _labels in self.samples}

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(labels)[label] for sample_name, labels in self.samples
                if sample_name == name and label in dict(labels)}

    def requests(self, method: str, route: str, status: int) -> float:
        """How many requests the latency histogram counted for this method, route and status."""
        return self.get("queuelog_http_request_duration_seconds_count", 0.0,
                        method=method, route=route, status=str(status)) or 0.0
