package jinja

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Values of the template language, with Python's semantics:
//
//	nil            None
//	undefinedVal   Undefined (missing variable, key or attribute)
//	bool, int64, float64, string
//	[]any          list
//	tuple          tuple
//	*Dict          dict with insertion order (string keys)
//	*namespace     the result of namespace()
//	*loopInfo      the loop variable
//	pyFunc         a built-in function or bound method
//	*macroVal      a macro
type (
	undefinedVal struct{ name string }
	tuple        []any
	pyFunc       func(args []any, kwargs map[string]any) (any, error)
)

// Dict is a Python dict with string keys, in insertion order.
type Dict struct {
	keys []string
	m    map[string]any
}

func (d *Dict) get(k string) (any, bool) { v, ok := d.m[k]; return v, ok }

func (d *Dict) set(k string, v any) {
	if _, ok := d.m[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.m[k] = v
}

type namespace struct{ attrs *Dict }

type loopInfo struct {
	index0, length int
	items          []any
}

type macroVal struct {
	m     *macroStmt
	scope *scope
}

// errBreak and errContinue carry the loop controls up to their loop.
var (
	errBreak    = errors.New("break outside a loop")
	errContinue = errors.New("continue outside a loop")
)

type scope struct {
	vars   map[string]any
	parent *scope
}

func newScope(parent *scope) *scope { return &scope{vars: make(map[string]any, 4), parent: parent} }

func (s *scope) lookup(name string) (any, bool) {
	for ; s != nil; s = s.parent {
		if v, ok := s.vars[name]; ok {
			return v, true
		}
	}
	return nil, false
}

// renderer executes one rendering of a template.
type renderer struct {
	out   strings.Builder
	now   func() time.Time
	depth int // macro call depth
	steps int // loop iterations so far, bounded by maxSteps
}

// maxSteps bounds the loop iterations of one rendering and maxOutput its size in bytes, so a
// template cannot run away (chat templates iterate over messages, far below both).
const (
	maxSteps  = 1 << 22
	maxOutput = 256 << 20
)

// maxMacroDepth bounds macro recursion.
const maxMacroDepth = 64

// maxRange bounds range(): a template cannot ask for more iterations than this.
const maxRange = 1 << 20

func (r *renderer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrTemplate, fmt.Sprintf(format, args...))
}

func (r *renderer) execBody(body []stmt, sc *scope) error {
	for _, s := range body {
		if err := r.exec(s, sc); err != nil {
			return err
		}
	}
	return nil
}

func (r *renderer) exec(s stmt, sc *scope) error {
	switch s := s.(type) {
	case *textStmt:
		r.out.WriteString(s.s)
	case *outputStmt:
		v, err := r.eval(s.e, sc)
		if err != nil {
			return err
		}
		writeStr(&r.out, v)
	case *ifStmt:
		for i, c := range s.conds {
			v, err := r.eval(c, sc)
			if err != nil {
				return err
			}
			if truthy(v) {
				return r.execBody(s.bodies[i], sc)
			}
		}
		return r.execBody(s.orElse, sc)
	case *forStmt:
		return r.execFor(s, sc)
	case *setStmt:
		v, err := r.eval(s.value, sc)
		if err != nil {
			return err
		}
		if s.attr != "" {
			target, _ := sc.lookup(s.targets[0])
			ns, ok := target.(*namespace)
			if !ok {
				return r.errorf("cannot assign attribute %s on %s: not a namespace", s.attr, typeName(target))
			}
			ns.attrs.set(s.attr, v)
			return nil
		}
		return r.assign(sc, s.targets, v)
	case *setBlockStmt:
		v, err := r.capture(s.body, sc)
		if err != nil {
			return err
		}
		var out any = v
		for _, f := range s.filters {
			if out, err = r.applyFilter(f, out, sc); err != nil {
				return err
			}
		}
		sc.vars[s.name] = out
	case *macroStmt:
		sc.vars[s.name] = &macroVal{m: s, scope: sc}
	case *filterBlockStmt:
		v, err := r.capture(s.body, sc)
		if err != nil {
			return err
		}
		var out any = v
		for _, f := range s.filters {
			if out, err = r.applyFilter(f, out, sc); err != nil {
				return err
			}
		}
		writeStr(&r.out, out)
	case *breakStmt:
		return errBreak
	case *continueStmt:
		return errContinue
	default:
		panic(fmt.Sprintf("BUG: unknown statement %T", s))
	}
	return nil
}

