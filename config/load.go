package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/knadh/koanf/parsers/json"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
)

// EnvPrefix starts every environment variable Load reads. Below it, a double underscore
// separates levels and a single underscore stays part of a key:
// SWITCHYARD_SERVER__PORT is server.port and SWITCHYARD_CACHE_AWARE__MIN_MATCHED_TOKENS is
// cache_aware.min_matched_tokens.
const EnvPrefix = "SWITCHYARD_"

// envSeparator separates levels in an environment variable name.
const envSeparator = "__"

// Format is a configuration file format.
type Format string

// Configuration file formats.
const (
	FormatYAML Format = "yaml"
	FormatJSON Format = "json"
)

// FormatOf returns the format a file name's extension selects: .yaml and .yml are YAML,
// .json is JSON (case-insensitive).
func FormatOf(name string) (Format, error) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return FormatYAML, nil
	case ".json":
		return FormatJSON, nil
	}
	return "", fmt.Errorf("cannot load config file %q: unsupported extension %q (use .yaml, .yml or .json)", name, filepath.Ext(name))
}

func parserFor(f Format) koanf.Parser {
	if f == FormatJSON {
		return json.Parser()
	}
	return yaml.Parser()
}

// Load builds the configuration from, in rising precedence, the defaults, the file named
// by --config, the SWITCHYARD_ environment variables in environ (os.Environ() form;
// nil reads none) and the command-line flags in args (without the program or subcommand
// name). It rejects unknown keys, values of the wrong type and dropped options, joining
// every problem with errors.Join; it does not run Validate. With -h or --help it returns
// an error wrapping flag.ErrHelp and the caller prints Usage.
func Load(args []string, environ []string) (*Config, error) {
	opts, err := parseFlags(args)
	if err != nil {
		return nil, err
	}
	return load(opts, environ)
}

// load builds the configuration of a parsed command line.
func load(opts *cliOptions, environ []string) (*Config, error) {
	k := koanf.New(".")
	if opts.configPath != "" {
		format, err := FormatOf(opts.configPath)
		if err != nil {
			return nil, err
		}
		if err := k.Load(file.Provider(opts.configPath), parserFor(format)); err != nil {
			return nil, fmt.Errorf("cannot load config file %q: %w", opts.configPath, err)
		}
	}
	if err := loadEnv(k, environ); err != nil {
		return nil, err
	}
	if len(opts.sets) > 0 {
		m := make(map[string]any)
		for _, s := range opts.sets {
			setNested(m, s.segs, s.value)
		}
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("cannot load flags: %w", err)
		}
	}
	cfg := Default()
	if err := decodeTree(cfg, k.Raw()); err != nil {
		return nil, err
	}
	if err := opts.apply(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Decode builds a configuration from the defaults and one YAML or JSON document, with
// the same strict rules as Load. It does not run Validate.
func Decode(data []byte, format Format) (*Config, error) {
	if format != FormatYAML && format != FormatJSON {
		return nil, fmt.Errorf("cannot decode config: unknown format %q", format)
	}
	k := koanf.New(".")
	if err := k.Load(bytesProvider(data), parserFor(format)); err != nil {
		return nil, fmt.Errorf("cannot parse config: %w", err)
	}
	cfg := Default()
	if err := decodeTree(cfg, k.Raw()); err != nil {
		return nil, err
	}
	return cfg, nil
}

// bytesProvider is a koanf.Provider over a byte slice.
type bytesProvider []byte

var _ koanf.Provider = bytesProvider(nil)

func (b bytesProvider) ReadBytes() ([]byte, error) { return b, nil }

func (b bytesProvider) Read() (map[string]any, error) {
	return nil, errors.New("bytes provider does not support Read")
}

// loadEnv merges the SWITCHYARD_ variables of environ into k. Every variable must name a
// scalar key of the schema and hold a value of its type.
func loadEnv(k *koanf.Koanf, environ []string) error {
	var p problems
	transform := func(name, value string) (string, any) {
		segs, ferr := envSegments(name)
		if ferr == nil {
			var path string
			var t reflect.Type
			path, t, ferr = schemaLeaf(segs)
			if ferr == nil {
				v, err := convertString(t, value)
				if err == nil {
					return strings.Join(segs, "."), v
				}
				ferr = &FieldError{Path: path, Msg: err.Error(), Kind: ErrType}
			}
		}
		ferr.Path = name + " (" + ferr.Path + ")"
		if ferr.Path == name+" ()" {
			ferr.Path = name
		}
		if ferr.Kind == ErrUnknownKey {
			// Other programs' variables never start with the prefix; one that does and names
			// nothing is most likely a typo, which must not pass unnoticed.
			ferr.Msg += " (an unknown " + EnvPrefix + "* variable stops the start: unset it or correct its name)"
		}
		p.errs = append(p.errs, ferr)
		return "", nil
	}
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:        EnvPrefix,
		TransformFunc: transform,
		EnvironFunc:   func() []string { return environ },
	}), nil)
	if err != nil {
		return fmt.Errorf("cannot load environment: %w", err)
	}
	return p.err()
}

// envSegments splits SWITCHYARD_A_B__C into ["a_b", "c"].
func envSegments(name string) ([]string, *FieldError) {
	rest := strings.ToLower(strings.TrimPrefix(name, EnvPrefix))
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return nil, &FieldError{Msg: "invalid variable name (use letters, digits and '_'; '__' separates levels)", Kind: ErrUnknownKey}
		}
	}
	segs := strings.Split(rest, envSeparator)
	for _, s := range segs {
		if s == "" {
			return nil, &FieldError{Msg: "invalid variable name (empty level; '__' separates levels)", Kind: ErrUnknownKey}
		}
	}
	return segs, nil
}

// Usage writes every flag with its default, the environment convention and the dropped
// options to w.
func Usage(w io.Writer) {
	var opts cliOptions
	fs := newFlagSet(&opts)
	fmt.Fprintf(w, "Flags (precedence: defaults < --config file < %s* environment < flags):\n", EnvPrefix)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		def := f.DefValue
		if def == "" {
			def = "none"
		}
		fmt.Fprintf(w, "  --%s%s\n        %s (default: %s)\n", f.Name, arg, usage, def)
	})
	fmt.Fprintf(w, `
Environment: %[1]s<KEY PATH>, upper case, with "__" between levels and "_" kept inside
key names, e.g. %[1]sSERVER__PORT=9000 sets server.port and
%[1]sCACHE_AWARE__MIN_MATCHED_TOKENS=512 sets cache_aware.min_matched_tokens.
Only scalar keys can be set this way (lists such as workers come from the file).
Unknown %[1]s* variables are errors.

Dropped options (rejected at startup):
`, EnvPrefix)
	for _, d := range droppedHelp() {
		fmt.Fprintf(w, "  %-36s %s\n", d[0], d[1])
	}
}
