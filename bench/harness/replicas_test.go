package harness

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReplicaPortTakenEndsTheWait: a router process that exits because its port was taken
// ends the wait for its readiness at once (not after replicaStartTimeout) and is recognised
// as a start to try again with fresh ports; one that exits for another reason is not.
func TestReplicaPortTakenEndsTheWait(t *testing.T) {
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, stderr string
		taken        bool
	}{
		{"port taken", "switchyard serve: cannot create server: listen tcp 127.0.0.1:1: bind: address already in use", true},
		{"bad configuration", "switchyard serve: invalid configuration: server.port", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &Options{ReplicaCommand: []string{"sh", "-c", "echo '" + tt.stderr + "' >&2; exit 1", "sh"}}
			p, err := o.startRouterProc(t.TempDir(), "r0", ports[0], "server: {}\n")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = stopReplicaProcs([]*replicaProc{p}) })
			start := time.Now()
			err = waitProcReady(context.Background(), p, readyPoll, replicaStartTimeout)
			if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
				t.Fatalf("wait = %v, want the process's exit", err)
			}
			if d := time.Since(start); d >= replicaStartTimeout/2 {
				t.Errorf("the wait took %v after the process exited", d)
			}
			if got := portTaken(p); got != tt.taken {
				t.Errorf("portTaken = %v, want %v (stderr %q)", got, tt.taken, p.stderr.String())
			}
		})
	}
}