// capture renders body into a string instead of the output.
func (r *renderer) capture(body []stmt, sc *scope) (string, error) {
	saved := r.out
	r.out = strings.Builder{}
	err := r.execBody(body, sc)
	s := r.out.String()
	r.out = saved
	return s, err
}

func (r *renderer) assign(sc *scope, targets []string, v any) error {
	if len(targets) == 1 {
		sc.vars[targets[0]] = v
		return nil
	}
	items, err := r.iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(targets) {
		return r.errorf("cannot unpack %d values into %d names", len(items), len(targets))
	}
	for i, t := range targets {
		sc.vars[t] = items[i]
	}
	return nil
}

func (r *renderer) execFor(s *forStmt, sc *scope) error {
	v, err := r.eval(s.iter, sc)
	if err != nil {
		return err
	}
	items, err := r.iterate(v)
	if err != nil {
		return err
	}
	if s.cond != nil {
		kept := make([]any, 0, len(items))
		for _, it := range items {
			inner := newScope(sc)
			if err := r.assign(inner, s.targets, it); err != nil {
				return err
			}
			c, err := r.eval(s.cond, inner)
			if err != nil {
				return err
			}
			if truthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return r.execBody(s.orElse, sc)
	}
	loop := &loopInfo{length: len(items), items: items}
	for i, it := range items {
		inner := newScope(sc)
		if err := r.assign(inner, s.targets, it); err != nil {
			return err
		}
		if r.steps++; r.steps > maxSteps || r.out.Len() > maxOutput {
			return r.errorf("rendering exceeds %d loop iterations or %d bytes", maxSteps, maxOutput)
		}
		l := *loop
		l.index0 = i
		inner.vars["loop"] = &l
		err := r.execBody(s.body, inner)
		switch {
		case err == errBreak:
			return nil
		case err == errContinue:
			continue
		case err != nil:
			return err
		}
	}
	return nil
}

// iterate returns the items a for loop visits: a list's items, a dict's keys, a string's
// characters.
func (r *renderer) iterate(v any) ([]any, error) {
	switch v := v.(type) {
	case []any:
		return v, nil
	case tuple:
		return v, nil
	case *Dict:
		out := make([]any, len(v.keys))
		for i, k := range v.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]any, 0, len(v))
		for _, c := range v {
			out = append(out, string(c))
		}
		return out, nil
	case undefinedVal:
		return nil, nil
	}
	return nil, r.errorf("%s is not iterable", typeName(v))
}

func (r *renderer) eval(e expr, sc *scope) (any, error) {
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		if v, ok := sc.lookup(e.name); ok {
			return v, nil
		}
		if f := r.global(e.name); f != nil {
			return f, nil
		}
		return undefinedVal{name: e.name}, nil
	case *listExpr:
		out := make([]any, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it, sc)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *tupleExpr:
		out := make(tuple, len(e.items))
		for i, it := range e.items {
			v, err := r.eval(it, sc)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *dictExpr:
		d := NewDict(len(e.keys))
		for i := range e.keys {
			k, err := r.eval(e.keys[i], sc)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, r.errorf("dict keys must be strings, got %s", typeName(k))
			}
			v, err := r.eval(e.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.set(ks, v)
		}
		return d, nil
	case *attrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return r.getAttr(obj, e.name)
	case *itemExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		key, err := r.eval(e.key, sc)
		if err != nil {
			return nil, err
		}
		return r.getItem(obj, key)
	case *sliceExpr:
		return r.evalSlice(e, sc)
	case *callExpr:
		return r.evalCall(e, sc)
	case *filterExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return r.applyFilter(e, obj, sc)
	case *testExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		args, err := r.evalList(e.args, sc)
		if err != nil {
			return nil, err
		}
		ok, err := r.test(e.name, obj, args)
		if err != nil {
			return nil, err
		}
		return ok != e.negate, nil
	case *unaryExpr:
		x, err := r.eval(e.x, sc)
		if err != nil {
			return nil, err
		}
		switch e.op {
		case "not":
			return !truthy(x), nil
		case "-":
			switch x := x.(type) {
			case int64:
				return -x, nil
			case float64:
				return -x, nil
			case bool:
				return -boolInt(x), nil
			}
		case "+":
			switch x := x.(type) {
			case int64, float64:
				return x, nil
			case bool:
				return boolInt(x), nil
			}
		}
		if u, ok := x.(undefinedVal); ok {
			return nil, r.undefinedErr(u)
		}
		return nil, r.errorf("bad operand type for unary %s: %s", e.op, typeName(x))
	case *binExpr:
		return r.evalBin(e, sc)
	case *concatExpr:
		var b strings.Builder
		for _, p := range e.parts {
			v, err := r.eval(p, sc)
			if err != nil {
				return nil, err
			}
			writeStr(&b, v)
		}
		return b.String(), nil
	case *compareExpr:
		left, err := r.eval(e.first, sc)
		if err != nil {
			return nil, err
		}
		for i, op := range e.ops {
			right, err := r.eval(e.rest[i], sc)
			if err != nil {
				return nil, err
			}
			ok, err := r.compare(op, left, right)
			if err != nil {
				return nil, err
			}
			if !ok {
				return false, nil
			}
			left = right
		}
		return true, nil
	case *condExpr:
		c, err := r.eval(e.test, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(e.yes, sc)
		}
		if e.no == nil {
			return undefinedVal{}, nil
		}
		return r.eval(e.no, sc)
	}
	panic(fmt.Sprintf("BUG: unknown expression %T", e))
}

