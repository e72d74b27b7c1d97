package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/indexer"
)

func TestIndexerFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		listen  string
		rest    []string
		wantErr bool
	}{
		{"default", []string{"--config", "x.yaml"}, defaultIndexerListen, []string{"--config", "x.yaml"}, false},
		{"separate value", []string{"--listen", "127.0.0.1:1", "--config", "x.yaml"}, "127.0.0.1:1", []string{"--config", "x.yaml"}, false},
		{"equals", []string{"-listen=:9", "--kv.shards=2"}, ":9", []string{"--kv.shards=2"}, false},
		{"missing value", []string{"--listen"}, "", nil, true},
		{"not host:port", []string{"--listen", "nope"}, "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			listen, rest, err := indexerFlags(tt.args)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (listen != tt.listen || strings.Join(rest, " ") != strings.Join(tt.rest, " ")) {
				t.Fatalf("listen %q rest %q", listen, rest)
			}
		})
	}
}

// TestIndexerServesSubscribedEvents runs `switchyard indexer` against a KV-event publisher
// on a real zmq4 PUB socket and looks a published prefix up through indexer.RemoteSource.
func TestIndexerServesSubscribedEvents(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "indexer.yaml")
	cfg := "workers:\n  - id: a\n    url: http://127.0.0.1:1\n    model: m\n    kv_events: tcp://" + pub.Addr().String() + "\n" +
		"kv:\n  reconnect_backoff: 20ms\nlog:\n  level: error\n"
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runIndexer(ctx, []string{"--listen", "127.0.0.1:0", "--config", cfgPath}, outW, io.Discard)
		outW.Close()
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("runIndexer: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("runIndexer did not return after cancel")
		}
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, outR)
	base := strings.TrimSpace(line[strings.Index(line, "http://"):])

	src, err := indexer.NewRemoteSource(indexer.RemoteConfig{URL: base, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]uint32, 320)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	enc := events.NewEncoder()
	payload, err := enc.Encode(&events.EventBatch{Events: []events.Event{{Kind: events.EventBlockStored,
		BlockHashes: hashing.AppendBlockHashes(nil, prompt, 16), TokenIDs: prompt, BlockSize: 16, Medium: events.MediumGPU}}}, events.ShapeMap)
	if err != nil {
		t.Fatal(err)
	}
	// Publish until the indexer has subscribed (the ZMQ slow joiner drops earlier messages).
	deadline := time.After(30 * time.Second)
	var l kv.Lookup
	for seq := uint64(0); ; seq++ {
		if err := pub.Send(zmq4.NewMsgFrom([]byte(""), binary.BigEndian.AppendUint64(nil, seq), payload)); err != nil {
			t.Fatal(err)
		}
		err := src.Lookup(context.Background(), "m", prompt, &l)
		if err != nil && !errors.Is(err, kv.ErrUnavailable) {
			t.Fatal(err)
		}
		if l.Tokens("a") == 320 {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("the indexer never served the published prefix: %+v, %v", l, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
