package config

import (
	"testing"
	"time"
)

func TestAbortKeys(t *testing.T) {
	file := writeFile(t, "abort.yaml", "abort: {enabled: false, prefill_to_completion: true, timeout: 500ms}\n")
	cfg, err := Load([]string{"--config", file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Abort{PrefillToCompletion: true, Timeout: 500 * time.Millisecond}); cfg.Abort != want {
		t.Errorf("abort = %+v, want %+v", cfg.Abort, want)
	}
	cfg.Abort.Timeout = 0
	if got := fieldErrors(cfg.Validate()); len(got) != 1 || got[0].Path != "abort.timeout" {
		t.Errorf("problems %v, want abort.timeout", got)
	}
}
