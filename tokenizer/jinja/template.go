package jinja

import (
	"errors"
	"fmt"
	"time"
)

// Template is a compiled template. It is immutable and safe for concurrent use: every
// rendering keeps its state to itself.
type Template struct {
	body []stmt
	now  func() time.Time
}

// Options configures Compile. The zero value is ready to use.
type Options struct {
	// Now is the clock of the strftime_now global. Default: time.Now.
	Now func() time.Time
}

// Compile parses a template. Its errors wrap ErrTemplate and name the line.
func Compile(src string, opts Options) (*Template, error) {
	body, err := parseTemplate(src)
	if err != nil {
		return nil, err
	}
	t := &Template{body: body, now: opts.Now}
	if t.now == nil {
		t.now = time.Now
	}
	return t, nil
}

// Render renders the template with vars as its variables (nil: none). sizeHint is the
// expected size of the output in bytes, a capacity to start with. Its errors wrap
// ErrTemplate: a template that raises (raise_exception), reads what it may not, or exceeds
// the bounds of one rendering.
func (t *Template) Render(vars *Dict, sizeHint int) (string, error) {
	root := newScope(nil)
	if vars != nil {
		for _, k := range vars.keys {
			root.vars[k] = vars.m[k]
		}
	}
	r := &renderer{now: t.now}
	r.out.Grow(max(0, min(sizeHint, maxOutput)))
	err := r.execBody(t.body, newScope(root))
	switch {
	case errors.Is(err, errBreak), errors.Is(err, errContinue):
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	case err != nil:
		return "", err
	}
	return r.out.String(), nil
}

// NewDict returns an empty Dict with room for n keys.
func NewDict(n int) *Dict { return &Dict{keys: make([]string, 0, n), m: make(map[string]any, n)} }

// Set sets key k to v; a new key goes last.
func (d *Dict) Set(k string, v any) { d.set(k, v) }

// Get returns the value of key k.
func (d *Dict) Get(k string) (any, bool) { return d.get(k) }

// Keys returns the keys in insertion order; the caller must not modify the slice.
func (d *Dict) Keys() []string { return d.keys }

// Len returns the number of keys.
func (d *Dict) Len() int { return len(d.keys) }
