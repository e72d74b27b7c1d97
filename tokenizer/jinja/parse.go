package jinja

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Errors of Compile and Render.
var (
	// ErrTemplate is wrapped by every error of compiling or rendering a template.
	ErrTemplate = errors.New("chat template error")
	// ErrRaised is wrapped, beside ErrTemplate, by the error of a template that called
	// raise_exception: the template itself refuses its input.
	ErrRaised = errors.New("template raised")
)

// ---- lexer --------------------------------------------------------------------------------

type tokKind uint8

const (
	tokText       tokKind = iota // template data
	tokVarBegin                  // {{
	tokVarEnd                    // }}
	tokBlockBegin                // {%
	tokBlockEnd                  // %}
	tokName
	tokString
	tokInt
	tokFloat
	tokOp
	tokEOF
)

type token struct {
	kind tokKind
	val  string
	line int
}

func (t token) String() string {
	switch t.kind {
	case tokEOF:
		return "end of template"
	case tokText:
		return "template text"
	case tokVarEnd:
		return "'}}'"
	case tokBlockEnd:
		return "'%}'"
	}
	return strconv.Quote(t.val)
}

type lexer struct {
	src        string
	pos        int
	line       int
	toks       []token
	lastTagMod byte // '-' or '+' before the end of the last tag, or 0
}

func (lx *lexer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrTemplate, lx.line, fmt.Sprintf(format, args...))
}

// lex cuts a template into tokens, applying the whitespace rules of Jinja with trim_blocks and
// lstrip_blocks.
func lex(src string) ([]token, error) {
	// Jinja normalizes line endings and drops one trailing newline (keep_trailing_newline off).
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, line: 1}
	stripNext := false // a -%} or -}} strips the whitespace that follows
	trimNewline := false
	for lx.pos < len(src) {
		k := indexTagStart(src[lx.pos:])
		end := len(src)
		if k >= 0 {
			end = lx.pos + k
		}
		text := src[lx.pos:end]
		if stripNext {
			text = strings.TrimLeft(text, " \t\n\r\v\f")
		} else if trimNewline {
			text = strings.TrimPrefix(text, "\n")
		}
		stripNext, trimNewline = false, false
		if k < 0 {
			lx.emitText(text)
			lx.pos = len(src)
			break
		}
		open := src[end : end+2]
		mod := byte(0)
		if end+2 < len(src) && (src[end+2] == '-' || src[end+2] == '+') {
			mod = src[end+2]
		}
		switch {
		case mod == '-':
			text = strings.TrimRight(text, " \t\n\r\v\f")
		case mod == 0 && open != "{{":
			// lstrip_blocks: spaces and tabs between a line start and a block or comment tag.
			i := strings.LastIndexByte(text, '\n')
			if (i >= 0 || lx.atLineStart(end-len(text))) && strings.TrimFunc(text[i+1:], unicode.IsSpace) == "" {
				text = text[:i+1]
			}
		}
		lx.emitText(text)
		lx.line += strings.Count(src[lx.pos:end], "\n")
		lx.pos = end + 2
		if mod != 0 {
			lx.pos++
		}
		var err error
		switch open {
		case "{#":
			stripNext, trimNewline, err = lx.comment()
		case "{{":
			lx.toks = append(lx.toks, token{kind: tokVarBegin, line: lx.line})
			stripNext, err = lx.tag("}}")
		case "{%":
			if name := lx.peekName(); name == "raw" {
				stripNext, trimNewline, err = lx.raw()
			} else {
				lx.toks = append(lx.toks, token{kind: tokBlockBegin, line: lx.line})
				stripNext, err = lx.tag("%}")
				trimNewline = !stripNext && lx.lastTagMod != '+'
			}
		}
		if err != nil {
			return nil, err
		}
	}
	lx.toks = append(lx.toks, token{kind: tokEOF, line: lx.line})
	return lx.toks, nil
}

// atLineStart reports whether position i of the source starts a line.
func (lx *lexer) atLineStart(i int) bool { return i == 0 || lx.src[i-1] == '\n' }

func indexTagStart(s string) int {
	for i := 0; ; {
		k := strings.IndexByte(s[i:], '{')
		if k < 0 || i+k+1 >= len(s) {
			return -1
		}
		switch s[i+k+1] {
		case '{', '%', '#':
			return i + k
		}
		i += k + 1
	}
}

