package main

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"switchyard/config"
)

var durationType = reflect.TypeFor[time.Duration]()

// row is one key of the reference.
type row struct {
	key, typ, unit, def, env, flag, meaning string
	scalar                                  bool // a value, not a section or a list
}

// section is one table: a top-level key of the configuration, or a type that appears at
// several places (a policy, a group) and is described once.
type section struct {
	title, anchor, intro string
	rows                 []row
}

// attachment is a place where a shared type appears.
type attachment struct {
	path  string
	envOK bool // its scalar keys can come from the environment and --set
}

// builder turns the schema into sections.
type builder struct {
	docs        map[string]typeDocs
	flags       []config.FlagKey
	shared      map[reflect.Type]bool
	attachments map[reflect.Type][]attachment
	errs        []error
}

// generate renders the reference page from the field comments in docs.
func generate(docs map[string]typeDocs) ([]byte, error) {
	sections, _, err := build(docs)
	if err != nil {
		return nil, err
	}
	return render(sections), nil
}

// build describes the schema as sections, and returns where each shared type appears.
func build(docs map[string]typeDocs) ([]section, map[reflect.Type][]attachment, error) {
	b := &builder{docs: docs, flags: config.FlagKeys(), attachments: map[reflect.Type][]attachment{}}
	root := reflect.TypeFor[config.Config]()
	b.shared = sharedTypes(root)
	b.attach(root, "", true)

	var sections []section
	def := reflect.ValueOf(config.Default()).Elem()
	for i := range root.NumField() {
		f := root.Field(i)
		key := koanfKey(f)
		if key == "" {
			continue
		}
		s := section{title: "`" + key + "`", anchor: key}
		ft := deref(f.Type)
		if ft.Kind() == reflect.Struct && ft != durationType && !b.shared[ft] && f.Type.Kind() != reflect.Pointer {
			s.intro = b.fieldDoc(root, f, key, false).meaning
			b.walk(&s, ft, key, true, def.Field(i))
		} else {
			b.field(&s, root, f, key, true, def.Field(i))
		}
		sections = append(sections, s)
	}
	for _, t := range sortedShared(b.shared) {
		sections = append(sections, b.sharedSection(t))
	}
	if len(b.errs) > 0 {
		return nil, nil, errors.Join(b.errs...)
	}
	return sections, b.attachments, nil
}

// sharedTypes returns the struct types that more than one field refers to.
func sharedTypes(root reflect.Type) map[reflect.Type]bool {
	refs := map[reflect.Type]int{}
	seen := map[reflect.Type]bool{}
	var visit func(t reflect.Type)
	visit = func(t reflect.Type) {
		if seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			if koanfKey(t.Field(i)) == "" {
				continue
			}
			if et := structOf(t.Field(i).Type); et != nil {
				refs[et]++
				visit(et)
			}
		}
	}
	visit(root)
	out := map[reflect.Type]bool{}
	for t, n := range refs {
		if n > 1 {
			out[t] = true
		}
	}
	return out
}

// attach records, for every shared type, the full paths where it appears.
func (b *builder) attach(t reflect.Type, path string, envOK bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		key := koanfKey(f)
		if key == "" {
			continue
		}
		p := join(path, key)
		ft := deref(f.Type)
		switch {
		case ft == durationType:
		case ft.Kind() == reflect.Struct:
			if b.shared[ft] {
				b.attachments[ft] = append(b.attachments[ft], attachment{p, envOK})
			}
			b.attach(ft, p, envOK)
		case ft.Kind() == reflect.Slice && structOf(ft) != nil:
			b.attach(structOf(ft), p+"[]", false)
		case ft.Kind() == reflect.Map && structOf(ft) != nil:
			b.attach(structOf(ft), p+".<name>", envOK)
		}
	}
}

// walk adds a row for every key of struct type t below path. def is t's value in
// config.Default, or invalid where the defaults hold no such value (inside lists and maps).
func (b *builder) walk(s *section, t reflect.Type, path string, envOK bool, def reflect.Value) {
	for i := range t.NumField() {
		f := t.Field(i)
		key := koanfKey(f)
		if key == "" {
			continue
		}
		var fv reflect.Value
		if def.IsValid() {
			fv = def.Field(i)
		}
		b.field(s, t, f, join(path, key), envOK, fv)
	}
}