func (r *renderer) evalList(es []expr, sc *scope) ([]any, error) {
	if len(es) == 0 {
		return nil, nil
	}
	out := make([]any, len(es))
	for i, e := range es {
		v, err := r.eval(e, sc)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (r *renderer) evalKwargs(kws []kwarg, sc *scope) (map[string]any, error) {
	if len(kws) == 0 {
		return nil, nil
	}
	out := make(map[string]any, len(kws))
	for _, kw := range kws {
		v, err := r.eval(kw.val, sc)
		if err != nil {
			return nil, err
		}
		out[kw.name] = v
	}
	return out, nil
}

func (r *renderer) undefinedErr(u undefinedVal) error {
	if u.name == "" {
		return r.errorf("value is undefined")
	}
	return r.errorf("%q is undefined", u.name)
}

func (r *renderer) evalBin(e *binExpr, sc *scope) (any, error) {
	if inner, ok := e.l.(*binExpr); ok && e.op == "+" && inner.op == "+" {
		return r.plusChain(e, sc)
	}
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	return r.arith(e.op, l, rv)
}

func (r *renderer) arith(op string, l, rv any) (any, error) {
	if u, ok := l.(undefinedVal); ok {
		return nil, r.undefinedErr(u)
	}
	if u, ok := rv.(undefinedVal); ok {
		return nil, r.undefinedErr(u)
	}
	switch op {
	case "+":
		switch a := l.(type) {
		case string:
			if b, ok := rv.(string); ok {
				return a + b, nil
			}
		case []any:
			if b, ok := rv.([]any); ok {
				return append(append(make([]any, 0, len(a)+len(b)), a...), b...), nil
			}
		case tuple:
			if b, ok := rv.(tuple); ok {
				return append(append(make(tuple, 0, len(a)+len(b)), a...), b...), nil
			}
		}
	case "*":
		if n, ok := asInt(rv); ok {
			switch a := l.(type) {
			case string:
				return strings.Repeat(a, int(max(0, min(n, maxRange)))), nil
			case []any:
				var out []any
				for range max(0, min(n, maxRange)) {
					out = append(out, a...)
				}
				return out, nil
			}
		}
		if n, ok := asInt(l); ok {
			if a, ok := rv.(string); ok {
				return strings.Repeat(a, int(max(0, min(n, maxRange)))), nil
			}
		}
	case "%":
		if f, ok := l.(string); ok {
			return r.percentFormat(f, rv)
		}
	}
	ai, aInt := asInt(l)
	bi, bInt := asInt(rv)
	af, aNum := asFloat(l)
	bf, bNum := asFloat(rv)
	if !aNum || !bNum {
		return nil, r.errorf("unsupported operand types for %s: %s and %s", op, typeName(l), typeName(rv))
	}
	bothInt := aInt && bInt
	switch op {
	case "+":
		if bothInt {
			return ai + bi, nil
		}
		return af + bf, nil
	case "-":
		if bothInt {
			return ai - bi, nil
		}
		return af - bf, nil
	case "*":
		if bothInt {
			return ai * bi, nil
		}
		return af * bf, nil
	case "/":
		if bf == 0 {
			return nil, r.errorf("division by zero")
		}
		return af / bf, nil
	case "//":
		if bf == 0 {
			return nil, r.errorf("integer division or modulo by zero")
		}
		if bothInt {
			q := ai / bi
			if (ai%bi != 0) && ((ai < 0) != (bi < 0)) {
				q--
			}
			return q, nil
		}
		return math.Floor(af / bf), nil
	case "%":
		if bf == 0 {
			return nil, r.errorf("integer division or modulo by zero")
		}
		if bothInt {
			m := ai % bi
			if m != 0 && ((m < 0) != (bi < 0)) {
				m += bi
			}
			return m, nil
		}
		m := math.Mod(af, bf)
		if m != 0 && ((m < 0) != (bf < 0)) {
			m += bf
		}
		return m, nil
	case "**":
		if bothInt && bi >= 0 {
			out := int64(1)
			for range min(bi, 64) {
				out *= ai
			}
			return out, nil
		}
		return math.Pow(af, bf), nil
	}
	return nil, r.errorf("unknown operator %s", op)
}

// plusChain evaluates a + b + c ... left to right as Python does, but while every operand is
// a string it copies them once at the end instead of once per "+". Fast path of the chat
// templates' message lines ('<|im_start|>' + role + '\n' + content + ...).
func (r *renderer) plusChain(e *binExpr, sc *scope) (any, error) {
	var ops []expr
	for x := e; ; {
		ops = append(ops, x.r)
		l, ok := x.l.(*binExpr)
		if !ok || l.op != "+" {
			ops = append(ops, x.l)
			break
		}
		x = l
	}
	slices.Reverse(ops)
	var parts []string
	var acc any
	strMode := true
	for i, op := range ops {
		v, err := r.eval(op, sc)
		if err != nil {
			return nil, err
		}
		if s, ok := v.(string); ok && strMode {
			parts = append(parts, s)
			continue
		}
		if strMode {
			strMode = false
			if i == 0 {
				acc = v
				continue
			}
			acc = strings.Join(parts, "")
		}
		if acc, err = r.arith("+", acc, v); err != nil {
			return nil, err
		}
	}
	if strMode {
		return strings.Join(parts, ""), nil
	}
	return acc, nil
}

// percentFormat implements the common cases of Python's "fmt" % args: %s, %d, %r, %%.
func (r *renderer) percentFormat(f string, args any) (any, error) {
	var list []any
	if t, ok := args.(tuple); ok {
		list = t
	} else {
		list = []any{args}
	}
	var b strings.Builder
	k := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		if f[i] == '%' {
			b.WriteByte('%')
			continue
		}
		if k >= len(list) {
			return nil, r.errorf("not enough arguments for format string")
		}
		switch f[i] {
		case 's':
			writeStr(&b, list[k])
		case 'r':
			writeRepr(&b, list[k])
		case 'd', 'i':
			n, ok := asInt(list[k])
			if f, isF := list[k].(float64); isF {
				n, ok = int64(f), true
			}
			if !ok {
				return nil, r.errorf("%%d format: a number is required, not %s", typeName(list[k]))
			}
			b.WriteString(strconv.FormatInt(n, 10))
		default:
			return nil, r.errorf("unsupported format character %q", f[i])
		}
		k++
	}
	if k < len(list) {
		return nil, r.errorf("not all arguments converted during string formatting")
	}
	return b.String(), nil
}

func (r *renderer) compare(op string, a, b any) (bool, error) {
	switch op {
	case "==":
		return pyEqual(a, b), nil
	case "!=":
		return !pyEqual(a, b), nil
	case "in", "notin":
		in, err := r.contains(b, a)
		if err != nil {
			return false, err
		}
		return in == (op == "in"), nil
	}
	c, err := r.order(a, b)
	if err != nil {
		return false, err
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	case ">=":
		return c >= 0, nil
	}
	return false, r.errorf("unknown comparison %s", op)
}

// order compares two values as Python's < does.
func (r *renderer) order(a, b any) (int, error) {
	if af, ok := asFloat(a); ok {
		if bf, ok := asFloat(b); ok {
			ai, aInt := asInt(a)
			bi, bInt := asInt(b)
			switch {
			case aInt && bInt && ai < bi, af < bf:
				return -1, nil
			case aInt && bInt && ai > bi, af > bf:
				return 1, nil
			}
			return 0, nil
		}
	}
	if as, ok := a.(string); ok {
		if bs, ok := b.(string); ok {
			return strings.Compare(as, bs), nil
		}
	}
	al, aok := asList(a)
	bl, bok := asList(b)
	if aok && bok {
		for i := 0; i < len(al) && i < len(bl); i++ {
			if pyEqual(al[i], bl[i]) {
				continue
			}
			return r.order(al[i], bl[i])
		}
		return len(al) - len(bl), nil
	}
	return 0, r.errorf("comparison not supported between %s and %s", typeName(a), typeName(b))
}

func (r *renderer) contains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, r.errorf("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(c, s), nil
	case []any:
		for _, v := range c {
			if pyEqual(v, item) {
				return true, nil
			}
		}
		return false, nil
	case tuple:
		for _, v := range c {
			if pyEqual(v, item) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		s, ok := item.(string)
		if !ok {
			return false, nil
		}
		_, in := c.m[s]
		return in, nil
	case undefinedVal:
		return false, nil
	}
	return false, r.errorf("argument of type %s is not iterable", typeName(container))
}

func (r *renderer) evalSlice(e *sliceExpr, sc *scope) (any, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]*int64
	for i, x := range []expr{e.start, e.stop, e.step} {
		if x == nil {
			continue
		}
		v, err := r.eval(x, sc)
		if err != nil {
			return nil, err
		}
		if v == nil {
			continue
		}
		n, ok := asInt(v)
		if !ok {
			return nil, r.errorf("slice indices must be integers, not %s", typeName(v))
		}
		bounds[i] = &n
	}
	step := int64(1)
	if bounds[2] != nil {
		step = *bounds[2]
		if step == 0 {
			return nil, r.errorf("slice step cannot be zero")
		}
	}
	pick := func(n int) []int {
		start, stop := sliceIndices(n, bounds[0], bounds[1], step)
		var idx []int
		if step > 0 {
			for i := start; i < stop; i += int(step) {
				idx = append(idx, i)
			}
		} else {
			for i := start; i > stop; i += int(step) {
				idx = append(idx, i)
			}
		}
		return idx
	}
	switch v := obj.(type) {
	case string:
		runes := []rune(v)
		var b strings.Builder
		for _, i := range pick(len(runes)) {
			b.WriteRune(runes[i])
		}
		return b.String(), nil
	case []any:
		out := []any{}
		for _, i := range pick(len(v)) {
			out = append(out, v[i])
		}
		return out, nil
	case tuple:
		out := tuple{}
		for _, i := range pick(len(v)) {
			out = append(out, v[i])
		}
		return out, nil
	case undefinedVal:
		return nil, r.undefinedErr(v)
	}
	return nil, r.errorf("%s is not subscriptable", typeName(obj))
}