func (lx *lexer) emitText(s string) {
	if s != "" {
		lx.toks = append(lx.toks, token{kind: tokText, val: s, line: lx.line})
	}
}

func (lx *lexer) peekName() string {
	i := lx.pos
	for i < len(lx.src) && isSpaceByte(lx.src[i]) {
		i++
	}
	j := i
	for j < len(lx.src) && isNameByte(lx.src[j]) {
		j++
	}
	return lx.src[i:j]
}

func (lx *lexer) comment() (stripNext, trimNewline bool, err error) {
	k := strings.Index(lx.src[lx.pos:], "#}")
	if k < 0 {
		return false, false, lx.errorf("unclosed comment")
	}
	body := lx.src[lx.pos : lx.pos+k]
	lx.line += strings.Count(body, "\n")
	lx.pos += k + 2
	switch {
	case strings.HasSuffix(body, "-"):
		return true, false, nil
	case strings.HasSuffix(body, "+"):
		return false, false, nil
	}
	return false, true, nil
}

// raw handles {% raw %}...{% endraw %}: the body is text, untouched.
func (lx *lexer) raw() (stripNext, trimNewline bool, err error) {
	// Skip "raw" and the end of the opening tag.
	k := strings.Index(lx.src[lx.pos:], "%}")
	if k < 0 {
		return false, false, lx.errorf("unclosed raw tag")
	}
	rawStrip := k > 0 && lx.src[lx.pos+k-1] == '-'
	lx.pos += k + 2
	start := lx.pos
	for {
		j := strings.Index(lx.src[lx.pos:], "{%")
		if j < 0 {
			return false, false, lx.errorf("raw block without endraw")
		}
		p := lx.pos + j + 2
		mod := byte(0)
		if p < len(lx.src) && (lx.src[p] == '-' || lx.src[p] == '+') {
			mod = lx.src[p]
			p++
		}
		save := lx.pos
		lx.pos = p
		if lx.peekName() != "endraw" {
			lx.pos = save + j + 2
			continue
		}
		e := strings.Index(lx.src[p:], "%}")
		if e < 0 {
			return false, false, lx.errorf("unclosed endraw tag")
		}
		body := lx.src[start : save+j]
		if rawStrip {
			body = strings.TrimLeft(body, " \t\n\r\v\f")
		} else {
			body = strings.TrimPrefix(body, "\n")
		}
		if mod == '-' {
			body = strings.TrimRight(body, " \t\n\r\v\f")
		} else if mod == 0 {
			if i := strings.LastIndexByte(body, '\n'); strings.Trim(body[i+1:], " \t") == "" && i >= 0 {
				body = body[:i+1]
			}
		}
		lx.emitText(body)
		lx.line += strings.Count(lx.src[start:p+e+2], "\n")
		endStrip := p+e > 0 && lx.src[p+e-1] == '-'
		lx.pos = p + e + 2
		return endStrip, !endStrip, nil
	}
}

func isSpaceByte(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
func isNameByte(c byte) bool {
	return c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z') || (c >= '0' && c <= '9')
}

// operators, longest first.
var jinjaOps = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
	"=", "(", ")", "[", "]", "{", "}", ".", ":", ",", "|", ";"}

