package jinja

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

func pyPrintable(c rune) bool { return unicode.IsPrint(c) }

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(c rune) bool { return unicode.IsSpace(c) || (c >= 0x1c && c <= 0x1f) }

// global returns a built-in global function, or nil.
func (r *renderer) global(name string) any {
	switch name {
	case "raise_exception":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			msg := ""
			if len(args) > 0 {
				msg = str(args[0])
			}
			return nil, fmt.Errorf("%w: %w: %s", ErrTemplate, ErrRaised, msg)
		})
	case "strftime_now":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			if len(args) != 1 {
				return nil, r.errorf("strftime_now takes one argument")
			}
			return strftime(r.now(), str(args[0])), nil
		})
	case "namespace":
		return pyFunc(func(args []any, kwargs map[string]any) (any, error) {
			ns := &namespace{attrs: NewDict(len(kwargs))}
			for _, a := range args {
				if d, ok := a.(*Dict); ok {
					for _, k := range d.keys {
						ns.attrs.set(k, d.m[k])
					}
				}
			}
			for _, k := range sortedKeys(kwargs) {
				ns.attrs.set(k, kwargs[k])
			}
			return ns, nil
		})
	case "dict":
		return pyFunc(func(args []any, kwargs map[string]any) (any, error) {
			d := NewDict(len(kwargs))
			for _, a := range args {
				if src, ok := a.(*Dict); ok {
					for _, k := range src.keys {
						d.set(k, src.m[k])
					}
				}
			}
			for _, k := range sortedKeys(kwargs) {
				d.set(k, kwargs[k])
			}
			return d, nil
		})
	case "range":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			var n [3]int64
			n[2] = 1
			for i, a := range args {
				v, ok := asInt(a)
				if !ok || i > 2 {
					return nil, r.errorf("range: bad argument %s", typeName(a))
				}
				n[i] = v
			}
			start, stop, step := int64(0), n[0], n[2]
			if len(args) >= 2 {
				start, stop = n[0], n[1]
			}
			if step == 0 {
				return nil, r.errorf("range: step must not be zero")
			}
			var out []any
			for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
				if len(out) >= maxRange {
					return nil, r.errorf("range: more than %d items", maxRange)
				}
				out = append(out, i)
			}
			return out, nil
		})
	}
	return nil
}

// sortedKeys gives keyword arguments a stable order (Python keeps call order, which the
// syntax tree does not; templates do not depend on it in practice).
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func argOr(args []any, kwargs map[string]any, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kwargs[name]; ok {
		return v
	}
	return def
}

// method returns a bound method of obj, or nil. Only methods that do not mutate exist (the
// immutable sandbox).
func (r *renderer) method(obj any, name string) any {
	switch o := obj.(type) {
	case string:
		return r.stringMethod(o, name)
	case *Dict:
		switch name {
		case "items":
			return pyFunc(func([]any, map[string]any) (any, error) {
				out := make([]any, len(o.keys))
				for i, k := range o.keys {
					out[i] = tuple{k, o.m[k]}
				}
				return out, nil
			})
		case "keys":
			return pyFunc(func([]any, map[string]any) (any, error) {
				out := make([]any, len(o.keys))
				for i, k := range o.keys {
					out[i] = k
				}
				return out, nil
			})
		case "values":
			return pyFunc(func([]any, map[string]any) (any, error) {
				out := make([]any, len(o.keys))
				for i, k := range o.keys {
					out[i] = o.m[k]
				}
				return out, nil
			})
		case "get":
			return pyFunc(func(args []any, kwargs map[string]any) (any, error) {
				if len(args) < 1 {
					return nil, r.errorf("get expected at least 1 argument")
				}
				if k, ok := args[0].(string); ok {
					if v, ok := o.m[k]; ok {
						return v, nil
					}
				}
				return argOr(args, kwargs, 1, "default", nil), nil
			})
		case "update", "pop", "popitem", "setdefault", "clear":
			return pyFunc(func([]any, map[string]any) (any, error) {
				return nil, r.errorf("unsafe: dict.%s mutates a value in the sandbox", name)
			})
		}
	case []any:
		switch name {
		case "index", "count":
			return pyFunc(func(args []any, _ map[string]any) (any, error) {
				if len(args) != 1 {
					return nil, r.errorf("list.%s takes one argument", name)
				}
				n := int64(0)
				for i, v := range o {
					if pyEqual(v, args[0]) {
						if name == "index" {
							return int64(i), nil
						}
						n++
					}
				}
				if name == "index" {
					return nil, r.errorf("value is not in list")
				}
				return n, nil
			})
		case "append", "extend", "insert", "pop", "remove", "sort", "reverse", "clear":
			return pyFunc(func([]any, map[string]any) (any, error) {
				return nil, r.errorf("unsafe: list.%s mutates a value in the sandbox", name)
			})
		}
	}
	return nil
}

