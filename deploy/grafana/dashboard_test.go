package grafana

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestCommittedDashboardIsGenerated fails when switchyard.json differs from what panels.go
// generates: run `go generate ./deploy/grafana` (make dashboard).
func TestCommittedDashboardIsGenerated(t *testing.T) {
	want, err := Switchyard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("switchyard.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("switchyard.json is not what panels.go generates: run `go generate ./deploy/grafana` (make dashboard)")
	}
}

// TestLayout: every panel lies inside the 24-unit grid, below its row, and no two overlap.
func TestLayout(t *testing.T) {
	b, err := Switchyard.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			ID      int
			Type    string
			Title   string
			GridPos grid
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	ids := map[int]bool{}
	for i, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("id %d used twice", p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.X < 0 || g.W <= 0 || g.H <= 0 || g.X+g.W > 24 {
			t.Errorf("%q: grid %+v outside 24 units", p.Title, g)
		}
		for _, q := range d.Panels[:i] {
			h := q.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("%q %+v overlaps %q %+v", p.Title, g, q.Title, h)
			}
		}
	}
}

func TestRejectsBadPanels(t *testing.T) {
	for name, p := range map[string]Panel{
		"no query":     {Title: "t", Description: "d"},
		"no title":     {Description: "d", Queries: []Query{{Expr: "x"}}},
		"too wide":     {Title: "t", Description: "d", Width: 25, Queries: []Query{{Expr: "x"}}},
		"unknown kind": {Title: "t", Description: "d", Kind: "piechart", Queries: []Query{{Expr: "x"}}},
	} {
		d := Dashboard{Rows: []Row{{Title: "r", Panels: []Panel{p}}}}
		if _, err := d.JSON(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestQueriesUseDefinedVariables: a query names only the dashboard's variables and Grafana's
// own, and every query follows the router selection ($instance).
func TestQueriesUseDefinedVariables(t *testing.T) {
	defined := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	for _, v := range variables() {
		defined[v.(map[string]any)["name"].(string)] = true
	}
	ref := regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
	for _, r := range Switchyard.Rows {
		for _, p := range r.Panels {
			for _, q := range p.Queries {
				for _, m := range ref.FindAllStringSubmatch(q.Expr, -1) {
					if !defined[m[1]] {
						t.Errorf("panel %q: undefined variable $%s in %s", p.Title, m[1], q.Expr)
					}
				}
				if !strings.Contains(q.Expr, `instance=~"$instance"`) {
					t.Errorf("panel %q: %s ignores the $instance selection", p.Title, q.Expr)
				}
			}
		}
	}
}