// sliceIndices resolves Python slice bounds for a sequence of length n.
func sliceIndices(n int, start, stop *int64, step int64) (int, int) {
	clamp := func(p *int64, def int, lo, hi int) int {
		if p == nil {
			return def
		}
		i := int(*p)
		if i < 0 {
			i += n
		}
		return max(lo, min(hi, i))
	}
	if step > 0 {
		return clamp(start, 0, 0, n), clamp(stop, n, 0, n)
	}
	return clamp(start, n-1, -1, n-1), clamp(stop, -1, -1, n-1)
}

func (r *renderer) getItem(obj, key any) (any, error) {
	switch o := obj.(type) {
	case *Dict:
		if k, ok := key.(string); ok {
			if v, ok := o.m[k]; ok {
				return v, nil
			}
			return r.attrFallback(obj, k)
		}
		return undefinedVal{}, nil
	case []any, tuple, string:
		n, ok := asInt(key)
		if !ok {
			if k, ok := key.(string); ok {
				return r.attrFallback(obj, k)
			}
			return undefinedVal{}, nil
		}
		switch o := o.(type) {
		case []any:
			return index(o, n), nil
		case tuple:
			return index(o, n), nil
		case string:
			runes := []rune(o)
			if n < 0 {
				n += int64(len(runes))
			}
			if n < 0 || n >= int64(len(runes)) {
				return undefinedVal{}, nil
			}
			return string(runes[n]), nil
		}
	case undefinedVal:
		return nil, r.undefinedErr(o)
	}
	if k, ok := key.(string); ok {
		return r.getAttr(obj, k)
	}
	return undefinedVal{}, nil
}

