"""Runs one agent turn through the HTTP edge with an SSE client library
(httpx-sse over httpx), as a browser-less caller of the turns endpoint would.

argv: base URL (http://127.0.0.1:PORT/v1), agent, message, and optionally
the conversation to continue; AIO_API_KEY is the key. Prints one JSON
object {status, content_type, events: [{event, data}]} with each event's
data parsed; the Rust test (tests/api/web/sse.rs) asserts.
"""

import json
import os
import sys

import httpx
from httpx_sse import connect_sse


def main():
    base, agent, message = sys.argv[1:4]
    body = {"message": message}
    if len(sys.argv) > 4 and sys.argv[4]:
        body["conversation_id"] = sys.argv[4]
    headers = {"Authorization": f"Bearer {os.environ['AIO_API_KEY']}"}
    events = []
    with httpx.Client(timeout=30.0) as client:
        with connect_sse(
            client, "POST", f"{base}/agents/{agent}/turns", json=body, headers=headers
        ) as source:
            response = source.response
            for sse in source.iter_sse():
                events.append({"event": sse.event, "data": json.loads(sse.data)})
    print(
        json.dumps(
            {
                "status": response.status_code,
                "content_type": response.headers.get("content-type"),
                "events": events,
            }
        )
    )


if __name__ == "__main__":
    main()
