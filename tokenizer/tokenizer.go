package tokenizer

import "errors"

// Tokenizer turns text into token IDs and back.
type Tokenizer interface {
	// Encode returns the token IDs of text.
	Encode(text string) []uint32
	// Decode returns the text of ids, best effort.
	Decode(ids []uint32) string
}

// ChatTemplater renders a conversation into the prompt text the model sees, ending with the
// generation prompt of the assistant's next turn.
type ChatTemplater interface {
	ApplyChatTemplate(messages []Message) (string, error)
}

// Message is one turn of a chat conversation.
type Message struct {
	// Role is system, developer, user, assistant or tool.
	Role string `json:"role"`
	// Content is the turn's text.
	Content string `json:"content"`
}

// Errors of ApplyChatTemplate.
var (
	// ErrNoMessages is returned for an empty conversation.
	ErrNoMessages = errors.New("no messages")
	// ErrInvalidRole is wrapped when a message has a role the template does not know.
	ErrInvalidRole = errors.New("invalid role")
)

// Roles the built-in chat template accepts.
const (
	RoleSystem    = "system"
	RoleDeveloper = "developer"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool"
)

// ValidRole reports whether role is one of the roles the built-in chat template accepts.
func ValidRole(role string) bool {
	switch role {
	case RoleSystem, RoleDeveloper, RoleUser, RoleAssistant, RoleTool:
		return true
	}
	return false
}
