// Drives the HTTP edge with the official OpenAI Node SDK: the same
// scenarios and the same JSON keys as openai_sdk.py beside it.
//
// argv[2] is the scenario (chat, stream, tools, errors, rate_limit,
// fallback, models); AIO_BASE_URL (http://127.0.0.1:PORT/v1) and
// AIO_API_KEY say where and as whom, AIO_OPENAI_NODE is the installed
// package's folder. Prints one JSON object of what the SDK observed: the
// Rust test (tests/api/web/sdk.rs) asserts, this script only reports,
// and fails on any error a scenario does not expect.

import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const sdk = require(process.env.AIO_OPENAI_NODE);
const OpenAI = sdk.OpenAI ?? sdk.default;

const BASE_URL = process.env.AIO_BASE_URL;
const API_KEY = process.env.AIO_API_KEY;
const HI = [{ role: 'user', content: 'Hi' }];
const WEATHER = [{ role: 'user', content: 'Weather in Paris?' }];
const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' } },
        required: ['city'],
      },
    },
  },
];

/** A client of the edge; `options` override the defaults (key, retries). */
function client(options = {}) {
  return new OpenAI({ apiKey: API_KEY, baseURL: BASE_URL, timeout: 30_000, ...options });
}

/** What an API error carries, as the SDK exposes it (keys as in Python). */
function described(e) {
  return {
    class: e.constructor.name,
    status: e.status,
    code: e.code ?? null,
    type: e.type ?? null,
    param: e.param ?? null,
    message: e.message,
    retry_after: e.headers?.get('retry-after') ?? null,
    retry_after_ms: e.headers?.get('retry-after-ms') ?? null,
  };
}

/** The error `call` rejected with, which must be an `expected`. */
async function refusal(expected, call) {
  try {
    await call();
  } catch (e) {
    if (e instanceof expected) return described(e);
    throw e;
  }
  throw new Error(`${expected.name} was not thrown`);
}

async function chat() {
  const { data, response } = await client()
    .chat.completions.create(
      {
        model: 'chat',
        messages: [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: 'Hi' },
        ],
        user: 'u-1',
      },
      { headers: { 'x-trace-id': 'sdk-chat-1' } },
    )
    .withResponse();
  const choice = data.choices[0];
  return {
    content: choice.message.content,
    finish_reason: choice.finish_reason,
    role: choice.message.role,
    model: data.model,
    object: data.object,
    usage: {
      prompt_tokens: data.usage.prompt_tokens,
      completion_tokens: data.usage.completion_tokens,
      total_tokens: data.usage.total_tokens,
    },
    trace_header: response.headers.get('x-trace-id'),
  };
}

async function stream() {
  const chunks = await client().chat.completions.create({
    model: 'chat',
    messages: HI,
    stream: true,
    stream_options: { include_usage: true },
  });
  let content = '';
  let count = 0;
  let firstRole = null;
  let finish = null;
  let usage = null;
  let usageChoices = null;
  for await (const chunk of chunks) {
    count += 1;
    if (chunk.usage) {
      usage = chunk.usage;
      usageChoices = chunk.choices.length;
    }
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (firstRole === null && choice.delta.role) firstRole = choice.delta.role;
    content += choice.delta.content ?? '';
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return {
    content,
    chunks: count,
    first_role: firstRole,
    finish_reason: finish,
    usage,
    usage_chunk_choices: usageChoices,
  };
}

async function tools() {
  const openai = client();
  const first = await openai.chat.completions.create({
    model: 'chat_tools',
    messages: WEATHER,
    tools: TOOLS,
    tool_choice: 'auto',
  });
  const calls = first.choices[0].message.tool_calls ?? [];
  // The caller runs its own tool and sends the result back.
  const assistant = {
    role: 'assistant',
    content: null,
    tool_calls: calls.map((c) => ({
      id: c.id,
      type: c.type,
      function: { name: c.function.name, arguments: c.function.arguments },
    })),
  };
  const results = calls.map((c) => ({
    role: 'tool',
    tool_call_id: c.id,
    content: '{"temp_c": 21}',
  }));
  const second = await openai.chat.completions.create({
    model: 'chat_tools',
    messages: [...WEATHER, assistant, ...results],
    tools: TOOLS,
  });

  // Streamed: the calls arrive as deltas, merged by index.
  const streamed = new Map();
  let streamFinish = null;
  const chunks = await openai.chat.completions.create({
    model: 'chat_tools',
    messages: WEATHER,
    tools: TOOLS,
    stream: true,
  });
  for await (const chunk of chunks) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    for (const delta of choice.delta.tool_calls ?? []) {
      if (!streamed.has(delta.index)) {
        streamed.set(delta.index, { id: null, type: null, name: '', arguments: '' });
      }
      const call = streamed.get(delta.index);
      call.id = delta.id ?? call.id;
      call.type = delta.type ?? call.type;
      call.name += delta.function?.name ?? '';
      call.arguments += delta.function?.arguments ?? '';
    }
    if (choice.finish_reason) streamFinish = choice.finish_reason;
  }
  return {
    finish_reason: first.choices[0].finish_reason,
    tool_calls: calls.map((c) => ({
      id: c.id,
      type: c.type,
      name: c.function.name,
      arguments: c.function.arguments,
    })),
    answer: second.choices[0].message.content,
    stream_tool_calls: [...streamed.keys()].sort((a, b) => a - b).map((i) => streamed.get(i)),
    stream_finish_reason: streamFinish,
  };
}

