package report

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the scenario as a text table with its heading and notes.
func WriteTable(w io.Writer, s *Scenario) error {
	var b strings.Builder
	fmt.Fprintf(&b, "== %s ==\n", s.Title())
	if s.Description != "" {
		fmt.Fprintf(&b, "workload:   %s\n", s.Description)
	}
	fmt.Fprintf(&b, "deployment: %s\n", s.Deployment)
	switch s.TimeBase {
	case TimeSimulated:
		fmt.Fprintf(&b, "times:      simulated (wall × speedup %g); latencies in ms, rates per simulated second\n", s.Speedup)
	default:
		fmt.Fprintf(&b, "times:      wall clock; latencies in ms\n")
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	switch s.Name {
	case ScenarioOverhead:
		overheadTable(tw, s)
	case ScenarioMailbox:
		mailboxTable(tw, s)
	case ScenarioReplicas:
		replicasTable(tw, s)
	case ScenarioSLO:
		sloTable(tw, s)
	case ScenarioInstructions:
		instructionsTable(tw, s)
	default:
		policyTable(tw, s)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write table: %w", err)
	}
	if o := s.Overhead; o != nil {
		fmt.Fprintf(&b, "router keeps %.1f%% of direct throughput; adds %s ms at p50 and %s ms at p99", 100*o.Share, num(o.AddedP50ms), num(o.AddedP99ms))
		if o.RouterCPUSecondsPer1K >= 0 {
			fmt.Fprintf(&b, "; router CPU %.3f s per 1,000 requests", o.RouterCPUSecondsPer1K)
		}
		b.WriteString("\n")
		for _, rr := range o.References {
			fmt.Fprintf(&b, "%s: router %.2f× %s's throughput", rr.Mode, rr.Throughput, rr.Against)
			if rr.CPU >= 0 {
				fmt.Fprintf(&b, ", %.2f× its CPU per request", rr.CPU)
			}
			b.WriteString("\n")
		}
	}
	for _, ir := range s.InstructionRatios {
		fmt.Fprintf(&b, "%s: router %.2f× %s's instructions per request\n", ir.Mode, ir.Ratio, ir.Against)
	}
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Summary == nil || r.Summary.ErrorCount() == 0 {
			continue
		}
		fmt.Fprintf(&b, "errors %s: %s\n", r.Name, counts(r.Summary.ErrorsByStatus, r.Summary.ErrorsByCode))
	}
	for i := range s.Rows {
		if r := &s.Rows[i]; r.Skipped != "" {
			fmt.Fprintf(&b, "skipped %s: %s\n", r.Name, r.Skipped)
		}
	}
	for i := range s.Rows {
		if r := &s.Rows[i]; r.Replicas != nil && len(r.Replicas.Events) > 0 {
			fmt.Fprintf(&b, "events %s: %s\n", r.Name, strings.Join(r.Replicas.Events, "; "))
		}
	}
	for i := range s.Rows {
		if r := &s.Rows[i]; r.Loss != nil && r.Summary != nil {
			writeLoss(&b, r)
		}
	}
	var late []string
	for i := range s.Rows {
		if r := &s.Rows[i]; r.Summary != nil && r.Summary.SendLate != nil {
			l := r.Summary.SendLate
			late = append(late, fmt.Sprintf("%s %.1f / %.1f / %.1f", r.Name, l.P50, l.P99, l.Max))
		}
	}
	if len(late) > 0 {
		fmt.Fprintf(&b, "sent late (wall ms after the arrival, p50 / p99 / max): %s\n", strings.Join(late, "; "))
	}
	for _, n := range s.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func counts(byStatus, byCode map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(byStatus)) {
		parts = append(parts, fmt.Sprintf("%s×%d", k, byStatus[k]))
	}
	if len(byCode) > 0 {
		var codes []string
		for _, k := range slices.Sorted(maps.Keys(byCode)) {
			codes = append(codes, fmt.Sprintf("%s×%d", k, byCode[k]))
		}
		parts = append(parts, "("+strings.Join(codes, ", ")+")")
	}
	return strings.Join(parts, " ")
}

