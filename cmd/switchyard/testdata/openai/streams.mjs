// Drives Switchyard with the official OpenAI SDK's streaming client, for the hostile-client
// tests (cmd/switchyard/hostile_test.go).
//
// usage: node streams.mjs SDK_DIR BASE_URL MODEL STREAMS MAX_TOKENS
//
// It opens STREAMS concurrent chat completion streams, prints "first I" when stream I has
// received its first chunk, then one JSON line per stream once all have ended:
//   {"stream": I, "outcome": "complete" | "api_error" | "other_error", "chunks": N,
//    "finish_reason": ..., "status": ..., "code": ..., "error": "..."}
// "complete": the SDK ended the iteration normally; "api_error": it raised an APIError (an
// error answer or an error event); "other_error": anything else (a malformed event the SDK
// could not parse, a broken connection).
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';

const [sdkDir, baseURL, model, streams, maxTokens] = process.argv.slice(2);
const require = createRequire(join(sdkDir, 'package.json'));
const entry = join(dirname(require.resolve('openai')), 'index.mjs');
const { default: OpenAI, APIError } = await import(pathToFileURL(entry).href);

const client = new OpenAI({ baseURL: baseURL + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });

async function one(i) {
  const r = { stream: i, outcome: 'complete', chunks: 0, finish_reason: null };
  try {
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'tell me a long story, stream ' + i }],
      max_tokens: Number(maxTokens),
      stream: true,
    });
    for await (const chunk of stream) {
      if (r.chunks++ === 0) console.log('first ' + i);
      const fr = chunk.choices?.[0]?.finish_reason;
      if (fr) r.finish_reason = fr;
    }
  } catch (e) {
    if (e instanceof APIError) {
      r.outcome = 'api_error';
      r.status = e.status ?? null;
      r.code = e.code ?? e.error?.code ?? null;
    } else {
      r.outcome = 'other_error';
    }
    r.error = String(e?.name) + ': ' + String(e?.message).slice(0, 300);
  }
  return r;
}

const results = await Promise.all(Array.from({ length: Number(streams) }, (_, i) => one(i)));
for (const r of results) console.log(JSON.stringify(r));