async function errors() {
  const openai = client({ maxRetries: 0 });
  return {
    auth: await refusal(sdk.AuthenticationError, () =>
      client({ apiKey: 'wrong-key', maxRetries: 0 }).chat.completions.create({
        model: 'chat',
        messages: HI,
      }),
    ),
    permission: await refusal(sdk.PermissionDeniedError, () =>
      client({
        maxRetries: 0,
        defaultHeaders: { 'x-team-id': 'someone-else' },
      }).chat.completions.create({ model: 'chat', messages: HI }),
    ),
    not_found: await refusal(sdk.NotFoundError, () => openai.models.retrieve('no-such-model')),
    bad_request: await refusal(sdk.BadRequestError, () =>
      openai.chat.completions.create({ model: 'no-such-task', messages: HI }),
    ),
    unavailable: await refusal(sdk.InternalServerError, () =>
      openai.chat.completions.create({ model: 'down', messages: HI }),
    ),
  };
}

/** The server admits one request at a time; a slow one holds the slot. */
async function rateLimit() {
  // Retries in case a probe below held the slot first.
  const slow = client({ maxRetries: 20 })
    .chat.completions.create({ model: 'slow', messages: HI })
    .then((reply) => reply.choices[0].message.content);
  let refused = null;
  const probe = client({ maxRetries: 0 });
  for (let i = 0; i < 200 && refused === null; i++) {
    try {
      await probe.chat.completions.create({ model: 'chat', messages: HI });
    } catch (e) {
      if (!(e instanceof sdk.RateLimitError)) throw e;
      refused = described(e);
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  // The SDK waits as retry-after-ms says, until the slot is free again;
  // the calls that reached our fetch are the attempts.
  let attempts = 0;
  const counting = client({
    maxRetries: 20,
    fetch: (url, init) => {
      attempts += 1;
      return fetch(url, init);
    },
  });
  const reply = await counting.chat.completions.create({ model: 'chat', messages: HI });
  const retried = { retries_taken: attempts - 1, content: reply.choices[0].message.content };
  return { refused, retried, slow_content: await slow };
}

async function fallback() {
  const openai = client();
  const answer = await openai.chat.completions.create({ model: 'fallback', messages: HI });
  let streamed = '';
  const chunks = await openai.chat.completions.create({
    model: 'fallback',
    messages: HI,
    stream: true,
  });
  for await (const chunk of chunks) {
    streamed += chunk.choices[0]?.delta.content ?? '';
  }
  return { content: answer.choices[0].message.content, stream_content: streamed };
}

async function models() {
  const page = await client().models.list();
  return { ids: page.data.map((m) => m.id) };
}

const SCENARIOS = {
  chat,
  stream,
  tools,
  errors,
  rate_limit: rateLimit,
  fallback,
  models,
};

const report = await SCENARIOS[process.argv[2]]();
// Exit once the report is written: idle keep-alive sockets must not hold
// the process open.
process.stdout.write(JSON.stringify(report) + '\n', () => process.exit(0));