// tag lexes the expression tokens of a tag up to its end delimiter; it returns whether the tag
// ends with "-" (strip the whitespace after it).
func (lx *lexer) tag(end string) (bool, error) {
	depth := 0
	lx.lastTagMod = 0
	for {
		for lx.pos < len(lx.src) && isSpaceByte(lx.src[lx.pos]) {
			if lx.src[lx.pos] == '\n' {
				lx.line++
			}
			lx.pos++
		}
		if lx.pos >= len(lx.src) {
			return false, lx.errorf("unclosed tag, want %q", end)
		}
		rest := lx.src[lx.pos:]
		if depth == 0 {
			for _, m := range []string{"", "-", "+"} {
				if strings.HasPrefix(rest, m+end) {
					kind := tokVarEnd
					if end == "%}" {
						kind = tokBlockEnd
					}
					lx.toks = append(lx.toks, token{kind: kind, line: lx.line})
					lx.pos += len(m) + len(end)
					if m != "" {
						lx.lastTagMod = m[0]
					}
					return m == "-", nil
				}
			}
		}
		c := rest[0]
		switch {
		case c == '\'' || c == '"':
			s, n, err := lx.stringLit(rest)
			if err != nil {
				return false, err
			}
			lx.toks = append(lx.toks, token{kind: tokString, val: s, line: lx.line})
			lx.pos += n
		case c >= '0' && c <= '9':
			n, isFloat := numberLen(rest)
			kind := tokInt
			if isFloat {
				kind = tokFloat
			}
			lx.toks = append(lx.toks, token{kind: kind, val: strings.ReplaceAll(rest[:n], "_", ""), line: lx.line})
			lx.pos += n
		case isNameByte(c):
			n := 0
			for n < len(rest) && isNameByte(rest[n]) {
				n++
			}
			lx.toks = append(lx.toks, token{kind: tokName, val: rest[:n], line: lx.line})
			lx.pos += n
		default:
			op := ""
			for _, o := range jinjaOps {
				if strings.HasPrefix(rest, o) {
					op = o
					break
				}
			}
			if op == "" {
				r, _ := utf8.DecodeRuneInString(rest)
				return false, lx.errorf("unexpected character %q", r)
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			}
			lx.toks = append(lx.toks, token{kind: tokOp, val: op, line: lx.line})
			lx.pos += len(op)
		}
	}
}

func numberLen(s string) (int, bool) {
	n := 0
	digits := func() {
		for n < len(s) && (s[n] >= '0' && s[n] <= '9' || s[n] == '_') {
			n++
		}
	}
	digits()
	isFloat := false
	if n+1 < len(s) && s[n] == '.' && s[n+1] >= '0' && s[n+1] <= '9' {
		isFloat = true
		n++
		digits()
	}
	if n < len(s) && (s[n] == 'e' || s[n] == 'E') {
		m := n + 1
		if m < len(s) && (s[m] == '+' || s[m] == '-') {
			m++
		}
		if m < len(s) && s[m] >= '0' && s[m] <= '9' {
			isFloat = true
			n = m
			digits()
		}
	}
	return n, isFloat
}

// stringLit reads a quoted string literal with Python's escapes.
func (lx *lexer) stringLit(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c == '\\' && i+1 < len(s):
			e := s[i+1]
			i += 2
			switch e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '\\', '\'', '"':
				b.WriteByte(e)
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'v':
				b.WriteByte('\v')
			case '0', '1', '2', '3', '4', '5', '6', '7':
				j := i - 1
				for j < len(s) && j < i+2 && s[j] >= '0' && s[j] <= '7' {
					j++
				}
				v, _ := strconv.ParseUint(s[i-1:j], 8, 32)
				b.WriteRune(rune(v))
				i = j
			case 'x', 'u', 'U':
				n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
				if i+n > len(s) {
					return "", 0, lx.errorf("truncated \\%c escape", e)
				}
				v, err := strconv.ParseUint(s[i:i+n], 16, 32)
				if err != nil {
					return "", 0, lx.errorf("bad \\%c escape", e)
				}
				b.WriteRune(rune(v))
				i += n
			case '\n':
				lx.line++ // line continuation
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		default:
			if c == '\n' {
				lx.line++
			}
			b.WriteByte(c)
			i++
		}
	}
	return "", 0, lx.errorf("unterminated string")
}

// ---- syntax tree ----------------------------------------------------------------------------

type expr interface{}

type (
	constExpr struct{ v any }
	nameExpr  struct{ name string }
	listExpr  struct{ items []expr }
	tupleExpr struct{ items []expr }
	dictExpr  struct{ keys, vals []expr }
	attrExpr  struct {
		obj  expr
		name string
	}
	itemExpr  struct{ obj, key expr }
	sliceExpr struct {
		obj               expr
		start, stop, step expr // nil when absent
	}
	callExpr struct {
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		obj    expr // nil inside a filter block
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		obj    expr
		name   string
		args   []expr
		negate bool
	}
	unaryExpr struct {
		op string // "-", "+", "not"
		x  expr
	}
	binExpr struct {
		op   string // + - * / // % ** and or
		l, r expr
	}
	concatExpr  struct{ parts []expr }
	compareExpr struct {
		first expr
		ops   []string // == != < <= > >= in notin
		rest  []expr
	}
	condExpr struct{ test, yes, no expr } // no may be nil
)

