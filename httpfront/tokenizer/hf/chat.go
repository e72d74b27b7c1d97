package hf

import (
	"time"

	"switchyard/httpfront/tokenizer"
)

type chatTemplate struct{}

func newChatTemplate(src string, vars map[string]any, now func() time.Time) (*chatTemplate, error) {
	return &chatTemplate{}, nil
}

func (t *Tokenizer) ApplyChatTemplate(messages []tokenizer.Message) (string, error) { return "", nil }
