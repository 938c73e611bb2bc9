"""An OTLP/HTTP traces endpoint on loopback, as a collector would be: the spans queuelog
exports (app/ops/tracing.py) are decoded and kept for the tests to read."""

from __future__ import annotations

import http.server
import threading
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


class Collector:
    """An OTLP/HTTP traces endpoint on loopback: each POST /v1/traces is decoded and its
    spans kept, as {"name", "trace_id", "span_id", "parent_span_id", "attributes"}."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/traces":
                    collector.take(body)
                    self.send_response(200)
                else:
                    self.send_response(404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, body: bytes) -> None:
        export = trace_service_pb2.ExportTraceServiceRequest()
        export.ParseFromString(body)
        spans = []
        for resource_spans in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "name": span.name, "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "service": service.get("service.name"),
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                    })
        with self.lock:
            self.spans.extend(spans)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"] == name]

    def __enter__(self) -> Collector:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None