// attrFallback is the attribute lookup Jinja tries when a subscript finds no item.
func (r *renderer) attrFallback(obj any, name string) (any, error) {
	if m := r.method(obj, name); m != nil {
		return m, nil
	}
	return undefinedVal{name: name}, nil
}

func index(items []any, n int64) any {
	if n < 0 {
		n += int64(len(items))
	}
	if n < 0 || n >= int64(len(items)) {
		return undefinedVal{}
	}
	return items[n]
}

// getAttr is Jinja's obj.name: a Python attribute (a method) first, then the item.
func (r *renderer) getAttr(obj any, name string) (any, error) {
	switch o := obj.(type) {
	case undefinedVal:
		return nil, r.undefinedErr(o)
	case *namespace:
		if v, ok := o.attrs.get(name); ok {
			return v, nil
		}
		return undefinedVal{name: name}, nil
	case *loopInfo:
		return r.loopAttr(o, name), nil
	}
	if m := r.method(obj, name); m != nil {
		return m, nil
	}
	if d, ok := obj.(*Dict); ok {
		if v, ok := d.m[name]; ok {
			return v, nil
		}
	}
	return undefinedVal{name: name}, nil
}

func (r *renderer) loopAttr(l *loopInfo, name string) any {
	switch name {
	case "index":
		return int64(l.index0 + 1)
	case "index0":
		return int64(l.index0)
	case "revindex":
		return int64(l.length - l.index0)
	case "revindex0":
		return int64(l.length - l.index0 - 1)
	case "first":
		return l.index0 == 0
	case "last":
		return l.index0 == l.length-1
	case "length":
		return int64(l.length)
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	case "previtem":
		if l.index0 > 0 {
			return l.items[l.index0-1]
		}
	case "nextitem":
		if l.index0+1 < l.length {
			return l.items[l.index0+1]
		}
	case "cycle":
		i := l.index0
		return pyFunc(func(args []any, _ map[string]any) (any, error) {
			if len(args) == 0 {
				return nil, r.errorf("loop.cycle needs at least one argument")
			}
			return args[i%len(args)], nil
		})
	}
	return undefinedVal{name: name}
}

