// Package tokenizer turns prompt text into token IDs for the router and the mock engine.
//
// # What it owns
//
//   - The Tokenizer contract (Encode, Decode) and the ChatTemplater contract
//     (ApplyChatTemplate), which a later Hugging Face tokenizer with a Jinja chat template
//     will implement as well.
//   - ValidUTF8, the decoding of ill-formed UTF-8 that the reference tokenizers and Python
//     see (one U+FFFD per maximal subpart), shared by tokenizer/hf and tokenizer/jinja.
//   - Simple, the built-in tokenizer: deterministic, allocation-light and about one token per
//     four bytes of English text. The router and the mock engine both use it until a real
//     tokenizer is configured, so identical text gives identical token IDs on both sides and
//     the router's block hashes match the engine's.
//
// # Simple's rules
//
// Text is cut into pieces: a word (a run of letters, digits or non-ASCII bytes), a
// punctuation run, or a whitespace run; a single space directly before a word or punctuation
// run belongs to that piece (" the"). A special token "<|name|>" (name: 1 to 32 ASCII
// letters, digits or underscores) is one piece. Pieces longer than four bytes, except special
// tokens, are cut into four-byte chunks. A one-byte piece has the byte's value as its ID; any
// other piece has the ID 256 + FNV-1a(piece) mod 50000, so every ID is below VocabSize.
// Decode is best effort: it knows single bytes, special tokens and a built-in table of common
// English pieces, and writes U+FFFD for any other ID.
//
// Simple's chat template renders each message as "<|role|>\n" + content + "\n" and ends with
// the generation prompt "<|assistant|>\n", so the prompt of one turn of a conversation is a
// text prefix (and, when the assistant's reply does not start with whitespace, a token
// prefix) of the next turn's prompt.
//
// # Concurrency model
//
// A Simple is immutable after NewSimple and safe for concurrent use. Encode and Decode
// allocate only their result; the Append forms allocate nothing when dst has room.
//
// # What a caller must release
//
// Nothing.
package tokenizer