func (r *renderer) stringMethod(s, name string) any {
	stripper := func(trim func(string, func(rune) bool) string, trimSet func(string, string) string) pyFunc {
		return func(args []any, _ map[string]any) (any, error) {
			if len(args) == 0 || args[0] == nil {
				return trim(s, pyIsSpace), nil
			}
			return trimSet(s, str(args[0])), nil
		}
	}
	switch name {
	case "strip":
		return stripper(strings.TrimFunc, strings.Trim)
	case "lstrip":
		return stripper(strings.TrimLeftFunc, strings.TrimLeft)
	case "rstrip":
		return stripper(strings.TrimRightFunc, strings.TrimRight)
	case "upper":
		return pyFunc(func([]any, map[string]any) (any, error) { return strings.ToUpper(s), nil })
	case "lower":
		return pyFunc(func([]any, map[string]any) (any, error) { return strings.ToLower(s), nil })
	case "title":
		return pyFunc(func([]any, map[string]any) (any, error) { return pyTitle(s), nil })
	case "capitalize":
		return pyFunc(func([]any, map[string]any) (any, error) { return capitalize(s), nil })
	case "startswith", "endswith":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			if len(args) < 1 {
				return nil, r.errorf("%s takes at least one argument", name)
			}
			test := strings.HasPrefix
			if name == "endswith" {
				test = strings.HasSuffix
			}
			var cands []any
			if t, ok := asList(args[0]); ok {
				cands = t
			} else {
				cands = []any{args[0]}
			}
			for _, c := range cands {
				cs, ok := c.(string)
				if !ok {
					return nil, r.errorf("%s first arg must be str or a tuple of str, not %s", name, typeName(c))
				}
				if test(s, cs) {
					return true, nil
				}
			}
			return false, nil
		})
	case "split", "rsplit":
		return pyFunc(func(args []any, kwargs map[string]any) (any, error) {
			sep := argOr(args, kwargs, 0, "sep", nil)
			maxsplit := int64(-1)
			if m, ok := asInt(argOr(args, kwargs, 1, "maxsplit", int64(-1))); ok {
				maxsplit = m
			}
			var parts []string
			if sep == nil {
				parts = splitWhitespace(s, maxsplit, name == "rsplit")
			} else {
				sp := str(sep)
				if sp == "" {
					return nil, r.errorf("empty separator")
				}
				n := -1
				if maxsplit >= 0 {
					n = int(maxsplit) + 1
				}
				if name == "rsplit" && n > 0 {
					parts = rsplitN(s, sp, n)
				} else {
					parts = strings.SplitN(s, sp, n)
				}
			}
			out := make([]any, len(parts))
			for i, p := range parts {
				out[i] = p
			}
			return out, nil
		})
	case "splitlines":
		return pyFunc(func([]any, map[string]any) (any, error) {
			var out []any
			for _, l := range strings.Split(strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n"), "\n") {
				out = append(out, l)
			}
			if len(out) > 0 && out[len(out)-1] == "" {
				out = out[:len(out)-1]
			}
			return out, nil
		})
	case "replace":
		return pyFunc(func(args []any, kwargs map[string]any) (any, error) {
			if len(args) < 2 {
				return nil, r.errorf("replace takes at least two arguments")
			}
			n := int64(-1)
			if c, ok := asInt(argOr(args, kwargs, 2, "count", int64(-1))); ok {
				n = c
			}
			return strings.Replace(s, str(args[0]), str(args[1]), int(n)), nil
		})
	case "find", "rfind", "index", "count":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			if len(args) < 1 {
				return nil, r.errorf("%s takes an argument", name)
			}
			sub := str(args[0])
			switch name {
			case "count":
				return int64(strings.Count(s, sub)), nil
			case "rfind":
				return runeIndex(s, strings.LastIndex(s, sub)), nil
			}
			i := strings.Index(s, sub)
			if i < 0 && name == "index" {
				return nil, r.errorf("substring not found")
			}
			return runeIndex(s, i), nil
		})
	case "join":
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			if len(args) != 1 {
				return nil, r.errorf("join takes one argument")
			}
			items, err := r.iterate(args[0])
			if err != nil {
				return nil, err
			}
			parts := make([]string, len(items))
			for i, it := range items {
				ps, ok := it.(string)
				if !ok {
					return nil, r.errorf("sequence item %d: expected str instance, %s found", i, typeName(it))
				}
				parts[i] = ps
			}
			return strings.Join(parts, s), nil
		})
	case "format":
		return pyFunc(func(args []any, kwargs map[string]any) (any, error) { return r.strFormat(s, args, kwargs) })
	case "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower":
		return pyFunc(func([]any, map[string]any) (any, error) { return strPredicate(s, name), nil })
	}
	return nil
}

