package engine

import "strings"

// LimitPDIncompatible is the Rejection limit of a PD attempt whose prefill engine had no
// compatible decode engine in its bucket.
const LimitPDIncompatible = "pd_incompatible"

// Compatibility is a PD bucket's pairing rule (groups.pd.compatibility): the worker labels
// a prefill engine and a decode engine must share. The empty rule pairs any two engines of
// the bucket's groups (their model and role were already matched).
type Compatibility []string

// Pairs reports whether prefill and decode share every label of the rule; a label a worker
// lacks counts as empty, so two workers that both lack it share it.
func (c Compatibility) Pairs(prefill, decode *Worker) bool {
	for _, k := range c {
		if prefill.Label(k) != decode.Label(k) {
			return false
		}
	}
	return true
}

// describe lists w's values of the rule's labels, "transfer_backend=nixl, zone=a".
func (c Compatibility) describe(w *Worker) string {
	var b strings.Builder
	for i, k := range c {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(w.Label(k))
	}
	return b.String()
}
