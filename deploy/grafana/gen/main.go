// Command gen writes deploy/grafana/switchyard.json from the panels of package grafana:
//
//	go generate ./deploy/grafana
package main

import (
	"fmt"
	"os"

	"switchyard/deploy/grafana"
)

func main() {
	b, err := grafana.Switchyard.JSON()
	if err == nil {
		err = os.WriteFile("switchyard.json", b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot generate the dashboard:", err)
		os.Exit(1)
	}
}
