package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// What the dashboard and alert tests need of PromQL and of the Prometheus text format: which
// metric names an expression selects, with which label matchers, and which labels it groups
// or joins by; and which names and labels a scrape exposes. A small tokenizer, not a PromQL
// parser: it knows the language's keywords, functions (an identifier before "("), label
// matchers ({...}), ranges and subqueries ([...], skipped) and strings.

// selector is one metric selected by an expression, with the label names it matches on.
type selector struct {
	name   string
	labels []string
}

// promQuery is what an expression refers to.
type promQuery struct {
	selectors []selector
	grouping  []string // labels of by, without, on, ignoring, group_left, group_right
}

// promKeywords are identifiers that are never metric names.
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
	"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
	"inf": true, "nan": true,
}

// promGrouping are the keywords followed by a parenthesised list of labels.
var promGrouping = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// parsePromQL extracts the selectors and grouping labels of expr. Grafana variables ($var,
// ${var}, $__rate_interval) may appear inside strings and ranges.
func parsePromQL(expr string) (promQuery, error) {
	var q promQuery
	s := expr
	i := 0
	depth := 0
	skipSpace := func() {
		for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
			i++
		}
	}
	ident := func() string {
		j := i
		for i < len(s) && (isIdentByte(s[i]) || (i > j && s[i] >= '0' && s[i] <= '9')) {
			i++
		}
		return s[j:i]
	}
	str := func() error {
		q := s[i]
		for i++; i < len(s); i++ {
			switch {
			case s[i] == '\\' && q != '`':
				i++
			case s[i] == q:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	// matchers reads {label op "value", ...} and returns the label names.
	matchers := func() ([]string, error) {
		var labels []string
		i++ // {
		for {
			skipSpace()
			if i >= len(s) {
				return nil, fmt.Errorf("unterminated label matchers in %q", expr)
			}
			if s[i] == '}' {
				i++
				return labels, nil
			}
			if s[i] == ',' {
				i++
				continue
			}
			name := ident()
			if name == "" {
				return nil, fmt.Errorf("label name expected at %d in %q", i, expr)
			}
			labels = append(labels, name)
			skipSpace()
			for i < len(s) && strings.ContainsRune("=!~", rune(s[i])) {
				i++
			}
			skipSpace()
			if i >= len(s) || !strings.ContainsRune("\"'`", rune(s[i])) {
				return nil, fmt.Errorf("label value of %s must be a string in %q", name, expr)
			}
			if err := str(); err != nil {
				return nil, err
			}
		}
	}
	for i < len(s) {
		c := s[i]
		switch {
		case strings.ContainsRune(" \t\r\n,+-*/%^=!<>", rune(c)):
			i++
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return q, fmt.Errorf("unbalanced ) in %q", expr)
			}
			i++
		case c == '[':
			j := strings.IndexByte(s[i:], ']')
			if j < 0 {
				return q, fmt.Errorf("unterminated range in %q", expr)
			}
			i += j + 1
		case c == '"' || c == '\'' || c == '`':
			if err := str(); err != nil {
				return q, err
			}
		case c == '{':
			return q, fmt.Errorf("a selector without a metric name in %q", expr)
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				j := strings.IndexByte(s[i:], '}')
				if j < 0 {
					return q, fmt.Errorf("unterminated variable in %q", expr)
				}
				i += j + 1
			} else {
				ident()
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdentByte(s[i]) || s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
				i++ // numbers, durations (5m), exponents
			}
		case isIdentByte(c):
			name := ident()
			skipSpace()
			next := byte(0)
			if i < len(s) {
				next = s[i]
			}
			switch {
			case (name == "group_left" || name == "group_right") && next != '(':
				// the label list is optional
			case promGrouping[name]:
				if next != '(' {
					return q, fmt.Errorf("%s without a label list in %q", name, expr)
				}
				j := strings.IndexByte(s[i:], ')')
				if j < 0 {
					return q, fmt.Errorf("unterminated %s list in %q", name, expr)
				}
				for _, l := range strings.Split(s[i+1:i+j], ",") {
					if l = strings.TrimSpace(l); l != "" {
						q.grouping = append(q.grouping, l)
					}
				}
				i += j + 1
			case promKeywords[name]:
			case next == '(':
				// a function
			default:
				sel := selector{name: name}
				if next == '{' {
					labels, err := matchers()
					if err != nil {
						return q, err
					}
					sel.labels = labels
				}
				q.selectors = append(q.selectors, sel)
			}
		default:
			return q, fmt.Errorf("unexpected %q at %d in %q", c, i, expr)
		}
	}
	if depth != 0 {
		return q, fmt.Errorf("unbalanced ( in %q", expr)
	}
	return q, nil
}

func isIdentByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
}

// exposition is a scrape: metric name → label name → present.
type exposition map[string]map[string]bool

// parseExposition reads the Prometheus text format.
func parseExposition(text string) (exposition, error) {
	out := exposition{}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end <= 0 {
			return nil, fmt.Errorf("line %d: %q", n+1, line)
		}
		name := line[:end]
		labels := out[name]
		if labels == nil {
			labels = map[string]bool{}
			out[name] = labels
		}
		if line[end] != '{' {
			continue
		}
		q, err := parsePromQL(line[:strings.LastIndexByte(line, '}')+1])
		if err != nil || len(q.selectors) != 1 {
			return nil, fmt.Errorf("line %d: %q: %v", n+1, line, err)
		}
		for _, l := range q.selectors[0].labels {
			labels[l] = true
		}
	}
	return out, nil
}

// targetLabels are attached by Prometheus to every scraped series; a scrape does not show them.
var targetLabels = []string{"instance", "job"}

// checkQuery reports every metric expr selects that the scrape lacks, every label it matches
// on that the metric does not carry, and every grouping label none of its metrics carries.
func checkQuery(exposed exposition, expr string) []string {
	q, err := parsePromQL(expr)
	if err != nil {
		return []string{err.Error()}
	}
	if len(q.selectors) == 0 {
		return []string{fmt.Sprintf("no metric in %q", expr)}
	}
	var problems []string
	all := map[string]bool{}
	for _, l := range targetLabels {
		all[l] = true
	}
	for _, sel := range q.selectors {
		labels, ok := exposed[sel.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s is not exported (in %q)", sel.name, expr))
			continue
		}
		for l := range labels {
			all[l] = true
		}
		for _, l := range sel.labels {
			if !labels[l] && !slices.Contains(targetLabels, l) {
				problems = append(problems, fmt.Sprintf("%s has no label %s (in %q)", sel.name, l, expr))
			}
		}
	}
	for _, l := range q.grouping {
		if !all[l] {
			problems = append(problems, fmt.Sprintf("no metric of %q has the label %s", expr, l))
		}
	}
	return problems
}

