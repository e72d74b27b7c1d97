package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// errStopped: the fleet was stopped.
var errStopped = errors.New("the worker lifecycle is stopped")

// Job states of an asynchronous worker addition (POST /workers without a model), as
// sgl-router reports them.
const (
	JobPending    = "pending"
	JobProcessing = "processing"
	JobFailed     = "failed"
	// JobAddWorker is the job type of an addition.
	JobAddWorker = "AddWorker"
)

// Bounds of the asynchronous additions: jobs running at once, and finished jobs whose
// failure is kept (for jobFailureTTL) for GET /workers/{url}.
const (
	maxJobs       = 256
	maxJobResults = 1024
	jobFailureTTL = 5 * time.Minute
)

// ErrTooManyJobs: maxJobs additions are already under way.
var ErrTooManyJobs = errors.New("too many worker additions under way")

// JobStatus is an asynchronous addition's state, until the worker is added (a succeeded
// job leaves no status: the worker answers for itself) or for a while after it failed.
type JobStatus struct {
	JobType   string `json:"job_type"`
	WorkerURL string `json:"worker_url"`
	Status    string `json:"status"`
	Message   string `json:"message,omitempty"`
	// Timestamp is when the status last changed, in Unix seconds.
	Timestamp int64 `json:"timestamp"`
}

// job is one addition's state, guarded by the fleet's mutex.
type job struct {
	status JobStatus
	id     string
	done   time.Time // when it failed; zero while it runs
	cancel context.CancelFunc
}

// normalizeURL is the form of a worker URL the fleet compares: without a trailing slash.
func normalizeURL(u string) string { return strings.TrimRight(u, "/") }

// AddLater adds the worker of spec in the background (POST /workers without a model): a job
// learns the engine's model (DiscoverModel), retrying every health.startup_check_interval
// for up to health.startup_timeout, then adds it as Add does with introspection, healthy at
// once. It returns the ID the worker will have. A worker or job for the same URL or ID is
// ErrWorkerExists; more than a bounded number of jobs at once is ErrTooManyJobs.
func (f *Fleet) AddLater(spec Spec) (string, error) {
	if spec.URL == "" {
		return "", fmt.Errorf("cannot add worker: %w: url is required", ErrInvalidWorker)
	}
	hostPort, isTLS, err := urlHostPort(spec.URL)
	if err != nil {
		return "", fmt.Errorf("cannot add worker: %w: %w", ErrInvalidWorker, err)
	}
	if spec.ID == "" {
		spec.ID = hostPort
	}
	url := normalizeURL(spec.URL)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruneJobsLocked()
	if f.members[spec.ID] != nil || f.memberByURLLocked(url) != nil {
		return "", fmt.Errorf("cannot add worker %q: %w", spec.ID, ErrWorkerExists)
	}
	running := 0
	for u, j := range f.jobs {
		if j.done.IsZero() {
			running++
			if u == url || j.id == spec.ID {
				return "", fmt.Errorf("cannot add worker %q: %w (its addition is under way)", spec.ID, ErrWorkerExists)
			}
		}
	}
	if running >= maxJobs {
		return "", fmt.Errorf("cannot add worker %q: %w (%d)", spec.ID, ErrTooManyJobs, running)
	}
	if f.stopped {
		return "", fmt.Errorf("cannot add worker %q: %w", spec.ID, errStopped)
	}
	if f.jobs == nil {
		f.jobs = map[string]*job{}
	}
	// The job runs until it is done or Stop cancels it.
	ctx, cancel := context.WithCancel(context.Background())
	j := &job{id: spec.ID, cancel: cancel,
		status: JobStatus{JobType: JobAddWorker, WorkerURL: spec.URL, Status: JobPending, Timestamp: f.clock.Now().Unix()}}
	f.jobs[url] = j
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer cancel()
		defer func() {
			if r := recover(); r != nil {
				f.logger.Error("worker addition panicked", slog.String("worker", spec.ID), slog.Any("panic", r))
				f.finishJob(url, fmt.Errorf("internal error: %v", r))
			}
		}()
		f.finishJob(url, f.runAdd(ctx, url, spec, hostPort, isTLS))
	}()
	return spec.ID, nil
}

