package load

import (
	"bytes"
	"fmt"
	"math"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// GaugeTag is the first element of every load-gauge payload.
const GaugeTag = "LoadStat"

// Load-gauge payload lengths: the basic form and the extended (native) form.
const (
	gaugeBasicLen    = 6
	gaugeExtendedLen = 11
)

// gaugeName names payload element i, for error messages.
func gaugeName(i int) string {
	switch i {
	case 1:
		return "num_running_reqs"
	case 2:
		return "num_waiting_reqs"
	case 3:
		return "num_tokens"
	case 4:
		return "max_total_num_tokens"
	case 5:
		return "attn_dp_rank"
	case 6:
		return "num_waiting_uncached_tokens"
	case 7:
		return "num_total_tokens"
	case 8:
		return "max_running_requests"
	case 9:
		return "total_prefill_uncached_tokens"
	case 10:
		return "total_prefill_busy_us"
	}
	return "element"
}

// DecodeGauge decodes one msgpack load-gauge payload:
//
//	["LoadStat", running, waiting, num_tokens, max_total_num_tokens, attn_dp_rank]
//
// or the extended 11-element form that appends num_waiting_uncached_tokens,
// num_total_tokens, max_running_requests, total_prefill_uncached_tokens and
// total_prefill_busy_us. Numbers may use any msgpack integer width or be floats; they must
// be non-negative. Any other length, a wrong tag, a non-number or trailing bytes is an
// error wrapping ErrMalformed. The extended form is native and carries the prefill counters.
// The gauge has no timestamp: the capture time is receivedAt.
func DecodeGauge(payload []byte, receivedAt time.Time) (RankReport, error) {
	var rep RankReport
	rd := bytes.NewReader(payload)
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(rd)

	n, err := dec.DecodeArrayLen()
	if err != nil {
		return rep, gaugeErr(err)
	}
	if n != gaugeBasicLen && n != gaugeExtendedLen {
		return rep, gaugeErr(fmt.Errorf("array of %d elements, want %d or %d", n, gaugeBasicLen, gaugeExtendedLen))
	}
	if err := decodeGaugeTag(dec); err != nil {
		return rep, gaugeErr(err)
	}
	var v [gaugeExtendedLen]int64
	for i := 1; i < n; i++ {
		if v[i], err = decodeGaugeNumber(dec); err != nil {
			return rep, gaugeErr(fmt.Errorf("element %d (%s): %w", i, gaugeName(i), err))
		}
	}
	if rd.Len() != 0 {
		return rep, gaugeErr(fmt.Errorf("%d trailing bytes", rd.Len()))
	}
	if v[5] >= MaxRanks {
		return rep, gaugeErr(fmt.Errorf("attn_dp_rank %d out of range", v[5]))
	}
	rep = RankReport{
		DPRank:         int(v[5]),
		Fields:         HasRunning | HasWaiting | HasUsedTokens,
		Running:        v[1],
		Waiting:        v[2],
		UsedTokens:     v[3],
		MaxTotalTokens: v[4],
		At:             receivedAt,
	}
	if rep.MaxTotalTokens > 0 {
		rep.Fields |= HasCapacity
	}
	if n == gaugeExtendedLen {
		rep.Fields |= HasNative | HasWaitingUncached
		rep.WaitingUncachedTokens = v[6]
		rep.TotalTokens = v[7]
		rep.MaxRunningRequests = v[8]
		rep.HasCounters = true
		rep.TotalPrefillUncached = v[9]
		rep.TotalPrefillBusyUs = v[10]
	}
	return rep, nil
}

func gaugeErr(err error) error { return decodeErr("load gauge", err) }

func decodeGaugeTag(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return fmt.Errorf("element 0: tag is not a string (code 0x%02x)", c)
	}
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return err
	}
	var tag [len(GaugeTag)]byte
	if n != len(tag) {
		return fmt.Errorf("element 0: tag of %d bytes, want %q", n, GaugeTag)
	}
	if err := dec.ReadFull(tag[:]); err != nil {
		return err
	}
	if string(tag[:]) != GaugeTag {
		return fmt.Errorf("element 0: tag %q, want %q", tag[:], GaugeTag)
	}
	return nil
}

// decodeGaugeNumber reads one non-negative number of any msgpack numeric encoding.
func decodeGaugeNumber(dec *msgpack.Decoder) (int64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case msgpcode.IsFixedNum(c), c == msgpcode.Int8, c == msgpcode.Int16, c == msgpcode.Int32,
		c == msgpcode.Int64, c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32:
		v, err := dec.DecodeInt64()
		if err != nil {
			return 0, err
		}
		if v < 0 {
			return 0, fmt.Errorf("negative count %d", v)
		}
		return v, nil
	case c == msgpcode.Uint64:
		v, err := dec.DecodeUint64()
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("count %d out of range", v)
		}
		return int64(v), nil
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := dec.DecodeFloat64()
		if err != nil {
			return 0, err
		}
		return floatCount(f)
	}
	return 0, fmt.Errorf("not a number (code 0x%02x)", c)
}

// AppendGauge appends the msgpack load-gauge payload of r to dst: the 6-element form, or
// the 11-element extended form when extended is set (counters are encoded as zero when r
// has none). Negative values are encoded as 0.
func AppendGauge(dst []byte, r RankReport, extended bool) []byte {
	n := gaugeBasicLen
	if extended {
		n = gaugeExtendedLen
	}
	buf := bytes.NewBuffer(dst)
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	enc.UseCompactInts(true)
	// Writes to a bytes.Buffer cannot fail; a failure here is a broken invariant.
	must := func(err error) {
		if err != nil {
			panic("BUG: load: cannot encode load gauge: " + err.Error())
		}
	}
	must(enc.EncodeArrayLen(n))
	must(enc.EncodeString(GaugeTag))
	for _, v := range [...]int64{r.Running, r.Waiting, r.UsedTokens, r.MaxTotalTokens, int64(r.DPRank)} {
		must(enc.EncodeInt(max(v, 0)))
	}
	if extended {
		var u, b int64
		if r.HasCounters {
			u, b = r.TotalPrefillUncached, r.TotalPrefillBusyUs
		}
		for _, v := range [...]int64{r.WaitingUncachedTokens, r.TotalTokens, r.MaxRunningRequests, u, b} {
			must(enc.EncodeInt(max(v, 0)))
		}
	}
	return buf.Bytes()
}
