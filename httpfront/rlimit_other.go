//go:build !unix

package httpfront

// openFileLimit is the process's limit on open files, or 0 when unknown.
func openFileLimit() int64 { return 0 }