// field adds the rows of one field of struct type parent: its own row unless it is a
// plain nested section, then its keys.
func (b *builder) field(s *section, parent reflect.Type, f reflect.StructField, path string, envOK bool, def reflect.Value) {
	key := koanfKey(f)
	ft := deref(f.Type)
	section := ft.Kind() == reflect.Struct && ft != durationType && !b.shared[ft] && f.Type.Kind() != reflect.Pointer
	fd := b.fieldDoc(parent, f, path, !section)
	r := row{key: path, unit: f.Tag.Get("unit"), def: fd.def, meaning: fd.meaning, typ: typeName(f.Type), scalar: isScalar(ft)}
	switch {
	case isScalar(ft) || ((ft.Kind() == reflect.Slice || ft.Kind() == reflect.Map) && structOf(ft) == nil):
		if envOK && isScalar(ft) {
			r.env = "`" + envName(path) + "`"
			r.flag = "`--set " + path + "=…`"
		}
		if fl := b.flagsFor(path); fl != "" {
			r.flag = fl
		}
		if def.IsValid() && f.Type.Kind() != reflect.Pointer {
			if err := checkDefault(fd.def, def); err != nil {
				b.errs = append(b.errs, fmt.Errorf("config.%s.%s (%s): %w", parent.Name(), f.Name, path, err))
			}
		}
		s.rows = append(s.rows, r)
	case ft.Kind() == reflect.Struct && b.shared[ft]:
		r.typ = "[" + sharedName(ft) + "](#" + sharedName(ft) + ")"
		if f.Type.Kind() == reflect.Pointer {
			r.typ += " or null"
		}
		r.flag = b.flagsBelow(path)
		s.rows = append(s.rows, r)
	case ft.Kind() == reflect.Struct:
		if f.Type.Kind() == reflect.Pointer {
			s.rows = append(s.rows, r)
		}
		var dv reflect.Value
		if def.IsValid() && f.Type.Kind() != reflect.Pointer {
			dv = def
		}
		b.walk(s, ft, path, envOK, dv)
	case ft.Kind() == reflect.Slice:
		s.rows = append(s.rows, r)
		b.walk(s, structOf(ft), path+"[]", false, reflect.Value{})
	case ft.Kind() == reflect.Map:
		s.rows = append(s.rows, r)
		b.walk(s, structOf(ft), path+".<name>", envOK, reflect.Value{})
	default:
		b.errs = append(b.errs, fmt.Errorf("config.%s.%s (%s): unsupported type %s", parent.Name(), f.Name, key, f.Type))
	}
}

// sharedSection describes a shared type once, with keys relative to where it appears.
func (b *builder) sharedSection(t reflect.Type) section {
	name := sharedName(t)
	s := section{title: name, anchor: name}
	var where []string
	for _, a := range b.attachments[t] {
		w := "`" + a.path + "`"
		if a.envOK {
			w += " (environment `" + envName(a.path) + "__…`)"
		}
		where = append(where, w)
	}
	s.intro = b.docs[t.Name()].doc + " It appears at " + strings.Join(where, ", ") +
		". Its keys below are relative to those places; where a place has an environment prefix, " +
		"its scalar keys can also come from the environment (the prefix, then the key's own part) " +
		"and from `--set`. Elsewhere they come only from the file."
	var rows section
	b.walk(&rows, t, "", false, reflect.Value{})
	for _, r := range rows.rows {
		if r.scalar && slices.ContainsFunc(b.attachments[t], func(a attachment) bool { return a.envOK }) {
			r.env = "`…__" + strings.ToUpper(strings.ReplaceAll(r.key, ".", "__")) + "`"
		}
		r.flag = b.sharedFlags(t, r.key)
		s.rows = append(s.rows, r)
	}
	return s
}

// flagsFor lists the flags that set exactly path.
func (b *builder) flagsFor(path string) string {
	var out []string
	for _, fk := range b.flags {
		if fk.Key == path {
			out = appendUnique(out, "`--"+fk.Flag+"`")
		}
	}
	return strings.Join(out, ", ")
}

// flagsBelow lists the flags that set a key below path, with that key.
func (b *builder) flagsBelow(path string) string {
	var out []string
	for _, fk := range b.flags {
		if rest, ok := strings.CutPrefix(fk.Key, path+"."); ok {
			out = appendUnique(out, "`--"+fk.Flag+"` (`"+rest+"`)")
		}
	}
	return strings.Join(out, ", ")
}

// sharedFlags lists the flags that set key (relative) of shared type t, with the places
// they set it: "every place" when they cover them all.
func (b *builder) sharedFlags(t reflect.Type, key string) string {
	atts := b.attachments[t]
	var out []string
	for _, fk := range b.flags {
		name := "`--" + fk.Flag + "`"
		if slices.ContainsFunc(out, func(s string) bool { return strings.HasPrefix(s, name) }) {
			continue
		}
		var places []string
		for _, a := range atts {
			if b.setsKey(fk.Flag, a.path+"."+key) {
				places = append(places, "`"+a.path+"`")
			}
		}
		switch {
		case len(places) == 0:
		case len(places) == len(atts):
			out = append(out, name+" (every place)")
		default:
			out = append(out, name+" ("+strings.Join(places, ", ")+")")
		}
	}
	return strings.Join(out, ", ")
}

func (b *builder) setsKey(flag, key string) bool {
	return slices.Contains(b.flags, config.FlagKey{Flag: flag, Key: key})
}