type kwarg struct {
	name string
	val  expr
}

type stmt interface{}

type (
	textStmt   struct{ s string }
	outputStmt struct{ e expr }
	ifStmt     struct {
		conds  []expr
		bodies [][]stmt
		orElse []stmt
	}
	forStmt struct {
		targets []string
		iter    expr
		cond    expr // nil when absent
		body    []stmt
		orElse  []stmt
	}
	setStmt struct {
		targets []string // names, or one name with attr set
		attr    string   // namespace attribute: targets[0].attr
		value   expr
	}
	setBlockStmt struct {
		name    string
		filters []*filterExpr
		body    []stmt
	}
	macroStmt struct {
		name     string
		params   []string
		defaults []expr // aligned with the trailing params
		body     []stmt
	}
	filterBlockStmt struct {
		filters []*filterExpr
		body    []stmt
	}
	breakStmt    struct{}
	continueStmt struct{}
)

// ---- parser -------------------------------------------------------------------------------

type parser struct {
	toks []token
	pos  int
}

func (p *parser) cur() token  { return p.toks[p.pos] }
func (p *parser) next() token { t := p.toks[p.pos]; p.pos++; return t }
func (p *parser) peek(k int) token {
	if p.pos+k < len(p.toks) {
		return p.toks[p.pos+k]
	}
	return p.toks[len(p.toks)-1]
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrTemplate, p.cur().line, fmt.Sprintf(format, args...))
}

func (p *parser) isOp(op string) bool { t := p.cur(); return t.kind == tokOp && t.val == op }
func (p *parser) isName(n string) bool {
	t := p.cur()
	return t.kind == tokName && t.val == n
}

func (p *parser) skipOp(op string) bool {
	if p.isOp(op) {
		p.pos++
		return true
	}
	return false
}

func (p *parser) skipName(n string) bool {
	if p.isName(n) {
		p.pos++
		return true
	}
	return false
}

func (p *parser) expectOp(op string) error {
	if !p.skipOp(op) {
		return p.errorf("want %q, got %s", op, p.cur())
	}
	return nil
}

func (p *parser) expectName() (string, error) {
	t := p.cur()
	if t.kind != tokName {
		return "", p.errorf("want a name, got %s", t)
	}
	p.pos++
	return t.val, nil
}

func (p *parser) expectBlockEnd() error {
	if p.cur().kind != tokBlockEnd {
		return p.errorf("want '%%}', got %s", p.cur())
	}
	p.pos++
	return nil
}

// parseTemplate parses a whole template.
func parseTemplate(src string) ([]stmt, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, end, err := p.parseBody(nil)
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, p.errorf("unexpected {%% %s %%}", end)
	}
	return body, nil
}

// parseBody parses statements until a block tag named in ends (consumed up to the name, which
// is returned) or the end of the template ("").
func (p *parser) parseBody(ends []string) ([]stmt, string, error) {
	var body []stmt
	for {
		t := p.cur()
		switch t.kind {
		case tokEOF:
			if len(ends) > 0 {
				return nil, "", p.errorf("missing {%% %s %%}", ends[len(ends)-1])
			}
			return body, "", nil
		case tokText:
			p.pos++
			body = append(body, &textStmt{s: t.val})
		case tokVarBegin:
			p.pos++
			e, err := p.parseTuple(false)
			if err != nil {
				return nil, "", err
			}
			if p.cur().kind != tokVarEnd {
				return nil, "", p.errorf("want '}}', got %s", p.cur())
			}
			p.pos++
			body = append(body, &outputStmt{e: e})
		case tokBlockBegin:
			p.pos++
			name := p.cur()
			if name.kind != tokName {
				return nil, "", p.errorf("want a statement, got %s", name)
			}
			for _, e := range ends {
				if name.val == e {
					p.pos++
					return body, e, nil
				}
			}
			s, err := p.parseStatement()
			if err != nil {
				return nil, "", err
			}
			body = append(body, s)
		default:
			return nil, "", p.errorf("unexpected %s", t)
		}
	}
}

