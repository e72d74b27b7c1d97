// bench_ref.mjs times the reference tokenizer (@anush008/tokenizers, the Hugging Face
// tokenizers library) for the Go benchmarks, which run it beside Switchyard's tokenizer:
//
//   node bench_ref.mjs NPM_DIR TOKENIZER_JSON TEXT_FILE
//
// It loads the tokenizer and the text, prints "ready", then for each line "N" read from stdin
// encodes the text N times (add_special_tokens=false, one at a time) and prints the elapsed
// nanoseconds, the token count and the CPU time the process spent, in nanoseconds (the machine
// may be shared: CPU time is what the comparison uses). Run it with RAYON_NUM_THREADS=1 for
// one core.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';

const [npmDir, tokFile, textFile] = process.argv.slice(2);
const require = createRequire(path.resolve(npmDir, 'package.json'));
const { Tokenizer } = require('@anush008/tokenizers');
const tok = Tokenizer.fromFile(tokFile);
const text = fs.readFileSync(textFile, 'utf8');
await tok.encode(text, null, { addSpecialTokens: false }); // warm up, as Go's first run does
console.log('ready');
for await (const line of readline.createInterface({ input: process.stdin })) {
  const n = Number(line);
  let ids = 0;
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < n; i++) ids = (await tok.encode(text, null, { addSpecialTokens: false })).getLength();
  const t1 = process.hrtime.bigint();
  const c1 = process.cpuUsage(c0);
  console.log(`${t1 - t0} ${ids} ${(c1.user + c1.system) * 1000}`);
}
