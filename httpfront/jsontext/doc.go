// Package jsontext writes JSON text: the one JSON string-literal appender of the router and
// the mock engines. It allocates nothing beyond growing the caller's slice and holds no state.
package jsontext
