// Package series names and registers Prometheus series on a VictoriaMetrics metrics.Set: the
// router's one label-value escaper (Label), series names built from a family and label pairs
// (Name), and Owned, the series one component registers and removes together when it
// closes. Counters are metrics.Counter, histograms classic Prometheus histograms (`le`
// buckets): a count that only grows is never exposed as a gauge. Histogram, made by a
// HistogramFamily, is such a histogram for series every request updates: Update takes no
// lock (atomics on one of several copies of the counts, added up at scrape), and a family's
// series are written together, as metrics.PrometheusHistogram writes them.
//
// It sits under load, the lowest folder, so that every package that exports metrics (kv,
// engine, actors, httpfront) can use it; it imports nothing internal. Owned is safe for
// concurrent use.
package series