// fieldDoc returns what field f's comment says, recording an error when it is missing or,
// when needDefault, states no default.
func (b *builder) fieldDoc(parent reflect.Type, f reflect.StructField, path string, needDefault bool) fieldDoc {
	text := b.docs[parent.Name()].fields[f.Name]
	if text == "" {
		b.errs = append(b.errs, fmt.Errorf("config.%s.%s (%s): no doc comment", parent.Name(), f.Name, path))
		return fieldDoc{}
	}
	fd, err := splitFieldDoc(f.Name, koanfKey(f), text)
	if err != nil && needDefault {
		b.errs = append(b.errs, fmt.Errorf("config.%s.%s (%s): %w", parent.Name(), f.Name, path, err))
	}
	return fd
}

// envName is the environment variable of a key path: SWITCHYARD_ and the upper-case path
// with "__" between levels; a model name is <NAME>.
func envName(path string) string {
	return config.EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "__"))
}

func typeName(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		return typeName(t.Elem()) + " or null"
	}
	if t == durationType {
		return "duration"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		if structOf(t) != nil {
			return "list"
		}
		return "list of " + typeName(t.Elem()) + "s"
	case reflect.Map:
		if structOf(t) == nil {
			return "mapping of " + typeName(t.Elem()) + "s"
		}
		return "mapping by name"
	case reflect.Struct:
		return "mapping"
	}
	return t.String()
}

func isScalar(t reflect.Type) bool {
	if t == durationType {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

// structOf returns the struct type a field of type t holds, through pointers, lists and
// maps, or nil.
func structOf(t reflect.Type) reflect.Type {
	for {
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Map:
			t = t.Elem()
			continue
		case reflect.Struct:
			if t == durationType {
				return nil
			}
			return t
		}
		return nil
	}
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

func koanfKey(f reflect.StructField) string { return config.FieldKey(f) }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func sharedName(t reflect.Type) string { return strings.ToLower(t.Name()) }

func sortedShared(m map[reflect.Type]bool) []reflect.Type {
	out := make([]reflect.Type, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b reflect.Type) int { return strings.Compare(a.Name(), b.Name()) })
	return out
}

func appendUnique(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// quoted matches a double-quoted string in a comment, shown as code.
var quoted = regexp.MustCompile(`"([^"]*)"`)

// cell makes text safe inside a table cell.
func cell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

// prose renders comment text as Markdown: double-quoted strings become code, and angle
// brackets outside code are escaped so that "models.<name>" is not read as HTML.
func prose(s string) string {
	s = quoted.ReplaceAllString(s, "`$1`")
	var b strings.Builder
	code := false
	for _, c := range s {
		switch {
		case c == '`':
			code = !code
			b.WriteRune(c)
		case c == '<' && !code:
			b.WriteString("&lt;")
		case c == '>' && !code:
			b.WriteString("&gt;")
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

const header = `<!-- Generated by ` + "`make docs`" + ` (go run ./config/internal/docgen) from the configuration
schema in config/. Do not edit: change the field comments in config/*.go and run ` + "`make docs`" + `. -->

# Configuration reference

Every configuration key, generated from the configuration schema; ` + "`make docs-check`" + ` (part of
` + "`make test`" + `) fails when this page and the schema disagree. How the file, the environment and the
flags combine, and the value rules, are in [configuration](configuration.md).

- **key**: the path in a YAML or JSON file. ` + "`<name>`" + ` stands for a model name and ` + "`[]`" + ` for each
  element of a list.
- **type**: ` + "`null`" + ` on an optional key means unset. Durations are strings such as ` + "`500ms`" + `,
  ` + "`5s`" + ` or ` + "`1m`" + `.
- **default**: the value when the key is absent; "required" keys must be given.
- **environment**: ` + "`SWITCHYARD_`" + ` and the upper-case path with ` + "`__`" + ` between levels (a single ` + "`_`" + `
  stays part of a key); model names are lower-cased. Keys inside lists (` + "`workers`" + `, ` + "`buckets`" + `)
  can only come from the file.
- **flag**: a flag of ` + "`switchyard serve`" + ` (and ` + "`switchyard indexer`" + `) that sets the key; ` + "`--set KEY=VALUE`" + `
  sets any key that has an environment variable.
`

// render writes the page.
func render(sections []section) []byte {
	var buf bytes.Buffer
	buf.WriteString(header)
	for _, s := range sections {
		fmt.Fprintf(&buf, "\n## %s\n\n", s.title)
		if s.intro != "" {
			fmt.Fprintf(&buf, "%s\n\n", prose(s.intro))
		}
		buf.WriteString("| key | type | unit | default | environment | flag | meaning |\n")
		buf.WriteString("|---|---|---|---|---|---|---|\n")
		for _, r := range s.rows {
			fmt.Fprintf(&buf, "| `%s` | %s | %s | %s | %s | %s | %s |\n",
				r.key, cell(r.typ), cell(r.unit), cell(prose(r.def)), cell(r.env), cell(r.flag), cell(prose(r.meaning)))
		}
	}
	return buf.Bytes()
}