// num formats a latency or rate with a precision suited to its size.
func num(v float64) string {
	switch a := max(v, -v); {
	case a == 0:
		return "0"
	case a < 1:
		return fmt.Sprintf("%.3f", v)
	case a < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func pct(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }

func policyTable(tw io.Writer, s *Scenario) {
	slow := len(s.SlowWorkers) > 0
	head := "POLICY\tREQS\tERR\tREQ/S\tOUT TOK/S\tTTFT p50\tp90\tp99\tITL p50\tE2E p90\tHIT\tvs ORACLE\tSPREAD req\tprefill\t"
	if slow {
		head += "SLOW\t"
	}
	fmt.Fprintln(tw, head)
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped\t\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Name)
			continue
		}
		m := r.Summary
		vs := "-"
		if v := r.VsOracle(); v > 0 {
			vs = pct(v)
		}
		name := r.Name
		if r.Truncated {
			name += "*"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t", name, m.Requests, m.ErrorCount(),
			num(m.RequestsPerS), num(m.OutputTokensPerS), num(m.TTFT.P50), num(m.TTFT.P90), num(m.TTFT.P99),
			num(m.ITL.P50), num(m.E2E.P90), pct(m.HitRate), vs, m.SpreadRequests, m.SpreadPrefill)
		if slow {
			fmt.Fprintf(tw, "%s\t", pct(max(s.SlowShare(r), 0)))
		}
		fmt.Fprintln(tw)
	}
	if o := s.Oracle; o != nil {
		fmt.Fprintf(tw, "oracle\t%d\t\t\t\t\t\t\t\t\t%s\t100.0%%\t\t\t\n", o.Requests, pct(o.HitRate))
		if p := o.NoQueue; p != nil && o.HitRate > 0 {
			fmt.Fprintf(tw, "no-queue oracle\t%d\t\t\t\t\t\t\t\t\t%s\t%s\t\t\t\n", p.Requests, pct(p.HitRate), pct(p.HitRate/o.HitRate))
		}
		if p := o.Pooled; p != nil && o.HitRate > 0 {
			fmt.Fprintf(tw, "pooled bound\t%d\t\t\t\t\t\t\t\t\t%s\t%s\t\t\t\n", p.Requests, pct(p.HitRate), pct(p.HitRate/o.HitRate))
		}
	}
}

// writeLoss writes a row's HitLoss: its simulated hit rate, and each class of the oracle's
// hits it lost as a share of the oracle's cached tokens.
func writeLoss(b *strings.Builder, r *Row) {
	l := r.Loss
	share := func(c LossClass) string {
		if l.OracleCached <= 0 {
			return fmt.Sprintf("0 (%d req)", c.Requests)
		}
		return fmt.Sprintf("%s (%d req)", pct(float64(c.Tokens)/float64(l.OracleCached)), c.Requests)
	}
	fmt.Fprintf(b, "hits %s: measured %s, simulated %s; of the oracle's cached tokens lost: gone %s, elsewhere %s, queued %s, on holder %s; gained %s\n",
		r.Name, pct(r.Summary.HitRate), pct(l.Simulated), share(l.Gone), share(l.Elsewhere), share(l.Queued), share(l.OnHolder), share(l.Gained))
	if x := l.Left; x != nil {
		fmt.Fprintf(b, "left %s: elsewhere and queued by the router's view: unseen %s, slower %s, tie %s, unrecorded %s",
			r.Name, share(x.Unseen), share(x.Slower), share(x.Tie), share(x.Unrecorded))
		if x.Slower.Requests > 0 {
			fmt.Fprintf(b, "; slower: queue ahead on the holder %.2f s (simulated %.2f s), on the engine chosen %.2f s (medians)",
				x.HolderQueue, x.HolderActual, x.ChosenQueue)
		}
		b.WriteString("\n")
	}
}

func overheadTable(tw io.Writer, s *Scenario) {
	fmt.Fprintln(tw, "MODE\tREQS\tERR\tREQ/S\tp50\tp90\tp99\tCPU s/1k req\tOWN CPU s/1k\t")
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped\t\t\t\t\t\t\t\t\n", r.Name)
			continue
		}
		m := r.Summary
		own := "-"
		if r.OwnCPUSecondsPer1K > 0 {
			own = fmt.Sprintf("%.3f", r.OwnCPUSecondsPer1K)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%.3f\t%s\t\n", r.Name, m.Requests, m.ErrorCount(), num(m.RequestsPerS),
			num(m.E2E.P50), num(m.E2E.P90), num(m.E2E.P99), r.CPUSecondsPer1K, own)
	}
}