// runAdd is an addition's work: learn the model, then add.
func (f *Fleet) runAdd(ctx context.Context, url string, spec Spec, hostPort string, isTLS bool) error {
	f.setJob(url, JobProcessing, "")
	up := newUpstream(f.t, hostPort, urlHost(spec.URL), isTLS, spec.TLS, metrics.NewSet().NewCounter(MetricStaleRetries))
	defer up.CloseIdle()
	timeout := f.health.StartupTimeout
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	interval := f.health.StartupCheckInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	model, err := WaitForModel(ctx, up.Probe(), []string{spec.URL}, timeout, interval, f.clock)
	if err != nil {
		return err
	}
	if spec.Model == "" {
		if info, ierr := Introspect(ctx, up.Probe(), spec.URL, f.health.Timeout); ierr != nil || info.Model() == "" {
			spec.Model = model // no introspection: the model /v1/models or /get_model_info named
		}
	}
	_, err = f.add(ctx, spec, true, url)
	return err
}

func (f *Fleet) setJob(url, status, msg string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if j := f.jobs[url]; j != nil {
		j.status.Status, j.status.Message, j.status.Timestamp = status, msg, f.clock.Now().Unix()
	}
}

// finishJob ends url's job: a failure is kept for jobFailureTTL; a success was forgotten as
// the worker was registered (add).
func (f *Fleet) finishJob(url string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	j := f.jobs[url]
	if j == nil {
		return
	}
	j.cancel()
	if err == nil {
		delete(f.jobs, url)
		return
	}
	f.logger.Warn("cannot add worker", slog.String("url", j.status.WorkerURL), slog.Any("error", err))
	now := f.clock.Now()
	j.status.Status, j.status.Message, j.status.Timestamp = JobFailed, err.Error(), now.Unix()
	j.done = now
	f.pruneJobsLocked()
}

// pruneJobsLocked forgets failures older than jobFailureTTL, and the oldest ones beyond
// maxJobResults; f.mu held.
func (f *Fleet) pruneJobsLocked() {
	now := f.clock.Now()
	var failed []string
	for u, j := range f.jobs {
		switch {
		case j.done.IsZero():
		case now.Sub(j.done) > jobFailureTTL:
			delete(f.jobs, u)
		default:
			failed = append(failed, u)
		}
	}
	if len(failed) > maxJobResults {
		slices.SortFunc(failed, func(a, b string) int { return f.jobs[a].done.Compare(f.jobs[b].done) })
		for _, u := range failed[:len(failed)-maxJobResults] {
			delete(f.jobs, u)
		}
	}
}

// Job returns the status of the addition of the worker at url (or with ID url), and the ID
// the worker will have, if an addition is under way or failed recently.
func (f *Fleet) Job(urlOrID string) (st JobStatus, id string, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pruneJobsLocked()
	if j := f.jobs[normalizeURL(urlOrID)]; j != nil {
		return j.status, j.id, true
	}
	for _, j := range f.jobs {
		if j.id == urlOrID {
			return j.status, j.id, true
		}
	}
	return JobStatus{}, "", false
}

// MemberByURL returns the worker whose URL is url (compared without a trailing slash), the
// one of lowest ID when several share it, or nil.
func (f *Fleet) MemberByURL(url string) *Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.memberByURLLocked(normalizeURL(url))
}

func (f *Fleet) memberByURLLocked(url string) *Member {
	var found *Member
	for _, m := range f.members {
		if normalizeURL(m.url) == url && (found == nil || m.id < found.id) {
			found = m
		}
	}
	return found
}