func (r *renderer) evalCall(e *callExpr, sc *scope) (any, error) {
	fn, err := r.eval(e.fn, sc)
	if err != nil {
		return nil, err
	}
	args, err := r.evalList(e.args, sc)
	if err != nil {
		return nil, err
	}
	kwargs, err := r.evalKwargs(e.kwargs, sc)
	if err != nil {
		return nil, err
	}
	switch f := fn.(type) {
	case pyFunc:
		return f(args, kwargs)
	case *macroVal:
		return r.callMacro(f, args, kwargs)
	case undefinedVal:
		return nil, r.undefinedErr(f)
	}
	return nil, r.errorf("%s is not callable", typeName(fn))
}

func (r *renderer) callMacro(mv *macroVal, args []any, kwargs map[string]any) (any, error) {
	m := mv.m
	if len(args) > len(m.params) {
		return nil, r.errorf("macro %s takes %d arguments, got %d", m.name, len(m.params), len(args))
	}
	if r.depth >= maxMacroDepth {
		return nil, r.errorf("macro %s: recursion deeper than %d", m.name, maxMacroDepth)
	}
	sc := newScope(mv.scope)
	firstDefault := len(m.params) - len(m.defaults)
	for i, p := range m.params {
		switch v, ok := kwargs[p]; {
		case i < len(args):
			sc.vars[p] = args[i]
		case ok:
			sc.vars[p] = v
		case i >= firstDefault:
			d, err := r.eval(m.defaults[i-firstDefault], sc)
			if err != nil {
				return nil, err
			}
			sc.vars[p] = d
		default:
			sc.vars[p] = undefinedVal{name: p}
		}
	}
	r.depth++
	s, err := r.capture(m.body, sc)
	r.depth--
	return s, err
}

