package jinja

import "testing"

// The seed corpora are in testdata/fuzz/<target>; f.Add seeds cover the rest.

func FuzzJinja(f *testing.F) {
	for _, s := range []string{"{{ x }}", "{% for m in messages %}{{ m.role }}{% endfor %}", "{% set ns = namespace(a=1) %}{{ ns.a }}",
		"{%- if a -%}{{ 'x' ~ 1 }}{% else %}{{ [1, 2][::-1] }}{% endif %}", "{{ {'a': 1}|tojson(indent=2) }}", "{% macro m(x) %}{{ x }}{% endmacro %}{{ m(1) }}",
		"{% raw %}{{{% endraw %}", "{{ '%s' % 1 }}{{ 'a'.split() }}"} {
		f.Add(s)
	}
	ctx, err := DecodeJSON([]byte(`{"messages":[{"role":"user","content":"hi"}],"a":true,"x":"v"}`))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, src string) {
		// Must not panic or hang; errors are fine. What renders is within the output bound,
		// and a second rendering of the same template and values gives the same result: a
		// rendering leaves no state behind (a chat template renders every request).
		tmpl, err := Compile(src, Options{Now: fixedNow})
		if err != nil {
			return
		}
		out, err := tmpl.Render(ctx.(*Dict), 0)
		if len(out) > maxOutput {
			t.Fatalf("%d bytes rendered, bound %d", len(out), maxOutput)
		}
		again, err2 := tmpl.Render(ctx.(*Dict), 0)
		if again != out || (err == nil) != (err2 == nil) {
			t.Fatalf("renderings differ: %q (%v), then %q (%v)", out, err, again, err2)
		}
	})
}

func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5,"x",null,true]}`, `"\ud83d\ude00"`, `[`, `{"a" 1}`, "\"\xff\"", `-0.0e+1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := DecodeJSON(data)
		if err != nil {
			return
		}
		// A decoded value renders as JSON again without error.
		tmpl, err := Compile("{{ v|tojson }}", Options{})
		if err != nil {
			t.Fatal(err)
		}
		d := NewDict(1)
		d.Set("v", v)
		if _, err := tmpl.Render(d, 0); err != nil {
			t.Fatalf("tojson of decoded %q: %v", data, err)
		}
	})
}
