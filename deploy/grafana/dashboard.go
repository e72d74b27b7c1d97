// Package grafana generates switchyard.json, Switchyard's Grafana dashboard, from the rows and
// panels of panels.go: `go generate ./deploy/grafana` (or `make dashboard`) writes it, and a
// test fails when the committed file differs from what the panels generate.
//
// A panel is a title, a description, a unit and its PromQL queries; the layout (ids, grid
// positions, rows) is computed here, so adding a panel is one entry in panels.go. Queries
// filter on the dashboard's variables: $instance (every panel) and $model (panels whose
// metric has a model label). Every metric a query names must be exported by a running router:
// cmd/switchyard's TestDeployArtifactsMatchARunningRouter scrapes one and checks.
package grafana

//go:generate go run ./gen

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Kind is a Grafana panel type.
type Kind string

// Panel types in use.
const (
	TimeSeries    Kind = "timeseries"
	Stat          Kind = "stat"
	StateTimeline Kind = "state-timeline"
)

// Row is a titled row of panels, laid out left to right, Width units each (24 per line).
type Row struct {
	Title  string
	Panels []Panel
}

// Panel is one graph.
type Panel struct {
	Title       string
	Description string
	Kind        Kind   // default TimeSeries
	Unit        string // Grafana unit id: reqps, s, percentunit, bytes, short, ops...
	Width       int    // grid units out of 24; default 8
	Height      int    // default 8
	Stack       bool   // stack the series (time series)
	Max         *float64
	Mappings    []Mapping // value → text (state timelines, stats)
	Queries     []Query
}

// Query is one PromQL target.
type Query struct {
	Expr   string
	Legend string // Grafana legend format, e.g. "{{model}}"
}

// Mapping shows a value as a text with a color.
type Mapping struct {
	Value string
	Text  string
	Color string
}

// Dashboard is the whole dashboard's content.
type Dashboard struct {
	UID, Title, Description string
	Tags                    []string
	Rows                    []Row
}

// JSON renders d as Grafana dashboard JSON (schema version 39: Grafana 10 and later),
// indented, with a trailing newline.
func (d Dashboard) JSON() ([]byte, error) {
	var panels []any
	id, y := 1, 0
	for _, r := range d.Rows {
		panels = append(panels, map[string]any{
			"type": "row", "id": id, "title": r.Title, "collapsed": false, "panels": []any{},
			"gridPos": grid{H: 1, W: 24, X: 0, Y: y},
		})
		id++
		y++
		x, lineH := 0, 0
		for _, p := range r.Panels {
			w, h := p.Width, p.Height
			if w == 0 {
				w = 8
			}
			if h == 0 {
				h = 8
			}
			if w > 24 {
				return nil, fmt.Errorf("panel %q: width %d > 24", p.Title, w)
			}
			if x+w > 24 {
				x, y = 0, y+lineH
				lineH = 0
			}
			jp, err := p.json(id, grid{H: h, W: w, X: x, Y: y})
			if err != nil {
				return nil, err
			}
			panels = append(panels, jp)
			id++
			x += w
			lineH = max(lineH, h)
		}
		y += lineH
	}
	doc := map[string]any{
		"uid": d.UID, "title": d.Title, "description": d.Description, "tags": d.Tags,
		"schemaVersion": 39, "version": 1, "editable": true, "graphTooltip": 1,
		"refresh": "30s", "time": map[string]any{"from": "now-1h", "to": "now"},
		"timezone":    "",
		"annotations": map[string]any{"list": []any{}},
		"links":       []any{},
		"templating":  map[string]any{"list": variables()},
		"panels":      panels,
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

type grid struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// datasource is the dashboard's Prometheus, chosen by the $datasource variable.
var datasource = map[string]any{"type": "prometheus", "uid": "${datasource}"}

func (p Panel) json(id int, g grid) (map[string]any, error) {
	if p.Title == "" || p.Description == "" || len(p.Queries) == 0 {
		return nil, fmt.Errorf("panel %d: a title, a description and a query are required", id)
	}
	kind := p.Kind
	if kind == "" {
		kind = TimeSeries
	}
	unit := p.Unit
	if unit == "" {
		unit = "short"
	}
	var targets []any
	for i, q := range p.Queries {
		if i >= 26 {
			return nil, fmt.Errorf("panel %q: too many queries", p.Title)
		}
		targets = append(targets, map[string]any{
			"refId": string(rune('A' + i)), "datasource": datasource, "expr": q.Expr,
			"legendFormat": q.Legend, "range": true, "editorMode": "code",
		})
	}
	defaults := map[string]any{"unit": unit}
	custom := map[string]any{}
	options := map[string]any{}
	switch kind {
	case TimeSeries:
		custom["fillOpacity"] = 10
		custom["showPoints"] = "never"
		if p.Stack {
			custom["stacking"] = map[string]any{"mode": "normal", "group": "A"}
			custom["fillOpacity"] = 40
		}
		defaults["min"] = 0
		options["legend"] = map[string]any{"displayMode": "table", "placement": "bottom", "showLegend": true, "calcs": []string{"mean", "max", "lastNotNull"}}
		options["tooltip"] = map[string]any{"mode": "multi", "sort": "desc"}
	case StateTimeline:
		custom["fillOpacity"] = 80
		options["showValue"] = "never"
		options["mergeValues"] = true
		options["legend"] = map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true}
		options["tooltip"] = map[string]any{"mode": "single", "sort": "none"}
	case Stat:
		options["reduceOptions"] = map[string]any{"calcs": []string{"lastNotNull"}, "fields": "", "values": false}
		options["colorMode"] = "value"
		options["graphMode"] = "none"
		options["textMode"] = "value_and_name"
	default:
		return nil, fmt.Errorf("panel %q: unknown kind %q", p.Title, kind)
	}
	if len(custom) > 0 {
		defaults["custom"] = custom
	}
	if p.Max != nil {
		defaults["max"] = *p.Max
	}
	if len(p.Mappings) > 0 {
		opts := map[string]any{}
		for i, m := range p.Mappings {
			opts[m.Value] = map[string]any{"text": m.Text, "color": m.Color, "index": i}
		}
		defaults["mappings"] = []any{map[string]any{"type": "value", "options": opts}}
		defaults["color"] = map[string]any{"mode": "thresholds"}
		defaults["thresholds"] = map[string]any{"mode": "absolute", "steps": []any{map[string]any{"color": "green", "value": nil}}}
	}
	return map[string]any{
		"id": id, "type": string(kind), "title": p.Title, "description": p.Description,
		"datasource": datasource, "gridPos": g, "targets": targets, "options": options,
		"fieldConfig": map[string]any{"defaults": defaults, "overrides": []any{}},
	}, nil
}

// variables are the dashboard's template variables: the Prometheus data source, the router
// instances and the models.
func variables() []any {
	query := func(name, label, expr string) map[string]any {
		return map[string]any{
			"name": name, "label": label, "type": "query", "datasource": datasource,
			"query":      expr,
			"definition": expr, "refresh": 2, "sort": 1,
			"includeAll": true, "multi": true, "allValue": ".*",
			"current": map[string]any{"selected": true, "text": []string{"All"}, "value": []string{"$__all"}},
		}
	}
	return []any{
		map[string]any{"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
			"current": map[string]any{}, "refresh": 1},
		query("instance", "Router", "label_values(switchyard_inflight_requests, instance)"),
		query("model", "Model", `label_values(switchyard_requests_total{model!~"none|unknown"}, model)`),
	}
}
