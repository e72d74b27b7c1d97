package hf

// wordModel turns one pre-tokenized piece of normalized text into token IDs: BPE, WordPiece
// or Unigram.
type wordModel interface {
	// appendWord appends the IDs of the piece w to dst.
	appendWord(dst []uint32, w string) []uint32
	// cutEnd returns the end of the first chunk of a long piece that the model encodes as it
	// would encode the whole piece (len(w) when it cannot cut).
	cutEnd(w string) int
}