func (p *parser) parseStatement() (stmt, error) {
	name := p.next().val
	switch name {
	case "if":
		return p.parseIf()
	case "for":
		return p.parseFor()
	case "set":
		return p.parseSet()
	case "macro":
		return p.parseMacro()
	case "filter":
		filters, err := p.parseFilterChain()
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endfilter"})
		if err != nil {
			return nil, err
		}
		return &filterBlockStmt{filters: filters, body: body}, p.expectBlockEnd()
	case "generation":
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, _, err := p.parseBody([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		return &ifStmt{conds: []expr{&constExpr{v: true}}, bodies: [][]stmt{body}}, p.expectBlockEnd()
	case "break":
		return &breakStmt{}, p.expectBlockEnd()
	case "continue":
		return &continueStmt{}, p.expectBlockEnd()
	}
	p.pos--
	return nil, p.errorf("unsupported statement %q", name)
}

func (p *parser) parseIf() (stmt, error) {
	s := &ifStmt{}
	for {
		cond, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		body, end, err := p.parseBody([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		s.conds = append(s.conds, cond)
		s.bodies = append(s.bodies, body)
		switch end {
		case "elif":
			continue
		case "else":
			if err := p.expectBlockEnd(); err != nil {
				return nil, err
			}
			if s.orElse, _, err = p.parseBody([]string{"endif"}); err != nil {
				return nil, err
			}
		}
		return s, p.expectBlockEnd()
	}
}

func (p *parser) parseFor() (stmt, error) {
	s := &forStmt{}
	for {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		s.targets = append(s.targets, n)
		if !p.skipOp(",") {
			break
		}
	}
	if !p.skipName("in") {
		return nil, p.errorf("want 'in', got %s", p.cur())
	}
	iter, err := p.parseTupleNoCond()
	if err != nil {
		return nil, err
	}
	s.iter = iter
	if p.skipName("if") {
		if s.cond, err = p.parseExpr(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.errorf("recursive loops are not supported")
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, end, err := p.parseBody([]string{"else", "endfor"})
	if err != nil {
		return nil, err
	}
	s.body = body
	if end == "else" {
		if err := p.expectBlockEnd(); err != nil {
			return nil, err
		}
		if s.orElse, _, err = p.parseBody([]string{"endfor"}); err != nil {
			return nil, err
		}
	}
	return s, p.expectBlockEnd()
}

func (p *parser) parseSet() (stmt, error) {
	first, err := p.expectName()
	if err != nil {
		return nil, err
	}
	if p.skipOp(".") {
		attr, err := p.expectName()
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		v, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		return &setStmt{targets: []string{first}, attr: attr, value: v}, p.expectBlockEnd()
	}
	targets := []string{first}
	for p.skipOp(",") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		targets = append(targets, n)
	}
	if p.skipOp("=") {
		v, err := p.parseTuple(false)
		if err != nil {
			return nil, err
		}
		return &setStmt{targets: targets, value: v}, p.expectBlockEnd()
	}
	if len(targets) != 1 {
		return nil, p.errorf("a set block takes one name")
	}
	var filters []*filterExpr
	if p.isOp("|") {
		if filters, err = p.parseFilterChain(); err != nil {
			return nil, err
		}
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	body, _, err := p.parseBody([]string{"endset"})
	if err != nil {
		return nil, err
	}
	return &setBlockStmt{name: first, filters: filters, body: body}, p.expectBlockEnd()
}

// parseFilterChain parses "name(args) | name ..." after {% filter or {% set x |.
func (p *parser) parseFilterChain() ([]*filterExpr, error) {
	var out []*filterExpr
	p.skipOp("|")
	for {
		f, err := p.parseFilterCall(nil)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
		if !p.skipOp("|") {
			return out, nil
		}
	}
}

func (p *parser) parseMacro() (stmt, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	m := &macroStmt{name: name}
	if err := p.expectOp("("); err != nil {
		return nil, err
	}
	for !p.skipOp(")") {
		if len(m.params) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
			if p.skipOp(")") {
				break
			}
		}
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		m.params = append(m.params, n)
		if p.skipOp("=") {
			d, err := p.parseExpr()
			if err != nil {
				return nil, err
			}
			m.defaults = append(m.defaults, d)
		} else if len(m.defaults) > 0 {
			return nil, p.errorf("macro %s: parameter %s without default after one with", name, n)
		}
	}
	if err := p.expectBlockEnd(); err != nil {
		return nil, err
	}
	if m.body, _, err = p.parseBody([]string{"endmacro"}); err != nil {
		return nil, err
	}
	return m, p.expectBlockEnd()
}

// parseTuple parses an expression, or a tuple of them without parentheses ("a, b").
func (p *parser) parseTuple(bool) (expr, error) {
	first, err := p.parseExpr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return first, nil
	}
	items := []expr{first}
	for p.skipOp(",") {
		if p.tupleEnds() {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleExpr{items: items}, nil
}

func (p *parser) tupleEnds() bool {
	t := p.cur()
	return t.kind == tokVarEnd || t.kind == tokBlockEnd || t.kind == tokEOF || (t.kind == tokOp && t.val == ")")
}

// parseTupleNoCond parses the iterable of a for loop, where "if" starts the loop filter.
func (p *parser) parseTupleNoCond() (expr, error) {
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	if !p.isOp(",") {
		return e, nil
	}
	items := []expr{e}
	for p.skipOp(",") {
		if p.tupleEnds() || p.isName("if") {
			break
		}
		e, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &tupleExpr{items: items}, nil
}

func (p *parser) parseExpr() (expr, error) {
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.skipName("if") {
		test, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		c := &condExpr{test: test, yes: e}
		if p.skipName("else") {
			if c.no, err = p.parseExpr(); err != nil {
				return nil, err
			}
		}
		e = c
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.skipName("or") {
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "or", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.skipName("and") {
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "and", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.skipName("not") {
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{op: "not", x: x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	c := &compareExpr{first: first}
	for {
		t := p.cur()
		var op string
		switch {
		case t.kind == tokOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == "<=" || t.val == ">" || t.val == ">="):
			op = t.val
			p.pos++
		case t.kind == tokName && t.val == "in":
			op = "in"
			p.pos++
		case t.kind == tokName && t.val == "not" && p.peek(1).kind == tokName && p.peek(1).val == "in":
			op = "notin"
			p.pos += 2
		}
		if op == "" {
			break
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, r)
	}
	if len(c.ops) == 0 {
		return first, nil
	}
	return c, nil
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().val
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	first, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	if !p.isOp("~") {
		return first, nil
	}
	c := &concatExpr{parts: []expr{first}}
	for p.skipOp("~") {
		e, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		c.parts = append(c.parts, e)
	}
	return c, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().val
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.skipOp("**") {
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	var e expr
	var err error
	switch {
	case p.isOp("-") || p.isOp("+"):
		op := p.next().val
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{op: op, x: x}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tokName:
		switch t.val {
		case "true", "True":
			return &constExpr{v: true}, nil
		case "false", "False":
			return &constExpr{v: false}, nil
		case "none", "None":
			return &constExpr{v: nil}, nil
		}
		return &nameExpr{name: t.val}, nil
	case tokString:
		s := t.val
		for p.cur().kind == tokString { // adjacent literals concatenate
			s += p.next().val
		}
		return &constExpr{v: s}, nil
	case tokInt:
		v, err := strconv.ParseInt(t.val, 10, 64)
		if err != nil {
			return nil, p.errorf("integer %s out of range", t.val)
		}
		return &constExpr{v: v}, nil
	case tokFloat:
		v, err := strconv.ParseFloat(t.val, 64)
		if err != nil {
			return nil, p.errorf("bad float %s", t.val)
		}
		return &constExpr{v: v}, nil
	case tokOp:
		switch t.val {
		case "(":
			if p.skipOp(")") {
				return &tupleExpr{}, nil
			}
			e, err := p.parseTuple(true)
			if err != nil {
				return nil, err
			}
			return e, p.expectOp(")")
		case "[":
			l := &listExpr{}
			for !p.skipOp("]") {
				if len(l.items) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.skipOp("]") {
						break
					}
				}
				e, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, e)
			}
			return l, nil
		case "{":
			d := &dictExpr{}
			for !p.skipOp("}") {
				if len(d.keys) > 0 {
					if err := p.expectOp(","); err != nil {
						return nil, err
					}
					if p.skipOp("}") {
						break
					}
				}
				k, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				if err := p.expectOp(":"); err != nil {
					return nil, err
				}
				v, err := p.parseExpr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
			}
			return d, nil
		}
	}
	p.pos--
	return nil, p.errorf("unexpected %s", t)
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("."):
			p.pos++
			t := p.next()
			switch t.kind {
			case tokName:
				e = &attrExpr{obj: e, name: t.val}
			case tokInt:
				v, _ := strconv.ParseInt(t.val, 10, 64)
				e = &itemExpr{obj: e, key: &constExpr{v: v}}
			default:
				p.pos--
				return nil, p.errorf("want an attribute name, got %s", t)
			}
		case p.isOp("["):
			p.pos++
			s, err := p.parseSubscript(e)
			if err != nil {
				return nil, err
			}
			e = s
		case p.isOp("("):
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}

func (p *parser) parseSubscript(obj expr) (expr, error) {
	var parts [3]expr
	n, isSlice := 0, false
	for {
		if p.isOp(":") {
			p.pos++
			isSlice = true
			n++
			if n > 2 {
				return nil, p.errorf("too many ':' in a slice")
			}
			continue
		}
		if p.skipOp("]") {
			break
		}
		e, err := p.parseExpr()
		if err != nil {
			return nil, err
		}
		if parts[n] != nil {
			return nil, p.errorf("want ']' or ':', got %s", p.cur())
		}
		parts[n] = e
	}
	if !isSlice {
		if parts[0] == nil {
			return nil, p.errorf("empty subscript")
		}
		return &itemExpr{obj: obj, key: parts[0]}, nil
	}
	return &sliceExpr{obj: obj, start: parts[0], stop: parts[1], step: parts[2]}, nil
}

func (p *parser) parseArgs() ([]expr, []kwarg, error) {
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	var args []expr
	var kwargs []kwarg
	for !p.skipOp(")") {
		if len(args)+len(kwargs) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, err
			}
			if p.skipOp(")") {
				break
			}
		}
		if p.cur().kind == tokName && p.peek(1).kind == tokOp && p.peek(1).val == "=" {
			name := p.next().val
			p.pos++
			v, err := p.parseExpr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name, v})
			continue
		}
		if len(kwargs) > 0 {
			return nil, nil, p.errorf("positional argument after keyword argument")
		}
		v, err := p.parseExpr()
		if err != nil {
			return nil, nil, err
		}
		args = append(args, v)
	}
	return args, kwargs, nil
}

func (p *parser) parseCall(fn expr) (expr, error) {
	args, kwargs, err := p.parseArgs()
	if err != nil {
		return nil, err
	}
	return &callExpr{fn: fn, args: args, kwargs: kwargs}, nil
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("|"):
			p.pos++
			f, err := p.parseFilterCall(e)
			if err != nil {
				return nil, err
			}
			e = f
		case p.isName("is"):
			p.pos++
			t, err := p.parseTest(e)
			if err != nil {
				return nil, err
			}
			e = t
		case p.isOp("("):
			c, err := p.parseCall(e)
			if err != nil {
				return nil, err
			}
			e = c
		default:
			return e, nil
		}
	}
}

func (p *parser) parseFilterCall(obj expr) (*filterExpr, error) {
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	for p.skipOp(".") {
		n, err := p.expectName()
		if err != nil {
			return nil, err
		}
		name += "." + n
	}
	f := &filterExpr{obj: obj, name: name}
	if p.isOp("(") {
		if f.args, f.kwargs, err = p.parseArgs(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) parseTest(obj expr) (expr, error) {
	t := &testExpr{obj: obj}
	t.negate = p.skipName("not")
	name, err := p.expectName()
	if err != nil {
		return nil, err
	}
	t.name = name
	c := p.cur()
	switch {
	case c.kind == tokOp && c.val == "(":
		args, kwargs, err := p.parseArgs()
		if err != nil {
			return nil, err
		}
		if len(kwargs) > 0 {
			return nil, p.errorf("test %s: keyword arguments are not supported", name)
		}
		t.args = args
	case (c.kind == tokName && c.val != "else" && c.val != "or" && c.val != "and" && c.val != "is") ||
		c.kind == tokString || c.kind == tokInt || c.kind == tokFloat ||
		(c.kind == tokOp && (c.val == "[" || c.val == "{")):
		arg, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if arg, err = p.parsePostfix(arg); err != nil {
			return nil, err
		}
		t.args = []expr{arg}
	}
	return t, nil
}
