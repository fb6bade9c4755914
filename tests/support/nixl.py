"""A decode engine's /metrics as vLLM 0.32 exports its NIXL KV-connector counters, served by a
real HTTP server on loopback (tests of the router's KV-path measurements)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

NIXL_TEXT = """# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} {count}
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} {count}
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} {seconds}
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_bucket{engine="0",le="+Inf",model_name="m"} {count}
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} {count}
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} {kv_bytes}
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} {failed}
"""


@contextmanager
def serving_nixl(values: Callable[[], Mapping[str, float]]) -> Iterator[str]:
    """Its base URL; each scrape fills NIXL_TEXT's {count}, {seconds}, {kv_bytes}, {failed} from `values()`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = NIXL_TEXT
            for k, v in values().items():
                body = body.replace("{" + k + "}", repr(float(v)))
            data = body.encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
