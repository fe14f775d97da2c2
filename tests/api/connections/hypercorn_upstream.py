"""A fake OpenAI Chat Completions upstream served by hypercorn: HTTP/2 by
prior knowledge (and HTTP/1.1), with hypercorn's own connection policy.
After `keep_alive_max_requests` requests on a connection hypercorn sends a
GOAWAY and then closes the connection, cutting the streams still in flight
(nginx's `keepalive_requests` does the same, 1,000 by default in both).

Usage: python hypercorn_upstream.py MAX_REQUESTS_PER_CONNECTION
Prints the port it listens on (127.0.0.1), then serves until killed.
`GET /stats` answers `{"busiest_connection": N}`: the most requests one
connection (client address and port) was served, so a test can tell
whether any connection reached the limit and was ended."""
import asyncio
import json
import socket
import sys
from collections import Counter

from hypercorn.asyncio import serve
from hypercorn.config import Config

BODY = json.dumps({
    "id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1732000000,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Brief."},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138},
}).encode()


# Requests served per connection (client address and port).
served = Counter()


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stats":
        stats = json.dumps({"busiest_connection": max(served.values(), default=0)})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": stats.encode()})
        return
    served[tuple(scope.get("client") or ())] += 1
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    # The body in two parts, as a provider's arrives: a connection ended
    # meanwhile cuts it.
    half = len(BODY) // 2
    await send({"type": "http.response.body", "body": BODY[:half], "more_body": True})
    await asyncio.sleep(0.02)
    await send({"type": "http.response.body", "body": BODY[half:]})


sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(128)
print(sock.getsockname()[1], flush=True)
config = Config()
config.bind = [f"fd://{sock.fileno()}"]
config.keep_alive_max_requests = int(sys.argv[1])
config.loglevel = "WARNING"
asyncio.run(serve(app, config))
