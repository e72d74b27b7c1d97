package main

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// checkDefault reports whether the default a comment states (the text after "Default")
// is v, the value config.Default holds. "none" and "unset" state a zero value; a number
// may carry thousands separators and a KiB, MiB or GiB suffix; a string may be quoted; a
// list is written in brackets.
func checkDefault(stated string, v reflect.Value) error {
	word, rest, _ := strings.Cut(stated, " ")
	word = strings.TrimRight(word, ",;:")
	if word == "none" || word == "unset" {
		if !v.IsZero() {
			return fmt.Errorf("the comment says the default is %q, config.Default holds %v", stated, v.Interface())
		}
		return nil
	}
	mismatch := func() error {
		return fmt.Errorf("the comment says the default is %q, config.Default holds %v", stated, v.Interface())
	}
	if v.Kind() == reflect.Slice {
		// A list is stated in brackets: "[502, 503, 504]".
		inner, ok := strings.CutPrefix(stated, "[")
		inner, _, closed := strings.Cut(inner, "]")
		if !ok || !closed {
			return fmt.Errorf("cannot read the default %q as a list (write \"Default [1, 2].\")", stated)
		}
		var items []string
		if strings.TrimSpace(inner) != "" {
			items = strings.Split(inner, ",")
		}
		if len(items) != v.Len() {
			return mismatch()
		}
		for i, item := range items {
			if checkDefault(strings.TrimSpace(item), v.Index(i)) != nil {
				return mismatch()
			}
		}
		return nil
	}
	if v.Type() == durationType {
		d, err := time.ParseDuration(word)
		if err != nil {
			return fmt.Errorf("cannot read the default %q as a duration (write \"Default 5s.\")", stated)
		}
		if d != time.Duration(v.Int()) {
			return mismatch()
		}
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		if strings.Trim(word, `"`) != v.String() {
			return mismatch()
		}
	case reflect.Bool:
		b, err := strconv.ParseBool(word)
		if err != nil {
			return fmt.Errorf("cannot read the default %q as true or false", stated)
		}
		if b != v.Bool() {
			return mismatch()
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(strings.ReplaceAll(word, ",", ""), 10, 64)
		if err != nil {
			return fmt.Errorf("cannot read the default %q as an integer (write \"Default 1024.\")", stated)
		}
		suffix, _, _ := strings.Cut(rest, " ")
		switch strings.TrimRight(suffix, ".,;)") {
		case "KiB":
			n <<= 10
		case "MiB":
			n <<= 20
		case "GiB":
			n <<= 30
		}
		if n != v.Int() {
			return mismatch()
		}
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(word, 64)
		if err != nil {
			return fmt.Errorf("cannot read the default %q as a number", stated)
		}
		if f != v.Float() {
			return mismatch()
		}
	default:
		return fmt.Errorf("cannot check a default of type %s", v.Type())
	}
	return nil
}
