package series

import (
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// labelEscaper escapes what a Prometheus label value may not hold as is.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// Label escapes v for a Prometheus label value: backslash, double quote and newline.
func Label(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	return labelEscaper.Replace(v)
}

// Name returns family{k1="v1",k2="v2",...} from label pairs (name, value), escaping the
// values; family alone when there are none. An odd trailing name is a bug.
func Name(family string, pairs ...string) string {
	if len(pairs)%2 != 0 {
		panic("BUG: series.Name needs label name/value pairs")
	}
	if len(pairs) == 0 {
		return family
	}
	var b strings.Builder
	b.Grow(len(family) + 16*len(pairs))
	b.WriteString(family)
	b.WriteByte('{')
	for i := 0; i < len(pairs); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(pairs[i])
		b.WriteString(`="`)
		b.WriteString(Label(pairs[i+1]))
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// Owned is the series a component registered on a set, unregistered together by Unregister
// (when the component closes, or a worker leaves). The zero value is not usable: use Own.
type Owned struct {
	set   *metrics.Set
	mu    sync.Mutex
	names []string
}

// Own returns an empty Owned on set; a nil set gets a private one (series kept, not
// exported).
func Own(set *metrics.Set) *Owned {
	if set == nil {
		set = metrics.NewSet()
	}
	return &Owned{set: set}
}

// Set is the set the series live on.
func (o *Owned) Set() *metrics.Set { return o.set }

func (o *Owned) add(name string) {
	o.mu.Lock()
	o.names = append(o.names, name)
	o.mu.Unlock()
}

// Counter returns the counter name, creating it if needed.
func (o *Owned) Counter(name string) *metrics.Counter {
	o.add(name)
	return o.set.GetOrCreateCounter(name)
}

// Gauge registers a gauge read from f at each scrape: a value that goes up and down (a count
// that only grows is a Counter).
func (o *Owned) Gauge(name string, f func() float64) {
	o.add(name)
	o.set.GetOrCreateGauge(name, f)
}

// Histogram returns the classic Prometheus histogram name with the given upper bounds.
func (o *Owned) Histogram(name string, bounds []float64) *metrics.PrometheusHistogram {
	o.add(name)
	return o.set.GetOrCreatePrometheusHistogramExt(name, bounds)
}

// Unregister removes every series registered through o so far.
func (o *Owned) Unregister() {
	o.mu.Lock()
	names := o.names
	o.names = nil
	o.mu.Unlock()
	for _, n := range names {
		o.set.UnregisterMetric(n)
	}
}