func TestParsePromQL(t *testing.T) {
	tests := []struct {
		name     string
		expr     string
		want     []selector
		grouping []string
		wantErr  bool
	}{
		{name: "rate by", expr: `sum by (model, status) (rate(switchyard_responses_total{instance=~"$instance", model=~"${model}"}[$__rate_interval]))`,
			want: []selector{{"switchyard_responses_total", []string{"instance", "model"}}}, grouping: []string{"model", "status"}},
		{name: "quantile", expr: `histogram_quantile(0.99, sum by (le) (rate(switchyard_time_to_first_token_seconds_bucket[5m])))`,
			want: []selector{{name: "switchyard_time_to_first_token_seconds_bucket"}}, grouping: []string{"le"}},
		{name: "ratio with on and bool", expr: `sum(rate(a_total{status=~"5.."}[5m])) / on (job) group_left sum(rate(b_total[5m:1m])) > bool 0.05`,
			want: []selector{{"a_total", []string{"status"}}, {name: "b_total"}}, grouping: []string{"job"}},
		{name: "aggregation after the argument", expr: `max(switchyard_worker_breaker_state) without (worker) == 1`,
			want: []selector{{name: "switchyard_worker_breaker_state"}}, grouping: []string{"worker"}},
		{name: "escaped quote", expr: `x{a="q\"}"} + y`, want: []selector{{"x", []string{"a"}}, {name: "y"}}},
		{name: "numbers and offset", expr: `rate(x[5m] offset 1h) * 1e3 + 0.5`, want: []selector{{name: "x"}}},
		{name: "no metric name", expr: `{__name__="x"}`, wantErr: true},
		{name: "unbalanced", expr: `sum(rate(x[5m])`, wantErr: true},
		{name: "unterminated string", expr: `x{a="b}`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, err := parsePromQL(tt.expr)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if fmt.Sprint(q.selectors) != fmt.Sprint(tt.want) || fmt.Sprint(q.grouping) != fmt.Sprint(tt.grouping) {
				t.Fatalf("got %v grouping %v, want %v grouping %v", q.selectors, q.grouping, tt.want, tt.grouping)
			}
		})
	}
}