func runeIndex(s string, byteIdx int) int64 {
	if byteIdx < 0 {
		return -1
	}
	return int64(utf8.RuneCountInString(s[:byteIdx]))
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for len(out) < n-1 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append(out, s[i+len(sep):])
		s = s[:i]
	}
	out = append(out, s)
	slices.Reverse(out)
	return out
}

// splitWhitespace is Python's str.split() without a separator.
func splitWhitespace(s string, maxsplit int64, fromRight bool) []string {
	if fromRight {
		// Only the unlimited form is needed in practice; it equals the left form.
		maxsplit = -1
	}
	var out []string
	for {
		s = strings.TrimLeftFunc(s, pyIsSpace)
		if s == "" {
			return out
		}
		if maxsplit >= 0 && int64(len(out)) == maxsplit {
			return append(out, s)
		}
		i := strings.IndexFunc(s, pyIsSpace)
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i])
		s = s[i:]
	}
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, c := range s {
		switch name {
		case "isdigit":
			if !unicode.IsDigit(c) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(c) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(c) && !unicode.IsNumber(c) {
				return false
			}
		case "isspace":
			if !pyIsSpace(c) {
				return false
			}
		case "isupper":
			if unicode.IsLower(c) {
				return false
			}
			cased = cased || unicode.IsUpper(c)
		case "islower":
			if unicode.IsUpper(c) {
				return false
			}
			cased = cased || unicode.IsLower(c)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToUpper(r)) + strings.ToLower(s[n:])
}

// pyTitle is Python's str.title.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, c := range s {
		if prevCased {
			b.WriteRune(unicode.ToLower(c))
		} else {
			b.WriteRune(unicode.ToTitle(c))
		}
		prevCased = unicode.IsLetter(c)
	}
	return b.String()
}

// strFormat implements str.format with {} and {0} and {name} fields, without format specs.
func (r *renderer) strFormat(s string, args []any, kwargs map[string]any) (any, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '}' && i+1 < len(s) && s[i+1] == '}' {
			b.WriteByte('}')
			i++
			continue
		}
		if c != '{' {
			b.WriteByte(c)
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			b.WriteByte('{')
			i++
			continue
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, r.errorf("single '{' encountered in format string")
		}
		field := s[i+1 : i+j]
		i += j
		var v any
		switch n, err := strconv.Atoi(field); {
		case field == "":
			if auto >= len(args) {
				return nil, r.errorf("format: not enough arguments")
			}
			v = args[auto]
			auto++
		case err == nil:
			if n >= len(args) {
				return nil, r.errorf("format: index %d out of range", n)
			}
			v = args[n]
		default:
			kv, ok := kwargs[field]
			if !ok {
				return nil, r.errorf("format: no argument %q", field)
			}
			v = kv
		}
		writeStr(&b, v)
	}
	return b.String(), nil
}

// applyFilter applies a filter to obj.
func (r *renderer) applyFilter(f *filterExpr, obj any, sc *scope) (any, error) {
	args, err := r.evalList(f.args, sc)
	if err != nil {
		return nil, err
	}
	kwargs, err := r.evalKwargs(f.kwargs, sc)
	if err != nil {
		return nil, err
	}
	return r.filter(f.name, obj, args, kwargs)
}

