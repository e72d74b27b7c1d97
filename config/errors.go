package config

import "errors"

// Sentinels classifying a FieldError; test with errors.Is on the error Load or Validate
// returns.
var (
	// ErrUnknownKey marks a key that is not part of the schema.
	ErrUnknownKey = errors.New("unknown key")
	// ErrType marks a value of the wrong type for its key.
	ErrType = errors.New("wrong type")
	// ErrInvalid marks a value that breaks a validation rule.
	ErrInvalid = errors.New("invalid value")
	// ErrDropped marks an option or policy that Switchyard no longer supports; the
	// message names its replacement.
	ErrDropped = errors.New("dropped option")
)

// FieldError is one problem at one configuration path, such as
// "models.llama.buckets[0].groups.pd.decode.policy.type" or a flag name such as
// "--policy". Load and Validate join every FieldError they find with errors.Join.
type FieldError struct {
	// Path locates the problem: a key path, an environment variable or a flag.
	Path string
	// Msg describes the problem.
	Msg string
	// Kind is the sentinel the error unwraps to: ErrUnknownKey, ErrType, ErrInvalid or
	// ErrDropped.
	Kind error
}

// Error returns "<path>: <message>".
func (e *FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Unwrap returns the error's sentinel.
func (e *FieldError) Unwrap() error { return e.Kind }

// problems collects FieldErrors in the order they are found.
type problems struct {
	errs []error
}

func (p *problems) add(path string, kind error, msg string) {
	p.errs = append(p.errs, &FieldError{Path: path, Msg: msg, Kind: kind})
}

func (p *problems) err() error {
	return errors.Join(p.errs...)
}