func TestCheckQuery(t *testing.T) {
	exposed, err := parseExposition(`# HELP ignored
switchyard_responses_total{route="/v1/chat/completions",model="a\"b",status="200"} 3
switchyard_inflight_requests 0
switchyard_ttft_seconds_bucket{route="r",model="m",le="+Inf"} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		expr string
		want int // problems
	}{
		{`sum by (status) (rate(switchyard_responses_total{model=~"$model",instance=~"$instance"}[5m]))`, 0},
		{`histogram_quantile(0.5, sum by (le, model) (rate(switchyard_ttft_seconds_bucket[5m])))`, 0},
		{`switchyard_inflight_requests`, 0},
		{`switchyard_requests_total`, 1},                                         // renamed metric
		{`sum by (code) (rate(switchyard_responses_total[5m]))`, 1},              // renamed grouping label
		{`rate(switchyard_responses_total{worker="x"}[5m])`, 1},                  // label the metric lacks
		{`switchyard_inflight_requests + switchyard_gone + switchyard_gone2`, 2}, // every problem
	}
	for _, tt := range tests {
		if got := checkQuery(exposed, tt.expr); len(got) != tt.want {
			t.Errorf("%s: %d problems %v, want %d", tt.expr, len(got), got, tt.want)
		}
	}
}

// checkMetricKinds reports every family of a scrape (with # TYPE lines) whose kind breaks the
// house rule: a family named *_total is a counter, a family with _bucket series is a classic
// Prometheus histogram whose buckets carry le (never VictoriaMetrics' vmrange), and every
// family says its kind.
func checkMetricKinds(scrape string) []string {
	kinds := map[string]string{}
	var problems []string
	for _, line := range strings.Split(scrape, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			kinds[f[2]] = f[3]
		}
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if strings.Contains(line, "vmrange=") {
			problems = append(problems, "a VictoriaMetrics histogram (vmrange): "+line)
		}
		name := line[:strings.IndexAny(line, "{ ")]
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue // the metrics library's own
		}
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && kinds[base] == "histogram" {
				family = base
			}
		}
		if seen[family] {
			continue
		}
		seen[family] = true
		kind := kinds[family]
		switch {
		case kind == "":
			problems = append(problems, family+": no # TYPE line")
		case strings.HasSuffix(family, "_total") && kind != "counter":
			problems = append(problems, family+": named _total but exposed as "+kind)
		case strings.HasSuffix(name, "_bucket") && kind != "histogram":
			problems = append(problems, name+": bucket series of a "+kind)
		case kind == "histogram" && !strings.Contains(scrape, "\n"+family+`_bucket{`) && !strings.HasPrefix(scrape, family+`_bucket{`):
			problems = append(problems, family+": a histogram without le buckets")
		}
	}
	if len(seen) < 20 {
		problems = append(problems, fmt.Sprintf("only %d families in the scrape", len(seen)))
	}
	return problems
}

// undocumentedMetrics returns the switchyard_* families of a scrape (its # TYPE lines) that
// doc never names as a whole word: a renamed or new metric fails here until the metric
// reference says what it counts.
func undocumentedMetrics(scrape, doc string) []string {
	var missing []string
	for _, line := range strings.Split(scrape, "\n") {
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" || !strings.HasPrefix(f[2], "switchyard_") {
			continue
		}
		if !namesWord(doc, f[2]) && !slices.Contains(missing, f[2]) {
			missing = append(missing, f[2])
		}
	}
	return missing
}

// namesWord reports whether text holds name not followed or preceded by an identifier byte.
func namesWord(text, name string) bool {
	for i := 0; ; {
		j := strings.Index(text[i:], name)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(name)
		before := start == 0 || !isIdentByte(text[start-1]) && (text[start-1] < '0' || text[start-1] > '9')
		after := end == len(text) || !isIdentByte(text[end]) && (text[end] < '0' || text[end] > '9')
		if before && after {
			return true
		}
		i = start + 1
	}
}

func TestUndocumentedMetrics(t *testing.T) {
	scrape := "# TYPE switchyard_requests_total counter\nswitchyard_requests_total 1\n" +
		"# TYPE switchyard_requests counter\nswitchyard_requests 1\n" +
		"# TYPE switchyard_lag_seconds histogram\nswitchyard_lag_seconds_bucket{le=\"1\"} 1\n" +
		"# TYPE go_goroutines gauge\ngo_goroutines 3\n"
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"all named", "`switchyard_requests_total`, `switchyard_requests{x}` and switchyard_lag_seconds.", nil},
		{"a longer name does not document a prefix", "`switchyard_requests_total`, `switchyard_lag_seconds`",
			[]string{"switchyard_requests"}},
		{"a histogram is named by its family, not its buckets", "switchyard_requests_total switchyard_requests switchyard_lag_seconds_bucket",
			[]string{"switchyard_lag_seconds"}},
		{"nothing named", "", []string{"switchyard_requests_total", "switchyard_requests", "switchyard_lag_seconds"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := undocumentedMetrics(scrape, tt.doc); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestCheckMetricKinds(t *testing.T) {
	var good, bad strings.Builder
	for i := range 20 {
		fmt.Fprintf(&good, "# HELP g%d\n# TYPE g%d gauge\ng%d 1\n", i, i, i)
	}
	bad.WriteString(good.String())
	good.WriteString("# HELP a_total\n# TYPE a_total counter\na_total 3\n" +
		"# HELP h_seconds\n# TYPE h_seconds histogram\nh_seconds_bucket{le=\"1\"} 1\nh_seconds_sum 0.5\nh_seconds_count 1\n")
	if p := checkMetricKinds(good.String()); len(p) != 0 {
		t.Fatalf("a good scrape: %v", p)
	}
	bad.WriteString("# HELP b_total\n# TYPE b_total gauge\nb_total 3\n" +
		"# HELP v_seconds\n# TYPE v_seconds histogram\nv_seconds_bucket{vmrange=\"1.0e0...1.1e0\"} 1\nv_seconds_sum 1\nv_seconds_count 1\n" +
		"u 1\n")
	p := checkMetricKinds(bad.String())
	for _, want := range []string{"b_total: named _total but exposed as gauge", "vmrange", "u: no # TYPE line"} {
		if !strings.Contains(strings.Join(p, "\n"), want) {
			t.Errorf("problems %q lack %q", p, want)
		}
	}
}

// fixedLabels are the labels whose values are a fixed set the code names (Go constants):
// every value a scrape shows for them must be named where docs/operations.md describes the
// metric. The others (model, bucket, worker, route, status, priority, tenant, policy, group
// and the build stamp) take their values from the configuration, the traffic or the build.
var fixedLabels = []string{"cause", "component", "decision", "direction", "kind", "limit", "order",
	"outcome", "owner", "reason", "result", "role", "scope", "source", "stage", "target", "trigger"}

// undocumentedLabelValues returns family{label="value"} for every value of a fixed label a
// scrape shows on a switchyard_* family that no entry of doc naming the family names: a
// table row, or a paragraph (lines between blank lines) outside tables.
func undocumentedLabelValues(scrape, doc string) []string {
	entries := docEntries(doc)
	var missing []string
	family := ""
	for _, line := range strings.Split(scrape, "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			family = f[2]
			continue
		}
		open := strings.IndexByte(line, '{')
		if !strings.HasPrefix(line, "switchyard_") || family == "" || !strings.HasPrefix(line, family) || open < 0 {
			continue
		}
		for _, lv := range sampleLabels(line[open:]) {
			if !slices.Contains(fixedLabels, lv[0]) {
				continue
			}
			named := false
			for _, e := range entries {
				if namesWord(e, family) && namesWord(e, lv[1]) {
					named = true
					break
				}
			}
			key := fmt.Sprintf("%s{%s=%q}", family, lv[0], lv[1])
			if !named && !slices.Contains(missing, key) {
				missing = append(missing, key)
			}
		}
	}
	return missing
}

// docEntries splits a Markdown document into its table rows and its other paragraphs.
func docEntries(doc string) []string {
	var out []string
	var para strings.Builder
	flush := func() {
		if para.Len() > 0 {
			out = append(out, para.String())
			para.Reset()
		}
	}
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "|"):
			flush()
			out = append(out, line)
		case strings.TrimSpace(line) == "":
			flush()
		default:
			para.WriteString(line)
			para.WriteByte('\n')
		}
	}
	flush()
	return out
}

// sampleLabels returns the label pairs of a sample's {a="x",b="y"} (values without escapes,
// as the fixed labels' are); it stops at the first pair it cannot read.
func sampleLabels(s string) [][2]string {
	s = strings.TrimPrefix(s, "{")
	var out [][2]string
	for len(s) > 0 && s[0] != '}' {
		eq := strings.Index(s, `="`)
		if eq <= 0 {
			break
		}
		end := strings.IndexByte(s[eq+2:], '"')
		if end < 0 {
			break
		}
		out = append(out, [2]string{s[:eq], s[eq+2 : eq+2+end]})
		s = strings.TrimPrefix(s[eq+2+end+1:], ",")
	}
	return out
}

func TestUndocumentedLabelValues(t *testing.T) {
	scrape := "# TYPE switchyard_retries_total counter\n" +
		`switchyard_retries_total{reason="transport"} 1` + "\n" + `switchyard_retries_total{reason="timeout"} 1` + "\n" +
		"# TYPE switchyard_lag_seconds histogram\n" + `switchyard_lag_seconds_bucket{source="zmq",le="1"} 1` + "\n" +
		"# TYPE switchyard_requests_total counter\n" + `switchyard_requests_total{model="llama",route="/v1/x"} 1` + "\n"
	tests := []struct {
		name, doc string
		want      []string
	}{
		{"named beside the metric", "`switchyard_retries_total{reason}`: transport, timeout.\n\n| `switchyard_lag_seconds` | `source` = zmq |\n", nil},
		{"a value named elsewhere is not documented",
			"`switchyard_retries_total{reason}`: transport.\n\ntimeout\n\n| `switchyard_lag_seconds` | |\n| zmq | |\n",
			[]string{`switchyard_retries_total{reason="timeout"}`, `switchyard_lag_seconds{source="zmq"}`}},
		{"a longer word does not name a value", "switchyard_retries_total transports timeouts switchyard_lag_seconds zmq",
			[]string{`switchyard_retries_total{reason="transport"}`, `switchyard_retries_total{reason="timeout"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := undocumentedLabelValues(scrape, tt.doc); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