func (r *renderer) filter(name string, obj any, args []any, kwargs map[string]any) (any, error) {
	switch name {
	case "tojson":
		return r.toJSON(obj, args, kwargs)
	case "length", "count":
		switch o := obj.(type) {
		case string:
			return int64(utf8.RuneCountInString(o)), nil
		case []any:
			return int64(len(o)), nil
		case tuple:
			return int64(len(o)), nil
		case *Dict:
			return int64(len(o.keys)), nil
		case undefinedVal:
			return int64(0), nil
		}
		return nil, r.errorf("object of type %s has no len()", typeName(obj))
	case "string":
		return str(obj), nil
	case "trim":
		s := str(obj)
		if c := argOr(args, kwargs, 0, "chars", nil); c != nil {
			return strings.Trim(s, str(c)), nil
		}
		return strings.TrimFunc(s, pyIsSpace), nil
	case "upper":
		return strings.ToUpper(str(obj)), nil
	case "lower":
		return strings.ToLower(str(obj)), nil
	case "capitalize":
		return capitalize(str(obj)), nil
	case "title":
		return jinjaTitle(str(obj)), nil
	case "replace":
		if len(args) < 2 {
			return nil, r.errorf("replace needs two arguments")
		}
		n := int64(-1)
		if c, ok := asInt(argOr(args, kwargs, 2, "count", int64(-1))); ok {
			n = c
		}
		return strings.Replace(str(obj), str(args[0]), str(args[1]), int(n)), nil
	case "default", "d":
		def := argOr(args, kwargs, 0, "default_value", "")
		boolean := truthy(argOr(args, kwargs, 1, "boolean", false))
		if _, undef := obj.(undefinedVal); undef || (boolean && !truthy(obj)) {
			return def, nil
		}
		return obj, nil
	case "join":
		items, err := r.iterate(obj)
		if err != nil {
			return nil, err
		}
		attr := argOr(args, kwargs, 1, "attribute", nil)
		var b strings.Builder
		sep := str(argOr(args, kwargs, 0, "d", ""))
		for i, it := range items {
			if i > 0 {
				b.WriteString(sep)
			}
			if attr != nil {
				if it, err = r.getAttr(it, str(attr)); err != nil {
					return nil, err
				}
			}
			writeStr(&b, it)
		}
		return b.String(), nil
	case "first", "last":
		items, err := r.iterate(obj)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return undefinedVal{}, nil
		}
		if name == "first" {
			return items[0], nil
		}
		return items[len(items)-1], nil
	case "list":
		items, err := r.iterate(obj)
		if err != nil {
			return nil, err
		}
		return append([]any{}, items...), nil
	case "reverse":
		if s, ok := obj.(string); ok {
			runes := []rune(s)
			slices.Reverse(runes)
			return string(runes), nil
		}
		items, err := r.iterate(obj)
		if err != nil {
			return nil, err
		}
		out := slices.Clone(items)
		slices.Reverse(out)
		return out, nil
	case "int":
		switch o := obj.(type) {
		case int64:
			return o, nil
		case bool:
			return boolInt(o), nil
		case float64:
			return int64(o), nil
		case string:
			if n, err := strconv.ParseInt(strings.TrimSpace(o), 10, 64); err == nil {
				return n, nil
			}
			if f, err := strconv.ParseFloat(strings.TrimSpace(o), 64); err == nil {
				return int64(f), nil
			}
		}
		return argOr(args, kwargs, 0, "default", int64(0)), nil
	case "float":
		if f, ok := asFloat(obj); ok {
			return f, nil
		}
		if s, ok := obj.(string); ok {
			if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
				return f, nil
			}
		}
		return argOr(args, kwargs, 0, "default", 0.0), nil
	case "abs":
		switch o := obj.(type) {
		case int64:
			if o < 0 {
				return -o, nil
			}
			return o, nil
		case float64:
			return math.Abs(o), nil
		}
		return nil, r.errorf("bad operand type for abs(): %s", typeName(obj))
	case "round":
		f, ok := asFloat(obj)
		if !ok {
			return nil, r.errorf("round: not a number")
		}
		prec, _ := asInt(argOr(args, kwargs, 0, "precision", int64(0)))
		p := math.Pow(10, float64(prec))
		switch str(argOr(args, kwargs, 1, "method", "common")) {
		case "ceil":
			return math.Ceil(f*p) / p, nil
		case "floor":
			return math.Floor(f*p) / p, nil
		}
		return math.RoundToEven(f*p) / p, nil
	case "items":
		d, ok := obj.(*Dict)
		if !ok {
			if _, undef := obj.(undefinedVal); undef {
				return []any{}, nil
			}
			return nil, r.errorf("items: %s is not a mapping", typeName(obj))
		}
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i] = tuple{k, d.m[k]}
		}
		return out, nil
	case "dictsort":
		d, ok := obj.(*Dict)
		if !ok {
			return nil, r.errorf("dictsort: %s is not a mapping", typeName(obj))
		}
		keys := slices.Clone(d.keys)
		slices.SortFunc(keys, func(a, b string) int { return strings.Compare(strings.ToLower(a), strings.ToLower(b)) })
		out := make([]any, len(keys))
		for i, k := range keys {
			out[i] = tuple{k, d.m[k]}
		}
		return out, nil
	case "map", "select", "reject", "selectattr", "rejectattr", "unique", "sort", "sum", "min", "max":
		return r.seqFilter(name, obj, args, kwargs)
	case "indent":
		width := "    "
		if w := argOr(args, kwargs, 0, "width", int64(4)); w != nil {
			if n, ok := asInt(w); ok {
				width = strings.Repeat(" ", int(max(0, n)))
			} else {
				width = str(w)
			}
		}
		first := truthy(argOr(args, kwargs, 1, "first", false))
		blank := truthy(argOr(args, kwargs, 2, "blank", false))
		lines := strings.Split(str(obj), "\n")
		for i := range lines {
			if (i == 0 && !first) || (!blank && strings.TrimFunc(lines[i], pyIsSpace) == "") {
				continue
			}
			lines[i] = width + lines[i]
		}
		return strings.Join(lines, "\n"), nil
	case "safe":
		return obj, nil
	case "e", "escape":
		return html.EscapeString(str(obj)), nil
	case "wordcount":
		return int64(len(splitWhitespace(str(obj), -1, false))), nil
	case "center":
		w, _ := asInt(argOr(args, kwargs, 0, "width", int64(80)))
		s := str(obj)
		n := int(w) - utf8.RuneCountInString(s)
		if n <= 0 {
			return s, nil
		}
		left := n / 2
		if n%2 == 1 && int(w)%2 == 1 {
			left++
		}
		return strings.Repeat(" ", left) + s + strings.Repeat(" ", n-left), nil
	}
	return nil, r.errorf("unknown filter %q", name)
}

