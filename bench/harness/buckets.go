package harness

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"switchyard/bench/loadgen"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// templateSlack covers the chat template's tokens around a prompt when bucket limits are
// derived from the length classes.
const templateSlack = 64

// bucketVariant is one deployment of the buckets scenario.
type bucketVariant struct {
	name string
	// model lays out the buckets; classWorkers names the engines serving each class.
	model        func(c *cluster) config.Model
	classWorkers func(c *cluster, class int) []string
}

// buckets runs the long-context mix on one pool of engines and on length buckets (one per
// class, engines split by each class's share of the prompt tokens), with power_of_two in
// every group, and reports each deployment as a whole and per length class.
func (h *harness) buckets(ctx context.Context) ([]*report.Scenario, error) {
	o := &h.opts
	classes := slices.Clone(o.bucketClasses())
	slices.SortStableFunc(classes, func(a, b workload.LengthClass) int { return cmp.Compare(a.Max, b.Max) })
	lc := o.Workload.LongContext
	lc.Classes = classes
	wl, err := workload.LongContext(lc, o.Seed)
	if err != nil {
		return nil, err
	}
	alloc := allocateEngines(o.Engines, classes)
	p2c := config.Policy{Type: config.PolicyPowerOfTwo}
	split := func(c *cluster, class int) []string {
		start := 0
		for i := range class {
			start += alloc[i]
		}
		return ids(c.plain[start : start+alloc[class]])
	}
	var layout []string
	for i, cl := range classes {
		layout = append(layout, fmt.Sprintf("%s %d", cl.Name, alloc[i]))
	}
	sc := &report.Scenario{
		Name: report.ScenarioBuckets, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: h.plainDeployment(o.Engines) + "; single_pool: one bucket; buckets: one bucket per class (engines " +
			strings.Join(layout, ", ") + "); power_of_two in every group; " + h.arrivals(),
	}
	variants := []bucketVariant{
		{
			name: "single_pool",
			model: func(c *cluster) config.Model {
				return config.Model{Buckets: []config.Bucket{plainBucket("all", ids(c.plain), p2c)}}
			},
			classWorkers: func(c *cluster, _ int) []string { return ids(c.plain) },
		},
		{
			name: "buckets",
			model: func(c *cluster) config.Model {
				var bs []config.Bucket
				for i, cl := range classes {
					b := plainBucket(cl.Name, split(c, i), p2c)
					b.Rank = i
					if i < len(classes)-1 {
						limit := int64(cl.Max + templateSlack)
						b.Limits.Max = &limit
					}
					bs = append(bs, b)
				}
				return config.Model{Buckets: bs}
			},
			classWorkers: split,
		},
	}
	for _, v := range variants {
		rows, err := h.bucketRows(ctx, wl, classes, v)
		sc.Rows = append(sc.Rows, rows...)
		if err != nil {
			return []*report.Scenario{sc}, err
		}
	}
	sc.Notes = append(sc.Notes, "rows name/class cover that length class's requests; their spread is over the engines that class may use; throughput is over the whole run")
	return []*report.Scenario{sc}, nil
}

func (h *harness) bucketRows(ctx context.Context, wl *workload.Workload, classes []workload.LengthClass, v bucketVariant) (rows []report.Row, err error) {
	o := &h.opts
	c, err := o.startCluster(ctx, clusterSpec{plain: o.Engines})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	cfg := o.routerConfig(c)
	cfg.Models = map[string]config.Model{o.Model: v.model(c)}
	r, err := o.startRouter(ctx, cfg)
	if errors.Is(err, errRouterBuild) {
		return []report.Row{{Name: v.name, Skipped: skipReason(err)}}, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	m, err := h.measure(ctx, load{
		label: "buckets " + v.name, urls: []string{r.url}, reqs: wl.Requests, stream: !o.NoStream, simulated: true,
		concurrency: h.concurrency(DefaultConcurrency), maxRequests: o.Requests, duration: o.Duration,
	})
	if err != nil {
		return nil, err
	}
	rows = append(rows, report.Row{Name: v.name, Truncated: m.Truncated,
		Summary: report.Summarize(m.Results, report.SummaryOptions{Workers: ids(c.plain), TimeScale: o.Speedup, Elapsed: m.Elapsed})})
	for i, cl := range classes {
		part := report.Filter(m.Results, func(r *loadgen.Result) bool { return r.Class == cl.Name })
		rows = append(rows, report.Row{Name: v.name + "/" + cl.Name,
			Summary: report.Summarize(part, report.SummaryOptions{Workers: v.classWorkers(c, i), TimeScale: o.Speedup, Elapsed: m.Elapsed})})
	}
	return rows, nil
}

// allocateEngines splits n engines over the classes in proportion to each class's expected
// share of prompt tokens (weight × mean length), at least one each, by largest remainder.
// n must be at least len(classes).
func allocateEngines(n int, classes []workload.LengthClass) []int {
	k := len(classes)
	out := make([]int, k)
	share := make([]float64, k)
	total := 0.0
	for i, c := range classes {
		share[i] = c.Weight * float64(c.Min+c.Max) / 2
		total += share[i]
	}
	spare := n - k
	type rem struct {
		i int
		r float64
	}
	var rems []rem
	given := 0
	for i := range classes {
		out[i] = 1
		if total <= 0 {
			continue
		}
		exact := share[i] / total * float64(spare)
		whole := int(exact)
		out[i] += whole
		given += whole
		rems = append(rems, rem{i, exact - float64(whole)})
	}
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for j := 0; given < spare; j++ {
		if len(rems) == 0 {
			out[0] += spare - given
			break
		}
		out[rems[j%len(rems)].i]++
		given++
	}
	return out
}
