// Command gen writes the file named by its argument with shagen.Generate.
package main

import (
	"fmt"
	"os"

	"switchyard/kv/hashing/internal/shagen"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gen FILE")
		os.Exit(2)
	}
	if err := os.WriteFile(os.Args[1], shagen.Generate(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
