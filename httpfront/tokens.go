package httpfront

import (
	"math"
	"strings"

	"switchyard/httpfront/tokenizer"
)

// estimateTokens is the body-size estimate of a prompt's length used when no tokenizer is
// configured: about four bytes per token, rounded up.
func estimateTokens(bodyLen int) int64 { return (int64(bodyLen) + 3) / 4 }

// inputTokens returns the request's input length in tokens and, for a single tokenized
// prompt, its token IDs. A body that is already tokenized (input_ids, a token-array prompt)
// is counted as is; otherwise tk encodes the prompt (through its chat template for chat
// requests when it has one); without tk, the body-size estimate applies. For a batch, the
// longest item counts.
func (f *requestFacts) inputTokens(tk tokenizer.Tokenizer, body []byte) (int64, []uint32) {
	if f.tokenCount >= 0 {
		if f.batch == 0 {
			return f.tokenCount, f.tokenIDs
		}
		return f.tokenCount, nil
	}
	if tk == nil {
		return estimateTokens(len(body)), nil
	}
	// Slow path: exact counting allocates the prompt text.
	switch f.kind {
	case routeChat:
		msgs := make([]tokenizer.Message, 0, len(f.messages))
		for _, m := range f.messages {
			msgs = append(msgs, chatMessage(m))
		}
		var text string
		if ct, ok := tk.(tokenizer.ChatTemplater); ok {
			t, err := ct.ApplyChatTemplate(msgs)
			if err == nil {
				text = t
			}
		}
		if text == "" {
			var b strings.Builder
			for _, m := range msgs {
				b.WriteString(m.Role)
				b.WriteByte('\n')
				b.WriteString(m.Content)
				b.WriteByte('\n')
			}
			text = b.String()
		}
		ids := tk.Encode(text)
		return int64(len(ids)), ids
	default:
		if len(f.prompts) == 1 && f.batch == 0 {
			ids := tk.Encode(string(appendUnquoted(nil, f.prompts[0].raw)))
			return int64(len(ids)), ids
		}
		longest := int64(0)
		var buf []byte
		for _, p := range f.prompts {
			buf = appendUnquoted(buf[:0], p.raw)
			longest = max(longest, int64(len(tk.Encode(string(buf)))))
		}
		return longest, nil
	}
}

// chatMessage extracts a message's role and text content (text parts joined).
func chatMessage(m jsonValue) tokenizer.Message {
	var msg tokenizer.Message
	_ = m.members(func(key []byte, v jsonValue) error {
		switch {
		case keyIs(key, "role") && v.kind == kindString:
			msg.Role = string(appendUnquoted(nil, v.raw))
		case keyIs(key, "content") && v.kind == kindString:
			msg.Content = string(appendUnquoted(nil, v.raw))
		case keyIs(key, "content") && v.kind == kindArray:
			var b []byte
			_ = v.elems(func(_ int, part jsonValue) error {
				if part.kind != kindObject {
					return nil
				}
				_ = part.members(func(k []byte, pv jsonValue) error {
					if keyIs(k, "text") && pv.kind == kindString {
						b = appendUnquoted(b, pv.raw)
					}
					return nil
				})
				return nil
			})
			msg.Content = string(b)
		}
		return nil
	})
	return msg
}

// expectedPeak is input plus the requested output, -1 when the output budget is unknown, or
// an error when the sum overflows.
func expectedPeak(input, maxTokens int64) (int64, *apiError) {
	if maxTokens < 0 {
		return -1, nil
	}
	if input > math.MaxInt64-maxTokens {
		return 0, paramError(CodeInvalidParameter, "max_tokens", "max_tokens plus the input length overflows")
	}
	return input + maxTokens, nil
}
