"""Drives the HTTP edge with the official OpenAI Python SDK.

argv[1] is the scenario (chat, stream, tools, errors, rate_limit, fallback,
models); AIO_BASE_URL (http://127.0.0.1:PORT/v1) and AIO_API_KEY say where
and as whom. Prints one JSON object of what the SDK observed: the Rust test
(tests/api/web/sdk.rs) asserts, this script only reports, and crashes
on any exception a scenario does not expect.
"""

import json
import os
import sys
import threading
import time

import openai

BASE_URL = os.environ["AIO_BASE_URL"]
API_KEY = os.environ["AIO_API_KEY"]
HI = [{"role": "user", "content": "Hi"}]
WEATHER = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def client(**options):
    """A client of the edge; `options` override the defaults (key, retries)."""
    settings = {"api_key": API_KEY, "base_url": BASE_URL, "timeout": 30.0}
    settings.update(options)
    return openai.OpenAI(**settings)


def described(e):
    """What an API error carries, as the SDK exposes it."""
    return {
        "class": type(e).__name__,
        "status": e.status_code,
        "code": e.code,
        "type": e.type,
        "param": e.param,
        "message": e.message,
        "retry_after": e.response.headers.get("retry-after"),
        "retry_after_ms": e.response.headers.get("retry-after-ms"),
    }


def refusal(expected, call):
    """The error `call` raised, which must be an `expected`."""
    try:
        call()
    except expected as e:
        return described(e)
    raise AssertionError(f"{expected.__name__} was not raised")


def chat():
    raw = client().chat.completions.with_raw_response.create(
        model="chat",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        user="u-1",
        extra_headers={"x-trace-id": "sdk-chat-1"},
    )
    completion = raw.parse()
    choice = completion.choices[0]
    return {
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "role": choice.message.role,
        "model": completion.model,
        "object": completion.object,
        "usage": {
            "prompt_tokens": completion.usage.prompt_tokens,
            "completion_tokens": completion.usage.completion_tokens,
            "total_tokens": completion.usage.total_tokens,
        },
        "trace_header": raw.headers.get("x-trace-id"),
    }


def stream():
    chunks = client().chat.completions.create(
        model="chat",
        messages=HI,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, count, first_role, finish, usage, usage_choices = "", 0, None, None, None, None
    for chunk in chunks:
        count += 1
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
            usage_choices = len(chunk.choices)
        for choice in chunk.choices[:1]:
            if first_role is None and choice.delta.role is not None:
                first_role = choice.delta.role
            content += choice.delta.content or ""
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    return {
        "content": content,
        "chunks": count,
        "first_role": first_role,
        "finish_reason": finish,
        "usage": usage,
        "usage_chunk_choices": usage_choices,
    }


def tools():
    sdk = client()
    first = sdk.chat.completions.create(
        model="chat_tools", messages=WEATHER, tools=TOOLS, tool_choice="auto"
    )
    calls = first.choices[0].message.tool_calls or []
    # The caller runs its own tool and sends the result back.
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": c.id,
                "type": c.type,
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in calls
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": '{"temp_c": 21}'} for c in calls
    ]
    second = sdk.chat.completions.create(
        model="chat_tools", messages=WEATHER + [assistant] + results, tools=TOOLS
    )

    # Streamed: the calls arrive as deltas, merged by index.
    streamed, stream_finish = {}, None
    for chunk in sdk.chat.completions.create(
        model="chat_tools", messages=WEATHER, tools=TOOLS, stream=True
    ):
        for choice in chunk.choices[:1]:
            for delta in choice.delta.tool_calls or []:
                call = streamed.setdefault(
                    delta.index, {"id": None, "type": None, "name": "", "arguments": ""}
                )
                call["id"] = delta.id or call["id"]
                call["type"] = delta.type or call["type"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            if choice.finish_reason is not None:
                stream_finish = choice.finish_reason
    return {
        "finish_reason": first.choices[0].finish_reason,
        "tool_calls": [
            {
                "id": c.id,
                "type": c.type,
                "name": c.function.name,
                "arguments": c.function.arguments,
            }
            for c in calls
        ],
        "answer": second.choices[0].message.content,
        "stream_tool_calls": [streamed[i] for i in sorted(streamed)],
        "stream_finish_reason": stream_finish,
    }


def errors():
    sdk = client(max_retries=0)
    return {
        "auth": refusal(
            openai.AuthenticationError,
            lambda: client(api_key="wrong-key", max_retries=0).chat.completions.create(
                model="chat", messages=HI
            ),
        ),
        "permission": refusal(
            openai.PermissionDeniedError,
            lambda: client(
                max_retries=0, default_headers={"x-team-id": "someone-else"}
            ).chat.completions.create(model="chat", messages=HI),
        ),
        "not_found": refusal(
            openai.NotFoundError, lambda: sdk.models.retrieve("no-such-model")
        ),
        "bad_request": refusal(
            openai.BadRequestError,
            lambda: sdk.chat.completions.create(model="no-such-task", messages=HI),
        ),
        "unavailable": refusal(
            openai.InternalServerError,
            lambda: sdk.chat.completions.create(model="down", messages=HI),
        ),
    }


def rate_limit():
    """The server admits one request at a time; a slow one holds the slot."""
    slow = {}

    def hold_the_slot():
        # Retries in case a probe below held the slot first.
        reply = client(max_retries=20).chat.completions.create(model="slow", messages=HI)
        slow["content"] = reply.choices[0].message.content

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    refused = None
    probe = client(max_retries=0)
    for _ in range(200):
        try:
            probe.chat.completions.create(model="chat", messages=HI)
        except openai.RateLimitError as e:
            refused = described(e)
            break
        time.sleep(0.02)
    # The SDK waits as retry-after-ms says, until the slot is free again.
    raw = client(max_retries=20).chat.completions.with_raw_response.create(
        model="chat", messages=HI
    )
    retried = {
        "retries_taken": raw.retries_taken,
        "content": raw.parse().choices[0].message.content,
    }
    holder.join(timeout=30)
    return {"refused": refused, "retried": retried, "slow_content": slow.get("content")}


def fallback():
    sdk = client()
    answer = sdk.chat.completions.create(model="fallback", messages=HI)
    streamed = ""
    for chunk in sdk.chat.completions.create(model="fallback", messages=HI, stream=True):
        for choice in chunk.choices[:1]:
            streamed += choice.delta.content or ""
    return {"content": answer.choices[0].message.content, "stream_content": streamed}


def models():
    page = client().models.list()
    return {"ids": [m.id for m in page.data]}


SCENARIOS = {
    "chat": chat,
    "stream": stream,
    "tools": tools,
    "errors": errors,
    "rate_limit": rate_limit,
    "fallback": fallback,
    "models": models,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]]()))