func instructionsTable(tw io.Writer, s *Scenario) {
	fmt.Fprintln(tw, "MODE\tREQS\tERR\tINSTRUCTIONS\tINSTR/REQ\t")
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" || r.Instructions == nil {
			fmt.Fprintf(tw, "%s\tskipped\t\t\t\t\n", r.Name)
			continue
		}
		f := r.Instructions
		errs := 0
		if r.Summary != nil {
			errs = r.Summary.ErrorCount()
		}
		fmt.Fprintf(tw, "%s\t%d / %d\t%d\t%s / %s\t%.0f\t\n", r.Name, f.Requests[0], f.Requests[1], errs,
			millions(f.Instructions[0]), millions(f.Instructions[1]), f.PerRequest)
	}
}

// millions formats an instruction count in millions.
func millions(n uint64) string { return fmt.Sprintf("%.1fM", float64(n)/1e6) }

func mailboxTable(tw io.Writer, s *Scenario) {
	fmt.Fprintln(tw, "MAILBOX\tSENT\tOK\t429\t429 RATE\tACCEPTED REQ/S\tp50\tp99\t")
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%d\tskipped\t\t\t\t\t\t\t\n", r.Mailbox)
			continue
		}
		m := r.Summary
		rejected := m.ErrorsByStatus["429"]
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", r.Mailbox, m.Requests, m.OK, rejected,
			pct(RejectRate(m)), num(m.RequestsPerS), num(m.E2E.P50), num(m.E2E.P99))
	}
}

// RejectRate is the fraction of requests answered 429.
func RejectRate(m *Summary) float64 {
	if m.Requests == 0 {
		return 0
	}
	return float64(m.ErrorsByStatus["429"]) / float64(m.Requests)
}

func replicasTable(tw io.Writer, s *Scenario) {
	fmt.Fprintln(tw, "ROUTERS\tREQS\tERR\ton crashed\tAGREE\tafter crash\tHIT\tvs 1 ROUTER\tTTFT p50\tp90\tE2E p90\tCPU s/1k req per router\t")
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" || r.Summary == nil || r.Replicas == nil {
			fmt.Fprintf(tw, "%s\tskipped\t\t\t\t\t\t\t\t\t\t\t\n", r.Name)
			continue
		}
		m, f := r.Summary, r.Replicas
		name := r.Name
		if r.Truncated {
			name += "*"
		}
		after, vs := "-", "-"
		if f.AgreementAfterCrash >= 0 {
			after = pct(f.AgreementAfterCrash)
		}
		if f.HitRateVsSingle > 0 {
			vs = pct(f.HitRateVsSingle)
		}
		cpu := make([]string, len(f.CPUSecondsPer1K))
		for k, v := range f.CPUSecondsPer1K {
			cpu[k] = fmt.Sprintf("%.3f", v)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, m.Requests, f.OtherErrors, f.CrashErrors,
			pct(f.Agreement), after, pct(m.HitRate), vs, num(m.TTFT.P50), num(m.TTFT.P90), num(m.E2E.P90), strings.Join(cpu, " "))
	}
}

func sloTable(tw io.Writer, s *Scenario) {
	fmt.Fprintln(tw, "ORDER\tREQS\tERR\tREQ/S\tSLO MET\tGOODPUT/S\tTTFT p50\tp90\tp99\tEST p50\tEST/OBS p10\tp50\tp90\tWITHIN 30%\tBUCKETS\t")
	for i := range s.Rows {
		r := &s.Rows[i]
		if r.Skipped != "" || r.SLO == nil {
			fmt.Fprintf(tw, "%s\tskipped\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Name)
			continue
		}
		m, o := r.Summary, r.SLO
		name := r.Name
		if r.Truncated {
			name += "*"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t\n", name, m.Requests, m.ErrorCount(),
			num(m.RequestsPerS), pct(o.Attainment), num(o.GoodputPerS), num(m.TTFT.P50), num(m.TTFT.P90), num(m.TTFT.P99),
			num(o.Estimated.P50), o.RatioP10, o.EstimateRatio.P50, o.EstimateRatio.P90, pct(o.Within30), bucketCounts(o.Buckets))
	}
}

// bucketCounts lists requests by bucket, "a:12 b:30".
func bucketCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s:%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}