// jinjaTitle is Jinja's title filter: words start after spaces, dashes and brackets.
func jinjaTitle(s string) string {
	var b strings.Builder
	start := true
	for _, c := range s {
		if strings.ContainsRune("-({[<", c) || unicode.IsSpace(c) {
			b.WriteRune(c)
			start = true
			continue
		}
		if start {
			b.WriteRune(unicode.ToUpper(c))
		} else {
			b.WriteRune(unicode.ToLower(c))
		}
		start = false
	}
	return b.String()
}

// seqFilter implements the filters over sequences.
func (r *renderer) seqFilter(name string, obj any, args []any, kwargs map[string]any) (any, error) {
	items, err := r.iterate(obj)
	if err != nil {
		return nil, err
	}
	attrOf := func(it any, attr any) (any, error) {
		if attr == nil {
			return it, nil
		}
		v := it
		for _, part := range strings.Split(str(attr), ".") {
			if v, err = r.getAttr(v, part); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	switch name {
	case "map":
		out := make([]any, 0, len(items))
		for _, it := range items {
			var v any
			if attr, ok := kwargs["attribute"]; ok {
				if v, err = attrOf(it, attr); err != nil {
					return nil, err
				}
				if _, undef := v.(undefinedVal); undef {
					if d, ok := kwargs["default"]; ok {
						v = d
					}
				}
			} else if len(args) > 0 {
				if v, err = r.filter(str(args[0]), it, args[1:], nil); err != nil {
					return nil, err
				}
			} else {
				v = it
			}
			out = append(out, v)
		}
		return out, nil
	case "select", "reject", "selectattr", "rejectattr":
		want := name == "select" || name == "selectattr"
		byAttr := strings.HasSuffix(name, "attr")
		var attr any
		rest := args
		if byAttr {
			if len(args) < 1 {
				return nil, r.errorf("%s needs an attribute", name)
			}
			attr, rest = args[0], args[1:]
		}
		out := []any{}
		for _, it := range items {
			v, err := attrOf(it, attr)
			if err != nil {
				return nil, err
			}
			ok := truthy(v)
			if len(rest) > 0 {
				if ok, err = r.test(str(rest[0]), v, rest[1:]); err != nil {
					return nil, err
				}
			}
			if ok == want {
				out = append(out, it)
			}
		}
		return out, nil
	case "unique":
		out := []any{}
		for _, it := range items {
			if !slices.ContainsFunc(out, func(o any) bool { return pyEqual(o, it) }) {
				out = append(out, it)
			}
		}
		return out, nil
	case "sort":
		reverse := truthy(argOr(args, kwargs, 0, "reverse", false))
		attr := argOr(args, kwargs, 2, "attribute", nil)
		out := slices.Clone(items)
		var sortErr error
		slices.SortStableFunc(out, func(a, b any) int {
			av, _ := attrOf(a, attr)
			bv, _ := attrOf(b, attr)
			if as, ok := av.(string); ok {
				if bs, ok := bv.(string); ok {
					av, bv = strings.ToLower(as), strings.ToLower(bs)
				}
			}
			c, err := r.order(av, bv)
			if err != nil {
				sortErr = err
			}
			if reverse {
				return -c
			}
			return c
		})
		return out, sortErr
	case "sum":
		var total any = argOr(args, kwargs, 1, "start", int64(0))
		attr := argOr(args, kwargs, 0, "attribute", nil)
		for _, it := range items {
			v, err := attrOf(it, attr)
			if err != nil {
				return nil, err
			}
			if total, err = r.arith("+", total, v); err != nil {
				return nil, err
			}
		}
		return total, nil
	case "min", "max":
		if len(items) == 0 {
			return undefinedVal{}, nil
		}
		best := items[0]
		for _, it := range items[1:] {
			c, err := r.order(it, best)
			if err != nil {
				return nil, err
			}
			if (name == "min" && c < 0) || (name == "max" && c > 0) {
				best = it
			}
		}
		return best, nil
	}
	return nil, r.errorf("unknown filter %q", name)
}

// test evaluates "obj is name(args)".
func (r *renderer) test(name string, obj any, args []any) (bool, error) {
	arg := func() (any, error) {
		if len(args) < 1 {
			return nil, r.errorf("test %s needs an argument", name)
		}
		return args[0], nil
	}
	switch name {
	case "defined":
		_, undef := obj.(undefinedVal)
		return !undef, nil
	case "undefined":
		_, undef := obj.(undefinedVal)
		return undef, nil
	case "none":
		return obj == nil, nil
	case "string":
		_, ok := obj.(string)
		return ok, nil
	case "number":
		switch obj.(type) {
		case int64, float64, bool:
			return true, nil
		}
		return false, nil
	case "integer":
		_, ok := obj.(int64)
		return ok, nil
	case "float":
		_, ok := obj.(float64)
		return ok, nil
	case "boolean":
		_, ok := obj.(bool)
		return ok, nil
	case "true":
		b, ok := obj.(bool)
		return ok && b, nil
	case "false":
		b, ok := obj.(bool)
		return ok && !b, nil
	case "mapping":
		_, ok := obj.(*Dict)
		return ok, nil
	case "sequence", "iterable":
		switch obj.(type) {
		case []any, tuple, string, *Dict:
			return true, nil
		}
		return false, nil
	case "callable":
		switch obj.(type) {
		case pyFunc, *macroVal:
			return true, nil
		}
		return false, nil
	case "odd", "even":
		n, ok := asInt(obj)
		if !ok {
			return false, r.errorf("test %s: not an integer", name)
		}
		return (n%2 != 0) == (name == "odd"), nil
	case "divisibleby":
		a, err := arg()
		if err != nil {
			return false, err
		}
		n, ok1 := asInt(obj)
		d, ok2 := asInt(a)
		if !ok1 || !ok2 || d == 0 {
			return false, r.errorf("divisibleby: bad operands")
		}
		return n%d == 0, nil
	case "eq", "equalto", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in":
		a, err := arg()
		if err != nil {
			return false, err
		}
		op := map[string]string{"eq": "==", "equalto": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[name]
		if op == "" {
			op = name
		}
		return r.compare(op, obj, a)
	case "sameas":
		a, err := arg()
		if err != nil {
			return false, err
		}
		switch obj.(type) {
		case nil, bool:
			return obj == a, nil
		}
		return pyEqual(obj, a), nil
	case "lower", "upper":
		s, ok := obj.(string)
		if !ok {
			return false, nil
		}
		if name == "lower" {
			return strPredicate(s, "islower"), nil
		}
		return strPredicate(s, "isupper"), nil
	}
	return false, r.errorf("unknown test %q", name)
}

// toJSON is transformers' tojson filter: json.dumps(x, ensure_ascii=False, indent=indent,
// separators=separators, sort_keys=sort_keys).
func (r *renderer) toJSON(obj any, args []any, kwargs map[string]any) (any, error) {
	indent := ""
	hasIndent := false
	if v := argOr(args, kwargs, 0, "indent", nil); v != nil {
		hasIndent = true
		if n, ok := asInt(v); ok {
			indent = strings.Repeat(" ", int(max(0, n)))
		} else {
			indent = str(v)
		}
	}
	itemSep, keySep := ", ", ": "
	if hasIndent {
		itemSep = ","
	}
	if v := argOr(args, kwargs, 3, "separators", nil); v != nil {
		l, ok := asList(v)
		if !ok || len(l) != 2 {
			return nil, r.errorf("tojson: separators must be a pair of strings")
		}
		itemSep, keySep = str(l[0]), str(l[1])
	}
	ensureASCII := truthy(argOr(args, kwargs, 1, "ensure_ascii", false))
	sortKeys := truthy(argOr(args, kwargs, 4, "sort_keys", false))
	var b strings.Builder
	if err := r.writeJSON(&b, obj, jsonStyle{indent, hasIndent, itemSep, keySep, ensureASCII, sortKeys}, 0); err != nil {
		return nil, err
	}
	return b.String(), nil
}

type jsonStyle struct {
	indent          string
	hasIndent       bool
	itemSep, keySep string
	ensureASCII     bool
	sortKeys        bool
}

func (r *renderer) writeJSON(b *strings.Builder, v any, st jsonStyle, level int) error {
	newline := func(l int) {
		if st.hasIndent {
			b.WriteByte('\n')
			for range l {
				b.WriteString(st.indent)
			}
		}
	}
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case float64:
		switch {
		case math.IsNaN(v):
			b.WriteString("NaN")
		case math.IsInf(v, 1):
			b.WriteString("Infinity")
		case math.IsInf(v, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloat(v))
		}
	case string:
		writeJSONString(b, v, st.ensureASCII)
	case []any, tuple:
		items, _ := asList(v)
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				b.WriteString(st.itemSep)
			}
			newline(level + 1)
			if err := r.writeJSON(b, it, st, level+1); err != nil {
				return err
			}
		}
		newline(level)
		b.WriteByte(']')
	case *Dict:
		if len(v.keys) == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := v.keys
		if st.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(st.itemSep)
			}
			newline(level + 1)
			writeJSONString(b, k, st.ensureASCII)
			b.WriteString(st.keySep)
			if err := r.writeJSON(b, v.m[k], st, level+1); err != nil {
				return err
			}
		}
		newline(level)
		b.WriteByte('}')
	case *namespace:
		return r.errorf("tojson: object of type Namespace is not JSON serializable")
	default:
		return r.errorf("tojson: object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// writeJSONString writes a string as Python's json.dumps does.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for _, c := range s {
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case c < 0x20 || (ensureASCII && c > 0x7f):
				if c > 0xFFFF {
					c -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xD800+(c>>10), 0xDC00+(c&0x3FF))
				} else {
					fmt.Fprintf(b, `\u%04x`, c)
				}
			default:
				b.WriteRune(c)
			}
		}
	}
	b.WriteByte('"')
}
