package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/load"
)

// Engine routes that name the served model besides the introspection routes.
const (
	PathModels       = "/v1/models"
	PathGetModelInfo = "/get_model_info"
)

// ErrNoModel means an engine answered none of the routes that name its model.
var ErrNoModel = errors.New("cannot learn the engine's model")

// DiscoverModel asks the engine at baseURL with c which model it serves: its introspection
// (/server_info, then /get_server_info: served_model_name, else model_path), else
// /v1/models (the first model's id), else /get_model_info (model_path). Every request is
// bounded by timeout; a failure wraps ErrNoModel with each route's answer.
func DiscoverModel(ctx context.Context, c load.Doer, baseURL string, timeout time.Duration) (string, error) {
	info, err := Introspect(ctx, c, baseURL, timeout)
	if err == nil && info.Model() != "" {
		return info.Model(), nil
	}
	errs := []error{err}
	base := strings.TrimRight(baseURL, "/")
	for _, route := range []struct {
		path  string
		model func([]byte) string
	}{
		{PathModels, func(b []byte) string {
			list, err := DecodeModelList(b)
			if err != nil {
				return ""
			}
			for i := range list {
				if !list[i].IsAdapter() { // the base model, not one of its LoRA adapters
					return list[i].ID
				}
			}
			return ""
		}},
		{PathGetModelInfo, func(b []byte) string {
			var mi struct {
				ModelPath string `json:"model_path"`
			}
			if json.Unmarshal(b, &mi) != nil {
				return ""
			}
			return mi.ModelPath
		}},
	} {
		var model string
		err := load.Fetch(ctx, c, base+route.path, "application/json", timeout, maxInfoBody, func(status int, body []byte) error {
			if status != fasthttp.StatusOK {
				return &errStatus{route.path, status}
			}
			if model = route.model(body); model == "" {
				return fmt.Errorf("%s names no model", route.path)
			}
			return nil
		})
		if err == nil {
			return model, nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("%w at %s: %w", ErrNoModel, base, errors.Join(errs...))
}

// WaitForModel learns the model the engines at urls serve, trying every interval until
// each answered or timeout passed (sgl-router waits for its workers at start-up the same
// way). Every engine must serve the same model. clock schedules the retries (nil: the wall
// clock).
func WaitForModel(ctx context.Context, c load.Doer, urls []string, timeout, interval time.Duration, clock Clock) (string, error) {
	if clock == nil {
		clock = SystemClock{}
	}
	deadline := clock.Now().Add(timeout)
	models := make([]string, len(urls))
	probeTimeout := min(interval, 5*time.Second)
	for {
		var last error
		for i, u := range urls {
			if models[i] != "" {
				continue
			}
			m, err := DiscoverModel(ctx, c, u, max(probeTimeout, time.Second))
			if err != nil {
				last = err
				continue
			}
			models[i] = m
		}
		if last == nil {
			break
		}
		if !clock.Now().Before(deadline) {
			return "", fmt.Errorf("no answer within %s: %w", timeout, last)
		}
		wake := make(chan struct{})
		stop := clock.AfterFunc(interval, func() { close(wake) })
		select {
		case <-ctx.Done():
			stop()
			return "", ctx.Err()
		case <-wake:
		}
	}
	for i := range models {
		if models[i] != models[0] {
			return "", fmt.Errorf("the engines serve different models (%s: %q, %s: %q): name the model with --model, or list the workers in a configuration file",
				urls[0], models[0], urls[i], models[i])
		}
	}
	return models[0], nil
}