// ---- Python semantics helpers -------------------------------------------------------------

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func asInt(v any) (int64, bool) {
	switch v := v.(type) {
	case int64:
		return v, true
	case bool:
		return boolInt(v), true
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch v := v.(type) {
	case int64:
		return float64(v), true
	case float64:
		return v, true
	case bool:
		return float64(boolInt(v)), true
	}
	return 0, false
}

func asList(v any) ([]any, bool) {
	switch v := v.(type) {
	case []any:
		return v, true
	case tuple:
		return v, true
	}
	return nil, false
}

func truthy(v any) bool {
	switch v := v.(type) {
	case nil, undefinedVal:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case float64:
		return v != 0
	case string:
		return v != ""
	case []any:
		return len(v) > 0
	case tuple:
		return len(v) > 0
	case *Dict:
		return len(v.keys) > 0
	}
	return true
}

func pyEqual(a, b any) bool {
	if af, ok := asFloat(a); ok {
		if bf, ok := asFloat(b); ok {
			ai, aInt := asInt(a)
			bi, bInt := asInt(b)
			if aInt && bInt {
				return ai == bi
			}
			return af == bf
		}
		return false
	}
	switch a := a.(type) {
	case nil:
		return b == nil
	case undefinedVal:
		_, ok := b.(undefinedVal)
		return ok
	case string:
		bs, ok := b.(string)
		return ok && a == bs
	case []any:
		bl, ok := b.([]any)
		return ok && listEqual(a, bl)
	case tuple:
		bl, ok := b.(tuple)
		return ok && listEqual(a, bl)
	case *Dict:
		bd, ok := b.(*Dict)
		if !ok || len(a.keys) != len(bd.keys) {
			return false
		}
		for k, v := range a.m {
			if w, ok := bd.m[k]; !ok || !pyEqual(v, w) {
				return false
			}
		}
		return true
	}
	return a == b
}

func listEqual(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !pyEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case undefinedVal:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case *loopInfo:
		return "LoopContext"
	case pyFunc, *macroVal:
		return "function"
	}
	return fmt.Sprintf("%T", v)
}

// writeStr writes Python's str(v) (an undefined value prints nothing).
func writeStr(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		b.WriteString(v)
	case undefinedVal:
	case nil:
		b.WriteString("None")
	case bool:
		if v {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case float64:
		b.WriteString(pyFloat(v))
	default:
		writeRepr(b, v)
	}
}

func str(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	var b strings.Builder
	writeStr(&b, v)
	return b.String()
}

// writeRepr writes Python's repr(v).
func writeRepr(b *strings.Builder, v any) {
	switch v := v.(type) {
	case string:
		writeStringRepr(b, v)
	case []any:
		b.WriteByte('[')
		for i, it := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it)
		}
		b.WriteByte(']')
	case tuple:
		b.WriteByte('(')
		for i, it := range v {
			if i > 0 {
				b.WriteString(", ")
			}
			writeRepr(b, it)
		}
		if len(v) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case *Dict:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeStringRepr(b, k)
			b.WriteString(": ")
			writeRepr(b, v.m[k])
		}
		b.WriteByte('}')
	case *namespace:
		b.WriteString("<Namespace ")
		writeRepr(b, v.attrs)
		b.WriteByte('>')
	case pyFunc, *macroVal, *loopInfo:
		b.WriteString("<" + typeName(v) + ">")
	default:
		writeStr(b, v)
	}
}

func writeStringRepr(b *strings.Builder, s string) {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	b.WriteByte(q)
	for _, c := range s {
		switch {
		case c == rune(q) || c == '\\':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		case c == utf8.RuneError || !pyPrintable(c):
			switch {
			case c < 0x100:
				fmt.Fprintf(b, `\x%02x`, c)
			case c < 0x10000:
				fmt.Fprintf(b, `\u%04x`, c)
			default:
				fmt.Fprintf(b, `\U%08x`, c)
			}
		default:
			b.WriteRune(c)
		}
	}
	b.WriteByte(q)
}

// pyFloat formats a float as Python's repr does.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	decpt := exp + 1
	if decpt > -4 && decpt <= 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
		return s
	}
	sign := "+"
	if exp < 0 {
		sign, exp = "-", -exp
	}
	return fmt.Sprintf("%se%s%02d", mant, sign, exp)
}
