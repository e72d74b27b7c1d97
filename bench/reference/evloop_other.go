//go:build !linux

package reference

func evloopListener(int, string) (int, string, error) { return -1, "", ErrNoEvloop }

func serveEvloop(int, []string) (func() error, error) { return nil, ErrNoEvloop }
